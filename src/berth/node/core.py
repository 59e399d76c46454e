"""The node core: one node's budget, layers, running workloads and snapshot — and no I/O.

This module owns what makes a node a node, independent of how time passes or how the node
talks to the cluster:

* the :class:`~berth.node.budget.NodeBudget` (the authority on what the node may hold), the
  :class:`~berth.node.layers.LayerRegistry` (mounted layers, LRU cache of unmounted ones) and
  a :class:`~berth.node.runtime.Runtime`, wired so that **a workload's end releases what it
  held**: its reservation (the budget follows its owner, or the lease bound to it) and its
  layer mounts (into the cache), whatever ended it;
* the running workloads, by id;
* :meth:`NodeCore.snapshot` — the node's :class:`~berth.state.NodeState` at a given time,
  numbered by a generation counter, with ``admitted`` (the budget's admission count, which a
  scheduler's assume cache compares with the ``seq`` of the admissions it made);
* the **one place-and-boot lifecycle**, :meth:`NodeCore.boot`.

Two users drive it.  The node agent (:mod:`berth.node.agent`) adds the I/O: a load monitor,
an advertiser that publishes snapshots on wall-clock heartbeats, the state store.  The
simulator (:mod:`berth.sim.simulator`) adds a simulated clock and load model, and publishes
snapshots when its events say so.  Both therefore run the same wiring and the same lifecycle;
neither re-implements them.

**The lifecycle** — ``boot(spec, layers, boot_spec)``, in this order (a step of
:meth:`NodeCore.boot` each: the checks, ``_mount``, ``_start``, ``_own_or_stop``):

0. *platform* — a node that runs none of the artifact's platforms refuses
   (``platform_mismatch``) before touching anything; it is a static fact, so it costs nothing
   to check first.  So is a cordon: a cordoned node refuses a try-run (``cordoned``) before
   mounting (the budget's admission refuses it too: the check is in the one table).
   With a ``reservation`` the lease must still be held (``lease_expired``).
1. *mount* the image's layers — the workload boots from them, so they come first; each mount
   reports whether it needed a pull (``PULLED`` / ``FROM_CACHE`` / ``ALREADY_MOUNTED``),
   which is what the simulator times pulls from;
2. *start* the workload — a boot failure is the node's refusal (``boot_failed``), after
   unmounting;
3. *admit or bind* — without a reservation (the seed's try-run) the budget admits ``spec``
   owned by the running workload; with one (the port's ``schedule``: a scheduler admitted
   under a lease first) the lease is bound to the workload.  A refusal stops the workload,
   whose end unmounts its layers.

Why admit *after* start: a reservation must be owned by something that can end, and the
workload is that only once it exists.  Admitting (or binding) the started workload means there
is never a reservation without an owner that releases it — the hard budget cannot leak — at
the price of a boot that is sometimes refused and stopped (a lost race against a stale
snapshot: rare, and cheap next to a leak).  On the leased path, any failure also releases the
reservation at once: nothing will ever bind it, and waiting for the lease to expire would
hold memory for nothing.

**Ends are pushed** (issue 20, part 6) once :meth:`NodeCore.push_events` was called (the
agent does when it has an :class:`~berth.events.port.EventSink`): each workload's start (a
boot done, or an adoption after a restart), its end, and each restart under its policy, is
kept as a :class:`~berth.events.port.WorkloadEvent` until
the agent reports that the sink stored it (:meth:`NodeCore.reported`).  With a journal an
ended workload's entry then stays — marked ``ended`` with its status — until its event is
stored, so a node that dies between the end and the report publishes the end again when it
restarts (:meth:`NodeCore.recover`).  Without it an entry goes as soon as the end is
recorded, as before: the API learns of the end by asking (``status``).

A boot may name its workload's id (``workload_id``, the id the API or a scheduler chose):
then it is **idempotent by id** — a retry after a lost answer, or a second caller racing the
first, boots nothing again; it gets the first boot's outcome (see :meth:`NodeCore.boot`).

It is deliberately not an advertiser, a clock, a monitor or a transport, and it never looks
at another node.

Its public methods validate their arguments before touching anything (the name is a
``Name``, labels ``Labels``, a spec a ``Spec``, layers and platforms lists, a time to live
from 1 ms to a year): a malformed call raises ``Invalid`` and mounts, starts or reserves
nothing; so does a stop with a malformed grace.  Past that edge the values are typed, and
the budget is asked through its typed ``_admit`` / ``_admit_leased``, which check nothing
again (a placement's spec and platforms were checked once, here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from berth.boot import BootFailed, BootSpec, WorkloadStatus
from berth.checks import CORDONED, CORDONED_DETAIL
from berth.errors import BerthError, Invalid
from berth.events.port import EventKind, WorkloadEvent
from berth.model import (
    INTERVAL_RULE,
    NAME_RULE,
    Labels,
    Layer,
    RestartPolicy,
    Spec,
    checked_layers,
    checked_platforms,
    checked_spec,
)
from berth.node.budget import NodeBudget
from berth.node.journal import Journal, JournalEntry
from berth.node.layers import LayerRegistry, MountResult
from berth.node.runtime.port import (
    AdoptingRuntime,
    Runtime,
    WorkloadExit,
    WorkloadHandle,
    WorkloadIds,
    checked_grace,
)
from berth.node.runtime.supervisor import alive
from berth.observability import tracing
from berth.ownership import Admission, Owner, Refused, refused_by
from berth.platform import Platform, matches_any
from berth.state import NodeState, running_digest
from berth.validation import Rule, shown

__all__ = ["ENDED_MEMORY", "Booted", "NodeCore", "Recovery"]

log = logging.getLogger("berth.node")

ENDED_MEMORY = 4096
"""How many ended workloads a node remembers (with how each ended) for status queries."""


@dataclass(frozen=True)
class Booted:
    """A booted workload: the workload, the reservation it owns, and what each mount did.

    ``mounts`` are in the order of the request's layers; a layer with outcome ``PULLED`` was
    on this node neither mounted nor cached.
    """

    workload: WorkloadHandle
    admission: Admission
    mounts: tuple[MountResult, ...]

    @property
    def pulled_bytes(self) -> int:
        """Bytes of the layers that had to be pulled."""
        return sum(mount.pulled_bytes for mount in self.mounts)


@dataclass
class Recovery:
    """What :meth:`NodeCore.recover` found: the workloads adopted, those whose end it
    recorded, the journal files it could not read, and the over-commit, if any."""

    adopted: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    unreadable: tuple[str, ...] = ()
    overcommitted: str | None = None

    def __str__(self) -> str:
        text = f"{len(self.adopted)} adopted, {len(self.ended)} ended"
        if self.unreadable:
            text += f", {len(self.unreadable)} unreadable"
        return text + (f", over-committed: {self.overcommitted}" if self.overcommitted else "")


class _Life:
    """The owner of a restartable workload's reservation, across all its runs: it ends once,
    when the workload's last run has ended (a stop, ``never``, restarts exhausted) — so the
    reservation is never free between two runs, for another admission to take."""

    def __init__(self) -> None:
        self.done = False
        self._callbacks: list[Callable[[_Life], object]] = []

    def add_done_callback(self, fn: Callable[[_Life], object], /) -> None:
        if self.done:
            fn(self)
        else:
            self._callbacks.append(fn)

    def end(self) -> None:
        if self.done:
            return
        self.done = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("a done callback of a workload's life failed")


@dataclass
class _Running:
    """A workload this node runs: its handle (its current run's), the layers it holds, its
    completed boot (set once it owns its reservation); with a restart policy, the owner of
    its reservation across runs (``life``), its boot spec and journal entry (to start it
    again), the times of its restarts within the policy's interval, the end of its last run
    and the pending restart."""

    workload: WorkloadHandle
    layer_ids: tuple[str, ...]
    booted: Booted | None = None
    life: _Life | None = None
    boot: BootSpec | None = None
    entry: JournalEntry | None = None
    restarts: int = 0
    restarted_at: list[float] = field(default_factory=list)
    last_exit: WorkloadExit | None = None
    restarting: asyncio.Task[None] | None = None
    stopping: bool = False


@dataclass
class _Ended:
    """How a workload ended, and its boot if it completed (a repeat of its id returns it)."""

    status: WorkloadStatus
    booted: Booted | None


class NodeCore:
    """One node's state and lifecycle without I/O (see the module docstring).

    ``platform`` is the platform the node runs; the budget's is set to it (or must equal it).
    ``labels`` are advertised in every snapshot.
    """

    def __init__(
        self,
        name: str,
        platform: Platform | str,
        budget: NodeBudget,
        runtime: Runtime,
        *,
        layers: LayerRegistry | None = None,
        labels: dict[str, str] | None = None,
        journal: Journal | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        name = NAME_RULE(name, "name")
        if journal is not None and not isinstance(journal, Journal):
            raise Invalid(f"expected a Journal, got {shown(journal)}", field="journal")
        labels = _LABELS(labels or {}, "labels")
        if not isinstance(budget, NodeBudget):
            raise Invalid(f"expected a NodeBudget, got {shown(budget)}", field="budget")
        if layers is not None and not isinstance(layers, LayerRegistry):
            raise Invalid(f"expected a LayerRegistry, got {shown(layers)}", field="layers")
        for method in ("start", "stop"):
            if not callable(getattr(runtime, method, None)):
                raise Invalid(f"{shown(runtime)} has no {method}() method", field="runtime")
        self.name = name
        self.platform = Platform.parse(platform)
        if budget.platform is None:
            budget.platform = self.platform
        elif budget.platform != self.platform:
            raise Invalid(
                f"the budget is for {budget.platform}, the node runs {self.platform}",
                field="platform",
            )
        self.budget = budget
        self.runtime = runtime
        self.layers = layers if layers is not None else LayerRegistry()
        self.labels = dict(labels or {})
        self.end_errors: list[str] = []
        """Bookkeeping errors met when a workload ended (a runtime only logs a failing
        callback, so they are kept here for :meth:`problems` to report)."""
        self._running: dict[str, _Running] = {}
        self._booting: dict[str, asyncio.Future[Booted]] = {}
        self._ended_recently: OrderedDict[str, _Ended] = OrderedDict()
        self._generation = 0
        self._generation_lock = threading.Lock()
        self.journal = journal
        self._ids = WorkloadIds()  # with a journal, ids are chosen here, before the start
        self._clock, self._sleep = clock, sleep  # a restart's backoff and attempt window
        self._wall_clock = wall_clock  # when an event happened, as the API reads it
        self._outbox: OrderedDict[tuple[str, EventKind], WorkloadEvent] | None = None
        """Starts, ends and restarts not yet reported stored (``None``: events are not pushed)."""
        self._event_listeners: list[Callable[[], None]] = []

    def add_change_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every change of reservations or of mounted/cached layers."""
        self.budget.add_change_listener(listener)
        self.layers.add_change_listener(listener)

    # -- events: starts, ends and restarts pushed------------------------------------------------
    def push_events(self) -> None:
        """Keep each start, end and restart as an event until :meth:`reported` (see the module
        docstring).  Called before :meth:`recover`, so ends found there are pushed too."""
        if self._outbox is None:
            self._outbox = OrderedDict()

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
        ended = event.kind == "ended" and event.workload_id not in self._running
        if ended and self.journal is not None:
            self._unjournal(event.workload_id)

    def _emit(
        self, workload_id: str, status: WorkloadStatus, kind: EventKind | None = None
    ) -> None:
        if self._outbox is None:
            return
        event = WorkloadEvent.of(self.name, workload_id, status, self._wall_clock(), kind)
        slot = (workload_id, event.kind)
        self._outbox.pop(slot, None)  # a newer restart replaces an older one: it says more
        self._outbox[slot] = event
        for listener in self._event_listeners:
            listener()

    def _journal_end(self, workload_id: str, status: WorkloadStatus) -> None:
        """Record ``status`` as the end of ``workload_id``: its journal entry goes now, or —
        events pushed — is marked ended and goes once the end's event is stored."""
        if self.journal is None:
            return
        if self._outbox is None:
            self._unjournal(workload_id)
            return
        try:
            self.journal.mark_ended(workload_id, status.to_dict())
        except OSError as error:
            self.end_errors.append(f"workload {workload_id}: journal entry not marked: {error}")
            log.error("node %s: marking %s ended in the journal: %s", self.name, workload_id, error)

    # -- the lifecycle -----------------------------------------------------------------------
    async def boot(
        self,
        spec: Spec,
        layers: Sequence[Layer],
        boot: BootSpec,
        *,
        reservation: str | None = None,
        platforms: Sequence[Platform] = (),
        workload_id: str | None = None,
    ) -> Booted:
        """Mount, start, then admit owned by the workload — or bind ``reservation`` to it.

        Raises ``Refused`` naming this node (``platform_mismatch``, ``lease_expired``,
        ``boot_failed``, ``mem_exhausted`` …); nothing is left mounted, running or reserved
        by a refused boot.  ``boot.mem_limit``, ``vcpus`` and ``disk_limit`` default to the
        spec's ``mem``, ``vcpus`` and ``disk``.

        ``workload_id`` (a ``Name``) is the id the caller chose; the runtime generates one
        without it.  A boot is **idempotent by id**: with the id of a workload this node runs,
        or ran (and still remembers how it ended), nothing is booted or reserved again — that
        boot's :class:`Booted` is returned (a ``reservation`` other than the one it holds is
        released: nothing will bind it); with the id of a boot in progress, the call awaits
        that boot's outcome (its ``Booted`` or its refusal).  A boot that was refused leaves
        nothing to be idempotent about: the id may be booted again.
        """
        spec, layers, platforms = _spec(spec), checked_layers(layers), checked_platforms(platforms)
        boot, reservation = _boot_spec(boot), _reservation(reservation)
        if workload_id is None:
            return await self._boot(spec, layers, boot, reservation, platforms, None)
        workload_id = NAME_RULE(workload_id, "workload_id")
        while True:
            booting = self._booting.get(workload_id)
            if booting is None:
                break
            await asyncio.wait({booting})  # our own cancellation raises; the boot's does not
            if not booting.cancelled():  # else the first caller gave up: boot it ourselves
                return self._again(booting.result(), reservation)
        done = self._booted(workload_id)
        if done is not None:
            return self._again(done, reservation)
        future: asyncio.Future[Booted] = asyncio.get_running_loop().create_future()
        self._booting[workload_id] = future
        try:
            booted = await self._boot(spec, layers, boot, reservation, platforms, workload_id)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        else:
            future.set_result(booted)
        finally:
            del self._booting[workload_id]
        return booted

    def _booted(self, workload_id: str) -> Booted | None:
        """The completed boot of ``workload_id``, running or ended, if this node knows one."""
        running = self._running.get(workload_id)
        if running is not None:
            return running.booted
        ended = self._ended_recently.get(workload_id)
        return None if ended is None else ended.booted

    def _again(self, booted: Booted, reservation: str | None) -> Booted:
        """A repeated boot's answer: ``booted``, with a reservation it does not hold released."""
        if reservation is not None and reservation != booted.admission.reservation_id:
            self.budget.release(reservation)
        log.info("node %s: run of %s repeated, nothing booted", self.name, booted.workload.id)
        return booted

    async def _boot(
        self,
        spec: Spec,
        layers: tuple[Layer, ...],
        boot: BootSpec,
        reservation: str | None,
        platforms: tuple[Platform, ...],
        workload_id: str | None,
    ) -> Booted:
        """The lifecycle proper, on checked values (see the module docstring)."""
        attributes = {"berth.node": self.name, "berth.leased": reservation is not None}
        with refused_by(self.name), tracing.span("berth.node.boot", attributes=attributes) as span:
            self._check_platforms(platforms)
            if reservation is None and self.budget.cordoned:  # before mounting anything
                raise Refused(CORDONED.code, CORDONED_DETAIL)
            if reservation is not None and not self.budget.holds(reservation):
                raise Refused.lease_expired(reservation)
            mounts = self._mount(layers)
            layer_ids = tuple(mount.layer_id for mount in mounts)
            boot = _limited(boot, spec)
            entry = self._journal_before_start(spec, layers, boot, reservation, workload_id)
            if entry is not None:
                workload_id = entry.workload_id
            workload = await self._start(boot, layer_ids, reservation, workload_id)
            span.set_attribute("berth.workload", workload.id)
            self._restartable(workload, boot, entry)
            workload.add_done_callback(lambda ended: self._ended(ended, layer_ids))
            admission = await self._own_or_stop(spec, workload, reservation, platforms)
        if entry is not None:
            self._journal_started(entry, workload, admission)
        booted = Booted(workload, admission, mounts)
        running = self._running.get(workload.id)
        if running is not None and running.workload is workload:
            running.booted = booted
            self._emit(workload.id, self.status(workload.id), "started")
        else:  # it ended already: remember the run, so a repeat of its id boots nothing
            ended = self._ended_recently.get(workload.id)
            if ended is not None:
                ended.booted = booted
        return booted

    # -- the journal: written before a start, removed after the end is recorded -------------
    def _journal_before_start(
        self,
        spec: Spec,
        layers: tuple[Layer, ...],
        boot: BootSpec,
        reservation: str | None,
        workload_id: str | None,
    ) -> JournalEntry | None:
        """Record the workload in the journal (if any) before it starts, choosing its id when
        the caller did not; a journal that cannot be written refuses the boot
        (``journal_failed``), after unmounting and releasing ``reservation``."""
        if self.journal is None:
            return None
        if workload_id is None:
            workload_id = self._ids.next(boot, self._known_ids())
        entry = JournalEntry(
            workload_id=workload_id,
            spec=spec,
            layers=layers,
            boot=boot,
            runtime=_runtime_kind(self.runtime),
            reservation=reservation,
        )
        try:
            self.journal.record(entry)
        except OSError as error:
            self._unmount(tuple(layer.id for layer in layers))
            if reservation is not None:
                self.budget.release(reservation)
            raise Refused("journal_failed", f"cannot write the journal: {error}") from None
        return entry

    def _journal_started(
        self, entry: JournalEntry, workload: WorkloadHandle, admission: Admission
    ) -> None:
        """Add how to find the started workload again, and the reservation it owns."""
        assert self.journal is not None
        if workload.done:
            return  # its end has been recorded and its entry removed
        update = {"locator": workload.locator, "reservation": admission.reservation_id}
        try:
            self.journal.record(entry.model_copy(update=update))
        except OSError as error:  # the entry written before the start still names it
            log.error("node %s: journal update of %s failed: %s", self.name, workload.id, error)

    def _unjournal(self, workload_id: str) -> None:
        assert self.journal is not None
        try:
            self.journal.remove(workload_id)
        except OSError as error:
            self.end_errors.append(f"workload {workload_id}: journal entry not removed: {error}")
            log.error(
                "node %s: removing the journal entry of %s: %s", self.name, workload_id, error
            )

    def _known_ids(self) -> set[str]:
        """Every id a new workload must not take: running, booting, remembered as ended."""
        return self._running.keys() | self._booting.keys() | self._ended_recently.keys()

    def _check_platforms(self, platforms: Sequence[Platform]) -> None:
        if not matches_any(self.platform, platforms):
            wanted = ", ".join(str(platform) for platform in platforms)
            raise Refused("platform_mismatch", f"node runs {self.platform}, asked for {wanted}")

    def _mount(self, layers: Sequence[Layer]) -> tuple[MountResult, ...]:
        mounts: list[MountResult] = []
        try:
            for layer in layers:
                mounts.append(self.layers.mount(layer.id, layer.size))
        except BaseException:
            self._unmount(tuple(mount.layer_id for mount in mounts))
            raise
        return tuple(mounts)

    async def _start(
        self,
        boot: BootSpec,
        layer_ids: tuple[str, ...],
        reservation: str | None,
        workload_id: str | None,
    ) -> WorkloadHandle:
        """Start the workload and count it running.  A failed start unmounts its layers and
        releases ``reservation`` (nothing will bind it); a ``BootFailed`` is this node's
        refusal, ``boot_failed``."""
        try:
            if workload_id is None:  # a runtime written before ids were the caller's works too
                workload = await self.runtime.start(boot)
            else:
                workload = await self.runtime.start(boot, workload_id=workload_id)
        except BaseException as error:
            if self.journal is not None and workload_id is not None:
                self._unjournal(workload_id)
            self._unmount(layer_ids)
            if reservation is not None:
                self.budget.release(reservation)
            if isinstance(error, BootFailed):
                raise Refused("boot_failed", error.reason) from None
            raise
        self._running[workload.id] = _Running(workload, layer_ids)
        return workload

    async def _own_or_stop(
        self,
        spec: Spec,
        workload: WorkloadHandle,
        reservation: str | None,
        platforms: tuple[Platform, ...],
    ) -> Admission:
        """:meth:`_own`; when it fails, the workload is stopped (its end unmounts its layers)
        and ``reservation`` released, and the failure raised."""
        try:
            return self._own(spec, workload, reservation, platforms)
        except BaseException as error:
            reason = getattr(error, "reason", type(error).__name__)
            log.info("node %s refused %s after boot: %s", self.name, workload.id, reason)
            await self.stop(workload.id)  # a restart it may have pending is cancelled too
            if reservation is not None:
                self.budget.release(reservation)
            raise

    def _own(
        self,
        spec: Spec,
        workload: WorkloadHandle,
        reservation: str | None,
        platforms: tuple[Platform, ...],
    ) -> Admission:
        """The reservation ``workload`` now owns: admitted for it, or the lease bound to it
        (owned by its life across restarts when it has a restart policy)."""
        owner = self._owner(workload)
        if reservation is None:
            return self.budget._admit(spec, owner, platforms).admission
        held = self.budget.get(reservation)
        if held is None:
            raise Refused.lease_expired(reservation)
        self.budget.bind(reservation, owner)
        return held.admission

    def _owner(self, workload: WorkloadHandle) -> Owner:
        """What owns ``workload``'s reservation: its life when it may restart, else itself."""
        running = self._running.get(workload.id)
        if running is not None and running.life is not None:
            return running.life
        return workload

    def _ended(self, workload: WorkloadHandle, layer_ids: tuple[str, ...]) -> None:
        # The reservation is released by the budget itself (it follows its owner); the layers
        # are ours to unmount.  A run its restart policy restarts ends nothing of that.
        running = self._running.get(workload.id)
        exhausted = False
        if running is not None and running.workload is workload and running.boot is not None:
            if self._restart_later(running, workload):
                return
            exhausted = running.restarting is None and self._exhausted(running, workload)
        ended = workload.exit
        reason = None if ended is None else ended.reason
        if exhausted and running is not None and running.boot is not None:
            policy = running.boot.restart
            assert policy is not None
            reason = f"restarts exhausted ({policy.attempts} in {policy.interval_s:g}s): {reason}"
        status = WorkloadStatus(
            "ended",
            None if ended is None else ended.code,
            reason,
            ended is not None and ended.stopped,
            0 if running is None else running.restarts,
            exhausted,
        )
        self._finish(workload.id, status, layer_ids)

    def _finish(self, workload_id: str, status: WorkloadStatus, layer_ids: tuple[str, ...]) -> None:
        """Record a workload's last end: forget it as running, remember ``status``, remove its
        journal entry, unmount its layers, end its life (its reservation with it)."""
        running = self._running.pop(workload_id, None)
        if running is None:
            self.end_errors.append(f"unknown workload {workload_id} ended")
        self._ended_recently[workload_id] = _Ended(
            status, None if running is None else running.booted
        )
        while len(self._ended_recently) > ENDED_MEMORY:
            self._ended_recently.popitem(last=False)
        self._journal_end(workload_id, status)
        self._emit(workload_id, status)
        try:
            self._unmount(layer_ids)
        except BerthError as error:
            self.end_errors.append(f"workload {workload_id}: {error}")
            log.error("node %s: unmounting after %s ended: %s", self.name, workload_id, error)
        if running is not None and running.life is not None:
            running.life.end()
        log.info("workload %s on %s ended: %s", workload_id, self.name, status.reason)

    # -- restarts: the same id, reservation and layers, after a backoff ----------------------
    def _restartable(
        self, workload: WorkloadHandle, boot: BootSpec, entry: JournalEntry | None
    ) -> None:
        """Give a started workload whose boot asks for restarts what it needs for them."""
        running = self._running.get(workload.id)
        if running is None or boot.restart is None or boot.restart.mode == "never":
            return
        running.life, running.boot, running.entry = _Life(), boot, entry

    def _window(self, running: _Running, policy: RestartPolicy) -> list[float]:
        """The times of ``running``'s restarts within the policy's interval, up to now."""
        now = self._clock()
        running.restarted_at = [at for at in running.restarted_at if now - at < policy.interval_s]
        return running.restarted_at

    def _exhausted(self, running: _Running, workload: WorkloadHandle) -> bool:
        """Whether the end of ``workload`` called for a restart its policy had no attempt
        left for."""
        policy, ended = None if running.boot is None else running.boot.restart, workload.exit
        if policy is None or ended is None or running.stopping:
            return False
        if not policy.restarts_after(ended.code, ended.stopped):
            return False
        return len(self._window(running, policy)) >= policy.attempts

    def _restart_later(self, running: _Running, workload: WorkloadHandle) -> bool:
        """Schedule the restart of ``workload``'s id if its end and its policy call for one
        (after ``min(delay · 2^k, max_delay)``, ``k`` the restarts within the interval).
        Whether one is scheduled."""
        policy, ended = None if running.boot is None else running.boot.restart, workload.exit
        if policy is None or ended is None or running.stopping:
            return False
        if not policy.restarts_after(ended.code, ended.stopped):
            return False
        window = self._window(running, policy)
        if len(window) >= policy.attempts:
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # ended outside any event loop: nothing can restart it
            return False
        delay = policy.delay(len(window))
        window.append(self._clock() + delay)
        running.last_exit = ended
        running.restarting = loop.create_task(
            self._restart(running, delay), name=f"berth-restart-{workload.id}"
        )
        log.info(
            "node %s: %s %s; restart %d in %.3gs",
            self.name,
            workload.id,
            ended.reason,
            running.restarts + 1,
            delay,
        )
        return True

    async def _restart(self, running: _Running, delay: float) -> None:
        """Wait ``delay``, then start the workload again under its id; a stop meanwhile
        (the task cancelled) or a failed start ends it for good."""
        workload_id, last = running.workload.id, running.last_exit
        assert running.boot is not None and last is not None
        try:
            await self._sleep(delay)
            if self.journal is not None:
                self.journal.forget_exit(workload_id)  # the last run's: not the next one's
            workload = await self.runtime.start(running.boot, workload_id=workload_id)
        except asyncio.CancelledError:
            reason = f"stopped while waiting to restart (last run {last.reason})"
            self._finish(
                workload_id,
                WorkloadStatus("ended", last.code, reason, True, running.restarts),
                running.layer_ids,
            )
            raise
        except Exception as error:
            why = error.reason if isinstance(error, BootFailed) else str(error)
            reason = f"restart failed: {why} (last run {last.reason})"
            self._finish(
                workload_id,
                WorkloadStatus("ended", last.code, reason, False, running.restarts),
                running.layer_ids,
            )
            return
        running.workload, running.restarting = workload, None
        running.restarts += 1
        if running.booted is not None:
            running.booted = Booted(workload, running.booted.admission, running.booted.mounts)
        layer_ids = running.layer_ids
        workload.add_done_callback(lambda ended: self._ended(ended, layer_ids))
        if running.entry is not None and running.booted is not None and self.journal is not None:
            entry = running.entry.model_copy(update={"restarts": running.restarts})
            self._journal_started(entry, workload, running.booted.admission)
        log.info("node %s restarted %s (restart %d)", self.name, workload_id, running.restarts)
        self._emit(workload_id, self.status(workload_id))
        if running.stopping:  # a stop came while it was starting
            await self.runtime.stop(workload_id)

    def _unmount(self, layer_ids: Sequence[str]) -> None:
        for layer_id in layer_ids:
            self.layers.unmount(layer_id)

    # -- a restart: the journal reconciled with the host ------------------------------------
    async def recover(self) -> Recovery:
        """Reconcile the journal with the host, before this node admits anything: each entry's
        workload is **adopted** if it still runs (the runtime watches it again, its layers are
        mounted, its spec re-reserved under its old reservation id — unchecked, even past
        limits that shrank: :meth:`~berth.node.budget.NodeBudget.readopt`), else its **end is
        recorded** (the supervisor's exit status when it wrote one, else "ended while the
        agent was down, status unknown"; a runtime that cannot adopt — microVM, fake — has its
        workloads killed and ended as "not adoptable") and its entry removed.  Without a
        journal there is nothing to do."""
        if self.journal is None:
            return Recovery()
        entries, unreadable = self.journal.read()
        recovery = Recovery(unreadable=tuple(str(problem) for problem in unreadable))
        for entry in entries:
            if entry.ended is not None:  # it ended before: its end not yet reported stored
                self._ended_before(entry)
                recovery.ended.append(entry.workload_id)
            elif self._readopt(entry):
                recovery.adopted.append(entry.workload_id)
            else:
                recovery.ended.append(entry.workload_id)
        self._ids.skip_past(entry.workload_id for entry in entries)
        over = self.budget.overcommitted()
        if over is not None:
            recovery.overcommitted = over
            log.warning("node %s is over-committed after its restart: %s", self.name, over)
        log.info("node %s recovered its journal: %s", self.name, recovery)
        return recovery

    def _ended_before(self, entry: JournalEntry) -> None:
        """An entry marked ended: remember how, and push its end again (or forget it)."""
        try:
            status = WorkloadStatus.from_dict(entry.ended)
        except Invalid as error:
            status = WorkloadStatus(
                "ended", None, f"ended; its recorded status is unreadable: {error}"
            )
        self._ended_recently[entry.workload_id] = _Ended(status, None)
        if self._outbox is None:
            self._unjournal(entry.workload_id)
        else:
            self._emit(entry.workload_id, status)

    def _readopt(self, entry: JournalEntry) -> bool:
        """Adopt ``entry``'s workload if it runs; else record its end.  Whether adopted."""
        runtime, workload_id = self.runtime, entry.workload_id
        adoptable = isinstance(runtime, AdoptingRuntime) and entry.runtime == _runtime_kind(runtime)
        handle = None
        if adoptable and isinstance(runtime, AdoptingRuntime):
            handle = runtime.adopt(workload_id, entry.boot, entry.locator)
        if handle is None:
            self._record_lost(entry, adoptable)
            return False
        mounts = tuple(self.layers.mount(layer.id, layer.size) for layer in entry.layers)
        layer_ids = tuple(mount.layer_id for mount in mounts)
        running = self._running[workload_id] = _Running(handle, layer_ids)
        self._restartable(handle, entry.boot, entry)
        running.restarts = entry.restarts
        handle.add_done_callback(lambda ended: self._ended(ended, layer_ids))
        held = self.budget.readopt(entry.spec, self._owner(handle), entry.reservation)
        running.booted = Booted(handle, held.admission, mounts)
        if not handle.done:
            self._journal_started(entry, handle, held.admission)
            self._emit(workload_id, self.status(workload_id), "started")  # its boot's may be lost
        log.info("node %s adopted %s (reservation %s)", self.name, workload_id, held.id)
        return True

    def _record_lost(self, entry: JournalEntry, adoptable: bool) -> None:
        """Record how a journaled workload that is not adopted ended, and forget its entry."""
        assert self.journal is not None
        runtime, workload_id = self.runtime, entry.workload_id
        if adoptable and isinstance(runtime, AdoptingRuntime):
            record = runtime.ended(workload_id, entry.locator)
            status = _lost_status(record)
        else:
            status = WorkloadStatus(
                "ended",
                None,
                f"not adoptable: the {entry.runtime} runtime does not outlive "
                "its agent; it was killed at the agent's restart",
            )
            if isinstance(runtime, AdoptingRuntime):
                runtime.abandon(workload_id, entry.locator)
            _kill_by_locator(entry.locator)
        self._ended_recently[workload_id] = _Ended(status, None)
        self._journal_end(workload_id, status)
        self._emit(workload_id, status)
        log.info(
            "node %s: %s ended while its agent was down: %s", self.name, workload_id, status.reason
        )

    # -- admission without a boot (the node client port) -------------------------------------
    def admit(
        self, spec: Spec, lease_ttl_s: float, platforms: Sequence[Platform] = ()
    ) -> Admission:
        """Reserve under a lease (the port's ``schedule`` confirmation)."""
        spec, platforms = _spec(spec), checked_platforms(platforms)
        lease_ttl_s = INTERVAL_RULE(lease_ttl_s, "lease_ttl_s")
        with refused_by(self.name):
            return self.budget._admit_leased(spec, lease_ttl_s, platforms).admission

    def bind(self, reservation_id: str, owner: Owner | str) -> None:
        """Tie a leased reservation to a workload (by id on this node, or an owner object).

        A lease past its deadline is refused ``lease_expired`` (the budget ends it then).
        """
        if not isinstance(reservation_id, str):
            raise Invalid(
                f"expected a reservation id, got {shown(reservation_id)}", field="reservation_id"
            )
        if not isinstance(owner, str) and not callable(getattr(owner, "add_done_callback", None)):
            raise Invalid(f"expected a workload id or an owner, got {shown(owner)}", field="owner")
        with refused_by(self.name):
            if isinstance(owner, str):
                if not self.budget.holds(reservation_id):  # say the likelier thing first
                    raise Refused.lease_expired(reservation_id)
                running = self._running.get(owner)
                if running is None:
                    raise Refused("unknown_workload", f"no workload {owner!r}")
                owner = self._owner(running.workload)  # its life, when it restarts
            self.budget.bind(reservation_id, owner)

    def release(self, reservation_id: str) -> bool:
        """Release a reservation; idempotent (False when it was not held, or already expired)."""
        return self.budget.release(reservation_id)

    # -- workloads ---------------------------------------------------------------------------
    async def stop(self, workload_id: str, *, grace_s: float | None = None) -> None:
        """Stop a workload: the graceful signal, the kill after ``grace_s`` (``None``: the
        runtime's configured grace); unknown or already stopped ids are harmless.  A malformed
        ``grace_s`` (:func:`~berth.node.runtime.port.checked_grace`) is ``Invalid`` and stops
        nothing.  A stop is never followed by a restart: one waiting for its backoff is
        cancelled (the workload ends ``stopped``)."""
        grace_s = checked_grace(grace_s)
        running = self._running.get(workload_id)
        if running is not None:
            running.stopping = True
            restarting = running.restarting
            if restarting is not None and not restarting.done():
                restarting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await restarting
                if self._running.get(workload_id) is not running:
                    return
        await self.runtime.stop(workload_id, grace_s=grace_s)

    async def stop_all(self) -> None:
        """Stop every running workload (each end releases what it held)."""
        for workload_id in list(self._running):
            await self.stop(workload_id)

    def workloads(self) -> dict[str, WorkloadHandle]:
        """The running workloads by id."""
        return {workload_id: entry.workload for workload_id, entry in self._running.items()}

    def status(self, workload_id: str) -> WorkloadStatus:
        """Whether ``workload_id`` runs here, ended (and how), or is unknown to this node."""
        running = self._running.get(workload_id)
        if running is not None:  # waiting to restart counts as running: it holds its place
            last = running.last_exit
            if last is None:
                return WorkloadStatus("running", restarts=running.restarts)
            return WorkloadStatus("running", last.code, last.reason, False, running.restarts)
        ended = self._ended_recently.get(workload_id)
        return WorkloadStatus("unknown") if ended is None else ended.status

    # -- node maintenance ----------------------------------------------------------------------
    @property
    def cordoned(self) -> bool:
        """Whether the node is cordoned (no new admissions; see :meth:`cordon`)."""
        return self.budget.cordoned

    def cordon(self, cordoned: bool = True) -> bool:
        """Cordon the node (``False``: uncordon): admission then refuses every new workload
        (``cordoned``) and snapshots say so; running workloads go on.  Whether it changed."""
        return self.budget.set_cordoned(cordoned)

    def workload_layers(self) -> dict[str, tuple[str, ...]]:
        """The layer ids each running workload holds mounted, by workload id."""
        return {workload_id: entry.layer_ids for workload_id, entry in self._running.items()}

    # -- the snapshot ------------------------------------------------------------------------
    def snapshot(self, now: float, *, reporting: bool = True) -> NodeState:
        """This node's state at ``now`` (the caller's clock), with the next generation number,
        and the digest of what it runs (``reporting``; else none: the agent's ``running``
        report is refused while it reconciles its journal).

        Loads are read from the budget's readings, clamped to the snapshot's ranges
        (``cpu_load`` to 0..1, bandwidths to ≥ 0): a monitor may briefly over- or undershoot.
        """
        headroom = self.budget.headroom()
        limits, load = self.budget.limits, self.budget.readings
        with self._generation_lock:
            self._generation += 1
            generation = self._generation
        return NodeState(
            node=self.name,
            platform=self.platform,
            generation=generation,
            admitted=self.budget.admitted,
            published_at=now,
            labels=self.labels,
            mem_free=max(headroom.mem_free, 0),  # over-committed by readopted workloads: full
            disk_free=max(headroom.disk_free, 0),
            mem_max=limits.mem_max,
            disk_max=limits.disk_max,
            cpu_load=min(max(load.cpu_load, 0.0), 1.0),
            cpu_capacity=limits.cpu_capacity,
            cpu_max_load=limits.cpu_max_load,
            disk_bw_load=max(load.disk_bw_load, 0.0),
            disk_bw_ceiling=limits.disk_bw_ceiling,
            net_bw_load=max(load.net_bw_load, 0.0),
            net_bw_ceiling=limits.net_bw_ceiling,
            layers=self.layers.mounted(),
            cached_layers=self.layers.cached(),
            overcommit=self.budget.overcommit(),
            cordoned=self.budget.cordoned,
            running_digest=running_digest(self._running) if reporting else None,
        )

    @property
    def generation(self) -> int:
        """The generation of the last snapshot taken (0 before the first)."""
        with self._generation_lock:
            return self._generation

    # -- self-checks -------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """What is wrong with this node's bookkeeping; empty when it is sound.

        The hard budget holds (reserved ``mem``/``disk`` within the limits, headroom equal to
        limits minus reservations), the mounted layers are exactly those of the running
        workloads, the layer cache is within its budget, and no workload's end went wrong.
        (Whether every reservation has a workload is the caller's to judge: an unbound lease
        legitimately has none.)
        """
        found: list[str] = []
        limits = self.budget.limits
        reservations = self.budget.reservations()
        mem = sum(reservation.spec.mem for reservation in reservations)
        disk = sum(reservation.spec.disk for reservation in reservations)
        if mem > limits.mem_max or disk > limits.disk_max:
            found.append(
                f"reserved {mem} B mem / {disk} B disk exceeds {limits.mem_max} / {limits.disk_max}"
            )
        headroom = self.budget.headroom()
        expected = (limits.mem_max - mem, limits.disk_max - disk)
        if (headroom.mem_free, headroom.disk_free) != expected:
            found.append(f"headroom {headroom} disagrees with reservations")
        used = {layer_id for entry in self._running.values() for layer_id in entry.layer_ids}
        if used != set(self.layers.mounted()):
            found.append("mounted layers differ from running workloads'")
        if self.layers.cached_bytes > self.layers.cache_budget_bytes:
            found.append("layer cache over its budget")
        found.extend(self.end_errors)
        return found

    def __repr__(self) -> str:
        return f"NodeCore({self.name!r}, {self.platform}, {len(self._running)} workloads)"


_LABELS: Rule[dict[str, str]] = Rule(Labels)


def _spec(spec: object) -> Spec:
    checked = checked_spec(spec)
    if checked is None:
        raise Invalid("a workload needs its resources, got None", field="spec")
    return checked


def _boot_spec(boot: object) -> BootSpec:
    if not isinstance(boot, BootSpec):
        raise Invalid(f"expected a BootSpec, got {shown(boot)}", field="boot")
    return boot


def _reservation(reservation: object) -> str | None:
    if reservation is not None and not isinstance(reservation, str):
        raise Invalid(f"expected a reservation id, got {shown(reservation)}", field="reservation")
    return reservation


def _limited(boot: BootSpec, spec: Spec) -> BootSpec:
    """``boot`` with the spec's ``mem``, ``vcpus`` and ``disk`` as its limits where it sets
    none (a zero in the spec sets nothing)."""
    limits = {"mem_limit": spec.mem, "vcpus": spec.vcpus, "disk_limit": spec.disk}
    unset = {key: value for key, value in limits.items() if value and getattr(boot, key) is None}
    return boot.model_copy(update=unset) if unset else boot


def _runtime_kind(runtime: object) -> str:
    """The name a journal entry records for the runtime that ran it (its class's)."""
    return type(runtime).__name__


def _lost_status(record: dict[str, object] | None) -> WorkloadStatus:
    """The status of a workload that ended while its agent was down, from its supervisor's
    exit record when there is one."""
    unknown = "ended while the agent was down, status unknown"
    if record is None:
        return WorkloadStatus("ended", None, unknown)
    code, signum = record.get("code"), record.get("signal")
    ended = WorkloadExit(
        code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        signal=signum if isinstance(signum, int) and not isinstance(signum, bool) else None,
    )
    reason = ended.reason if ended.reason != "ended" else unknown
    why = record.get("orphaned") or record.get("lost")
    if isinstance(why, str):
        reason = f"{reason}: {why}"
    return WorkloadStatus("ended", ended.code, f"{reason} (while the agent was down)")


def _kill_by_locator(locator: dict[str, object] | None) -> None:
    """End what a locator of a workload that will not be adopted names, each process only if
    it is still the one that was started then (``[pid, start ticks]``): a process runtime's
    ``supervisor`` is asked to kill its workload's tree (``SIGUSR1``: killing the supervisor
    itself would leave the tree to init); anything else (``qemu``) is killed."""
    found = {
        key: value
        for key, value in (locator or {}).items()
        if isinstance(value, list)
        and len(value) == 2
        and all(isinstance(part, int) and not isinstance(part, bool) for part in value)
    }
    if "supervisor" in found:
        found = {"supervisor": found["supervisor"]}
    for key, (pid, ticks) in found.items():
        if alive(pid, ticks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGUSR1 if key == "supervisor" else signal.SIGKILL)
