"""The discrete-event simulator: berth's real scheduler and node budgets on a simulated clock.

This module owns *time* around real berth code — the event loop — so placement quality is
measured, not assumed.  Every decision is made by the real
:class:`~berth.scheduler.multinode.ClusterScheduler` (``schedule``, the placement port) with
the policy under test, and confirmed by the chosen node's real
:class:`~berth.node.budget.NodeBudget` (through :class:`~berth.nodeclient.local.LocalNodes`):
the simulator never re-implements fit, ranking or admission.  The rest of a simulation lives
beside it, one responsibility a module: its knobs (:mod:`berth.sim.config`: ``SimConfig``),
its nodes (:mod:`berth.sim.cluster`: layout, cores, load model, bookkeeping checks), what a
start waits for (:mod:`berth.sim.pulls`: shared links, registry, unpacking) and what a run
produces (:mod:`berth.sim.results`: ``Decision``, ``SimResult``, the tallies); their public
names are re-exported here.  It is not a load generator (:mod:`berth.sim.workload` draws the
arrivals) and not a report (:mod:`berth.sim.report` turns a :class:`SimResult` into metrics,
tables and plots).

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
mounts say what the start waits for (:mod:`berth.sim.pulls`: layers pulled over shared links
and unpacked, or waited for while another workload pulls them; cached ones are free).
**Refusals cost a round trip**: each refusal at confirmation delays the decision by
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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from enum import IntEnum
from typing import Any

import numpy as np

from berth.boot import AdmitOrder
from berth.dataset import Dataset
from berth.errors import BerthError, Invalid, NoCapacity, NoMatchingPlatform
from berth.model import Layer, Placement, Request, Spec
from berth.node.classes import NodeClass
from berth.node.core import Booted, NodeCore
from berth.node.runtime import BootSpec, FakeRuntime
from berth.nodeclient.local import LocalNodes
from berth.nodeclient.recording import RecordingNodes
from berth.ownership import Admission, Refused
from berth.scheduler.multinode import ClusterScheduler
from berth.scheduler.policy import POLICIES, Policy, SeedLike
from berth.scheduler.policy import policy as make_policy
from berth.sim.bounds import LayerUse, capacity_bound, distinct_layer_bound
from berth.sim.cluster import (
    InvariantViolated,
    SimNode,
    check_drained,
    check_node,
    layout,
    preseed,
    simulated_node,
)
from berth.sim.config import (
    DEFAULT_NODE_CLASSES,
    DEFAULT_NODE_PLATFORMS,
    MAX_CONCURRENCY,
    MAX_SIM_NODES,
    SimConfig,
)
from berth.sim.pulls import PullModel
from berth.sim.results import Decision, Observer, Outcome, SimResult, Tally
from berth.sim.workload import Arrival, generate_workload
from berth.state import NodeState, first_failed_check
from berth.store.memory import MemoryStore

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


class GaveUp(BerthError):
    """A placement stopped walking its candidates after ``max_refusals`` refusals."""


class _BoundedNodes(RecordingNodes):
    """The recording client that gives up at the ``limit``-th refusal of one decision."""

    def __init__(self, nodes: LocalNodes, limit: int) -> None:
        super().__init__(nodes)
        self.limit = limit

    async def forward_admit(
        self, node: str, order: AdmitOrder, call: Callable[[], Awaitable[Admission]]
    ) -> Admission:
        try:
            return await super().forward_admit(node, order, call)
        except Refused:
            if len(self.refusals) >= self.limit:
                raise GaveUp(f"gave up after {len(self.refusals)} refusals") from None
            raise


class _Event(IntEnum):
    """Event kinds, in the order they run at equal times."""

    END = 0
    DELIVER = 1
    SAMPLE = 2
    ARRIVE = 3


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
            node = simulated_node(info, node_class, self._clock)
            self.info[info.name] = info
            self.nodes[info.name] = node
        self.preseeded = preseed(self.nodes, self.info, self.arrivals, config.preseed_layers)
        for name, node in self.nodes.items():
            node.add_change_listener(functools.partial(self._dirty.add, name))
        self._pulls = PullModel(config, self.nodes)
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
        self._tally: Tally | None = None
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
        tally = self._tally = Tally(
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
        self._running_tally().sample(self._mem_free)  # every node's latest snapshot: the truth

    async def _arrival(self, index: int) -> None:
        """Place one arrival, record the decision, tell the observer and the progress bar."""
        tally = self._running_tally()
        arrival = self.arrivals[index]
        decision = await self._arrive(index, arrival)
        tally.record(decision, self.now)
        if tally.observer is not None:
            tally.observer(decision, arrival, self.schedulers[decision.scheduler])
        if tally.progress is not None:
            tally.progress(len(tally.decisions), len(self.arrivals))

    def _running_tally(self) -> Tally:
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
            return Decision(
                **base,
                outcome=outcome,
                decision_seconds=elapsed,
                refusals=refusals,
                could_hold=could_hold,
            )

        return await self._start(which, arrival, placement, base, elapsed, refusals)

    async def _start(
        self,
        which: int,
        arrival: Arrival,
        placement: Placement,
        base: dict[str, Any],
        elapsed: float,
        refusals: tuple[tuple[str, str], ...],
    ) -> Decision:
        """Boot a placed arrival on its node's core, model when it starts (refusal round trips,
        pulls, boot) and schedule its end; the placed ``Decision``."""
        request = arrival.request
        name = placement.worker_node
        spec = request.spec
        if placement.reservation_id is None or spec is None:  # pragma: no cover - specs given
            raise InvariantViolated(f"{request.key}: placed without a reservation")
        platform = self.info[name].platform
        layers = arrival.layers_on(platform)
        boot = BootSpec(name=request.key, command=("microvm", arrival.image), mem_limit=spec.mem)
        booted = await self._boot(name, spec, layers, boot, placement.reservation_id)
        self.schedulers[which].replicas.bound(name, placement.reservation_id)  # the workload's

        now = self.now
        decided = now + len(refusals) * self.config.refusal_rtt
        ready, missing = self._pulls.ready(name, booted.mounts, decided=decided, now=now)
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

    async def _boot(
        self, name: str, spec: Spec, layers: tuple[Layer, ...], boot: BootSpec, reservation: str
    ) -> Booted:
        """``NodeCore.boot`` on ``name`` under the placement's lease: mount, start, bind."""
        try:
            return await self.nodes[name].boot(spec, layers, boot, reservation=reservation)
        except BerthError as error:  # pragma: no cover - leases are bound in the same event
            raise InvariantViolated(f"{boot.name}: could not boot on {name}: {error}") from None

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
