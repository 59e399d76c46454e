"""What a node writes down about its workloads: its journal entries and its unreported events.

This module owns the node core's :class:`Ledger`, the two records of its workloads that
outlive a moment of the core — and the one rule that ties them together:

* **the journal** (:mod:`berth.node.journal`), when the node has one: an entry written before
  a workload starts (choosing its id when the caller did not), updated with how to find it
  again once it owns its reservation, and dropped after its end is recorded;
* **the events** (issue 20, part 6), once :meth:`Ledger.push_events` was called (the agent
  does when it has an :class:`~berth.events.port.EventSink`): each workload's start (a boot
  done, or an adoption after a restart), its end, and each restart under its policy, is kept
  as a :class:`~berth.events.port.WorkloadEvent` until the agent reports that the sink stored
  it (:meth:`Ledger.reported`).

**Ends are pushed**: with a journal, an ended workload's entry then stays — marked ``ended``
with its status — until its event is stored, so a node that dies between the end and the
report publishes the end again when it restarts (:mod:`berth.node.recovery`).  Without
events an entry goes as soon as the end is recorded, as before: the API learns of the end by
asking (``status``).

A journal write that fails after the start is logged (the entry written before the start
still names the workload); one that fails at an end is kept in the node's ``end_errors`` for
its self-check to report.  A failure to write the entry *before* a start is the boot's to
handle (:mod:`berth.node.lifecycle` refuses it).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

from berth.boot import BootSpec, WorkloadStatus
from berth.events.port import EventKind, WorkloadEvent
from berth.model import Layer, Spec
from berth.node.journal import Journal, JournalEntry
from berth.node.runtime.port import WorkloadHandle, WorkloadIds
from berth.node.workloads import Workloads
from berth.ownership import Admission

__all__ = ["Ledger", "runtime_kind"]

log = logging.getLogger("berth.node")


class Ledger:
    """A node's journal (if any) and its events not yet reported stored (see the module
    docstring).  ``end_errors`` is the node's list of bookkeeping errors met at an end."""

    def __init__(
        self,
        name: str,
        journal: Journal | None,
        workloads: Workloads,
        end_errors: list[str],
        wall_clock: Callable[[], float],
    ) -> None:
        self._name = name
        self.journal = journal
        self.ids = WorkloadIds()  # with a journal, ids are chosen here, before the start
        self._workloads = workloads
        self._end_errors = end_errors
        self._wall_clock = wall_clock  # when an event happened, as the API reads it
        self._outbox: OrderedDict[tuple[str, EventKind], WorkloadEvent] | None = None
        """Starts, ends and restarts not yet reported stored (``None``: events are not pushed)."""
        self._event_listeners: list[Callable[[], None]] = []

    # -- events: starts, ends and restarts pushed ------------------------------------------
    def push_events(self) -> None:
        """Keep each start, end and restart as an event until :meth:`reported`."""
        if self._outbox is None:
            self._outbox = OrderedDict()

    @property
    def pushes_events(self) -> bool:
        """Whether :meth:`push_events` was called."""
        return self._outbox is not None

    def add_event_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` whenever an event is added to those not yet reported."""
        self._event_listeners.append(listener)

    def unreported(self) -> list[WorkloadEvent]:
        """The events not yet reported stored, oldest first."""
        return [] if self._outbox is None else list(self._outbox.values())

    def reported(self, event: WorkloadEvent) -> None:
        """``event`` is stored: forget it — and for an end, the workload's journal entry —
        unless a newer event of its workload and kind replaced it meanwhile."""
        if self._outbox is None:
            return
        slot = (event.workload_id, event.kind)
        current = self._outbox.get(slot)
        if current is None or current.key != event.key:
            return
        del self._outbox[slot]
        ended = event.kind == "ended" and event.workload_id not in self._workloads.running
        if ended and self.journal is not None:
            self.unjournal(event.workload_id)

    def emit(self, workload_id: str, status: WorkloadStatus, kind: EventKind | None = None) -> None:
        """Keep the event of ``workload_id``'s ``status`` (when events are pushed), replacing
        an older one of its workload and kind, and tell the listeners."""
        if self._outbox is None:
            return
        event = WorkloadEvent.of(self._name, workload_id, status, self._wall_clock(), kind)
        slot = (workload_id, event.kind)
        self._outbox.pop(slot, None)  # a newer restart replaces an older one: it says more
        self._outbox[slot] = event
        for listener in self._event_listeners:
            listener()

    # -- the journal: written before a start, removed after the end is recorded -------------
    def before_start(
        self,
        spec: Spec,
        layers: tuple[Layer, ...],
        boot: BootSpec,
        runtime: str,
        reservation: str | None,
        workload_id: str | None,
    ) -> JournalEntry | None:
        """Record the workload in the journal (if any) before it starts, choosing its id when
        the caller did not; ``runtime`` is the :func:`runtime_kind` that runs it.  Raises the
        ``OSError`` of a journal that cannot be written."""
        if self.journal is None:
            return None
        if workload_id is None:
            workload_id = self.ids.next(boot, self._workloads.known_ids())
        entry = JournalEntry(
            workload_id=workload_id,
            spec=spec,
            layers=layers,
            boot=boot,
            runtime=runtime,
            reservation=reservation,
        )
        self.journal.record(entry)
        return entry

    def started(self, entry: JournalEntry, workload: WorkloadHandle, admission: Admission) -> None:
        """Add how to find the started workload again, and the reservation it owns."""
        assert self.journal is not None
        if workload.done:
            return  # its end has been recorded and its entry removed
        update = {"locator": workload.locator, "reservation": admission.reservation_id}
        try:
            self.journal.record(entry.model_copy(update=update))
        except OSError as error:  # the entry written before the start still names it
            log.error("node %s: journal update of %s failed: %s", self._name, workload.id, error)

    def end(self, workload_id: str, status: WorkloadStatus) -> None:
        """Record ``status`` as the end of ``workload_id``: its journal entry goes now, or —
        events pushed — is marked ended and goes once the end's event is stored."""
        if self.journal is None:
            return
        if self._outbox is None:
            self.unjournal(workload_id)
            return
        try:
            self.journal.mark_ended(workload_id, status.to_dict())
        except OSError as error:
            self._end_errors.append(f"workload {workload_id}: journal entry not marked: {error}")
            log.error(
                "node %s: marking %s ended in the journal: %s", self._name, workload_id, error
            )

    def unjournal(self, workload_id: str) -> None:
        """Remove ``workload_id``'s journal entry (a failure is kept in ``end_errors``)."""
        assert self.journal is not None
        try:
            self.journal.remove(workload_id)
        except OSError as error:
            self._end_errors.append(f"workload {workload_id}: journal entry not removed: {error}")
            log.error(
                "node %s: removing the journal entry of %s: %s", self._name, workload_id, error
            )


def runtime_kind(runtime: object) -> str:
    """The name a journal entry records for the runtime that ran it (its class's)."""
    return type(runtime).__name__
