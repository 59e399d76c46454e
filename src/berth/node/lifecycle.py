"""A node's one place-and-boot lifecycle: mount, start, then admit or bind — refused cleanly.

This module owns :class:`Boots`, the lifecycle behind :meth:`~berth.node.core.NodeCore.boot`
— the same for the node agent and the simulator, on values the core has already checked.
``boot(spec, layers, boot_spec)`` runs, in this order (a step of :meth:`Boots._boot` each:
the checks, ``_mount``, ``_start``, ``_own_or_stop``):

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

With a journal, the workload's entry is written between 1 and 2 (:mod:`berth.node.ledger`;
a journal the disk refuses is the node's refusal, ``journal_failed``), and completed once the
workload owns its reservation.

Why admit *after* start: a reservation must be owned by something that can end, and the
workload is that only once it exists.  Admitting (or binding) the started workload means there
is never a reservation without an owner that releases it — the hard budget cannot leak — at
the price of a boot that is sometimes refused and stopped (a lost race against a stale
snapshot: rare, and cheap next to a leak).  On the leased path, any failure also releases the
reservation at once: nothing will ever bind it, and waiting for the lease to expire would
hold memory for nothing.

A boot may name its workload's id (``workload_id``, the id the API or a scheduler chose):
then it is **idempotent by id** — a retry after a lost answer, or a second caller racing the
first, boots nothing again; it gets the first boot's outcome.

The budget is asked through its typed ``_admit``, which checks nothing again (a placement's
spec and platforms were checked once, at the core's edge).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from berth.boot import BootFailed, BootSpec
from berth.checks import CORDONED, CORDONED_DETAIL
from berth.model import Layer, Spec
from berth.node.budget import NodeBudget
from berth.node.ends import Ends, NodeParts, unmount
from berth.node.journal import JournalEntry
from berth.node.layers import LayerRegistry, MountResult
from berth.node.ledger import Ledger, runtime_kind
from berth.node.runtime.port import Runtime, WorkloadHandle
from berth.node.workloads import Booted, Running, Workloads
from berth.observability import tracing
from berth.ownership import Admission, Refused, refused_by
from berth.platform import Platform, matches_any

__all__ = ["Boots"]

log = logging.getLogger("berth.node")


class Boots(NodeParts):
    """One node's boots (see the module docstring)."""

    def __init__(
        self,
        name: str,
        platform: Platform,
        budget: NodeBudget,
        runtime: Runtime,
        layers: LayerRegistry,
        workloads: Workloads,
        ledger: Ledger,
        ends: Ends,
    ) -> None:
        super().__init__(name, runtime, layers, workloads, ledger)
        self._platform = platform
        self._budget = budget
        self._ends = ends

    async def boot(
        self,
        spec: Spec,
        layers: tuple[Layer, ...],
        boot: BootSpec,
        reservation: str | None,
        platforms: tuple[Platform, ...],
        workload_id: str | None,
    ) -> Booted:
        """Boot on checked values, idempotent by ``workload_id`` when there is one (see
        :meth:`~berth.node.core.NodeCore.boot`)."""
        if workload_id is None:
            return await self._boot(spec, layers, boot, reservation, platforms, None)
        booting = self._workloads.booting
        while True:
            pending = booting.get(workload_id)
            if pending is None:
                break
            await asyncio.wait({pending})  # our own cancellation raises; the boot's does not
            if not pending.cancelled():  # else the first caller gave up: boot it ourselves
                return self._again(pending.result(), reservation)
        done = self._workloads.booted(workload_id)
        if done is not None:
            return self._again(done, reservation)
        future: asyncio.Future[Booted] = asyncio.get_running_loop().create_future()
        booting[workload_id] = future
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
            del booting[workload_id]
        return booted

    def _again(self, booted: Booted, reservation: str | None) -> Booted:
        """A repeated boot's answer: ``booted``, with a reservation it does not hold released."""
        if reservation is not None and reservation != booted.admission.reservation_id:
            self._budget.release(reservation)
        log.info("node %s: run of %s repeated, nothing booted", self._name, booted.workload.id)
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
        attributes = {"berth.node": self._name, "berth.leased": reservation is not None}
        with refused_by(self._name), tracing.span("berth.node.boot", attributes=attributes) as span:
            self._check_platforms(platforms)
            if reservation is None and self._budget.cordoned:  # before mounting anything
                raise Refused(CORDONED.code, CORDONED_DETAIL)
            if reservation is not None and not self._budget.holds(reservation):
                raise Refused.lease_expired(reservation)
            mounts = self._mount(layers)
            layer_ids = tuple(mount.layer_id for mount in mounts)
            boot = _limited(boot, spec)
            entry = self._journal_before_start(spec, layers, boot, reservation, workload_id)
            if entry is not None:
                workload_id = entry.workload_id
            workload = await self._start(boot, layer_ids, reservation, workload_id)
            span.set_attribute("berth.workload", workload.id)
            self._ends.restartable(workload, boot, entry)
            self._ends.watch(workload, layer_ids)
            admission = await self._own_or_stop(spec, workload, reservation, platforms)
        if entry is not None:
            self._ledger.started(entry, workload, admission)
        booted = Booted(workload, admission, mounts)
        running = self._workloads.running.get(workload.id)
        if running is not None and running.workload is workload:
            running.booted = booted
            self._ledger.emit(workload.id, self._workloads.status(workload.id), "started")
        else:  # it ended already: remember the run, so a repeat of its id boots nothing
            ended = self._workloads.ended.get(workload.id)
            if ended is not None:
                ended.booted = booted
        return booted

    def _journal_before_start(
        self,
        spec: Spec,
        layers: tuple[Layer, ...],
        boot: BootSpec,
        reservation: str | None,
        workload_id: str | None,
    ) -> JournalEntry | None:
        """Record the workload in the journal (if any) before it starts; a journal that
        cannot be written refuses the boot (``journal_failed``), after unmounting and
        releasing ``reservation``."""
        kind = runtime_kind(self._runtime)
        try:
            return self._ledger.before_start(spec, layers, boot, kind, reservation, workload_id)
        except OSError as error:
            unmount(self._layers, tuple(layer.id for layer in layers))
            if reservation is not None:
                self._budget.release(reservation)
            raise Refused("journal_failed", f"cannot write the journal: {error}") from None

    def _check_platforms(self, platforms: Sequence[Platform]) -> None:
        if not matches_any(self._platform, platforms):
            wanted = ", ".join(str(platform) for platform in platforms)
            raise Refused("platform_mismatch", f"node runs {self._platform}, asked for {wanted}")

    def _mount(self, layers: Sequence[Layer]) -> tuple[MountResult, ...]:
        mounts: list[MountResult] = []
        try:
            for layer in layers:
                mounts.append(self._layers.mount(layer.id, layer.size))
        except BaseException:
            unmount(self._layers, tuple(mount.layer_id for mount in mounts))
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
                workload = await self._runtime.start(boot)
            else:
                workload = await self._runtime.start(boot, workload_id=workload_id)
        except BaseException as error:
            if self._ledger.journal is not None and workload_id is not None:
                self._ledger.unjournal(workload_id)
            unmount(self._layers, layer_ids)
            if reservation is not None:
                self._budget.release(reservation)
            if isinstance(error, BootFailed):
                raise Refused("boot_failed", error.reason) from None
            raise
        self._workloads.running[workload.id] = Running(workload, layer_ids)
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
            log.info("node %s refused %s after boot: %s", self._name, workload.id, reason)
            await self._ends.stop(workload.id, None)  # a restart it may have pending too
            if reservation is not None:
                self._budget.release(reservation)
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
        owner = self._workloads.owner(workload)
        if reservation is None:
            return self._budget._admit(spec, owner, platforms).admission
        held = self._budget.get(reservation)
        if held is None:
            raise Refused.lease_expired(reservation)
        self._budget.bind(reservation, owner)
        return held.admission


def _limited(boot: BootSpec, spec: Spec) -> BootSpec:
    """``boot`` with the spec's ``mem``, ``vcpus`` and ``disk`` as its limits where it sets
    none (a zero in the spec sets nothing)."""
    limits = {"mem_limit": spec.mem, "vcpus": spec.vcpus, "disk_limit": spec.disk}
    unset = {key: value for key, value in limits.items() if value and getattr(boot, key) is None}
    return boot.model_copy(update=unset) if unset else boot
