"""The workload events port: a node's word that a workload started, ended or restarted, pushed.

A node is the authority on what runs on it; the API learns that a workload runs and how it
ended by being *told*, not by asking every node on each listing (issue 20, part 6).  Each
start (a boot done, or a workload adopted by a restarted agent), each end — and each restart
under a restart policy — becomes a :class:`WorkloadEvent` the node's agent publishes
through an :class:`EventSink`; the API consumes them from an :class:`EventFeed` and applies
each to the workload's record with a compare-and-set
(:meth:`~berth.api.backend.ClusterBackend.apply_event`).

The promises, which :mod:`berth.testing.events_contract` checks of every driver:

* **stored before acknowledged** — :meth:`EventSink.publish` returns only once the event is
  kept (on NATS: JetStream's acknowledgement of the stream write).  A node removes a
  workload's journal entry only after the end's event was acknowledged, so an end is never
  forgotten by a node that dies right after it: its restart publishes it again.
* **at least once** — an event is handed to a consumer until one acknowledges it: a handler
  that fails (the registry unreachable) gets it again later, a consumer that dies before
  acknowledging leaves it for the next.  Applying an event twice changes nothing the first
  application did not (the record's compare-and-sets only move a live record), so
  at-least-once is enough.
* **each event to one consumer of a feed** — several API processes share one feed (on
  NATS: one durable consumer), so an event is applied once, not once per process.
* **what is published while nobody consumes is kept** — an API that restarts finds the ends
  of the meanwhile (for as long as the driver keeps them: on NATS, :data:`EVENT_MAX_AGE_S`).

What it is not: the truth about what runs.  A lost event (kept past its age, a node that
never came back) is caught by the reconciler, which still asks each node which ids it runs
(:mod:`berth.api.reconciler`); events make the common case fast and cheap.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

from pydantic import Field

from berth.boot import WorkloadStatus
from berth.model import Name
from berth.validation import BerthModel, Text

__all__ = [
    "EVENT_MAX_AGE_S",
    "EventFeed",
    "EventHandler",
    "EventKind",
    "EventSink",
    "WorkloadEvent",
]

EVENT_MAX_AGE_S = 86400.0
"""How long a published event is kept for a consumer that has not taken it (a day)."""

EventKind = Literal["started", "ended", "restarted"]


class WorkloadEvent(BerthModel):
    """One node's word about one workload: it ``started`` (booted: it runs), ``ended`` (for
    good: how) or was ``restarted`` under its policy (how often, how its last run ended)."""

    node: Name
    workload_id: Name
    kind: EventKind
    exit_code: int | None = None
    reason: Text | None = Field(default=None, max_length=4096)
    stopped: bool = False
    restarts: int = Field(default=0, ge=0)
    exhausted: bool = False
    at: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    """When the node recorded it (its wall clock, seconds since the epoch)."""

    @classmethod
    def of(
        cls,
        node: str,
        workload_id: str,
        status: WorkloadStatus,
        at: float,
        kind: EventKind | None = None,
    ) -> WorkloadEvent:
        """The event of ``status``: an end's, or a running one's after a restart — or
        ``kind`` when given (``started``: its boot is done)."""
        if kind is None:
            kind = "ended" if status.state == "ended" else "restarted"
        return cls(
            node=node,
            workload_id=workload_id,
            kind=kind,
            exit_code=status.exit_code,
            reason=None if status.reason is None else status.reason[:4096],
            stopped=status.stopped,
            restarts=status.restarts,
            exhausted=status.exhausted,
            at=at,
        )

    @property
    def key(self) -> str:
        """What makes this event itself (a publisher's de-duplication id): a republished
        event is the same event; the next restart of the workload is another."""
        return f"{self.node}.{self.workload_id}.{self.kind}.{self.restarts}"

    def status(self) -> WorkloadStatus:
        """The node's status this event says: ``ended`` with how, or ``running``."""
        return WorkloadStatus(
            "ended" if self.kind == "ended" else "running",
            self.exit_code,
            self.reason,
            self.stopped,
            self.restarts,
            self.exhausted,
        )


EventHandler = Callable[[WorkloadEvent], Awaitable[object]]
"""Applies one event; raising means "not applied: hand it to me (or another) again"."""


class EventSink(Protocol):
    """Where a node publishes its events."""

    async def publish(self, event: WorkloadEvent) -> None:
        """Keep ``event`` for the consumers; return once it is kept (``Unavailable`` when
        that is not known: the caller publishes it again later)."""
        ...


class EventFeed(Protocol):
    """Where the API takes events from (see the module docstring for the promises)."""

    async def consume(self, handler: EventHandler) -> None:
        """Hand every event to ``handler``, oldest first, until cancelled; an event whose
        handler raised is handed out again later.  A feed that cannot be reached is
        retried, not raised."""
        ...
