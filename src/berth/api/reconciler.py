"""The reconciler: the API's records compared with what the nodes report, and converged.

The API records a workload (``pending``) before its node is asked to run it, and the nodes are
the authority on what runs.  Each pass of :class:`Reconciler` takes the records, the report of
every node in the schedulers' view of which workload ids it runs
(:meth:`~berth.nodeclient.port.AgentClient.running`, one small request per node), and moves
each record towards what the node says — every change a compare-and-set on the record
(:meth:`~berth.registry.port.WorkloadRegistry.transition`), logged and counted in
``/metrics`` (:mod:`berth.observability.metrics`, ``berth_reconciler_*``):

* **the node runs it** — a ``pending`` record is *adopted* (``running``); an ``unknown`` one
  is ``running`` again; a stop kept on the record is delivered;
* **the node answers but does not run it** — a ``running`` or ``unknown`` record is ended
  with what is known (the node's ``status``: its exit code, stopped, or ``failed`` when the
  node never heard of it); a ``pending`` one younger than ``pending_after_s`` is left alone
  (its create is still asking), older it is **retried** under the same id (the node runs an
  id once) — ``running`` if the node now runs it, ``failed`` with the node's reason if it
  refuses — and after :data:`~berth.registry.port.CLAIM_PENDING_S` it is ended ``failed``;
  only while it holds its identity's claim, though: a create whose intent write failed gives
  the identity back, yet the write may have landed — that record is ended ``failed``, never
  run beside the workload that took the identity since;
  a kept stop on a pending record that never ran ends it ``stopped``;
* **the node does not answer** (or left the view) — what the API's reads do: ``running`` →
  ``unknown``; after ``node_gone_after`` → ``lost`` (and a restartable one placed again);
* **the node is starting** (a restarted agent still reconciling its journal answers
  ``node_starting``) — its records are left alone this pass: its report would miss the
  workloads it is about to adopt;
* **a ghost** — an id a node runs that no live record names, seen so for at least one period
  (a create between recording its intent and the run is never taken for one: the record is
  read again before acting), is stopped and counted (``why``: ``unrecorded`` — no record at
  all — or ``ended`` — its record says it ended, e.g. ``lost`` while it ran on);
* **routes** (with the scheduler's routing registry, ``berth_routes``: an index that must
  converge, issue 36; compared with the scheduler's watched copy of them, :class:`RouteIndex`,
  not read from the bucket every pass) — a workload recorded ``running`` and run by its node
  whose route is missing (a create whose scheduler died between the placement and the route write, a
  route deleted) gets it written again from the record (identity, node, reservation,
  spec, function; :meth:`~berth.registry.port.RouteRegistry.repair`, never over a stored
  route), and a route whose reservation is that of an ended record, with no live record of
  its identity on that node, is removed at the revision read — both counted
  (``berth_reconciler_routes_total{action}``).  A record without a reservation (its run was
  retried by the reconciler: the node reserved for itself) gets none: the node would drop
  a route it holds no reservation for;
* **what changed, not everything** (issue 36: a pass over 10,000 nodes and 100,000 records
  within its period) — the records come from a watched copy of the registry when one is
  given (:class:`~berth.registry.port.RecordIndex`; listing copies every record), and a node
  is asked only when what it runs may have changed: every snapshot a node publishes carries
  the digest of its report (:attr:`~berth.state.NodeState.running_digest`), and the report
  held from the last question stands while the node has published since it was taken (it
  answers: a paused node publishes nothing, and is asked) with the same digest.  A record
  its node runs, ``running`` with no stop kept, needs nothing and costs no coroutine;
* **old idempotency keys** — at most every :data:`KEYS_EXPIRE_EVERY_S`, the creates' key
  claims older than their retention are deleted (:meth:`~berth.api.idempotency.CreateKeys.
  expire`; an expired claim counts as absent anyway: this only keeps the store small).

**One at a time.**  :meth:`Reconciler.run` acts only while it holds a
:class:`~berth.registry.port.LeaderLease` (a KV key with a TTL on NATS,
:mod:`berth.registry.nats_lease`):
a task of its own renews it every third of the TTL whatever a pass is doing; the lease counts
as held for two thirds of the TTL from the renewal's start, so a holder that fails to renew
stops acting (no new pass, no ghost stopped) while its lease may still be valid — and
another scheduler service takes over once it has expired.  The compare-and-sets keep two
overlapping passes (a holder paused past its TTL) from overwriting each other; the lease
keeps the work, and the ghost stops, to one.

What it is not: the API's reads (:class:`~berth.api.backend.ClusterBackend` refreshes what it
answers by itself, with the same rules), nor a restart policy (issue 20's part 5).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from berth.api.backend import ClusterBackend
from berth.api.records import STATUS_TIMEOUT_S
from berth.boot import BootSpec, RunOrder
from berth.defaults import RECONCILE_ASK_AT_ONCE, RECONCILE_EVERY_S, RECONCILE_PENDING_AFTER_S
from berth.errors import Invalid, Unavailable
from berth.model import INTERVAL_RULE, Request
from berth.observability.metrics import Metrics
from berth.ownership import Refused
from berth.registry.port import (
    CLAIM_PENDING_S,
    ENDED_STATES,
    LIVE_STATES,
    LeaderLease,
    RecordIndex,
    Route,
    RouteRegistry,
    StoredWorkload,
)
from berth.state import NodeState, running_digest

__all__ = ["PassReport", "Reconciler", "RouteIndex"]

log = logging.getLogger("berth.reconciler")
T = TypeVar("T")

KEYS_EXPIRE_EVERY_S = 3600.0
"""How often a pass deletes the expired idempotency key claims (a pass an hour: they are
kept a day)."""


class RouteIndex(Protocol):
    """A copy of the routing registry kept by a watch: what a pass compares the records with,
    without reading the bucket (a route it lacks is written with ``repair``, which never
    overwrites; one it still holds is removed only at its revision)."""

    def entries(self) -> list[tuple[int, Route]]: ...


STARTING = object()
"""A node's report while it reconciles its journal: neither what it runs nor unreachable."""


@dataclass
class _Held:
    """A node's report held from the last question: its ids, their digest, and the
    generation of the node's snapshot that last vouched for it."""

    ids: frozenset[str]
    digest: str
    generation: int


@dataclass
class PassReport:
    """What one pass saw and did."""

    records: int = 0
    converged: int = 0
    """Records that needed nothing (live and run by their node as recorded): not visited."""
    nodes_asked: int = 0
    nodes_held: int = 0
    """Nodes not asked: their snapshot since the last question has the held report's digest."""
    nodes_unanswered: int = 0
    nodes_starting: int = 0
    """Nodes still adopting their workloads (``node_starting``): their records left alone."""
    transitions: dict[str, int] = field(default_factory=dict)
    adopted: int = 0
    retried: int = 0
    ghosts_stopped: int = 0
    ghosts_seen: int = 0
    keys_expired: int = 0
    """Expired idempotency key claims deleted (on the passes that look, hourly)."""
    routes_restored: int = 0
    """Missing routes of running records written again."""
    routes_removed: int = 0
    """Routes of ended records removed."""
    seconds: float = 0.0


class Reconciler:
    """Converges the API's records with the nodes' reports (see the module docstring)."""

    def __init__(
        self,
        backend: ClusterBackend,
        *,
        every_s: float = RECONCILE_EVERY_S,
        pending_after_s: float = RECONCILE_PENDING_AFTER_S,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
        routes: RouteRegistry | None = None,
        route_index: RouteIndex | None = None,
        records: RecordIndex | None = None,
    ) -> None:
        self.backend = backend
        self.records = records
        """A watched copy of the records to compare (``None``, or one not caught up yet: the
        registry is listed)."""
        self.routes = routes
        """The routing registry whose routes of API workloads are converged (``None``: not)."""
        self.route_index = route_index
        """A watched copy of those routes to compare with (the scheduler's
        :class:`~berth.scheduler.nats_server.RouteReplicas`); ``None``: the registry is read
        every pass."""
        self.metrics = backend.metrics if metrics is None else metrics
        """Where passes, transitions, ghosts and adoptions are counted (the scheduler's)."""
        self.every_s = INTERVAL_RULE(every_s, "reconcile_every")
        self.pending_after_s = INTERVAL_RULE(pending_after_s, "pending_after_s")
        self.monotonic = monotonic
        self.passes = 0
        """Passes this reconciler completed (only while holding the lease, under :meth:`run`)."""
        self._held: dict[str, _Held] = {}
        """The nodes' reports from the last questions (see the module docstring)."""
        self._unrecorded: dict[tuple[str, str], float] = {}
        """Ids a node ran that no live record named: since when (``monotonic``)."""
        self._held_until = -math.inf
        """Until when the lease is surely held (``monotonic``; set by :meth:`run`)."""
        self._keys_expired_at = -math.inf
        """When a pass last deleted the expired key claims (``monotonic``)."""
        self._taken = asyncio.Event()
        """Set when this reconciler takes the lease (:meth:`_keep`): the first pass starts then,
        not up to a period later — a holder that died has left the records unreconciled for
        the lease's TTL already."""

    # -- one pass ----------------------------------------------------------------------------
    async def reconcile(self, *, acting: Callable[[], bool] = lambda: True) -> PassReport:
        """One pass over every record and every node in the schedulers' view.  ``acting``
        is asked before each ghost is stopped (the lease still held)."""
        started = self.monotonic()
        report = PassReport()
        backend = self.backend
        watched = None if self.records is None else self.records.records()
        records = await backend.workloads.list() if watched is None else watched
        report.records = len(records)
        answers = await self._reports(backend.view.states(), report)
        reports = {n: ids for n, ids in answers.items() if isinstance(ids, frozenset)}
        starting = {n for n, ids in answers.items() if ids is STARTING}
        report.nodes_unanswered = len(answers) - len(reports)
        report.nodes_starting = len(starting)
        # a node still adopting its workloads is left alone until its report is whole
        work = [
            r
            for r in records
            if r.state in LIVE_STATES
            and r.node not in starting
            and not _converged(r, reports.get(r.node))
        ]
        report.converged = sum(1 for r in records if r.state in LIVE_STATES) - len(work)
        after = await _at_once([self._converge(r, reports.get(r.node), report) for r in work])
        named = {(r.node, r.node_workload_id) for r in records if r.state in LIVE_STATES}
        await self._ghosts(reports, named, report, acting)
        now = {r.id: r for r in records} | {r.id: r for r in after}
        await self._routes(list(now.values()), reports, report, acting)
        await self._expire_keys(report, acting)
        report.seconds = self.monotonic() - started
        self.passes += 1
        return report

    async def _reports(
        self, states: Mapping[str, NodeState], report: PassReport
    ) -> dict[str, frozenset[str] | object | None]:
        """Every node's report: the one held, while the node has published since it was
        taken with the same digest; else asked (:meth:`_report`) and held again."""
        answers: dict[str, frozenset[str] | object | None] = {}
        asked: list[tuple[str, int]] = []
        for node, state in states.items():
            held = self._held.get(node)
            if (
                held is not None
                and state.generation > held.generation
                and state.running_digest == held.digest
            ):
                held.generation = state.generation
                answers[node] = held.ids
            else:
                asked.append((node, state.generation))
        fresh = await _at_once([self._report(node) for node, _ in asked])
        for (node, generation), ids in zip(asked, fresh, strict=True):
            answers[node] = ids
            if isinstance(ids, frozenset):
                self._held[node] = _Held(ids, running_digest(ids), generation)
            else:
                self._held.pop(node, None)
        for node in [node for node in self._held if node not in states]:
            del self._held[node]
        report.nodes_asked = len(asked)
        report.nodes_held = len(states) - len(asked)
        return answers

    async def _report(self, node: str) -> frozenset[str] | object | None:
        """The ids ``node`` runs; ``None`` when it did not answer; :data:`STARTING` while it
        reconciles its journal (``node_starting``)."""
        try:
            return frozenset(
                await asyncio.wait_for(self.backend.nodes.running(node), STATUS_TIMEOUT_S)
            )
        except (Unavailable, TimeoutError) as error:
            log.info("node %s did not report its workloads: %s", node, error)
            return None
        except Refused as error:
            log.info("node %s is starting: %s", node, error)
            return STARTING

    def _count(self, report: PassReport, transition: str, applied: bool) -> None:
        if applied:
            report.transitions[transition] = report.transitions.get(transition, 0) + 1
        if self.metrics is not None:
            self.metrics.reconciled(transition, applied)

    async def _converge(
        self, record: StoredWorkload, runs: frozenset[str] | None, report: PassReport
    ) -> StoredWorkload:
        """Move ``record`` towards its node's report (``runs``; ``None``: no answer); the
        record as it is after (as it was, when that failed)."""
        before = record.state
        try:
            if runs is not None and record.node_workload_id in runs:
                after = await self._runs(record, report)
            elif runs is not None and before == "pending":
                after = await self._pending_not_run(record, report)
            else:
                after = await self.backend.refresh(record)
        except (Unavailable, Refused, Invalid) as error:
            log.warning("reconciling %s: %s", record.id, error)
            return record
        if after.state != before:
            self._count(report, f"{before}_{after.state}", True)
            log.info("%s: %s -> %s (%s)", record.id, before, after.state, after.detail)
        return after

    async def _runs(self, record: StoredWorkload, report: PassReport) -> StoredWorkload:
        """The node reports that it runs ``record``: a ``pending`` one is adopted and an
        ``unknown`` one runs again (a compare-and-set each, counted ``applied`` or ``raced``);
        a stop kept on it is delivered (:meth:`ClusterBackend.runs`)."""
        if record.state in ("pending", "unknown"):
            update: dict[str, object] = {"state": "running", "unknown_since": None, "detail": None}
            moved, mine = await self.backend.workloads.transition(
                record.id, update, expect=("pending", "unknown")
            )
            if moved is None:
                return record
            if not mine:
                self._count(report, f"{record.state}_running", False)
                return moved
            if record.state == "pending":
                report.adopted += 1
                if self.metrics is not None:
                    self.metrics.adopted()
                log.info("adopted %s: %s runs it", record.id, record.node)
            record = moved
        return await self.backend.runs(record)

    async def _pending_not_run(self, record: StoredWorkload, report: PassReport) -> StoredWorkload:
        """A ``pending`` record its (answering) node does not run: wait, retry, or end it."""
        age_s = self.backend.clock() - record.created_at
        if age_s < self.pending_after_s:
            return record  # its create is still asking the node
        if record.stop_requested:
            update: dict[str, object] = {
                "state": "stopped",
                "detail": "stopped before it ever ran",
            }
            return await self.backend.end(record, update)
        if age_s >= CLAIM_PENDING_S:
            return await self.backend.refresh(record)  # never ran: ended failed with why
        request = Request.from_dict(record.request)
        assert request.spec is not None  # a record is created only with a spec
        holder = await self.backend.workloads.claims.holder(request.key)
        if holder != record.id:  # its create gave the identity back: running it makes two
            held = "free" if holder is None else f"held by {holder}"
            update = {
                "state": "failed",
                "detail": f"never ran: not retried, its identity {request.key} is {held} "
                "(its create failed and gave it back)",
            }
            return await self.backend.end(record, update)
        boot = BootSpec(
            name=record.id, command=tuple(record.command), env=record.env, image=record.image
        )
        report.retried += 1
        self._count(report, "pending_retried", True)
        try:
            order = RunOrder(
                request.spec,
                request.layers,
                boot,
                request.platforms,
                workload_id=record.node_workload_id,
            )
            await self.backend.nodes.try_run(record.node, order)
        except (Refused, Invalid) as error:
            update = {
                "state": "failed",
                "detail": f"never ran: retried on {record.node} {age_s:.0f}s after its "
                f"create, refused: {error}",
            }
            return await self.backend.end(record, update)
        log.info("retried the run of %s on %s: it runs", record.id, record.node)
        # the node admitted it by itself: the placement's lease the record names is not its
        update = {"state": "running", "reservation_id": None, "detail": None}
        moved, _ = await self.backend.workloads.transition(record.id, update, expect=("pending",))
        return await self.backend.runs(moved or record)

    async def _ghosts(
        self,
        reports: dict[str, frozenset[str]],
        named: set[tuple[str, str]],
        report: PassReport,
        acting: Callable[[], bool],
    ) -> None:
        """Stop what nodes run that no live record names, once seen so for a period."""
        now = self.monotonic()
        seen = {(node, wid) for node, ids in reports.items() for wid in ids} - named
        for key in list(self._unrecorded):
            if key not in seen:
                del self._unrecorded[key]
        report.ghosts_seen = len(seen)
        due = [
            key
            for key in sorted(seen)
            if now - self._unrecorded.setdefault(key, now) >= self.every_s
        ]
        await asyncio.gather(*(self._stop_ghost(node, wid, report, acting) for node, wid in due))

    async def _stop_ghost(
        self, node: str, workload_id: str, report: PassReport, acting: Callable[[], bool]
    ) -> None:
        """Stop one ghost, unless a live record names it now (a create in flight whose
        record landed after the pass read them) or the lease is no longer held."""
        record = await self.backend.workloads.get(workload_id)
        if record is not None and record.state in LIVE_STATES and record.node == node:
            self._unrecorded.pop((node, workload_id), None)
            return
        if not acting():
            return
        why = "ended" if record is not None and record.state in ENDED_STATES else "unrecorded"
        try:
            await self.backend.nodes.stop(node, workload_id)
        except (Unavailable, Refused) as error:
            log.warning("could not stop ghost %s on %s: %s", workload_id, node, error)
            return
        self._unrecorded.pop((node, workload_id), None)
        report.ghosts_stopped += 1
        if self.metrics is not None:
            self.metrics.ghost_stopped(why)
        state = "no record names it" if record is None else f"its record is {record.state}"
        log.warning("stopped ghost %s on %s (%s)", workload_id, node, state)

    async def _routes(
        self,
        records: list[StoredWorkload],
        reports: dict[str, frozenset[str]],
        report: PassReport,
        acting: Callable[[], bool],
    ) -> None:
        """Write the missing routes of running workloads, remove those of ended ones (see the
        module docstring); a registry that fails is tried again next pass."""
        routes = self.routes
        if routes is None or not acting():
            return
        try:
            index = self.route_index
            listed = index.entries() if index is not None else await routes.entries()
            stored = {(r.workload, r.node): (rev, r) for rev, r in listed}
        except Exception as error:  # an index: the next pass reads it again
            log.warning("the routes were not read: %s", error)
            return
        live = {(_identity(r), r.node) for r in records if r.state in LIVE_STATES}
        ended = {
            (r.node, r.reservation_id)
            for r in records
            if r.state in ENDED_STATES and r.reservation_id is not None
        }
        missing = [
            r
            for r in records
            if r.state == "running"
            and r.reservation_id is not None
            and r.node_workload_id in reports.get(r.node, ())
            and (_identity(r), r.node) not in stored
        ]
        stale = [
            (key, revision)
            for key, (revision, route) in stored.items()
            if (route.node, route.reservation_id) in ended and key not in live
        ]
        for record in missing:
            if not acting():
                return
            try:
                if await routes.repair(_route(record)) is not None:
                    report.routes_restored += 1
                    self._routed("restored")
                    log.info("wrote the missing route of %s on %s", record.id, record.node)
            except Exception as error:  # the next pass writes it
                log.warning("the route of %s was not written: %s", record.id, error)
        for (workload, node), revision in stale:
            if not acting():
                return
            try:
                await routes.remove(workload, node, revision=revision)
            except Exception as error:  # the next pass removes it
                log.warning("the stale route of %s on %s stays: %s", workload, node, error)
                continue
            report.routes_removed += 1
            self._routed("removed")
            log.info("removed the route of %s on %s: its workload ended", workload, node)

    def _routed(self, action: str) -> None:
        if self.metrics is not None:
            self.metrics.route_reconciled(action)

    async def _expire_keys(self, report: PassReport, acting: Callable[[], bool]) -> None:
        """Delete the expired idempotency key claims, if the last pass that did is
        :data:`KEYS_EXPIRE_EVERY_S` old; a registry that fails is tried again next pass."""
        now = self.monotonic()
        if now - self._keys_expired_at < KEYS_EXPIRE_EVERY_S or not acting():
            return
        try:
            report.keys_expired = await self.backend.keys.expire()
        except Unavailable as error:
            log.warning("the expired idempotency keys were not deleted: %s", error)
            return
        self._keys_expired_at = now
        if report.keys_expired:
            log.info("deleted %d expired idempotency key claim(s)", report.keys_expired)

    # -- one at a time -----------------------------------------------------------------------
    def holding(self) -> bool:
        """Whether this reconciler may act: its lease was renewed within two thirds of its TTL
        (under :meth:`run`; always ``False`` outside it)."""
        return self.monotonic() < self._held_until

    async def run(self, lease: LeaderLease, holder: str) -> None:
        """Reconcile every ``every_s`` while holding ``lease`` as ``holder``, until cancelled
        (then the lease is given up).  The lease is renewed every third of its TTL by a task
        of its own, whatever a pass is doing; a pass starts only while it is held — the first
        one as soon as it is taken —, stops no ghost once a renewal has failed
        (:meth:`holding`), and is cut off after the TTL."""
        keeper = asyncio.create_task(self._keep(lease, holder), name="berth reconciler lease")
        try:
            while True:
                started = self.monotonic()
                self._taken.clear()
                if self.holding():
                    await self._bounded_pass(lease.ttl_s)
                with contextlib.suppress(TimeoutError):  # a period, or until the lease is taken
                    await asyncio.wait_for(
                        self._taken.wait(), max(0.0, self.every_s - (self.monotonic() - started))
                    )
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            self._held_until = -math.inf
            with contextlib.suppress(Exception):
                await asyncio.shield(lease.release(holder))

    async def _keep(self, lease: LeaderLease, holder: str) -> None:
        """Take or renew the lease every third of its TTL; a failed renewal stops acting."""
        while True:
            asked = self.monotonic()
            try:
                held = await lease.hold(holder)
            except Unavailable as error:
                log.warning("the reconciler lease could not be renewed: %s", error)
                held = False
            if held:
                if not self.holding():
                    log.info("%s holds the reconciler lease", holder)
                    self._taken.set()
                self._held_until = asked + lease.ttl_s * 2 / 3
            else:
                if self.holding():
                    log.warning("%s lost the reconciler lease: it stops acting", holder)
                self._held_until = -math.inf
                self._unrecorded.clear()  # another holder acts: start afresh if it returns
            await asyncio.sleep(lease.ttl_s / 3)

    async def _bounded_pass(self, limit_s: float) -> None:
        metrics = self.metrics
        try:
            await asyncio.wait_for(self.reconcile(acting=self.holding), limit_s)
        except Exception:
            log.exception("a reconciler pass failed")
            if metrics is not None:
                metrics.reconciler_pass(False)
            return
        if metrics is not None:
            metrics.reconciler_pass(True)


async def _at_once(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """``asyncio.gather`` of ``calls``, :data:`~berth.defaults.RECONCILE_ASK_AT_ONCE` of them
    running at a time (each may ask a node: thousands asked together time out)."""
    limit = asyncio.Semaphore(RECONCILE_ASK_AT_ONCE)

    async def bounded(call: Coroutine[Any, Any, T]) -> T:
        async with limit:
            return await call

    return await asyncio.gather(*map(bounded, calls))


def _converged(record: StoredWorkload, runs: frozenset[str] | None) -> bool:
    """Whether ``record`` needs nothing from a pass: ``running`` with no stop kept, and its
    node's report (``runs``) has it."""
    return (
        record.state == "running"
        and not record.stop_requested
        and runs is not None
        and record.node_workload_id in runs
    )


def _identity(record: StoredWorkload) -> str:
    """The key a workload's route is stored under: its ``namespace/name/replica``
    (:attr:`berth.model.Request.key`, what the scheduler records)."""
    return f"{record.namespace}/{record.name}/{record.replica}"


def _route(record: StoredWorkload) -> Route:
    """The route a running record stands for, as its scheduler would have written it
    (``placed_at`` its create's time)."""
    request = Request.from_dict(record.request)
    return Route(
        _identity(record),
        record.node,
        record.reservation_id,
        request.spec,
        record.created_at,
        record.namespace,
        record.name,
    )
