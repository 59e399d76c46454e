"""The API's workload records, kept following their nodes: reads, events, unknown, lost.

:class:`Records` owns what a record says after its create: every move of a live record
(``pending``, ``running``, ``unknown``) is learnt from its node and written by
compare-and-set, with the same rules whoever learns it — a read, an event, a sweep, the
reconciler (:mod:`berth.api.reconciler`) or a stop.

**Ends are pushed** (issue 20, part 6): a node publishes each workload's start, end and
restart as an event (:mod:`berth.events`), and :meth:`Records.apply_event` — which the
served API runs on every event of the shared feed — records it with the same rules a read
applies to the node's ``status`` answer, by compare-and-set; an event of a workload no live
record of its node names (a ghost's, a replaced record's) changes nothing (counted
``unrecorded`` or ``stale``).  A start moves a ``pending`` record whose run's answer was lost
(its caller died, the connection dropped) to ``running`` at once, without a read.  So **a
listing reads the records** and asks no node; what a listing shows is as fresh as the last
event, read or reconciler pass (a node that does not answer is noticed by the reconciler,
within its period).

**State** follows the node: reading one live workload asks its node (``status``) and records
``exited`` (with the exit code), ``stopped`` or ``failed`` when it has ended — ``failed``
for one the node does not know only once the node's report of its workloads is whole (not
while a restarted agent is still adopting them: ``node_starting``).  **Unknown is
not an end**: a node that does not answer makes its workloads ``unknown`` (claim kept); a
node that answers again turns the record ``running`` and gets the stop kept on it, if any
(:meth:`Records.deliver_stop`; how a stop is kept: :mod:`berth.api.stops`).  Only a node out
of the schedulers' view for :attr:`Records.node_gone_after_s` is gone — its workloads
``lost``, their claims freed, restartable ones placed again (``replaced_by``).

**Restart and reschedule**: a create's restart policy goes to the node in the boot spec —
the node restarts (it sees the exit first); a read records the restarts the node reports
(``restarts``, a ``restarted`` event) and an end with the restarts exhausted as ``failed``.
Rescheduling is the API's: a record that ends ``lost``, or ``failed`` with its restarts
exhausted, is placed again as its reschedule policy allows (``replaced_by``, a
``rescheduled`` event), by the ``replace`` a :class:`Records` is given (the creates',
:meth:`berth.api.create.Creates.replace`); a drain's replacement does not count as one.
Each record keeps its ``history`` of such events.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from berth.api.ports import ApiPorts
from berth.api.problems import Problem
from berth.boot import WorkloadStatus
from berth.defaults import API_STOP_GRACE_S
from berth.errors import Invalid, NoCapacity, Unavailable
from berth.events.port import WorkloadEvent
from berth.model import INTERVAL_RULE, Request
from berth.ownership import Refused
from berth.registry.port import (
    CLAIM_PENDING_S,
    LIVE_STATES,
    IdentityTaken,
    StoredWorkload,
    with_event,
)

__all__ = [
    "STATUS_TIMEOUT_S",
    "STOP_MARGIN_S",
    "SWEEP_EVERY_S",
    "Records",
    "Replace",
    "dumped",
    "not_found",
]

log = logging.getLogger("berth.api")

STOP_MARGIN_S = 5.0
"""What a stop waits beyond its grace: the round trip, the kill, the runtime's cleanup."""
STATUS_TIMEOUT_S = 2.0
SWEEP_EVERY_S = 5.0
"""How often a served API refreshes its live workloads when nobody reads them
(:meth:`Records.sweep_forever`)."""

Replace = Callable[[StoredWorkload], Awaitable[StoredWorkload]]
"""Place and boot an ended workload again, as one more reschedule of its line: its
replacement's record."""


def not_found(what: str, name: str) -> Problem:
    return Problem(404, "not_found", "not found", f"no {what} {name!r}")


def dumped(history: list[Any]) -> list[dict[str, object]]:
    """A record's history as plain data, for a transition's update."""
    return [event.model_dump() for event in history]


class Records:
    """The workload records following their nodes (see the module docstring)."""

    def __init__(self, ports: ApiPorts, *, node_gone_after_s: float, replace: Replace) -> None:
        self.ports = ports
        self.node_gone_after_s = node_gone_after_s
        """How long a node is out of the schedulers' view before its workloads are lost."""
        self._replace = replace

    # -- reads -------------------------------------------------------------------------------
    async def workload(self, workload_id: str) -> StoredWorkload:
        """The record, refreshed from its node if live (:meth:`refresh`); ``404`` if none."""
        workload = await self.ports.workloads.get(workload_id)
        if workload is None:
            raise not_found("workload", workload_id)
        return await self.refresh(workload)

    async def list_workloads(
        self, namespace: str | None, node: str | None, state: str | None
    ) -> list[StoredWorkload]:
        """The records as they are (no node is asked: ends arrive as events)."""
        found = await self.ports.workloads.list(namespace=namespace, node=node)
        return [workload for workload in found if state is None or workload.state == state]

    async def apply_event(self, event: WorkloadEvent) -> str:
        """Record what a node's event says (see the module docstring): ``applied``,
        ``stale`` (the record had it already, or has ended) or ``unrecorded`` (no record of
        that node names the workload).  A registry that cannot be reached raises
        ``Unavailable``: the feed hands the event out again."""
        workload = await self.ports.workloads.get(event.workload_id)
        if (
            workload is None
            or workload.node != event.node
            or workload.node_workload_id != event.workload_id
        ):
            outcome = "unrecorded"
        elif workload.state not in LIVE_STATES:
            outcome = "stale"
        elif event.kind == "started":  # its run's answer may never have come: it runs
            moved = await self.runs(workload)
            outcome = "applied" if moved.state != workload.state else "stale"
        elif event.kind == "restarted":
            moved = await self._restarted(workload, event.status())
            await self.runs(moved)  # the node restarted it: it runs (a kept stop delivered)
            outcome = "stale" if moved is workload and workload.state == "running" else "applied"
        else:
            ended = await self._node_ended(workload, event.status())
            outcome = "applied" if ended.state not in LIVE_STATES else "stale"
        if outcome != "applied":
            log.debug("event %s: %s", event.key, outcome)
        if self.ports.metrics is not None:  # berth_events_applied_total{outcome}
            self.ports.metrics.event_applied(outcome, max(0.0, self.ports.clock() - event.at))
        return outcome

    async def sweep(self) -> int:
        """Refresh every live workload (:meth:`refresh`), as a read would: unknown ones are
        noticed, kept stops delivered and gone nodes' workloads lost without anyone reading
        them.  How many live records were looked at."""
        live = [w for w in await self.ports.workloads.list() if w.state in LIVE_STATES]
        await asyncio.gather(*(self.refresh(workload) for workload in live))
        return len(live)

    async def sweep_forever(self, every_s: float = SWEEP_EVERY_S) -> None:
        """:meth:`sweep` every ``every_s`` seconds until cancelled; a sweep that fails (the
        registry unreachable) is logged and the next one tries again.  An interim for the
        reconciler (:mod:`berth.api.reconciler`, which the served API runs instead): every
        process that runs it sweeps, and the compare-and-sets keep them apart."""
        every_s = INTERVAL_RULE(every_s, "every_s")
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.sweep()
            except Exception:
                log.exception("a sweep of the live workloads failed")

    # -- what a record learns from its node --------------------------------------------------
    async def refresh(self, workload: StoredWorkload) -> StoredWorkload:
        """Ask a live workload's node about it and record what is learnt (each change a
        compare-and-set): ``pending`` or ``unknown`` → ``running`` when the node runs it (a
        stop kept meanwhile is delivered then); ``running`` → ``unknown`` when the node does
        not answer; → ``exited``/``stopped``/``failed`` when it says the workload ended or
        never heard of it; ``unknown`` → ``lost`` once its node has been out of the
        schedulers' view for :attr:`node_gone_after_s`."""
        if workload.state not in LIVE_STATES:
            return workload
        if workload.state != "running" and workload.node not in self.ports.view.states():
            return await self._maybe_lost(workload)  # not back yet: nothing to ask
        try:
            status = await asyncio.wait_for(
                self.ports.nodes.status(workload.node, workload.node_workload_id), STATUS_TIMEOUT_S
            )
        except (Unavailable, TimeoutError) as error:
            return await self._unreachable(workload, error)
        if status.state == "running":
            return await self.runs(await self._restarted(workload, status))
        if status.state == "unknown":
            if workload.state == "pending":
                return await self._pending_unknown_to_node(workload)
            if not await self._settled(workload.node):
                return workload  # a restarted agent not done adopting: it may yet know it
            update: dict[str, object] = {
                "state": "failed",
                "detail": f"node {workload.node} no longer knows it (the agent restarted?)",
            }
            return await self._record_end(workload, update, exhausted=False)
        return await self._node_ended(workload, status)

    async def runs(self, workload: StoredWorkload) -> StoredWorkload:
        """The node says the workload runs: a ``pending`` or ``unknown`` record turns
        ``running`` (by compare-and-set); a stop kept on it is delivered now."""
        if workload.state != "running":
            update: dict[str, object] = {"state": "running", "unknown_since": None, "detail": None}
            moved, _ = await self.ports.workloads.transition(
                workload.id, update, expect=("pending", "unknown")
            )
            if moved is None:
                return workload
            workload = moved
            if workload.state == "running":
                log.info("%s runs on %s again", workload.id, workload.node)
        if workload.state == "running" and workload.stop_requested:
            return await self.deliver_stop(workload)
        return workload

    async def _node_ended(self, workload: StoredWorkload, status: WorkloadStatus) -> StoredWorkload:
        """The node says the workload ended (its ``status`` answer or its event): record
        ``stopped``, ``exited`` or ``failed`` with the exit code and the node's reason."""
        kind = (
            "stopped"
            if status.stopped
            else ("exited" if status.exit_code is not None and not status.exhausted else "failed")
        )
        update: dict[str, object] = {
            "state": kind,
            "exit_code": status.exit_code,
            "detail": status.reason,
            "restarts": max(workload.restarts, status.restarts),
        }
        return await self._record_end(workload, update, exhausted=status.exhausted)

    async def _record_end(
        self, workload: StoredWorkload, update: dict[str, object], *, exhausted: bool
    ) -> StoredWorkload:
        """End the record with ``update`` and an event in its history; one whose restarts
        ran out (``exhausted``) and ended ``failed`` is placed again as its policy allows."""
        history = with_event(
            workload.history,
            self.ports.clock(),
            str(update["state"]),
            str(update["detail"]),
            workload.node,
        )
        update["history"] = dumped(history)
        ended = await self.end(workload, update)
        if exhausted and ended.state == "failed":
            return await self._reschedule(ended)
        return ended

    async def _restarted(self, workload: StoredWorkload, status: WorkloadStatus) -> StoredWorkload:
        """Record the restarts the node reports beyond those recorded (count and event)."""
        if status.restarts <= workload.restarts:
            return workload
        first, last = workload.restarts + 1, status.restarts
        count = f"restart {last}" if first == last else f"restarts {first}-{last}"
        reason = f"{count}, after its run {status.reason or 'ended'}"
        history = with_event(
            workload.history, self.ports.clock(), "restarted", reason, workload.node
        )
        update: dict[str, object] = {"restarts": status.restarts, "history": dumped(history)}
        moved, _ = await self.ports.workloads.transition(
            workload.id, update, expect=(workload.state,)
        )
        return workload if moved is None else moved

    async def _settled(self, node: str) -> bool:
        """Whether ``node``'s word that it does not know a workload is final: not while a
        restarted agent is still adopting its workloads (its report refused
        ``node_starting``), nor when the node does not answer that question."""
        try:
            await asyncio.wait_for(self.ports.nodes.running(node), STATUS_TIMEOUT_S)
        except (Refused, Unavailable, TimeoutError):
            return False
        return True

    async def _unreachable(self, workload: StoredWorkload, error: Exception) -> StoredWorkload:
        """The node did not answer: a ``running`` workload becomes ``unknown`` (it may well
        still run: its identity stays claimed); a ``pending`` or ``unknown`` one stays as it
        is, unless its node has been gone long enough for it to be lost."""
        if workload.state != "running":
            return await self._maybe_lost(workload)
        update: dict[str, object] = {
            "state": "unknown",
            "unknown_since": self.ports.clock(),
            "detail": f"node {workload.node} does not answer ({error or type(error).__name__})",
        }
        moved, mine = await self.ports.workloads.transition(
            workload.id, update, expect=("running",)
        )
        if mine:
            log.warning("%s is unknown: %s", workload.id, update["detail"])
        return workload if moved is None else moved

    async def _maybe_lost(self, workload: StoredWorkload) -> StoredWorkload:
        """An ``unknown`` workload whose node is out of the schedulers' view, and has not
        answered for :attr:`node_gone_after_s` since it was first unreachable, is ``lost``:
        its identity is freed and a restartable one is placed again elsewhere
        (``replaced_by``).  A ``pending`` one likewise, counted from its create and never
        before :data:`~berth.registry.port.CLAIM_PENDING_S` (its create may still be asking
        the node)."""
        if workload.node in self.ports.view.states():
            return workload  # the node publishes: it lives, only its answers are missing
        if workload.state == "unknown" and workload.unknown_since is not None:
            since, wait_s = workload.unknown_since, self.node_gone_after_s
        else:
            since, wait_s = workload.created_at, max(self.node_gone_after_s, CLAIM_PENDING_S)
        silent_s = self.ports.clock() - since
        if silent_s < wait_s:
            return workload
        detail = (
            f"node {workload.node} gone: out of the cluster, no answer for "
            f"{silent_s:.0f}s (node_gone_after {self.node_gone_after_s:g}s)"
        )
        history = with_event(workload.history, self.ports.clock(), "lost", detail, workload.node)
        update: dict[str, object] = {"state": "lost", "detail": detail, "history": dumped(history)}
        lost, recorded = await self.end_by_id(workload.id, update)
        if lost is None or not recorded:
            return workload if lost is None else lost
        log.warning("%s lost: %s", workload.id, update["detail"])
        return await self._reschedule(lost)

    async def _reschedule(self, ended: StoredWorkload) -> StoredWorkload:
        """Place an ended (``lost``, or ``failed`` with its restarts exhausted) workload again,
        elsewhere when its node is gone, if its reschedule policy allows one more; its record
        gets ``replaced_by`` and a ``rescheduled`` event, or the reason it was not."""
        if not ended.reschedule.allows(ended.reschedules):
            return ended
        state = (ended.state,)
        try:
            replacement = await self._replace(ended)
        except (Invalid, NoCapacity, Unavailable, Refused, IdentityTaken) as error:
            log.warning("%s %s and not placed again: %s", ended.id, ended.state, error)
            detail = f"{ended.detail}; not placed again: {error}"
            history = with_event(
                ended.history, self.ports.clock(), "not rescheduled", str(error), None
            )
            update: dict[str, object] = {"detail": detail, "history": dumped(history)}
            return (await self.ports.workloads.transition(ended.id, update, expect=state))[
                0
            ] or ended
        return await self.replaced(ended, replacement, "rescheduled", state) or ended

    async def replaced(
        self,
        workload: StoredWorkload,
        replacement: StoredWorkload,
        event: str,
        expect: Collection[str],
    ) -> StoredWorkload | None:
        """Write on ``workload``'s record that ``replacement`` runs in its place
        (``replaced_by``, and an ``event`` naming it and its node), if its state is still one
        of ``expect``: the record as it is then (``None``: it is gone)."""
        history = with_event(
            workload.history,
            self.ports.clock(),
            event,
            f"as {replacement.id}",
            replacement.node,
        )
        update: dict[str, object] = {"replaced_by": replacement.id, "history": dumped(history)}
        replaced, _ = await self.ports.workloads.transition(workload.id, update, expect=expect)
        return replaced

    async def _pending_unknown_to_node(self, workload: StoredWorkload) -> StoredWorkload:
        """A ``pending`` workload its node has never heard of: its boot is still on its way
        (or being retried) — unless its create is older than
        :data:`~berth.registry.port.CLAIM_PENDING_S`, when no boot can still be coming and the
        record ends ``failed``."""
        if self.ports.clock() - workload.created_at < CLAIM_PENDING_S:
            return workload
        update: dict[str, object] = {
            "state": "failed",
            "detail": f"never ran: node {workload.node} has no such workload "
            f"{CLAIM_PENDING_S:g}s after its create",
        }
        return await self.end(workload, update)

    # -- ends --------------------------------------------------------------------------------
    async def end(self, workload: StoredWorkload, update: dict[str, object]) -> StoredWorkload:
        """Record that a live workload ended (``update`` applied to its record as it is now,
        by compare-and-set: nothing written meanwhile is lost), and free its identity — once,
        by whichever reader recorded the end."""
        ended, _ = await self.end_by_id(workload.id, update)
        return workload.model_copy(update=update) if ended is None else ended

    async def end_by_id(
        self, workload_id: str, update: dict[str, object]
    ) -> tuple[StoredWorkload | None, bool]:
        """:meth:`end` by id: the record and whether this call recorded the end."""
        update.setdefault("ended_at", self.ports.clock())
        ended, recorded = await self.ports.workloads.end(workload_id, update)
        if ended is not None and recorded:
            await self.release(Request.from_dict(ended.request).key, ended.id)
        return ended, recorded

    async def release(self, identity: str, workload_id: str) -> None:
        """Give up ``workload_id``'s claim on ``identity`` (best effort: a claim left behind
        is taken over once its holder is seen not to run)."""
        try:
            await self.ports.workloads.claims.release(identity, workload_id)
        except Exception as error:
            log.warning("could not release the claim of %s on %s: %s", workload_id, identity, error)

    # -- stops on the node -------------------------------------------------------------------
    async def deliver_stop(self, workload: StoredWorkload) -> StoredWorkload:
        """Deliver a stop kept on the record of a workload whose node answers again."""
        try:
            stopped = await self.stop_on_node(workload, workload.stop_grace_s)
        except (Unavailable, Refused) as error:
            log.warning("the kept stop of %s is not delivered yet: %s", workload.id, error)
            return workload
        log.info("delivered the kept stop of %s on %s", workload.id, workload.node)
        return stopped

    async def stop_on_node(self, workload: StoredWorkload, grace_s: float | None) -> StoredWorkload:
        """Ask a running workload's node to stop it (``grace_s``; ``None``: the node's) and
        record the end it reports; waits that long plus :data:`STOP_MARGIN_S`."""
        deadline = API_STOP_GRACE_S if grace_s is None else grace_s
        try:
            await asyncio.wait_for(
                self.ports.nodes.stop(workload.node, workload.node_workload_id, grace_s=grace_s),
                deadline + STOP_MARGIN_S,
            )
        except TimeoutError:
            raise Unavailable(
                f"{workload.id} did not stop within {deadline:g}s on {workload.node}"
            ) from None
        stopped = await self.refresh(workload)  # records the end the node reports
        if stopped.state in LIVE_STATES:  # the node's status lags its stop by nothing, but be sure
            update: dict[str, object] = {"state": "stopped", "detail": "stopped by the API"}
            stopped = await self.end(workload, update)
        return stopped
