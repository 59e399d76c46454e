"""The scheduler's Prometheus metrics: every name, help text and bucket in one place.

A :class:`Metrics` owns its own :class:`~prometheus_client.CollectorRegistry` — never
prometheus-client's process-global default, so two schedulers in one process (tests, the
embedded cluster) never share or collide — and the instruments the scheduler's walk updates
(through :mod:`berth.observability.probe`):

================================== ========= ==================================================
``berth_placements_total``         counter   placement decisions by ``outcome``: ``placed``,
                                             ``no_capacity``, ``invalid``, ``unavailable``,
                                             ``error`` (anything else: a bug)
``berth_placement_seconds``        histogram one decision, from the call to the confirmed node
                                             (or the error): rankings and confirmations included
``berth_ranking_seconds``          histogram one ranking of the scheduler's view (the engine's part)
``berth_confirmation_refusals_total`` counter nodes' refusals at confirmation by ``reason``
                                             code (``mem_exhausted``, ``cpu_saturated``,
                                             ``lease_expired``, ``boot_failed``, ``unavailable``…)
``berth_confirmation_attempts``    histogram nodes asked per decision that asked any (1: the
                                             first choice confirmed; ``_sum - _count`` = retries
                                             on the next candidate)
``berth_rerankings_total``         counter   extra passes: a walk exhausted its ranking while the
                                             view changed, and ranked again
``berth_api_placements_total``     counter   placement requests through the HTTP API of this
                                             process by ``outcome`` (as the API saw them, the
                                             whole queue group behind it: ``unavailable`` when no
                                             scheduler answered, ``refused`` when the node
                                             refused the boot)
``berth_reconciler_transitions_total`` counter the reconciler's compare-and-sets on workload
                                             records by ``transition`` (``pending_running``,
                                             ``running_unknown``, ``running_exited`` …, and
                                             ``pending_retried``) and ``outcome``: ``applied``,
                                             or ``raced`` (another writer moved it first)
``berth_reconciler_ghosts_stopped_total`` counter workloads a node ran that no live record
                                             names, stopped by the reconciler, by ``why``:
                                             ``unrecorded`` (no record at all) or ``ended``
                                             (the record says it ended)
``berth_reconciler_adoptions_total`` counter a ``pending`` record whose node reports it running,
                                             taken as ``running`` by the reconciler
``berth_reconciler_passes_total``  counter   reconciler passes by ``outcome`` (``done``,
                                             ``failed``); only the lease holder's count
``berth_nodes``                    gauge     nodes in the scheduler's view by ``state``:
                                             ``ready``, ``cordoned``, ``stale`` (see below)
``berth_reservations``             gauge     ``state="assumed"``: reservations this scheduler
                                             confirmed that the nodes' snapshots do not show yet
``berth_reserved_bytes``           gauge     by ``resource`` (``mem``, ``disk``) and ``source``:
                                             ``held`` — what the nodes' own snapshots report
                                             reserved; ``assumed`` — what the assume cache adds
``berth_capacity_bytes``           gauge     by ``resource``: the nodes' hard budgets, summed
================================== ========= ==================================================

The last four are read at scrape time by :class:`ClusterCollector` from the scheduler's own
replica (no bookkeeping on the hot path).  A node is ``stale`` when its latest snapshot was
published more than ``stale_after_s`` ago (a node that stops publishing leaves the replica
after three heartbeats; before that, it is stale); else ``cordoned`` if an operator cordoned
it; else ``ready``.  Each node counts once, in that order of precedence.

**Cheap on the hot path.**  Labelled children are resolved once (``placed`` … and each
reason the first time it is seen), so a decision costs a few counter increments and two
histogram observations (~2 µs; ``benchmarks/observability_overhead.py``).  Reason labels are
bounded: a code that is not ``[a-z][a-z0-9_]*`` (a refusal arriving from a misbehaving peer)
or one past the first ``MAX_REASONS`` distinct codes is counted as ``other``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from berth.errors import Invalid
from berth.model import Spec
from berth.observability.outcomes import outcome_of, reason_of
from berth.state import NodeState

__all__ = [
    "CONTENT_TYPE",
    "DECISION_BUCKETS",
    "EVENT_OUTCOMES",
    "OUTCOMES",
    "ClusterCollector",
    "Metrics",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

DECISION_BUCKETS = (
    50e-6,
    100e-6,
    250e-6,
    500e-6,
    1e-3,
    2.5e-3,
    5e-3,
    10e-3,
    25e-3,
    50e-3,
    100e-3,
    250e-3,
    500e-3,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Seconds: an in-process decision on a small cluster takes ~100 µs, one on 10k nodes about a
millisecond, one over NATS a few milliseconds, one walking refusals or timeouts seconds."""

ATTEMPT_BUCKETS = (1, 2, 3, 4, 6, 8, 16, 32, 64, 128)

OUTCOMES = ("placed", "no_capacity", "invalid", "unavailable", "error")
API_OUTCOMES = ("placed", "no_capacity", "invalid", "unavailable", "refused", "error")
"""What an API placement request ended in, as the API reports it (``refused``: the chosen
node refused the boot)."""
EVENT_OUTCOMES = ("applied", "stale", "unrecorded")
"""What the API did with a node's workload event (:meth:`Metrics.event_applied`)."""

NODE_STATES = ("ready", "cordoned", "stale")

MAX_REASONS = 64
_REASON = re.compile(r"[a-z][a-z0-9_]{0,63}")


class Metrics:
    """The instruments of one scheduler process on its own registry (module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        registry = self.registry
        self.placements = Counter(
            "berth_placements",
            "Placement decisions by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.placement_seconds = Histogram(
            "berth_placement_seconds",
            "Seconds per placement decision, rankings and confirmations included.",
            buckets=DECISION_BUCKETS,
            registry=registry,
        )
        self.ranking_seconds = Histogram(
            "berth_ranking_seconds",
            "Seconds per ranking of the scheduler's view of the nodes.",
            buckets=DECISION_BUCKETS,
            registry=registry,
        )
        self.refusals = Counter(
            "berth_confirmation_refusals",
            "Nodes' refusals at confirmation, by reason code.",
            ["reason"],
            registry=registry,
        )
        self.attempts = Histogram(
            "berth_confirmation_attempts",
            "Nodes asked to confirm per placement decision.",
            buckets=ATTEMPT_BUCKETS,
            registry=registry,
        )
        self.rerankings = Counter(
            "berth_rerankings",
            "Extra rankings: a walk exhausted its ranking while the view changed.",
            registry=registry,
        )
        self.api_placements = Counter(
            "berth_api_placements",
            "Placement requests through this process's HTTP API, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.reconciler_transitions = Counter(
            "berth_reconciler_transitions",
            "The reconciler's compare-and-sets on workload records, by transition and outcome.",
            ["transition", "outcome"],
            registry=registry,
        )
        self.reconciler_ghosts = Counter(
            "berth_reconciler_ghosts_stopped",
            "Workloads a node ran that no live record names, stopped by the reconciler.",
            ["why"],
            registry=registry,
        )
        self.reconciler_adoptions = Counter(
            "berth_reconciler_adoptions",
            "Pending records whose node reports them running, taken as running.",
            registry=registry,
        )
        self.reconciler_routes = Counter(
            "berth_reconciler_routes",
            "Routes the reconciler wrote for running workloads that had none (restored) or "
            "removed for ended ones (removed).",
            ["action"],
            registry=registry,
        )
        self.reconciler_passes = Counter(
            "berth_reconciler_passes",
            "Reconciler passes of the lease holder, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.events_applied = Counter(
            "berth_events_applied",
            "Workload events from the nodes taken by this process's API, by outcome "
            "(applied, stale: the record had it, unrecorded: no record names it).",
            ["outcome"],
            registry=registry,
        )
        self.event_lag_seconds = Histogram(
            "berth_events_lag_seconds",
            "From a node recording a workload's end or restart to the API applying it "
            "(the node's wall clock against this process's).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=registry,
        )
        self._outcomes = {outcome: self.placements.labels(outcome) for outcome in OUTCOMES}
        self._api = {outcome: self.api_placements.labels(outcome) for outcome in API_OUTCOMES}
        self._reasons: dict[str, Counter] = {}
        self._collectors: list[ClusterCollector] = []

    # -- the hot path (called through berth.observability.probe) -----------------------------
    def decided(self, error: BaseException | None, seconds: float, attempts: int) -> None:
        """One decision ended: ``error`` is ``None`` when it placed."""
        self._outcomes[outcome_of(error)].inc()
        self.placement_seconds.observe(seconds)
        if attempts:
            self.attempts.observe(attempts)

    def rejected(self) -> None:
        """A placement request refused as malformed before any decision (``invalid``)."""
        self._outcomes["invalid"].inc()

    def api_placement(self, outcome: str) -> None:
        """An API placement request ended in ``outcome`` (one of :data:`API_OUTCOMES`; any
        other word counts as ``error``)."""
        self._api.get(outcome, self._api["error"]).inc()

    def reconciled(self, transition: str, applied: bool) -> None:
        """The reconciler compare-and-set a record through ``transition`` (``from_to``, of
        the bounded set of workload states); ``applied`` False when another writer won."""
        self.reconciler_transitions.labels(transition, "applied" if applied else "raced").inc()

    def ghost_stopped(self, why: str) -> None:
        """The reconciler stopped a workload no live record names (``unrecorded``/``ended``)."""
        self.reconciler_ghosts.labels(why).inc()

    def adopted(self) -> None:
        self.reconciler_adoptions.inc()

    def route_reconciled(self, action: str) -> None:
        """The reconciler ``restored`` a missing route or ``removed`` a stale one."""
        self.reconciler_routes.labels(action).inc()

    def event_applied(self, outcome: str, lag_s: float) -> None:
        """A node's event was taken: ``outcome`` of :data:`EVENT_OUTCOMES` (any other word
        counts as ``stale``), ``lag_s`` after the node recorded it."""
        self.events_applied.labels(outcome if outcome in EVENT_OUTCOMES else "stale").inc()
        self.event_lag_seconds.observe(lag_s)

    def reconciler_pass(self, done: bool) -> None:
        self.reconciler_passes.labels("done" if done else "failed").inc()

    def ranked(self, seconds: float, rerank: bool) -> None:
        """One ranking took ``seconds``; ``rerank`` when it was not the decision's first."""
        self.ranking_seconds.observe(seconds)
        if rerank:
            self.rerankings.inc()

    def refused(self, error: BaseException) -> None:
        """A node refused a confirmation (``Refused``) or could not be reached."""
        reason = reason_of(error)
        child = self._reasons.get(reason)
        if child is None:
            if not _REASON.fullmatch(reason) or len(self._reasons) >= MAX_REASONS:
                reason = "other"
            child = self._reasons.get(reason)
            if child is None:
                child = self._reasons[reason] = self.refusals.labels(reason)
        child.inc()

    # -- scrape time -------------------------------------------------------------------------
    def watch(
        self,
        scheduler: ClusterSource,
        *,
        stale_after_s: float,
        clock: Callable[[], float] = time.time,
    ) -> ClusterCollector:
        """Report ``scheduler``'s view (nodes by state, reservations) at every scrape.

        ``stale_after_s``: a snapshot older than this (wall clock, as nodes stamp
        ``published_at``) makes its node ``stale`` — two heartbeats is a good choice."""
        if self._collectors:
            raise Invalid("this registry already reports a scheduler's view", field="scheduler")
        collector = ClusterCollector(scheduler, stale_after_s=stale_after_s, clock=clock)
        self.registry.register(collector)
        self._collectors.append(collector)
        return collector

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (what ``GET /metrics`` serves)."""
        return generate_latest(self.registry)


class _Pending(Protocol):
    @property
    def spec(self) -> Spec: ...


class AssumedSource(Protocol):
    """What the collector reads of an assume cache (``berth.scheduler.assume.AssumeCache``)."""

    def pending(self, node: str) -> Sequence[_Pending]: ...

    def __len__(self) -> int: ...


class ClusterSource(Protocol):
    """What the collector reads of a scheduler: a ``ClusterScheduler``'s own snapshots and
    assume cache."""

    @property
    def assumed(self) -> AssumedSource | None: ...

    def snapshots(self) -> Mapping[str, NodeState]: ...


class ClusterCollector(Collector):
    """Nodes by state and reservations, read from a scheduler's replica at scrape time.

    Read on the scheduler's event loop (an ``async`` HTTP handler): the replica is not
    thread-safe, and a copy taken from another thread could race its updates."""

    def __init__(
        self,
        scheduler: ClusterSource,
        *,
        stale_after_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not callable(getattr(scheduler, "snapshots", None)):
            raise Invalid("has no snapshots() method", field="scheduler")
        if isinstance(stale_after_s, bool) or not stale_after_s > 0:
            raise Invalid(f"must be positive seconds, got {stale_after_s!r}", field="stale_after_s")
        self.scheduler = scheduler
        self.stale_after_s = float(stale_after_s)
        self.clock = clock

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        snapshots = self.scheduler.snapshots()
        assumed = self.scheduler.assumed
        return list(self._families(snapshots, assumed, self.clock()))

    def _families(
        self,
        snapshots: Mapping[str, NodeState] | None = None,
        assumed: AssumedSource | None = None,
        now: float = 0.0,
    ) -> Iterator[Metric]:
        # One plain loop with local sums: ~1-3 µs a node (a scrape of 10,000 nodes blocks the
        # scheduler's loop for tens of milliseconds; Prometheus scrapes every 15 s or so).
        stale = cordoned = ready = 0
        mem_max_sum = disk_max_sum = mem_held = disk_held = 0
        stale_before = now - self.stale_after_s
        for state in (snapshots or {}).values():
            if state.published_at < stale_before:
                stale += 1
            elif state.cordoned:
                cordoned += 1
            else:
                ready += 1
            mem_max, disk_max = state.mem_max, state.disk_max
            if mem_max is not None:
                mem_max_sum += mem_max
                if mem_max > state.mem_free:
                    mem_held += mem_max - state.mem_free
            if disk_max is not None:
                disk_max_sum += disk_max
                if disk_max > state.disk_free:
                    disk_held += disk_max - state.disk_free
        pending = {"mem": 0, "disk": 0}
        if snapshots and assumed is not None and len(assumed):
            for node in snapshots:
                for assumption in assumed.pending(node):
                    pending["mem"] += assumption.spec.mem
                    pending["disk"] += assumption.spec.disk
        states = {"ready": ready, "cordoned": cordoned, "stale": stale}
        capacity = {"mem": mem_max_sum, "disk": disk_max_sum}
        held = {"mem": mem_held, "disk": disk_held}
        nodes = GaugeMetricFamily(
            "berth_nodes", "Nodes in the scheduler's view by state.", labels=["state"]
        )
        for state_name, count in states.items():
            nodes.add_metric([state_name], count)
        yield nodes
        reservations = GaugeMetricFamily(
            "berth_reservations",
            "Reservations this scheduler confirmed that no node snapshot shows yet.",
            labels=["state"],
        )
        reservations.add_metric(["assumed"], len(assumed) if assumed is not None else 0)
        yield reservations
        reserved = GaugeMetricFamily(
            "berth_reserved_bytes",
            "Bytes reserved: held (the nodes' snapshots), assumed (this scheduler's, not yet "
            "in a snapshot).",
            labels=["resource", "source"],
        )
        for resource in ("mem", "disk"):
            reserved.add_metric([resource, "held"], held[resource])
            reserved.add_metric([resource, "assumed"], pending[resource])
        yield reserved
        total = GaugeMetricFamily(
            "berth_capacity_bytes", "The nodes' hard budgets, summed.", labels=["resource"]
        )
        for resource in ("mem", "disk"):
            total.add_metric([resource], capacity[resource])
        yield total
