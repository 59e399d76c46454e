"""The nodes of a simulated cluster: their layout, their cores, their bookkeeping checks.

This module owns what a simulated node *is* — not what happens to it (the events are
:mod:`berth.sim.simulator`'s, the pulls :mod:`berth.sim.pulls`').

**The cluster.**  ``SimConfig.nodes`` nodes named ``node-000`` …; each draws a size class
(:class:`~berth.node.classes.NodeClass`: memory, disk, cores, bandwidth caps — the type the
embedded cluster uses too) and a platform from weighted mixes, shuffled by ``SimConfig.seed``
so neither correlates with the name order some policies use for ties.  Every node is a
:class:`~berth.node.core.NodeCore` — the node agent's own core, minus the agent's I/O — with a
``NodeBudget`` on the simulated clock, a :class:`~berth.node.layers.LayerRegistry`
(refcounted mounts, LRU cache) and a :class:`~berth.node.runtime.FakeRuntime`.

**The layer cache is part of the node's disk.**  Each node's cache of unmounted layers is
sized from its disk — ``cache_fraction`` of it (``cache_bytes``, when set, gives every node
the same size instead) — and charged against it: the node's hard disk budget, what workloads
may reserve, is its disk *minus* the cache.  (A mounted image counts inside its workload's
own disk reservation, as a microVM's root filesystem does.)  So a small node keeps a small
cache and evicts sooner (least recently unmounted first).  With ``preseed_layers`` = N each
node starts with the N layers its platform's arrivals use most (the common base images a
fleet pre-pulls) already in its cache; they can be evicted like any other.

The core's wiring is the agent's: a workload's end releases its reservation (the lease is
bound to it) and unmounts its layers into the cache, and its snapshot is the agent's snapshot.
(:class:`~berth.node.agent.Agent` itself is not used: its advertiser is an asyncio heartbeat
in wall-clock time, while here snapshots must follow the simulated clock — the simulator is
the advertiser.)

**Load model** (what the budget's soft check and the snapshot read — a simulator concern,
plugged into the core as its budget's readings plus a change listener): every workload keeps
the vCPUs and bandwidth it declared busy, so ``cpu_load = min(1, Σ reserved vcpus /
cpu_capacity)`` and ``disk_bw_load`` / ``net_bw_load`` are the reserved sums, recomputed on
every change of the node's reservations.  Deterministic and pessimistic; with the default
classes cores, disk and bandwidth are at most 80 % used when memory is full, so memory is the
binding resource.

The checks (:func:`check_node`, :func:`check_drained`) say what must hold of a node's
bookkeeping between two events and at the end of a run; a failure is
:class:`InvariantViolated`, a bug, never an outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from berth.node.budget import NodeBudget, StaticLoad
from berth.node.classes import NodeClass
from berth.node.core import NodeCore
from berth.node.layers import LayerRegistry
from berth.node.runtime import FakeRuntime
from berth.platform import Platform, matches_any
from berth.sim.config import SimConfig
from berth.sim.workload import Arrival

__all__ = [
    "InvariantViolated",
    "SimNode",
    "check_drained",
    "check_node",
    "layout",
    "preseed",
    "simulated_node",
]


class InvariantViolated(RuntimeError):
    """A hard budget, a layer refcount or a release went wrong: a bug, never an outcome."""


@dataclass(frozen=True)
class SimNode:
    """A simulated node's fixed description."""

    name: str
    node_class: str
    platform: str
    mem_max: int
    disk_max: int
    """What workloads may reserve: the class's disk minus the layer cache."""
    cpus: float
    cache_bytes: int = 0
    zone: str | None = None


def _counts(weights: Sequence[float], total: int) -> list[int]:
    """Split ``total`` by ``weights`` (largest remainder; ties to the earlier entry)."""
    scale = sum(weights)
    exact = [weight * total / scale for weight in weights]
    counts = [int(value) for value in exact]
    order = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def layout(config: SimConfig) -> list[tuple[SimNode, NodeClass]]:
    """The nodes of ``config``: classes and platforms split by weight, shuffled by the seed."""
    rng = np.random.default_rng([config.seed, 0x5EED])
    classes = config.node_classes
    class_of = [
        index
        for index, count in enumerate(_counts([c.weight for c in classes], config.nodes))
        for _ in range(count)
    ]
    platforms = list(config.node_platforms)
    platform_of = [
        index
        for index, count in enumerate(_counts(list(config.node_platforms.values()), config.nodes))
        for _ in range(count)
    ]
    class_order = rng.permutation(config.nodes).tolist()
    platform_order = rng.permutation(config.nodes).tolist()
    width = max(3, len(str(config.nodes - 1)))
    out: list[tuple[SimNode, NodeClass]] = []
    for i in range(config.nodes):
        node_class = classes[class_of[class_order[i]]]
        cache = config.cache_of(node_class)
        info = SimNode(
            name=f"node-{i:0{width}d}",
            node_class=node_class.name,
            platform=platforms[platform_of[platform_order[i]]],
            mem_max=node_class.mem,
            disk_max=node_class.disk - cache,
            cpus=node_class.cpus,
            cache_bytes=cache,
            zone=f"z{i % config.zones}" if config.zones else None,
        )
        out.append((info, node_class))
    return out


def _reserved_load(budget: NodeBudget, load: StaticLoad) -> Callable[[], None]:
    """The simulated load model (module docstring), as a listener on ``budget``'s changes:
    ``load`` is kept at the reserved sums (``cpu_load`` as a fraction of the cores)."""

    def update() -> None:
        vcpus = disk_bw = net_bw = 0.0
        for reservation in budget.reservations():
            vcpus += reservation.spec.vcpus
            disk_bw += reservation.spec.disk_bw
            net_bw += reservation.spec.net_bw
        load.cpu_load = min(1.0, vcpus / budget.limits.cpu_capacity)
        load.disk_bw_load = disk_bw
        load.net_bw_load = net_bw

    return update


def simulated_node(info: SimNode, node_class: NodeClass, clock: Callable[[], float]) -> NodeCore:
    """A node core with the simulated load model, on the simulated clock; its disk budget is
    the class's disk minus its layer cache (``info.disk_max``)."""
    load = StaticLoad()
    limits = node_class.model_copy(update={"disk": info.disk_max}).limits()
    budget = NodeBudget(limits, load, clock=clock)
    budget.add_change_listener(_reserved_load(budget, load))
    return NodeCore(
        info.name,
        info.platform,
        budget,
        FakeRuntime(),
        layers=LayerRegistry(info.cache_bytes),
        labels=None if info.zone is None else {"zone": info.zone},
    )


def check_node(node: NodeCore) -> None:
    """Raise ``InvariantViolated`` unless ``node``'s bookkeeping holds between two events.

    The core's own checks (:meth:`~berth.node.core.NodeCore.problems`: hard budget, layer
    refcounts, cache bound, clean ends), plus one that holds only here: every reservation
    belongs to a running workload, because the simulator binds each lease in the event that
    took it.
    """
    problems = node.problems()
    reservations, running = len(node.budget.reservations()), len(node.workloads())
    if reservations != running:
        problems.append(f"{reservations} reservations for {running} workloads")
    if problems:
        raise InvariantViolated(f"{node.name}: {problems[0]}")


def check_drained(node: NodeCore) -> None:
    """Raise ``InvariantViolated`` unless every workload ended and released everything."""
    check_node(node)
    limits = node.budget.limits
    headroom = node.budget.headroom()
    leftovers = (
        node.workloads() or node.runtime.list() or node.layers.mounted(),
        (headroom.mem_free, headroom.disk_free) != (limits.mem_max, limits.disk_max),
    )
    if any(leftovers):
        raise InvariantViolated(
            f"{node.name}: not drained at the end: {len(node.workloads())} workloads, "
            f"{len(node.layers.mounted())} mounted layers, headroom {headroom}"
        )


def preseed(
    nodes: Mapping[str, NodeCore],
    info: Mapping[str, SimNode],
    arrivals: Sequence[Arrival],
    count: int,
) -> dict[str, frozenset[str]]:
    """Put each platform's ``count`` most used layers into every such node's cache.

    "Most used": by the number of arrivals whose layers on that platform include it (ties by
    id) — the common base images an operator pre-pulls.  A layer larger than a node's cache
    is not kept there.  Returns platform → the layers seeded on at least one node of it.
    """
    if not count:
        return {}
    seeded: dict[str, frozenset[str]] = {}
    for platform in sorted({each.platform for each in info.values()}):
        wanted = Platform.parse(platform)
        uses: dict[str, int] = {}
        sizes: dict[str, int] = {}
        for arrival in arrivals:
            if arrival.request.platforms and not matches_any(wanted, arrival.request.platforms):
                continue
            for layer in arrival.layers_on(wanted):
                uses[layer.id] = uses.get(layer.id, 0) + 1
                sizes[layer.id] = layer.size
        top = sorted(uses, key=lambda layer_id: (-uses[layer_id], layer_id))[:count]
        members = [node for name, node in nodes.items() if info[name].platform == platform]
        for node in members:
            for layer_id in reversed(top):  # the most used ends most recently cached
                node.layers.mount(layer_id, sizes[layer_id])
                node.layers.unmount(layer_id)
        seeded[platform] = frozenset(
            layer_id for layer_id in top if any(node.layers.is_cached(layer_id) for node in members)
        )
    return seeded
