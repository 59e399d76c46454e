"""A workload's stop: delivered to its node now, or kept on its record until it answers.

:class:`Stops` owns ``POST /v1/workloads/{id}/stop``.  **Stop** is idempotent (a workload
that has ended is returned as it is).  **Unknown is not an end**: a workload whose node does
not answer (``unknown``), or whose boot has not been answered (``pending``), keeps the stop on
its record (``202``) and it is delivered when the node answers, which also turns the record
``running`` again (:meth:`berth.api.records.Records.runs`) — asked by the API process that
kept it, in the background, as soon as the node answers (a kept stop must not wait for the
reconciler, whose lease may be held by a process that just died), and by the reconciler's
passes whatever becomes of that process.  :meth:`Stops.close` cancels the background
deliveries; their records keep the stops.
"""

from __future__ import annotations

import asyncio
import logging

from berth.api.records import Records
from berth.registry.port import LIVE_STATES, StoredWorkload

__all__ = ["KEPT_STOP_ASK_FIRST_S", "KEPT_STOP_ASK_MAX_S", "MAX_KEPT_STOPS", "Stops"]

log = logging.getLogger("berth.api")

KEPT_STOP_ASK_FIRST_S = 0.25
"""The first wait before the node of a kept stop is asked again (then doubled)."""
KEPT_STOP_ASK_MAX_S = 1.0
"""The longest wait between two questions to the node of a kept stop: a node that answers
again has its kept stops delivered within about this, plus the stop itself."""
MAX_KEPT_STOPS = 10_000
"""Kept stops one API process delivers in the background at once (more: the reconciler's)."""


class Stops:
    """Stops, and the kept ones this process delivers (see the module docstring)."""

    def __init__(self, records: Records) -> None:
        self.records = records
        self._couriers: dict[str, asyncio.Task[None]] = {}
        """Kept stops this process delivers in the background, by record id (:meth:`stop`)."""

    async def close(self) -> None:
        """Cancel the background deliveries of kept stops (their records keep the stops: the
        reconciler, or the next API process, delivers them)."""
        couriers, self._couriers = list(self._couriers.values()), {}
        for courier in couriers:
            courier.cancel()
        if couriers:
            await asyncio.wait(couriers, timeout=1.0)

    async def stop(self, workload_id: str, grace_s: float | None) -> StoredWorkload:
        """Stop a workload (idempotent): the node's runtime sends the graceful signal and
        kills it ``grace_s`` later (a :data:`~berth.node.runtime.port.StopGrace` the body's
        schema checked; ``None``: the node's configured grace); this waits that
        long plus :data:`~berth.api.records.STOP_MARGIN_S` (``None``:
        :data:`~berth.defaults.API_STOP_GRACE_S` plus it).

        A workload whose node cannot be reached now (``unknown``), or whose boot has not
        been answered (``pending``), keeps the stop on its record (``stop_requested``): it is
        delivered when the node answers again, and the record answered as it is (the HTTP
        API's ``202``: accepted, not done).  A ``pending`` one's create delivers it after its
        boot; an ``unknown`` one's node is asked again from this process in the background
        (:meth:`_deliver_when_back`) — and by the reconciler's passes, whichever answers
        first: the stop is on the record, so it survives this process."""
        workload = await self.records.workload(workload_id)
        if workload.state in ("pending", "unknown"):
            kept, _ = await self.records.ports.workloads.transition(
                workload.id,
                {"stop_requested": True, "stop_grace_s": grace_s},
                expect=("pending", "unknown"),
            )
            if kept is not None and kept.state == "running":  # it came back meanwhile
                return await self.records.stop_on_node(kept, grace_s)
            if kept is not None and kept.state == "unknown":
                self._deliver_when_back(kept.id)
            return workload if kept is None else kept
        if workload.state != "running":
            return workload
        return await self.records.stop_on_node(workload, grace_s)

    def _deliver_when_back(self, workload_id: str) -> None:
        """Ask the node of an ``unknown`` workload with a kept stop again in the background
        until the stop is delivered or the record has ended (:meth:`_courier`); one task per
        record, at most :data:`MAX_KEPT_STOPS` (beyond, the reconciler delivers them)."""
        if workload_id in self._couriers:
            return
        if len(self._couriers) >= MAX_KEPT_STOPS:
            log.warning(
                "the kept stop of %s waits for the reconciler: %d deliveries already wait",
                workload_id,
                len(self._couriers),
            )
            return
        task = asyncio.get_running_loop().create_task(self._courier(workload_id))
        self._couriers[workload_id] = task
        task.add_done_callback(lambda done: self._delivered(workload_id, done))

    def _delivered(self, workload_id: str, task: asyncio.Task[None]) -> None:
        if self._couriers.get(workload_id) is task:
            del self._couriers[workload_id]

    async def _courier(self, workload_id: str) -> None:
        """Read the record and refresh it (:meth:`~berth.api.records.Records.refresh`: the
        node asked, once it is back in the schedulers' view) every
        :data:`KEPT_STOP_ASK_FIRST_S` doubling to :data:`KEPT_STOP_ASK_MAX_S`, until it has
        ended or carries no kept stop; a node that answers again turns the record ``running``
        and gets the stop at once.  Given up (the reconciler's then) after
        :attr:`~berth.api.records.Records.node_gone_after_s` — by then a node still silent
        has made the record ``lost``."""
        records = self.records
        wait_s = KEPT_STOP_ASK_FIRST_S
        give_up_at = records.ports.clock() + records.node_gone_after_s
        while records.ports.clock() < give_up_at:
            await asyncio.sleep(wait_s)
            wait_s = min(wait_s * 2, KEPT_STOP_ASK_MAX_S)
            try:
                record = await records.ports.workloads.get(workload_id)
                if record is None or record.state not in LIVE_STATES or not record.stop_requested:
                    return
                if (await records.refresh(record)).state not in LIVE_STATES:
                    return
            except Exception as error:  # a background task: whatever failed, ask again
                log.info("the kept stop of %s is not delivered yet: %s", workload_id, error)
        log.warning("the kept stop of %s is left to the reconciler", workload_id)
