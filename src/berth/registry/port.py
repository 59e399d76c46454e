"""The registry ports: what the API and the schedulers record beside the node states.

Small ports, each with an in-process driver (:mod:`berth.registry.memory`, the embedded
API and tests) and a NATS one (:mod:`berth.registry.nats`, :mod:`berth.registry.nats_routes`),
and one contract suite both pass (:mod:`berth.testing.registry_contract`):

* :class:`WorkloadRegistry` — every workload the API placed and booted (a
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
* :class:`IdentityClaims` — **one running workload per identity**.  A workload's identity is
  ``namespace/name/replica`` (what the routing registry and ``berth whereis`` key on).  A
  claim is taken create-if-absent *before* anything is placed — of two concurrent creates
  exactly one stores it, the other is refused (:class:`IdentityTaken`) having changed
  nothing.  A claim whose holder no longer holds it (ended, stopped, failed, lost, replaced —
  or a create that died before recording its workload, after :data:`CLAIM_PENDING_S`) is
  taken over atomically; a ``pending`` or ``unknown`` holder still holds it; a release frees
  a claim only for its own holder.
* :class:`IdempotencyKeys` — **one create per idempotency key**: a create that carries a key
  (the HTTP API's ``Idempotency-Key``) claims it create-if-absent *before* it records
  anything (:class:`KeyClaim`: the workload id it names, a hash of its request), so of two
  API processes given the same key at once exactly one creates; the other finds the winner's
  claim and answers from it.  A claim the caller judges gone (expired, or abandoned by a
  create that died before recording) is taken over by compare-and-set; the holder renews its
  claim (:meth:`IdempotencyKeys.confirm`, a compare-and-set too) just before it records its
  workload, so a takeover and that record never both happen.  What a key means to the API
  is :mod:`berth.api.idempotency`'s; the port stores claims only.
* :class:`ImageRegistry` — named images as layer chains with sizes (:class:`Image`), so a
  request can name one; values are checked before they reach it
  (:func:`berth.registry.images.image_of`).
* :class:`LeaderLease` — **one holder at a time** of a cluster-wide job (the reconciler): taken
  create-if-absent, kept by renewing it before its TTL runs out (a compare-and-set on what
  the holder last wrote), lost by a holder that fails to renew in time — which then stops
  acting — and taken by another once it has expired.
* :class:`RouteRegistry` — which node holds each placed workload (:class:`Route`), written by
  the scheduler that confirmed it, removed when the workload ends, purged for a node that
  leaves; followed by every scheduler (:meth:`RouteRegistry.follow`) to count the replicas the
  others placed.  It is an index, not the truth: the node's reservation is.

What this module is not: any storage.  The values here are the ports' vocabulary; the API's
answers are built from them (:mod:`berth.api.schemas`).
"""

from __future__ import annotations

import builtins
import re
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel

from berth.defaults import FOLLOW_IDLE_HEARTBEAT_S, FOLLOW_SYNC_TIMEOUT_S
from berth.errors import BerthError
from berth.model import Placement, ReschedulePolicy, RestartPolicy, Spec

__all__ = [
    "CLAIM_PENDING_S",
    "ENDED_STATES",
    "LIVE_STATES",
    "MAX_HISTORY",
    "WORKLOAD_ID",
    "Claim",
    "HistoryEvent",
    "Holds",
    "IdempotencyKeys",
    "IdentityClaims",
    "IdentityTaken",
    "Image",
    "ImageLayer",
    "ImageRegistry",
    "KeyClaim",
    "LeaderLease",
    "RecordIndex",
    "Replaceable",
    "Route",
    "RouteEvent",
    "RouteListener",
    "RouteRegistry",
    "RouteWatch",
    "StoredWorkload",
    "Workload",
    "WorkloadRegistry",
    "WorkloadState",
    "new_workload_id",
    "with_event",
]

# -- workloads -------------------------------------------------------------------------------
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


# -- identity claims -------------------------------------------------------------------------
CLAIM_PENDING_S = 300.0
"""How long a claim whose workload has no record yet (its create is placing and booting) is
respected; after that its create is taken to have died and the claim may be taken over."""


class IdentityTaken(BerthError):
    """A workload's identity (``namespace/name/replica``) is held by another workload that
    runs (or is being created): ``identity`` and the holder's ``workload_id``."""

    def __init__(self, identity: str, workload_id: str, how: str) -> None:
        self.identity = identity
        self.workload_id = workload_id
        super().__init__(
            f"{identity} is taken: workload {workload_id} holds it ({how}); stop it first, "
            f"or give another replica"
        )


class Claim(BaseModel):
    """Who holds an identity, since when."""

    workload_id: str
    claimed_at: float


Holds = Callable[[Claim], Awaitable[str | None]]
"""How a claim's holder still holds it (``"running on node-01"``, ``"being created"``), or
``None`` when it no longer does (it ended, or its create died)."""


class IdentityClaims(Protocol):
    """One running workload per identity (see the module docstring)."""

    async def holder(self, identity: str) -> str | None:
        """The workload id holding ``identity``, if any."""
        ...

    async def claim(self, identity: str, workload_id: str, *, holds: Holds, now: float) -> None:
        """Take ``identity`` for ``workload_id``, or raise :class:`IdentityTaken` naming the
        workload holding it.  A holder for which ``holds`` says ``None`` is replaced atomically
        (a claim changed while ``holds`` was asked is looked at again); claiming an identity
        already held by ``workload_id`` is a no-op."""
        ...

    async def release(self, identity: str, workload_id: str) -> None:
        """Give ``identity`` up if ``workload_id`` holds it (a newer holder keeps it)."""
        ...


# -- idempotency keys ------------------------------------------------------------------------
class KeyClaim(BaseModel):
    """Who took an idempotency key: ``key`` (its name in the store, a hash of the caller's
    key — never the key itself), the workload its create names, a hash of the request that
    create was given, and when it was taken (or last renewed, :meth:`IdempotencyKeys.confirm`)
    on the API's clock."""

    key: str
    workload_id: str
    request_hash: str
    claimed_at: float
    owner: str | None = None
    """The API process whose create took it (its scheduler service's id; ``None`` from a
    process that did not say): once that process is gone, a repeat need not wait for the
    claim to look abandoned (:mod:`berth.api.idempotency`)."""


Replaceable = Callable[[KeyClaim], Awaitable[bool]]
"""Whether a held key claim may be taken over (it expired, or its create died before
recording its workload): the caller's judgement, asked between the store's atomic steps."""


class IdempotencyKeys(Protocol):
    """One create per idempotency key (see the module docstring)."""

    async def holder(self, key: str) -> KeyClaim | None:
        """The claim holding ``key``, if any."""
        ...

    async def claim(self, claim: KeyClaim, *, replaceable: Replaceable) -> KeyClaim:
        """Take ``claim.key`` for ``claim``: stored create-if-absent, so of concurrent claims
        exactly one stores it; a held claim for which ``replaceable`` says ``True`` is
        replaced by compare-and-set (a claim changed while it was asked is looked at again).
        The claim holding the key now: ``claim`` when this call took it (or its workload id
        held it already), else the holder's — the caller compares workload ids."""
        ...

    async def confirm(self, key: str, workload_id: str, *, now: float) -> bool:
        """Renew ``workload_id``'s claim on ``key`` (``claimed_at`` := ``now``) by
        compare-and-set, just before its create records its workload: of this and a takeover
        racing it exactly one holds.  ``False`` when ``workload_id`` no longer holds ``key``
        (taken over: its create must not record anything)."""
        ...

    async def release(self, key: str, workload_id: str) -> None:
        """Give ``key`` up if ``workload_id`` holds it (a newer holder keeps it)."""
        ...

    async def expire(self, before: float) -> int:
        """Delete every claim taken (or last renewed) before ``before`` — unless it changed
        meanwhile; how many were deleted."""
        ...


# -- leases ----------------------------------------------------------------------------------
class LeaderLease(Protocol):
    """One holder at a time of one named job (see the module docstring).  ``ttl_s`` is how
    long a holder keeps it without renewing; a holder renews well within it (a third)."""

    @property
    def ttl_s(self) -> float: ...

    async def hold(self, holder: str) -> bool:
        """Take the lease for ``holder`` if nobody holds it, or renew it if ``holder`` does;
        whether ``holder`` holds it now (for ``ttl_s`` from this call).  ``False`` when another
        holder's lease has not expired — including after ``holder`` failed to renew in time
        and another took it.  ``Unavailable`` when the store cannot be asked: the caller
        then acts as if it did not hold it."""
        ...

    async def release(self, holder: str) -> None:
        """Give the lease up if ``holder`` holds it (a stopping service: another takes over at
        once instead of after the TTL); harmless otherwise."""
        ...


# -- images ----------------------------------------------------------------------------------
class ImageLayer(BaseModel):
    id: str
    size: int


class Image(BaseModel):
    """A registered image: its layers (base first), their total size, platform and command."""

    name: str
    platform: str | None = None
    layers: list[ImageLayer]
    size: int
    command: list[str] = []
    created_at: float


class ImageRegistry(Protocol):
    """The API's images, by name."""

    async def add(self, image: Image) -> None:
        """Register ``image`` (replacing one of the same name)."""
        ...

    async def get(self, name: str) -> Image | None: ...

    async def list(self) -> builtins.list[Image]:
        """Every image, by name."""
        ...


# -- routes ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    """Where a workload runs: the node, the reservation it holds there, its spec, and the
    function it is a replica of (``namespace``, ``name``; ``None`` in a route written before
    routes carried it)."""

    workload: str
    node: str
    reservation_id: str | None = None
    spec: Spec | None = None
    placed_at: float = 0.0
    namespace: str | None = None
    name: str | None = None

    @property
    def function(self) -> tuple[str, str] | None:
        """``(namespace, name)``, or ``None`` when the route does not say."""
        if self.namespace is None or self.name is None:
            return None
        return (self.namespace, self.name)


@dataclass(frozen=True)
class RouteEvent:
    """A change :meth:`RouteRegistry.follow` saw: a route stored under ``key`` (``put``), or
    the key deleted (``delete``; ``route`` is ``None`` — a delete carries no value).  ``key``
    is the driver's name for one workload on one node (a delete names only it);
    ``revision`` is the registry's sequence number of the change (0 when unknown)."""

    kind: Literal["put", "delete"]
    key: str
    route: Route | None = None
    revision: int = 0


RouteListener = Callable[[RouteEvent], None]


class RouteWatch(Protocol):
    """A running :meth:`RouteRegistry.follow`, delivering in the registry's order: once it has
    delivered revision ``r`` every change stored before ``r`` has reached its listener too."""

    @property
    def rejected(self) -> int:
        """Stored values skipped as not being routes (0 for a driver that stores typed ones)."""
        ...

    async def reached(self, revision: int, timeout_s: float) -> bool:
        """Wait until the watch has delivered ``revision``; False if ``timeout_s`` passed."""
        ...

    async def stop(self) -> None: ...


class RouteRegistry(Protocol):
    """The routing registry (see the module docstring): one route per workload and node."""

    async def record(
        self,
        workload: str,
        placement: Placement,
        spec: Spec | None = None,
        *,
        function: tuple[str, str] | None = None,
    ) -> int:
        """``workload`` now runs on ``placement.worker_node`` under its reservation, a replica
        of ``function`` (``(namespace, name)``) when given; the route's revision (a later
        record has a higher one)."""
        ...

    async def remove(self, workload: str, node: str, *, revision: int | None = None) -> None:
        """The workload ended (idempotent).  With ``revision`` (from :meth:`on_node`), only
        while the route is still that revision: one stored again since stays."""
        ...

    async def whereis(self, workload: str) -> Route | None:
        """The route of ``workload`` (the latest placed, if on several nodes), or ``None``."""
        ...

    async def list(self, node: str | None = None) -> builtins.list[Route]:
        """Every route (of ``node`` when given), by workload then node."""
        ...

    async def on_node(self, node: str) -> builtins.list[tuple[int, Route]]:
        """Every route of ``node`` with its revision; a route stored before this call began
        is in it."""
        ...

    async def entries(self) -> builtins.list[tuple[int, Route]]:
        """Every route with its revision (what a reconciler's pass compares with the
        records); a route stored before this call began is in it."""
        ...

    async def repair(self, route: Route) -> int | None:
        """Store ``route`` exactly as it is (reservation, spec, function, ``placed_at``) unless
        its key holds a route now — never written, purged, or deleted: what the reconciler
        writes for a workload its record and its node both say runs; its revision, or
        ``None`` when a route is stored (which is never overwritten)."""
        ...

    async def clear_node(self, node: str) -> int:
        """Remove every route of ``node`` one by one (what a node may do of its own); how
        many there were."""
        ...

    async def purge_node(self, node: str) -> int:
        """Remove every route of ``node`` (it left the cluster) at once; how many there were.
        A follower need not see a purge: it learns that the node left from the state store."""
        ...

    async def follow(
        self,
        listener: RouteListener,
        *,
        idle_heartbeat_s: float = FOLLOW_IDLE_HEARTBEAT_S,
        sync_timeout_s: float = FOLLOW_SYNC_TIMEOUT_S,
    ) -> RouteWatch:
        """Call ``listener`` with every route stored now, then with every change as it lands;
        returns once the routes stored now were delivered (or ``sync_timeout_s`` passed).
        ``idle_heartbeat_s`` is how soon a network driver notices a lost feed."""
        ...
