"""The node's authoritative budget: admission, reservations held for an owner's lifetime.

Schedulers decide from stale snapshots; this module is where a decision becomes true or is
refused.  Two kinds of budget per workload (docs/design.md §1.3):

* **hard** (``mem``, ``disk``) — never over-committed by an admission, because overfilling
  memory or disk crashes workloads (workloads re-adopted after an agent restart are reserved
  unchecked — :meth:`NodeBudget.readopt` — since they run whatever the limits say; a budget
  whose limits shrank meanwhile then says so, and admits nothing until it fits again).
  A reservation is taken atomically (check and add under one lock) and is
  held for the lifetime of its *owner*; when the owner ends, exactly what it held is released.
  Under any interleaving of admits, releases and owner deaths, the sum of reservations never
  exceeds ``mem_max`` / ``disk_max``.
* **soft** (``vcpus``, ``disk_bw``, ``net_bw``) — over-committing only slows things down, so
  it is judged against *live* load readings (:class:`LoadReadings`):
  ``cpu_load + vcpus / cpu_capacity <= cpu_max_load``,
  ``disk_bw_load + disk_bw <= disk_bw_ceiling``, ``net_bw_load + net_bw <= net_bw_ceiling``.
  Optionally (the β_max stage) the *reserved* soft sums are bounded too:
  ``Σ reserved β + spec.β <= k_max * total``.

``admit(spec, owner, platforms)`` walks the one table of checks (:data:`berth.checks.CHECKS`
— cordon, platform, hard, β_max, soft, in that order; the snapshot filter walks the same table) on a
*live view* built under the lock — free amounts from the reserved sums, the readings as they
are now — and reserves in the same step, so check and reservation are atomic.  A refusal
raises :class:`Refused` with the failed check's reason code (``platform_mismatch``,
``mem_exhausted``, ``disk_exhausted``, ``*_overcommitted``, ``*_saturated``) and its detail
(``"134217728 B asked, 0 B free"``, ``"load 0.600 + 1/4 cores > 0.800"``).

An *owner* is anything that can say when it has ended — it has ``add_done_callback`` (an
asyncio task or future, a ``concurrent.futures.Future``, a runtime workload handle; an OS
process handle through :func:`process_owner`) — or a :class:`Lease`: an explicit owner
that expires unless renewed or bound to another owner (how a scheduler confirms over the
network before the workload exists).  The budget is safe to use
from threads and from asyncio tasks alike: all state changes happen under one lock, and the
``on_change`` hook (the advertiser) runs after the lock is released.

Every entry point validates its arguments *before* it changes anything — a spec that is not
a ``Spec``, an owner without ``add_done_callback``, a malformed platform or time to live, a
reservation id that is not a string all raise ``Invalid`` and leave the budget exactly as it
was; an owner that fails while being told about its reservation gets the reservation back.
The node core (:mod:`berth.node.core`), which checks the same arguments at its own entry,
and the in-process node client (:mod:`berth.nodeclient.local`, handed a checked
:class:`~berth.boot.AdmitOrder`) call the typed ``_admit`` / ``_admit_leased`` instead, so a
placement's spec and platforms are checked once on the node (a lease still checks its time
to live: that is the lease's own rule).
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Protocol, runtime_checkable

from pydantic import Field, Strict

from berth.checks import CHECKS, HELD_STAGES, Check, Demand, NodeFigures, first_failed
from berth.errors import Invalid
from berth.model import ByteCount, Cores, Fraction, Name, Spec, checked_platforms, required_spec
from berth.ownership import Admission, Clock, Lease, Owner, Refused, has_ended
from berth.platform import Platform
from berth.state import Overcommit
from berth.validation import BerthModel, Rule, shown

__all__ = [
    "IDLE",
    "BudgetLimits",
    "Headroom",
    "LoadReadings",
    "NodeBudget",
    "Reservation",
    "StaticLoad",
]

_INCARNATION: Rule[str] = Rule(Annotated[Name, Field(max_length=32)])


@runtime_checkable
class LoadReadings(Protocol):
    """Live, smoothed load: ``cpu_load`` (busy fraction 0..1), bandwidths in bytes/s."""

    @property
    def cpu_load(self) -> float: ...

    @property
    def disk_bw_load(self) -> float: ...

    @property
    def net_bw_load(self) -> float: ...


@dataclass
class StaticLoad:
    """Readings set by hand (tests, simulation); ``IDLE`` reads zero everywhere."""

    cpu_load: float = 0.0
    disk_bw_load: float = 0.0
    net_bw_load: float = 0.0


@dataclass(frozen=True)
class _Idle:
    cpu_load: float = 0.0
    disk_bw_load: float = 0.0
    net_bw_load: float = 0.0


IDLE: LoadReadings = _Idle()
"""Zero load, shared by every budget built without readings — so it cannot be changed (a
mutable default here let one budget's readings leak into every other)."""


Factor = Annotated[float, Strict(), Field(gt=0, le=1e6, allow_inf_nan=False)]


class BudgetLimits(BerthModel):
    """A node's ceilings, already resolved to numbers (config parsing lives elsewhere).

    Soft ceilings are ``max_load * cap`` (``disk_bw_ceiling = disk_bw_max_load * disk_bw_cap``).
    ``*_overcommit`` are the β_max factors ``k_max``; ``None`` leaves that resource unbounded,
    and the stage is off entirely when all three are ``None``.
    """

    mem_max: ByteCount
    disk_max: ByteCount
    cpu_capacity: Cores
    cpu_max_load: Fraction = 1.0
    disk_bw_cap: ByteCount
    disk_bw_max_load: Fraction = 1.0
    net_bw_cap: ByteCount
    net_bw_max_load: Fraction = 1.0
    cpu_overcommit: Factor | None = None
    disk_bw_overcommit: Factor | None = None
    net_bw_overcommit: Factor | None = None

    @property
    def disk_bw_ceiling(self) -> float:
        return self.disk_bw_max_load * self.disk_bw_cap

    @property
    def net_bw_ceiling(self) -> float:
        return self.net_bw_max_load * self.net_bw_cap

    @property
    def overcommit_enabled(self) -> bool:
        factors = (self.cpu_overcommit, self.disk_bw_overcommit, self.net_bw_overcommit)
        return any(factor is not None for factor in factors)


@dataclass(frozen=True)
class Headroom:
    """Hard headroom now: bytes of memory and disk not reserved."""

    mem_free: int
    disk_free: int


@dataclass(frozen=True)
class Reservation:
    """What one admitted workload holds."""

    id: str
    spec: Spec
    owner: object
    seq: int = 0

    @property
    def admission(self) -> Admission:
        """The reservation as the node-client port reports it (id and admission count)."""
        return Admission(self.id, self.seq)


class NodeBudget:
    """The authoritative hard/soft budget of one node (see the module docstring)."""

    def __init__(
        self,
        limits: BudgetLimits,
        readings: LoadReadings = IDLE,
        *,
        on_change: Callable[[], None] | None = None,
        clock: Clock = time.monotonic,
        platform: Platform | str | None = None,
        checks: Sequence[Check] = CHECKS,
        incarnation: str | None = None,
    ) -> None:
        self.limits = limits
        # Reservation ids are ``r<seq>.<incarnation>``: a node that restarts counts from 1
        # again, and a stale release or bind of the old ``r1`` must not hit the new one.
        self.incarnation = secrets.token_hex(4) if incarnation is None else incarnation
        _INCARNATION(self.incarnation, "incarnation")
        # The fit rule admission enforces (the table the schedulers filter by).
        self.checks = tuple(checks)
        # The platform this node runs; ``None`` (a bare budget in a test) runs anything.
        self.platform = None if platform is None else Platform.parse(platform, field="platform")
        self.readings = readings
        self.clock = clock
        self._listeners: list[Callable[[], None]] = [on_change] if on_change else []
        self._lock = threading.RLock()
        self._reservations: dict[str, Reservation] = {}
        self._leases: dict[str, Lease] = {}
        self._mem_reserved = 0
        self._disk_reserved = 0
        self._vcpus_reserved = 0.0
        self._disk_bw_reserved = 0
        self._net_bw_reserved = 0
        self._admitted = 0  # reservations taken so far: the next one's seq is this + 1
        self._cordoned = False  # node maintenance: no new admissions (the ``cordoned`` check)

    def add_change_listener(self, listener: Callable[[], None]) -> None:
        """Also call ``listener()`` after every change of reservations (e.g. an advertiser)."""
        self._listeners.append(listener)

    @property
    def cordoned(self) -> bool:
        """Whether the node is cordoned: every admission is refused ``cordoned`` (the check of
        :data:`berth.checks.CHECKS`); reservations already held are untouched."""
        return self._cordoned

    def set_cordoned(self, cordoned: bool) -> bool:
        """Cordon (``True``) or uncordon the node; whether that changed anything."""
        if not isinstance(cordoned, bool):
            raise Invalid(f"expected true or false, got {shown(cordoned)}", field="cordoned")
        with self._lock:
            changed, self._cordoned = self._cordoned != cordoned, cordoned
        if changed:
            self._changed()
        return changed

    # -- admission ---------------------------------------------------------------------------
    def admit(self, spec: Spec, owner: Owner, platforms: Sequence[Platform] = ()) -> Reservation:
        """Every check of the table on the live view, then the reservation held for ``owner``.

        ``platforms`` are those the workload's artifact was built for (empty: any); a node
        that runs none of them refuses with ``platform_mismatch``.
        """
        spec, owner = required_spec(spec, "a reservation"), _owner(owner)
        return self._admit(spec, owner, checked_platforms(platforms))

    def _admit(self, spec: Spec, owner: Owner, platforms: tuple[Platform, ...]) -> Reservation:
        """:meth:`admit` on values already checked (the node core's, checked at its entry)."""
        return self._take(spec, owner, Demand.of(spec, platforms), self.checks)

    def reserve(self, spec: Spec, owner: Owner) -> Reservation:
        """Only the checks on what reservations hold (hard and β_max), then the reservation.

        For a caller that has judged platform and load itself; :meth:`admit` is the rule.
        """
        spec, owner = required_spec(spec, "a reservation"), _owner(owner)
        held = tuple(check for check in self.checks if check.stage in HELD_STAGES)
        return self._take(spec, owner, Demand.of(spec), held)

    def _take(
        self, spec: Spec, owner: Owner, demand: Demand, checks: Sequence[Check]
    ) -> Reservation:
        """Judge ``demand`` by ``checks`` on the live view and reserve ``spec``, atomically."""
        self.reap()
        if has_ended(owner):
            raise Refused("owner_ended", "the workload ended before admission")
        with self._lock:
            view = self._view_locked()
            failed = first_failed(view, demand, checks)
            if failed is not None:
                raise Refused(failed.code, failed.detail(view, demand))
            self._admitted += 1
            reservation = Reservation(
                id=f"r{self._admitted}.{self.incarnation}",
                spec=spec,
                owner=owner,
                seq=self._admitted,
            )
            self._hold_locked(reservation)
            if isinstance(owner, Lease):
                self._leases[reservation.id] = owner
        return self._until_done(reservation, owner)

    def readopt(self, spec: Spec, owner: Owner, reservation_id: str | None = None) -> Reservation:
        """Reserve ``spec`` for a workload that already runs (adopted after an agent restart),
        **without any check**: its memory and disk are in use whatever the limits say now, so
        refusing would only hide them.  It keeps ``reservation_id`` (the id it held before the
        restart) unless that is taken or malformed.  When the sum now exceeds the hard limits
        (they shrank meanwhile) the budget is over-committed: :meth:`overcommitted` says by how
        much, and every admission is refused until enough ends.
        """
        spec, owner = required_spec(spec, "a reservation"), _owner(owner)
        with self._lock:
            self._admitted += 1
            if (
                not isinstance(reservation_id, str)
                or not reservation_id
                or reservation_id in self._reservations
            ):
                reservation_id = f"r{self._admitted}.{self.incarnation}"
            reservation = Reservation(reservation_id, spec, owner, seq=self._admitted)
            self._hold_locked(reservation)
        return self._until_done(reservation, owner)

    def _hold_locked(self, reservation: Reservation) -> None:
        """Count ``reservation`` as held (under ``self._lock``; :meth:`release` undoes it)."""
        self._reservations[reservation.id] = reservation
        spec = reservation.spec
        self._mem_reserved += spec.mem
        self._disk_reserved += spec.disk
        self._vcpus_reserved += spec.vcpus
        self._disk_bw_reserved += spec.disk_bw
        self._net_bw_reserved += spec.net_bw

    def _until_done(self, reservation: Reservation, owner: Owner) -> Reservation:
        """``reservation``, just held, released when ``owner`` ends; listeners told."""
        try:
            owner.add_done_callback(lambda _: self.release(reservation.id))
        except BaseException:
            self.release(reservation.id)  # an owner that cannot tell its end holds nothing
            raise
        self._changed()
        return reservation

    def overcommitted(self) -> str | None:
        """What exceeds the hard limits (only readopted workloads can make it so); ``None``
        when the budget holds."""
        with self._lock:
            mem, disk = self._mem_reserved, self._disk_reserved
        limits = self.limits
        if mem <= limits.mem_max and disk <= limits.disk_max:
            return None
        return f"reserved {mem} B mem / {disk} B disk exceeds {limits.mem_max} / {limits.disk_max}"

    def lease(self, ttl_s: float) -> Lease:
        """A new lease on this budget's clock, to admit under before the workload exists."""
        return Lease(ttl_s, self.clock)

    def admit_leased(
        self, spec: Spec, ttl_s: float, platforms: Sequence[Platform] = ()
    ) -> Reservation:
        """``admit`` under a new lease: the confirmation a scheduler makes before the workload
        exists.  :meth:`bind` it to the workload, or :meth:`release` it, within ``ttl_s``
        (positive and finite, else ``Invalid`` naming ``lease_ttl_s``)."""
        return self._admit_leased(
            required_spec(spec, "a reservation"), ttl_s, checked_platforms(platforms)
        )

    def _admit_leased(
        self, spec: Spec, ttl_s: float, platforms: tuple[Platform, ...]
    ) -> Reservation:
        """:meth:`admit_leased` on a spec and platforms already checked (the node core's, an
        order's)."""
        lease = self.lease(ttl_s)
        try:
            return self._take(spec, lease, Demand.of(spec, platforms), self.checks)
        except Refused:
            lease.end()
            raise

    def bind(self, reservation_id: str, owner: Owner) -> None:
        """Tie a leased reservation to ``owner``: it is released when ``owner`` ends.

        Refused with ``lease_expired`` when the reservation is gone or its lease's deadline
        has come (then it is released now, whether or not a reap has run).
        """
        reservation_id, owner = _reservation_id(reservation_id), _owner(owner)
        with self._lock:
            lease = self._leases.get(reservation_id)
        if lease is None:
            raise Refused.lease_expired(reservation_id)
        lease.bind(owner)

    def release(self, reservation_id: str) -> bool:
        """Release a reservation; idempotent (False when it was not held, or when its lease's
        deadline had already come: expiry ended it, whether or not a reap had run)."""
        reservation_id = _reservation_id(reservation_id)
        if self._expire_if_due(reservation_id):
            return False
        with self._lock:
            reservation = self._reservations.pop(reservation_id, None)
            if reservation is None:
                return False
            lease = self._leases.pop(reservation_id, None)
            spec = reservation.spec
            self._mem_reserved -= spec.mem
            self._disk_reserved -= spec.disk
            self._vcpus_reserved -= spec.vcpus
            self._disk_bw_reserved -= spec.disk_bw
            self._net_bw_reserved -= spec.net_bw
            if not self._reservations:
                self._vcpus_reserved = 0.0  # no float drift once empty
        if lease is not None:
            lease.end()
        self._changed()
        return True

    def reap(self) -> int:
        """End every unbound lease whose deadline has come (``now >= deadline``), releasing
        its reservation; how many ended.  Each lease decides under its own lock, so a lease
        bound or renewed meanwhile is left alone (see :class:`~berth.ownership.Lease`)."""
        with self._lock:
            leases = list(self._leases.values())
        return sum(lease.expire_if_due() for lease in leases)

    # -- reading -----------------------------------------------------------------------------
    def headroom(self) -> Headroom:
        """Hard headroom now (after reaping expired leases)."""
        self.reap()
        with self._lock:
            return Headroom(mem_free=self._free_mem(), disk_free=self._free_disk())

    @property
    def admitted(self) -> int:
        """How many reservations this budget has taken so far (snapshots advertise it)."""
        with self._lock:
            return self._admitted

    def reservations(self) -> list[Reservation]:
        with self._lock:
            return list(self._reservations.values())

    def get(self, reservation_id: str) -> Reservation | None:
        reservation_id = _reservation_id(reservation_id)
        with self._lock:
            return self._reservations.get(reservation_id)

    def holds(self, reservation_id: str) -> bool:
        """Whether the reservation is held and alive: one whose lease's deadline has come is
        ended now, reaped or not (the answer a late bind must get)."""
        reservation_id = _reservation_id(reservation_id)
        if self._expire_if_due(reservation_id):
            return False
        with self._lock:
            return reservation_id in self._reservations

    def _expire_if_due(self, reservation_id: str) -> bool:
        # Reaping is lazy; a call about one reservation must not see its lease alive after
        # the deadline (a late bind reviving it, a release reporting it held).
        with self._lock:
            lease = self._leases.get(reservation_id)
        return lease is not None and lease.expire_if_due()

    def overcommit(self) -> Overcommit | None:
        """The β_max stage's reserved sums and ceilings, when configured."""
        with self._lock:
            return self._overcommit_locked()

    # -- internals ---------------------------------------------------------------------------
    def _free_mem(self) -> int:
        return self.limits.mem_max - self._mem_reserved

    def _free_disk(self) -> int:
        return self.limits.disk_max - self._disk_reserved

    def _overcommit_locked(self) -> Overcommit | None:
        limits = self.limits
        if not limits.overcommit_enabled:
            return None
        return Overcommit(
            vcpus_reserved=max(self._vcpus_reserved, 0.0),
            vcpus_ceiling=_ceiling(limits.cpu_overcommit, limits.cpu_capacity),
            disk_bw_reserved=self._disk_bw_reserved,
            disk_bw_ceiling=_ceiling(limits.disk_bw_overcommit, limits.disk_bw_cap),
            net_bw_reserved=self._net_bw_reserved,
            net_bw_ceiling=_ceiling(limits.net_bw_overcommit, limits.net_bw_cap),
        )

    def _view_locked(self) -> NodeFigures:
        """What the checks judge: free amounts and β_max sums now, the readings as they are."""
        limits, load = self.limits, self.readings
        return NodeFigures(
            platform=self.platform,
            mem_free=self._free_mem(),
            disk_free=self._free_disk(),
            cpu_load=load.cpu_load,
            cpu_capacity=limits.cpu_capacity,
            cpu_max_load=limits.cpu_max_load,
            disk_bw_load=load.disk_bw_load,
            disk_bw_ceiling=limits.disk_bw_ceiling,
            net_bw_load=load.net_bw_load,
            net_bw_ceiling=limits.net_bw_ceiling,
            cordoned=self._cordoned,
            oc_vcpus_reserved=max(self._vcpus_reserved, 0.0),
            oc_vcpus_ceiling=_unbounded(_ceiling(limits.cpu_overcommit, limits.cpu_capacity)),
            oc_disk_bw_reserved=self._disk_bw_reserved,
            oc_disk_bw_ceiling=_unbounded(_ceiling(limits.disk_bw_overcommit, limits.disk_bw_cap)),
            oc_net_bw_reserved=self._net_bw_reserved,
            oc_net_bw_ceiling=_unbounded(_ceiling(limits.net_bw_overcommit, limits.net_bw_cap)),
        )

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()


def _owner(owner: object) -> Owner:
    """``owner`` if it can report its end (``add_done_callback``), else ``Invalid``."""
    if not callable(getattr(owner, "add_done_callback", None)):
        raise Invalid(
            f"an owner reports its end through add_done_callback; {shown(owner)} does not",
            field="owner",
        )
    return owner  # type: ignore[return-value]


def _reservation_id(reservation_id: object) -> str:
    if not isinstance(reservation_id, str):
        raise Invalid(
            f"expected a reservation id string, got {shown(reservation_id)}", field="reservation_id"
        )
    return reservation_id


def _ceiling(factor: float | None, total: float) -> float | None:
    """The β_max ceiling ``k_max * total``; ``None`` when the resource is unbounded."""
    return None if factor is None else factor * total


def _unbounded(ceiling: float | None) -> float:
    return math.inf if ceiling is None else ceiling
