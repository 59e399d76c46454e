"""The pull model: what a workload's start waits for, its layers' transfers and unpacking.

This module owns the simulated network and disks a cold start crosses — a simulator concern,
measured in simulated seconds; which layers a node has is the node's own
:class:`~berth.node.layers.LayerRegistry`'s (the mounts a boot reports say what it lacked):
a cached layer is re-mounted free; a layer another workload is still pulling is waited for; a
layer neither mounted nor cached is *pulled*:

* **Pulls share bandwidth.**  Each node's link (``pull_bandwidth``) and the registry
  (``registry_bandwidth``, shared by every node) are work-conserving FIFO pipes: a layer's
  transfer starts ``layer_latency`` after the decision (one registry round trip per layer,
  issued in parallel) or when the node's link is free, whichever is later, and takes
  ``size / pull_bandwidth``; the registry serves transfers in order at
  ``registry_bandwidth``, and a layer is downloaded when both have carried it.  FIFO drains a
  backlog in the same total time as fair sharing would; only the order of completions
  differs.  So twenty cold starts on one node, or a burst of cold starts across the fleet,
  wait for each other — the cold-start hot spots a real fleet sees.
* **Unpacking costs time.**  A downloaded layer is unpacked at ``unpack_bandwidth`` on its
  node, one layer at a time (a node's disk is one more FIFO pipe).
"""

from __future__ import annotations

from collections.abc import Iterable

from berth.node.layers import MountOutcome, MountResult
from berth.sim.config import SimConfig

__all__ = ["PullModel"]


class PullModel:
    """The FIFO pipes of every node and of the registry (module docstring), and when each
    layer a node pulled is ready (a later mount of it waits until then)."""

    def __init__(self, config: SimConfig, nodes: Iterable[str]) -> None:
        names = list(nodes)
        self.config = config
        self._ready_at: dict[str, dict[str, float]] = {name: {} for name in names}
        self._link_free = dict.fromkeys(names, 0.0)
        self._unpack_free = dict.fromkeys(names, 0.0)
        self._registry_free = 0.0

    def ready(
        self, node: str, mounts: Iterable[MountResult], *, decided: float, now: float
    ) -> tuple[float, int]:
        """When every layer of a boot on ``node`` decided at ``decided`` is there, and the
        bytes it pulled: pulled layers go through the pipes; a layer already mounted is ready
        when its own pull is (``now`` if it was not pulled); a cached one is ready at once."""
        ready_at = self._ready_at[node]
        missing = 0
        ready = decided
        for mounted in mounts:
            if mounted.outcome is MountOutcome.PULLED:
                missing += mounted.size
                ready_at[mounted.layer_id] = done = self._pull(node, mounted.size, decided)
                ready = max(ready, done)
            elif mounted.outcome is MountOutcome.ALREADY_MOUNTED:
                ready = max(ready, ready_at.get(mounted.layer_id, now))
        return ready, missing

    def _pull(self, node: str, size: int, at: float) -> float:
        """When a layer of ``size`` bytes pulled to ``node`` from ``at`` is unpacked (node link,
        registry, node unpacking)."""
        config = self.config
        start = at + config.layer_latency
        link = max(start, self._link_free[node]) + size / config.pull_bandwidth
        registry = max(start, self._registry_free) + size / config.registry_bandwidth
        self._registry_free = registry
        downloaded = self._link_free[node] = max(link, registry)
        unpacked = max(downloaded, self._unpack_free[node]) + size / config.unpack_bandwidth
        self._unpack_free[node] = unpacked
        return unpacked
