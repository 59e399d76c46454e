"""Lower bounds on the layer bytes a simulated run must pull, whatever the policy.

This module owns the two bounds a run's ``bytes_pulled`` is compared with, computed from what
the run placed (which requests, on which platform, holding how much memory, from when to
when).  It runs nothing and imports no simulator type, so the simulator, the report and the
tests share one definition.  Both are *true* lower bounds of the run they are computed from:
no schedule of those same placements — by any policy, with any cache — pulls less.

**Every distinct layer once** (:func:`distinct_layer_bound`)::

    distinct = Σ size(L)  over the distinct layers L mounted by a placed request on a node of
                          a platform p where no node of p started with L (``preseeded``)

Nodes start empty except for pre-seeded layers, so each such layer reaches at least one node
by a pull.

**Capacity-aware** (:func:`capacity_bound`).  A layer in use at time t by placed requests
that together hold M_{L,p}(t) bytes of memory on nodes of platform p is mounted, at t, on
distinct nodes of p whose memory budgets add up to at least M_{L,p}(t) — so on at least
``k_p(M)``, the fewest nodes of p whose memories sum to M taking the largest first.  That is
never less than the issue's ⌈M / mem_max_p⌉ (mem_max_p the largest memory of a node of p)
and is tighter in a mixed fleet: with one 16 GiB node and the rest 4 GiB, 40 GiB at once
needs 7 nodes, not ⌈40 / 16⌉ = 3.  Each of those nodes got L by a pull (unless it started
with it), and a pull serves one node, so::

    capacity = Σ_{L, p not pre-seeded with L} size(L) · k_p(max_t M_{L,p}(t))

(k_p grows with M, so the busiest instant decides.)

*At once* means at the same simulated instant: a request holds its memory and mounts its
layers from its placement (``start``, the decision) until its workload ends (``end``); at
equal times an end counts before a start, as the simulator handles them.  Taking the maximum
over instants (not the sum of all memory ever) keeps the bound true: requests that never
overlap may reuse one node.  Each (L, p) term is at least ``size(L)`` when L was used on p,
so ``capacity ≥ distinct`` (a layer used on two platforms counts on each: different nodes).

The bound ignores disk, CPU and layers evicted and pulled again, so real runs sit above it;
a ratio near 1 means the policy did about as well as capacity allows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from berth.model import Layer

__all__ = ["LayerUse", "capacity_bound", "distinct_layer_bound", "nodes_needed", "peak_memory"]


@dataclass(frozen=True, slots=True)
class LayerUse:
    """One placed request: memory ``mem`` held and ``layers`` mounted on a node of
    ``platform`` from ``start`` to ``end`` (simulated seconds)."""

    start: float
    end: float
    mem: int
    platform: str
    layers: Sequence[Layer]


def _seeded(preseeded: Mapping[str, Iterable[str]], platform: str) -> frozenset[str]:
    seeded = preseeded.get(platform, ())
    return seeded if isinstance(seeded, frozenset) else frozenset(seeded)


def distinct_layer_bound(
    uses: Iterable[LayerUse], preseeded: Mapping[str, Iterable[str]] | None = None
) -> int:
    """Σ sizes of the distinct layers some placed request needed a pull for (module
    docstring); ``preseeded`` maps a platform to the layers some node of it started with."""
    preseeded = preseeded or {}
    needed: dict[str, int] = {}
    for use in uses:
        seeded = _seeded(preseeded, use.platform)
        for layer in use.layers:
            if layer.id not in seeded:
                needed[layer.id] = layer.size
    return sum(needed.values())


def peak_memory(intervals: Iterable[tuple[float, float, int]]) -> int:
    """``max_t M(t)``: the most memory ``(start, end, mem)`` intervals hold at one instant,
    ends before starts at equal times (0 when there are none)."""
    events = sorted(
        (at, kind, mem) for start, end, mem in intervals for at, kind in ((start, 1), (end, 0))
    )
    held = peak = 0
    for _, kind, mem in events:
        held += mem if kind else -mem
        peak = max(peak, held)
    return peak


def nodes_needed(memory: int, node_mems: Sequence[int]) -> int:
    """The fewest of ``node_mems`` (sorted largest first) whose sum reaches ``memory``; at
    least 1 (a layer in use is on some node), all of them if even their sum falls short."""
    total = 0
    for count, mem in enumerate(node_mems, start=1):
        total += mem
        if total >= memory:
            return count
    return max(1, len(node_mems))


def capacity_bound(
    uses: Iterable[LayerUse],
    node_mems: Mapping[str, Sequence[int]],
    preseeded: Mapping[str, Iterable[str]] | None = None,
) -> int:
    """The capacity-aware bound (module docstring).

    ``node_mems`` maps each platform to the memory budgets of its nodes; ``preseeded`` maps a
    platform to the layers some node of it started with.
    """
    preseeded = preseeded or {}
    ordered = {platform: sorted(mems, reverse=True) for platform, mems in node_mems.items()}
    intervals: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    sizes: dict[str, int] = {}
    for use in uses:
        seeded = _seeded(preseeded, use.platform)
        for layer in use.layers:
            if layer.id in seeded:
                continue
            sizes[layer.id] = layer.size
            intervals.setdefault((layer.id, use.platform), []).append((use.start, use.end, use.mem))
    total = 0
    for (layer_id, platform), spans in intervals.items():
        total += sizes[layer_id] * nodes_needed(peak_memory(spans), ordered[platform])
    return total
