"""The discrete-event simulator: berth's real scheduler and node budgets on a simulated clock.

This module owns *time and bookkeeping* around real berth code, so placement quality is
measured, not assumed.  Every decision is made by the real
:class:`~berth.scheduler.multinode.ClusterScheduler` (``schedule``, the placement port) with
the policy under test, and confirmed by the chosen node's real
:class:`~berth.node.budget.NodeBudget` (through :class:`~berth.nodeclient.local.LocalNodes`):
the simulator never re-implements fit, ranking or admission.  It is not a load generator
(:mod:`berth.sim.workload` draws the arrivals) and not a report (:mod:`berth.sim.report`
turns a :class:`SimResult` into metrics, tables and plots).

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

The core's wiring is the agent's: a workload's end
releases its reservation (the lease is bound to it) and unmounts its layers into the cache,
and its snapshot is the agent's snapshot.  (:class:`~berth.node.agent.Agent` itself is not
used: its advertiser is an asyncio heartbeat in wall-clock time, while here snapshots must
follow the simulated clock — the simulator is the advertiser.)

**Load model** (what the budget's soft check and the snapshot read — a simulator concern,
plugged into the core as its budget's readings plus a change listener): every workload keeps
the vCPUs and bandwidth it declared busy, so ``cpu_load = min(1, Σ reserved vcpus /
cpu_capacity)`` and ``disk_bw_load`` / ``net_bw_load`` are the reserved sums, recomputed on
every change of the node's reservations.  Deterministic and pessimistic; with the default
classes cores, disk and bandwidth are at most 80 % used when memory is full, so memory is the
binding resource.

**Schedulers and staleness.**  ``concurrency`` = K schedulers, each a real
``ClusterScheduler`` with its own :class:`~berth.store.memory.MemoryStore` replica and its
own policy instance (seeded from ``SimConfig.seed`` and its index).  Arrivals go to them
round-robin.  A node re-publishes its ``NodeState`` (``generation`` + 1) after every event
that changed its reservations or layers; each replica receives it ``staleness`` = Δ simulated
seconds later (Δ = 0: before the next event).  Stale replicas are how collisions — refusals
at confirmation — arise; they are counted, not assumed.  Every node's initial snapshot is
delivered at time 0.

**A placement's life.**  At ``arrival.at`` the scheduler's ``schedule(request)`` ranks its
replica and walks the candidates; each node's ``admit`` reserves under a lease or refuses.
The simulator then hands the placement to the node's core — ``NodeCore.boot`` with the
lease, the same lifecycle the agent runs: mount the image's layers (for a multi-platform
request, the variant of the node's platform), start the workload, bind the lease to it.  The
mounts say what the start waits for: a cached layer is re-mounted free; a layer another
workload is still pulling is waited for; a layer neither mounted nor cached is *pulled*:

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
* **Refusals cost a round trip.**  Each refusal at confirmation delays the decision by
  ``refusal_rtt``, and a placement gives up (outcome ``gave_up``) at the ``max_refusals``-th
  refusal, as a real scheduler bounds its retries.

The workload starts ``boot_seconds`` after its last layer is unpacked — that wait, from
arrival, is its modelled start latency — and ends ``lifetime`` seconds after starting, when
the runtime reports its exit: the reservation is released and its layers unmounted into the
cache.  A request the scheduler cannot place (``NoCapacity``, ``NoMatchingPlatform``, gave up)
is recorded and dropped, never retried.

**Refusals judged against the truth.**  When a request is not placed for capacity (including
giving up), the simulator asks whether some node *could* have held it right then without
displacing anything: a node of a matching platform whose true current state (its latest
snapshot, published after every change — not any scheduler's replica) passes every fit
check.  The first such node is recorded as :attr:`Decision.could_hold`; the report counts
these *avoidable* refusals.

**Events** are dispatched by kind through a handler table (:attr:`Simulation._handlers`):
a workload's end, a snapshot's delivery to a replica, a utilisation sample, an arrival.

**Determinism.**  Events are ordered by (time, kind, sequence): at equal times ends come
before snapshot deliveries, samples and arrivals.  Nodes publish in name order.  Nothing
depends on the wall clock except the measured decision latency, which is reported, never used.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, Strict, StrictBool, StrictInt, field_validator, model_validator

from berth.dataset import Dataset
from berth.errors import BerthError, Invalid, NoCapacity, NoMatchingPlatform
from berth.model import Bytes, BytesPerSecond, Layer, Placement, Request, Spec
from berth.model import Seconds as Delay
from berth.node.budget import NodeBudget, StaticLoad
from berth.node.classes import NodeClass
from berth.node.core import NodeCore
from berth.node.layers import LayerRegistry, MountOutcome
from berth.node.runtime import BootSpec, FakeRuntime
from berth.nodeclient.local import LocalNodes
from berth.nodeclient.recording import RecordingNodes
from berth.ownership import Admission, Refused
from berth.platform import Platform, matches_any
from berth.scheduler.multinode import ClusterScheduler
from berth.scheduler.policy import POLICIES, Policy, SeedLike
from berth.scheduler.policy import policy as make_policy
from berth.sim.bounds import LayerUse, capacity_bound, distinct_layer_bound
from berth.sim.workload import Arrival, WorkloadConfig, generate_workload
from berth.state import NodeState, first_failed_check
from berth.store.memory import MemoryStore
from berth.validation import BerthModel

__all__ = [
    "DEFAULT_NODE_CLASSES",
    "DEFAULT_NODE_PLATFORMS",
    "MAX_CONCURRENCY",
    "MAX_SIM_NODES",
    "Decision",
    "GaveUp",
    "InvariantViolated",
    "NodeClass",
    "Observer",
    "SimConfig",
    "SimNode",
    "SimResult",
    "Simulation",
    "check_drained",
    "check_node",
    "layout",
    "simulate",
    "simulate_policies",
]

GiB = 2**30
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
MAX_SIM_NODES = 10_000
"""The most nodes one simulation builds."""
MAX_CONCURRENCY = 64
"""The most concurrent schedulers one simulation runs."""
MAX_SAMPLES = 10_000


DEFAULT_NODE_CLASSES: tuple[NodeClass, ...] = (
    NodeClass(name="small", mem="4GiB", disk="128GiB", cpus=10, disk_bw="1GiBps",
              net_bw="512MiBps", weight=0.5),
    NodeClass(name="medium", mem="8GiB", disk="256GiB", cpus=20, disk_bw="2GiBps",
              net_bw="1GiBps", weight=0.3),
    NodeClass(name="large", mem="16GiB", disk="512GiB", cpus=40, disk_bw="4GiBps",
              net_bw="2GiBps", weight=0.2),
)  # fmt: skip
"""Three sizes, half of them small.  Hyper's instance types all ask 2 vCPUs, 16 GiB disk,
128 MiBps disk and 64 MiBps network per GiB of memory; these nodes offer 2.5 cores, 32 GiB
disk, 256 MiBps and 128 MiBps per GiB, so memory is what fills first.  Small on purpose: a
default run of 2,000 requests then spans several workload lifetimes at moderate load."""

DEFAULT_NODE_PLATFORMS: Mapping[str, float] = {
    "linux/amd64": 0.92,
    "linux/arm64/v8": 0.04,
    "windows/amd64": 0.04,
}
"""Mostly linux/amd64, as the dataset's pulls are; images for platforms no node runs
(linux/ppc64le, linux/mips64le, linux/s390x, linux/386 in the Docker Hub data: ~0.2 % of
pulls) end in ``NoMatchingPlatform`` and are counted as such."""

DEFAULT_WORKLOAD = WorkloadConfig(requests=2000, rate=2.0, lifetime_mean=300.0)


class SimConfig(BerthModel):
    """Everything that decides a simulation besides the policy; see the module docstring.

    ``cache_fraction`` of each node's disk is its layer cache (``cache_bytes``, when set: the
    same size on every node), charged against the disk workloads may reserve;
    ``pull_bandwidth`` a node's link, shared by its concurrent pulls; ``registry_bandwidth``
    the registry's, shared by every node; ``layer_latency`` the round trip before a layer's
    transfer; ``unpack_bandwidth`` the rate a node unpacks at; ``preseed_layers`` how many of
    the most used layers every node starts with in its cache; ``refusal_rtt`` what a refusal
    at confirmation costs and ``max_refusals`` after how many a placement gives up;
    ``boot_seconds`` a fixed boot time added to every start; ``samples`` how many evenly
    spaced utilisation samples cover the arrival window; ``seed`` draws the node layout and
    seeds the policies (the workload has its own seed); ``zones`` > 0 labels node ``i``
    ``zone=z<i mod zones>`` (for requests that spread over zones; 0: no label).
    """

    nodes: Annotated[StrictInt, Field(ge=1, le=MAX_SIM_NODES)] = 100
    node_classes: Annotated[tuple[NodeClass, ...], Field(min_length=1, max_length=64)] = (
        DEFAULT_NODE_CLASSES
    )
    node_platforms: Annotated[
        dict[str, Annotated[float, Strict(), Field(ge=0, le=1e6, allow_inf_nan=False)]],
        Field(max_length=64),
    ] = Field(default_factory=lambda: dict(DEFAULT_NODE_PLATFORMS))
    cache_bytes: Bytes | None = None
    cache_fraction: Annotated[float, Strict(), Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0625
    pull_bandwidth: Annotated[BytesPerSecond, Field(gt=0)] = 125_000_000
    registry_bandwidth: Annotated[BytesPerSecond, Field(gt=0)] = 2_500_000_000
    layer_latency: Delay = 0.02
    unpack_bandwidth: Annotated[BytesPerSecond, Field(gt=0)] = 500_000_000
    preseed_layers: Annotated[StrictInt, Field(ge=0, le=1024)] = 0
    refusal_rtt: Delay = 0.002
    max_refusals: Annotated[StrictInt, Field(ge=1, le=MAX_SIM_NODES)] = 8
    boot_seconds: Delay = 0.125
    concurrency: Annotated[StrictInt, Field(ge=1, le=MAX_CONCURRENCY)] = 1
    staleness: Delay = 0.0
    assume: StrictBool = True
    samples: Annotated[StrictInt, Field(ge=1, le=MAX_SAMPLES)] = 200
    seed: Annotated[StrictInt, Field(ge=0, le=2**64 - 1)] = 0
    zones: Annotated[StrictInt, Field(ge=0, le=MAX_SIM_NODES)] = 0
    workload: WorkloadConfig = DEFAULT_WORKLOAD

    @field_validator("node_platforms")
    @classmethod
    def _platforms(cls, mix: dict[str, float]) -> dict[str, float]:
        if not mix:
            raise Invalid("must name at least one platform")
        normal: dict[str, float] = {}
        for text, weight in mix.items():
            if not weight >= 0:
                raise Invalid(f"weights must not be negative, got {weight!r} for {text!r}")
            key = str(Platform.parse(text, field="node_platforms"))
            normal[key] = normal.get(key, 0.0) + float(weight)
        if not sum(normal.values()) > 0:
            raise Invalid(f"at least one weight must be positive, got {mix}")
        return normal

    @field_validator("node_classes")
    @classmethod
    def _classes(cls, classes: tuple[NodeClass, ...]) -> tuple[NodeClass, ...]:
        if not sum(node_class.weight for node_class in classes) > 0:
            raise Invalid("at least one node class must have a positive weight")
        if len({node_class.name for node_class in classes}) != len(classes):
            raise Invalid("node class names must be unique")
        return classes

    @model_validator(mode="after")
    def _cache_fits(self) -> SimConfig:
        if self.cache_bytes is not None:
            smallest = min(self.node_classes, key=lambda node_class: node_class.disk)
            if self.cache_bytes >= smallest.disk:
                raise Invalid(
                    f"must be smaller than every node's disk; class {smallest.name!r} has "
                    f"{smallest.disk} bytes, got {self.cache_bytes}",
                    field="cache_bytes",
                )
        return self

    def cache_of(self, node_class: NodeClass) -> int:
        """The layer cache of a node of ``node_class``, in bytes (class docstring)."""
        if self.cache_bytes is not None:
            return min(self.cache_bytes, node_class.disk)
        return int(self.cache_fraction * node_class.disk)


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


Outcome = Literal["placed", "no_capacity", "gave_up", "no_matching_platform"]


class GaveUp(BerthError):
    """A placement stopped walking its candidates after ``max_refusals`` refusals."""


class _BoundedNodes(RecordingNodes):
    """The recording client that gives up at the ``limit``-th refusal of one decision."""

    def __init__(self, nodes: LocalNodes, limit: int) -> None:
        super().__init__(nodes)
        self.limit = limit

    async def admit(
        self,
        node: str,
        spec: Spec,
        *,
        lease_ttl_s: float,
        platforms: Sequence[Platform] = (),
    ) -> Admission:
        try:
            return await super().admit(node, spec, lease_ttl_s=lease_ttl_s, platforms=platforms)
        except Refused:
            if len(self.refusals) >= self.limit:
                raise GaveUp(f"gave up after {len(self.refusals)} refusals") from None
            raise


@dataclass(frozen=True)
class Decision:
    """What happened to one arrival.

    ``refusals`` are the nodes that refused at confirmation during this decision (whether or
    not another then accepted), as ``(node, reason)``; ``local_bytes`` the request's layer
    bytes already on the chosen node (mounted or cached), ``pulled_bytes`` the rest;
    ``start_latency`` the modelled wait from arrival to start (refusal round trips, pulls,
    unpacking, boot); ``decision_seconds`` the wall-clock time of the real ``schedule`` call;
    ``layers`` what the chosen node mounted (its platform's variant), ``mem`` the memory
    reserved; ``could_hold`` — for a request not placed for capacity — a node whose true state
    could have held it at that moment.
    """

    index: int
    at: float
    request: str
    image: str
    instance_type: str
    platform: str
    scheduler: int
    outcome: Outcome
    decision_seconds: float
    refusals: tuple[tuple[str, str], ...] = ()
    node: str | None = None
    rank: int | None = None
    colocated_bytes: int = 0
    local_bytes: int = 0
    pulled_bytes: int = 0
    start_latency: float | None = None
    ends_at: float | None = None
    node_platform: str | None = None
    layers: tuple[Layer, ...] = ()
    mem: int = 0
    could_hold: str | None = None

    @property
    def placed(self) -> bool:
        return self.outcome == "placed"

    @property
    def refused(self) -> bool:
        """Not placed for lack of capacity (``no_capacity`` or ``gave_up``)."""
        return self.outcome in ("no_capacity", "gave_up")


@dataclass
class SimResult:
    """Everything one simulated run produced (metrics are computed by :mod:`berth.sim.report`).

    ``pulls`` is ``(simulated time, cumulative bytes pulled)`` after every placement that
    pulled; ``utilisation[s, n]`` is node ``n``'s reserved memory fraction at
    ``sample_times[s]``; ``lower_bound_bytes`` and ``capacity_bound_bytes`` the two lower
    bounds of :mod:`berth.sim.bounds` on this run's bytes pulled; ``preseeded`` maps a
    platform to the layers some node of it started with.
    """

    config: SimConfig
    policy: str
    nodes: tuple[SimNode, ...]
    decisions: list[Decision]
    pulls: list[tuple[float, int]]
    sample_times: npt.NDArray[np.float64]
    utilisation: npt.NDArray[np.float64]
    lower_bound_bytes: int
    end_time: float
    wall_seconds: float
    capacity_bound_bytes: int = 0
    preseeded: dict[str, frozenset[str]] = field(default_factory=dict)

    @property
    def pulled_bytes(self) -> int:
        return self.pulls[-1][1] if self.pulls else 0

    def placements(self) -> list[tuple[str, str | None]]:
        """``(request key, node or None)`` per arrival, in arrival order."""
        return [(decision.request, decision.node) for decision in self.decisions]


Observer = Callable[[Decision, Arrival, ClusterScheduler], None]
"""Called after each decision, before the chosen node re-publishes: the scheduler's replica
is still the view the decision was made from (``berth demo`` explains placements with it)."""


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


def _simulated_node(info: SimNode, node_class: NodeClass, clock: Callable[[], float]) -> NodeCore:
    """A node core with the simulated load model, on the simulated clock; its disk budget is
    the class's disk minus its layer cache (``info.disk_max``)."""
    load = StaticLoad()
    limits = node_class.model_copy(update={"disk": info.disk_max}).limits()
    budget = NodeBudget(limits, load, clock=clock)
    budget.add_change_listener(_reserved_load(budget, load))
    return NodeCore(
        info.name, info.platform, budget, FakeRuntime(), layers=LayerRegistry(info.cache_bytes),
        labels=None if info.zone is None else {"zone": info.zone},
    )  # fmt: skip


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


class _Event(IntEnum):
    """Event kinds, in the order they run at equal times."""

    END = 0
    DELIVER = 1
    SAMPLE = 2
    ARRIVE = 3


@dataclass
class _Tally:
    """What a run accumulates as its events are handled."""

    mem_max: npt.NDArray[np.float64]
    utilisation: npt.NDArray[np.float64]
    progress: Callable[[int, int], None] | None
    observer: Observer | None
    samples: int = 0
    decisions: list[Decision] = field(default_factory=list)
    pulls: list[tuple[float, int]] = field(default_factory=list)
    pulled_total: int = 0


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


class Simulation:
    """One run of one policy over a fixed list of arrivals (see the module docstring).

    ``policy`` is a registered policy name (:data:`berth.scheduler.policy.POLICIES`) or a
    factory called once per scheduler with that scheduler's seed generator, so a test can hand
    in any :class:`~berth.scheduler.policy.Policy`.  ``check_invariants`` re-checks every
    touched node's hard budget and layer refcounts after every event (slower; for tests).

    ``nodes`` are the simulated nodes' :class:`~berth.node.core.NodeCore` by name, ``info``
    their fixed descriptions.
    """

    def __init__(
        self,
        config: SimConfig,
        policy: str | Callable[[SeedLike], Policy],
        arrivals: Sequence[Arrival] | None = None,
        *,
        dataset: Dataset | None = None,
        check_invariants: bool = False,
    ) -> None:
        if isinstance(policy, str):
            make_policy(policy)  # unknown names fail here, before any work
            self.policy_name = policy
            factory: Callable[[SeedLike], Policy] = POLICIES[policy]
        else:
            factory = policy
            self.policy_name = getattr(factory(0), "name", "custom")
        self.config = config
        self.arrivals = (
            list(arrivals) if arrivals is not None else generate_workload(config.workload, dataset)
        )
        self.check_invariants = check_invariants
        self.now = 0.0
        self._dirty: set[str] = set()
        self.info: dict[str, SimNode] = {}
        self.nodes: dict[str, NodeCore] = {}
        for info, node_class in layout(config):
            node = _simulated_node(info, node_class, self._clock)
            self.info[info.name] = info
            self.nodes[info.name] = node
        self.preseeded = _preseed(self.nodes, self.info, self.arrivals, config.preseed_layers)
        for name, node in self.nodes.items():
            node.add_change_listener(functools.partial(self._dirty.add, name))
        # When each layer a node pulled is ready (a later mount of it waits until then), and
        # when each FIFO pipe (module docstring) is next free.
        self._ready_at: dict[str, dict[str, float]] = {name: {} for name in self.nodes}
        self._link_free = dict.fromkeys(self.nodes, 0.0)
        self._unpack_free = dict.fromkeys(self.nodes, 0.0)
        self._registry_free = 0.0
        self._local = LocalNodes({name: node.budget for name, node in self.nodes.items()})
        self.stores = [MemoryStore(clock=self._clock) for _ in range(config.concurrency)]
        # The truth, for the counterfactual at refusal time: every node's latest snapshot,
        # and its free memory and disk as arrays in name order.
        self._names = sorted(self.nodes)
        self._truth: dict[str, NodeState] = {}
        self._mem_free = np.zeros(len(self._names), dtype=np.int64)
        self._disk_free = np.zeros(len(self._names), dtype=np.int64)
        self._slot = {name: slot for slot, name in enumerate(self._names)}
        for name in self._names:
            state = self.nodes[name].snapshot(0.0)
            self._know(state)
            for store in self.stores:
                store.publish_now(state)
        self._clients = [_BoundedNodes(self._local, config.max_refusals) for _ in self.stores]
        seeds = np.random.SeedSequence([config.seed, 0x9011C7]).spawn(config.concurrency)
        self.schedulers = [
            ClusterScheduler(
                store,
                client,
                policy=factory(np.random.default_rng(seed)),
                assume=config.assume,
                clock=self._clock,
            )
            for store, client, seed in zip(self.stores, self._clients, seeds, strict=True)
        ]
        self._events: list[tuple[float, _Event, int, Any]] = []
        self._sequence = itertools.count()
        self._handlers: dict[_Event, Callable[[Any], Awaitable[None]]] = {
            _Event.END: self._end,
            _Event.DELIVER: self._deliver,
            _Event.SAMPLE: self._sample,
            _Event.ARRIVE: self._arrival,
        }
        self._tally: _Tally | None = None
        self._ran = False

    def _clock(self) -> float:
        return self.now

    def _push(self, at: float, kind: _Event, payload: Any) -> None:
        heapq.heappush(self._events, (at, kind, next(self._sequence), payload))

    def check(self, node: str) -> None:
        """Raise ``InvariantViolated`` unless ``node``'s bookkeeping holds (see
        :func:`check_node`)."""
        check_node(self.nodes[node])

    def run(
        self,
        *,
        progress: Callable[[int, int], None] | None = None,
        observer: Observer | None = None,
    ) -> SimResult:
        """Run to the end (every workload ended); ``progress(done, total)`` after each arrival."""
        if self._ran:
            raise Invalid("a Simulation runs once; build a new one", field="simulation")
        self._ran = True
        return asyncio.run(self._run(progress, observer))

    async def _run(
        self,
        progress: Callable[[int, int], None] | None,
        observer: Observer | None,
    ) -> SimResult:
        started = time.perf_counter()
        for index, arrival in enumerate(self.arrivals):
            self._push(arrival.at, _Event.ARRIVE, index)
        horizon = self.arrivals[-1].at if self.arrivals else 0.0
        sample_times = np.linspace(0.0, horizon, self.config.samples, endpoint=False)
        for at in sample_times.tolist():
            self._push(at, _Event.SAMPLE, None)
        names = self._names
        tally = self._tally = _Tally(
            mem_max=np.array([self.info[name].mem_max for name in names], dtype=np.float64),
            utilisation=np.zeros((self.config.samples, len(names)), dtype=np.float64),
            progress=progress,
            observer=observer,
        )
        handlers = self._handlers
        while self._events:
            at, kind, _, payload = heapq.heappop(self._events)
            self.now = at
            await handlers[kind](payload)
            self._flush()

        for node in self.nodes.values():
            check_drained(node)
        for scheduler in self.schedulers:
            scheduler.close()
        uses = [
            LayerUse(d.at, d.ends_at, d.mem, d.node_platform, d.layers)
            for d in tally.decisions
            if d.placed and d.ends_at is not None and d.node_platform is not None
        ]
        node_mems: dict[str, list[int]] = {}
        for info in self.info.values():
            node_mems.setdefault(info.platform, []).append(info.mem_max)
        return SimResult(
            config=self.config,
            policy=self.policy_name,
            nodes=tuple(self.info[name] for name in names),
            decisions=tally.decisions,
            pulls=tally.pulls,
            sample_times=sample_times,
            utilisation=tally.utilisation[: tally.samples],
            lower_bound_bytes=distinct_layer_bound(uses, self.preseeded),
            end_time=self.now,
            wall_seconds=time.perf_counter() - started,
            capacity_bound_bytes=capacity_bound(uses, node_mems, self.preseeded),
            preseeded=self.preseeded,
        )

    # -- event handlers ----------------------------------------------------------------------
    async def _end(self, payload: tuple[str, str, int, Placement]) -> None:
        """A workload's lifetime is over: its runtime reports the exit (the core releases),
        and the scheduler that placed it stops counting the replica (for spreading)."""
        node_name, workload_id, which, placement = payload
        runtime = self.nodes[node_name].runtime
        assert isinstance(runtime, FakeRuntime)
        runtime.finish(workload_id)
        self.schedulers[which].ended(placement)

    async def _deliver(self, payload: tuple[int, NodeState]) -> None:
        """A snapshot published ``staleness`` seconds ago reaches one scheduler's replica."""
        store_index, state = payload
        self.stores[store_index].publish_now(state)

    async def _sample(self, payload: None) -> None:
        """Record every node's reserved memory fraction."""
        tally = self._running_tally()
        free = self._mem_free.astype(np.float64)  # every node's latest snapshot: the truth
        mem_max = tally.mem_max
        tally.utilisation[tally.samples] = 1.0 - np.divide(
            free, mem_max, out=np.ones_like(free), where=mem_max > 0
        )
        tally.samples += 1

    async def _arrival(self, index: int) -> None:
        """Place one arrival, record the decision, tell the observer and the progress bar."""
        tally = self._running_tally()
        arrival = self.arrivals[index]
        decision = await self._arrive(index, arrival)
        tally.decisions.append(decision)
        if decision.placed and decision.pulled_bytes:
            tally.pulled_total += decision.pulled_bytes
            tally.pulls.append((self.now, tally.pulled_total))
        if tally.observer is not None:
            tally.observer(decision, arrival, self.schedulers[decision.scheduler])
        if tally.progress is not None:
            tally.progress(len(tally.decisions), len(self.arrivals))

    def _running_tally(self) -> _Tally:
        if self._tally is None:  # pragma: no cover - handlers run only inside _run
            raise RuntimeError("no simulation is running")
        return self._tally

    async def _arrive(self, index: int, arrival: Arrival) -> Decision:
        request = arrival.request
        which = index % len(self.schedulers)
        scheduler, client = self.schedulers[which], self._clients[which]
        client.clear()
        base: dict[str, Any] = {
            "index": index,
            "at": arrival.at,
            "request": request.key,
            "image": arrival.image,
            "instance_type": arrival.instance_type,
            "platform": ",".join(str(p) for p in request.platforms) or "any",
            "scheduler": which,
        }
        outcome: Outcome = "placed"
        tick = time.perf_counter()
        try:
            placement = await scheduler.schedule(request)
        except NoMatchingPlatform:
            outcome = "no_matching_platform"
        except NoCapacity:
            outcome = "no_capacity"
        except GaveUp:
            outcome = "gave_up"
        elapsed = time.perf_counter() - tick
        refusals = tuple(client.refusals)
        if outcome != "placed":
            could_hold = None if outcome == "no_matching_platform" else self._could_hold(request)
            return Decision(**base, outcome=outcome, decision_seconds=elapsed, refusals=refusals,
                            could_hold=could_hold)  # fmt: skip

        name = placement.worker_node
        node = self.nodes[name]
        spec = request.spec
        if placement.reservation_id is None or spec is None:  # pragma: no cover - specs given
            raise InvariantViolated(f"{request.key}: placed without a reservation")
        platform = self.info[name].platform
        layers = arrival.layers_on(platform)
        boot = BootSpec(name=request.key, command=("microvm", arrival.image), mem_limit=spec.mem)
        try:
            booted = await node.boot(spec, layers, boot, reservation=placement.reservation_id)
        except BerthError as error:  # pragma: no cover - leases are bound in the same event
            raise InvariantViolated(f"{request.key}: could not boot on {name}: {error}") from None
        scheduler.replicas.bound(name, placement.reservation_id)  # the lease is the workload's

        now = self.now
        decided = now + len(refusals) * self.config.refusal_rtt
        ready_at = self._ready_at[name]
        missing = 0
        ready = decided
        for mounted in booted.mounts:
            if mounted.outcome is MountOutcome.PULLED:
                missing += mounted.size
                ready_at[mounted.layer_id] = done = self._pull(name, mounted.size, decided)
                ready = max(ready, done)
            elif mounted.outcome is MountOutcome.ALREADY_MOUNTED:
                ready = max(ready, ready_at.get(mounted.layer_id, now))
        starts = ready + self.config.boot_seconds
        ends = starts + arrival.lifetime
        self._push(ends, _Event.END, (name, booted.workload.id, which, placement))
        total_bytes = sum(layer.size for layer in layers)
        return Decision(
            **base,
            outcome="placed",
            decision_seconds=elapsed,
            refusals=refusals,
            node=name,
            rank=placement.rank,
            colocated_bytes=placement.colocated_bytes,
            local_bytes=total_bytes - missing,
            pulled_bytes=missing,
            start_latency=starts - now,
            ends_at=ends,
            node_platform=platform,
            layers=layers,
            mem=spec.mem,
        )

    def _pull(self, node: str, size: int, at: float) -> float:
        """When a layer of ``size`` bytes pulled to ``node`` from ``at`` is unpacked (the
        FIFO pipes of the module docstring: node link, registry, node unpacking)."""
        config = self.config
        start = at + config.layer_latency
        link = max(start, self._link_free[node]) + size / config.pull_bandwidth
        registry = max(start, self._registry_free) + size / config.registry_bandwidth
        self._registry_free = registry
        downloaded = self._link_free[node] = max(link, registry)
        unpacked = max(downloaded, self._unpack_free[node]) + size / config.unpack_bandwidth
        self._unpack_free[node] = unpacked
        return unpacked

    def _could_hold(self, request: Request) -> str | None:
        """A node whose true state (latest snapshot) passes every fit check for ``request``
        now — so refusing it displaced nothing — or ``None``."""
        spec = request.spec
        if spec is None:  # pragma: no cover - simulated requests declare resources
            return None
        roomy = np.flatnonzero((self._mem_free >= spec.mem) & (self._disk_free >= spec.disk))
        for slot in roomy.tolist():
            state = self._truth[self._names[slot]]
            if first_failed_check(state, spec, request.platforms) is None:
                return state.node
        return None

    def _know(self, state: NodeState) -> None:
        """Record ``state`` as its node's truth."""
        self._truth[state.node] = state
        slot = self._slot[state.node]
        self._mem_free[slot] = state.mem_free
        self._disk_free[slot] = state.disk_free

    def _flush(self) -> None:
        """Every node changed by the last event publishes once, in name order."""
        if not self._dirty:
            return
        dirty = sorted(self._dirty)
        self._dirty.clear()
        delay = self.config.staleness
        for name in dirty:
            node = self.nodes[name]
            if self.check_invariants:
                check_node(node)
            state = node.snapshot(self.now)
            self._know(state)
            for index, store in enumerate(self.stores):
                if delay == 0:
                    store.publish_now(state)
                else:
                    self._push(self.now + delay, _Event.DELIVER, (index, state))


def _preseed(
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


def simulate(
    config: SimConfig,
    policy: str,
    arrivals: Sequence[Arrival] | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Run ``policy`` on ``config`` (arrivals drawn from ``config.workload`` unless given)."""
    return Simulation(config, policy, arrivals).run(progress=progress)


def simulate_policies(
    config: SimConfig,
    policies: Iterable[str],
    *,
    progress: Callable[[str, int, int], None] | None = None,
    dataset: Dataset | None = None,
    arrivals: Sequence[Arrival] | None = None,
) -> dict[str, SimResult]:
    """Run each policy on the *same* arrivals (common random numbers), in the order given:
    ``arrivals`` when given, else drawn from ``config.workload`` (and ``dataset``).
    ``progress(policy, done, total)`` after each arrival."""
    names = list(policies)
    for name in names:
        make_policy(name)
    if arrivals is None:
        arrivals = generate_workload(config.workload, dataset)
    results: dict[str, SimResult] = {}
    for name in names:

        def step(done: int, total: int, name: str = name) -> None:
            if progress is not None:
                progress(name, done, total)

        results[name] = Simulation(config, name, arrivals).run(progress=step)
    return results
