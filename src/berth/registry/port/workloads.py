"""The workload registry port: every workload the API placed and booted, and its states.

:class:`WorkloadRegistry` — every workload the API placed and booted (a
:class:`StoredWorkload`), so a restarted scheduler (or another one serving the API) knows
what runs.  A record is written *before* its node is asked to run it, so nothing boots that
the registry has not seen.  The states (:data:`WorkloadState`):

- live (:data:`LIVE_STATES`, the identity stays claimed): ``pending`` (recorded, the node
  asked or about to be; the run's answer not yet known), ``running`` (the node said so),
  ``unknown`` (its node did not answer, or left the schedulers' view: it may well still run;
  ``unknown_since`` says since when);
- ended: ``exited`` (it ended by itself; ``exit_code``), ``stopped`` (the API stopped it, or
  a drain did), ``failed`` (the node refused it, it was killed by a signal, or its node no
  longer knows it), ``lost`` (its node stayed unreachable for ``node_gone_after``: declared
  gone).

A stop asked of a workload its node cannot be reached for is kept on the record
(``stop_requested``, ``stop_grace_s``) and delivered when the node answers again.  The node
is the authority on whether a workload still runs; the registry learns it by being told
(:meth:`WorkloadRegistry.transition` and :meth:`WorkloadRegistry.end`, compare-and-sets: a
change written meanwhile is never overwritten), never by guessing.

Its drivers: :class:`~berth.registry.memory.MemoryWorkloads`,
:class:`~berth.registry.nats.NatsWorkloads` (the rules they share: :mod:`berth.registry.documents`).
"""

from __future__ import annotations

import builtins
import re
import uuid
from collections.abc import Collection, Sequence
from typing import Literal, Protocol

from pydantic import BaseModel

from berth.model import ReschedulePolicy, RestartPolicy
from berth.registry.port.claims import IdempotencyKeys, IdentityClaims

__all__ = [
    "ENDED_STATES",
    "LIVE_STATES",
    "MAX_HISTORY",
    "WORKLOAD_ID",
    "HistoryEvent",
    "RecordIndex",
    "StoredWorkload",
    "Workload",
    "WorkloadRegistry",
    "WorkloadState",
    "new_workload_id",
    "with_event",
]

WorkloadState = Literal["pending", "running", "unknown", "exited", "stopped", "failed", "lost"]
LIVE_STATES: frozenset[WorkloadState] = frozenset({"pending", "running", "unknown"})
"""The states of a workload that may run: its identity stays claimed, its end is to come."""
ENDED_STATES: frozenset[WorkloadState] = frozenset({"exited", "stopped", "failed", "lost"})
"""The states a record ends in; none is left again."""
WORKLOAD_ID = re.compile(r"w-[0-9a-f]{12}")
"""The ids :func:`new_workload_id` hands out; a registry looks up nothing else."""


def new_workload_id() -> str:
    """A fresh workload id, ``w-`` and 12 hex digits (also the node's boot name)."""
    return f"w-{uuid.uuid4().hex[:12]}"


class HistoryEvent(BaseModel):
    """One event of a workload's life as its record keeps it: when (the API's clock), what
    (``created``, ``restarted``, ``failed``, ``lost``, ``rescheduled`` …), why, and on which
    node."""

    at: float
    event: str
    reason: str | None = None
    node: str | None = None


MAX_HISTORY = 100
"""The most events a record keeps (the oldest are dropped first)."""


def with_event(
    history: Sequence[HistoryEvent], at: float, event: str, reason: str | None, node: str | None
) -> list[HistoryEvent]:
    """``history`` and one more event, at most :data:`MAX_HISTORY` of them."""
    added = [*history, HistoryEvent(at=at, event=event, reason=reason, node=node)]
    return added[-MAX_HISTORY:]


class Workload(BaseModel):
    """A workload the API placed and booted (its record, and the API's answer).

    ``node_workload_id`` is the node's own id for it (the API's id, for a workload booted
    under it); ``detail`` says how it ended or why its state is what it is; ``replaced_by``
    names the workload a drain (or a lost node) started in its place.  ``unknown_since`` is
    when the API first failed to reach a ``running`` workload's node (it was last seen
    before that); ``stop_requested`` (with ``stop_grace_s``) is a stop accepted while its node
    could not be reached, delivered when the node answers again.  ``restart`` is the policy
    its node restarts it by, ``restarts`` how often it did; ``reschedule`` whether the API
    places it again elsewhere when it is lost or its restarts are exhausted (``restartable``
    says the same in one bit), ``reschedules`` how many of its line came before it;
    ``history`` the events of its life, oldest first.
    """

    id: str
    namespace: str
    name: str
    replica: int
    image: str | None = None
    node: str
    node_workload_id: str
    reservation_id: str | None = None
    colocated_bytes: int
    rank: int
    state: WorkloadState
    exit_code: int | None = None
    detail: str | None = None
    command: list[str]
    restartable: bool
    created_at: float
    ended_at: float | None = None
    replaced_by: str | None = None
    unknown_since: float | None = None
    stop_requested: bool = False
    stop_grace_s: float | None = None
    restart: RestartPolicy | None = None
    reschedule: ReschedulePolicy = ReschedulePolicy()
    restarts: int = 0
    reschedules: int = 0
    history: list[HistoryEvent] = []


class StoredWorkload(Workload):
    """A workload's record: what the API answers, plus what only the registry keeps — its
    environment (it may hold secrets: never answered) and the placement request it was
    created from (to place it again after a drain)."""

    env: dict[str, str] = {}
    request: dict[str, object] = {}


class WorkloadRegistry(Protocol):
    """The API's workloads (see the module docstring)."""

    @property
    def claims(self) -> IdentityClaims:
        """The identities of the workloads: one running workload holds each."""
        ...

    @property
    def keys(self) -> IdempotencyKeys:
        """The creates' idempotency keys: one create per key."""
        ...

    async def record(self, workload: StoredWorkload) -> None:
        """Store ``workload``'s record (replacing the one of the same id)."""
        ...

    async def transition(
        self,
        workload_id: str,
        update: dict[str, object],
        *,
        expect: Collection[str],
    ) -> tuple[StoredWorkload | None, bool]:
        """Apply ``update`` to the record as it is now, if its state is one of ``expect``
        (compare-and-set on the record, looked at again when it changed under it, so a change
        written meanwhile is never overwritten): ``(record, True)`` when this call changed it,
        ``(record, False)`` when its state is not one of ``expect`` (someone else moved it
        first), ``(None, False)`` when it is gone."""
        ...

    async def end(
        self, workload_id: str, update: dict[str, object]
    ) -> tuple[StoredWorkload | None, bool]:
        """Record that a *live* workload (:data:`LIVE_STATES`) ended: :meth:`transition` from
        any live state — so of concurrent readers that learnt of one end exactly one records
        it, and a drain's ``replaced_by`` written meanwhile stands."""
        ...

    async def get(self, workload_id: str) -> StoredWorkload | None:
        """The record of ``workload_id``; ``None`` for an unknown id or one that is not of
        :data:`WORKLOAD_ID`'s form."""
        ...

    async def list(
        self,
        *,
        namespace: str | None = None,
        node: str | None = None,
        state: str | None = None,
    ) -> builtins.list[StoredWorkload]:
        """The workloads matching every filter given, oldest first (then by id)."""
        ...


class RecordIndex(Protocol):
    """A copy of a workload registry's records kept current by its change feed (a watch):
    what the reconciler compares with the nodes' reports every pass, instead of listing (and
    copying) every record — a listing of 100,000 records costs seconds.

    It may lag the registry by the feed's delay: a reader acts on a record only through the
    registry's compare-and-sets, and reads a record again before anything it cannot undo."""

    def records(self) -> builtins.list[StoredWorkload] | None:
        """Every record now — shared, never to be changed by the caller —, or ``None`` while
        the copy has not caught up with the registry yet (then list the registry)."""
        ...
