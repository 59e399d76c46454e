"""The node core: one node's budget, layers, running workloads and snapshot — and no I/O.

This module owns what makes a node a node, independent of how time passes or how the node
talks to the cluster — :class:`NodeCore`, which composes the parts beside it:

* the :class:`~berth.node.budget.NodeBudget` (the authority on what the node may hold), the
  :class:`~berth.node.layers.LayerRegistry` (mounted layers, LRU cache of unmounted ones) and
  a :class:`~berth.node.runtime.Runtime`, wired so that **a workload's end releases what it
  held**: its reservation (the budget follows its owner, or the lease bound to it) and its
  layer mounts (into the cache), whatever ended it (:mod:`berth.node.ends`, with restarts
  under a workload's policy);
* the running workloads, by id, and how the recently ended ones ended
  (:mod:`berth.node.workloads`);
* :meth:`NodeCore.snapshot` — the node's :class:`~berth.state.NodeState` at a given time,
  numbered by a generation counter, with ``admitted`` (the budget's admission count, which a
  scheduler's assume cache compares with the ``seq`` of the admissions it made);
* admission without a boot — a lease (the port's ``schedule``), bound to a workload later;
* the **one place-and-boot lifecycle**, :meth:`NodeCore.boot` (:mod:`berth.node.lifecycle`: mount,
  start, then admit or bind; idempotent by the workload's id);
* the journal and the pushed events (:mod:`berth.node.ledger`), and a restarted node's
  reconciliation of its journal with the host, :meth:`NodeCore.recover`
  (:mod:`berth.node.recovery`: each workload adopted, or its end recorded).

Two users drive it.  The node agent (:mod:`berth.node.agent`) adds the I/O: a load monitor,
an advertiser that publishes snapshots on wall-clock heartbeats, the state store.  The
simulator (:mod:`berth.sim.simulator`) adds a simulated clock and load model, and publishes
snapshots when its events say so.  Both therefore run the same wiring and the same lifecycle;
neither re-implements them.

It is deliberately not an advertiser, a clock, a monitor or a transport, and it never looks
at another node.

Its public methods validate their arguments before touching anything (the name is a
``Name``, labels ``Labels``, a spec a ``Spec``, layers and platforms lists, a time to live
from 1 ms to a year): a malformed call raises ``Invalid`` and mounts, starts or reserves
nothing; so does a stop with a malformed grace.  An admission's and a boot's arguments are
checked by the order they make (:class:`~berth.boot.AdmitOrder`,
:class:`~berth.boot.RunOrder`); the agent, which is handed orders already made, calls
:meth:`NodeCore.admit_order` and :meth:`NodeCore.boot_order`, which check nothing again.  Past
that edge the values are typed, and the budget is asked through its typed ``_admit`` /
``_admit_leased``, which check nothing again (a placement's spec and platforms were checked
once).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence

from berth.boot import AdmitOrder, BootSpec, RunOrder, WorkloadStatus
from berth.errors import Invalid
from berth.events.port import WorkloadEvent
from berth.model import NAME_RULE, Labels, Layer, Spec
from berth.node.budget import NodeBudget
from berth.node.ends import Ends
from berth.node.journal import Journal
from berth.node.layers import LayerRegistry
from berth.node.ledger import Ledger
from berth.node.lifecycle import Boots
from berth.node.recovery import Recovery, recover
from berth.node.runtime.port import Runtime, WorkloadHandle, checked_grace
from berth.node.workloads import ENDED_MEMORY, Booted, Workloads
from berth.ownership import Admission, Owner, Refused, refused_by
from berth.platform import Platform
from berth.state import NodeState, running_digest
from berth.validation import Rule, shown

__all__ = ["ENDED_MEMORY", "Booted", "NodeCore", "Recovery"]


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
        self.journal = journal
        self._generation = 0
        self._generation_lock = threading.Lock()
        self._workloads = Workloads()
        self._ledger = Ledger(name, journal, self._workloads, self.end_errors, wall_clock)
        self._ends = Ends(
            name,
            runtime,
            self.layers,
            self._workloads,
            self._ledger,
            self.end_errors,
            clock=clock,  # a restart's backoff and attempt window
            sleep=sleep,
        )
        self._boots = Boots(
            name,
            self.platform,
            budget,
            runtime,
            self.layers,
            self._workloads,
            self._ledger,
            self._ends,
        )

    def add_change_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every change of reservations or of mounted/cached layers."""
        self.budget.add_change_listener(listener)
        self.layers.add_change_listener(listener)

    # -- events: starts, ends and restarts pushed (berth.node.ledger) --------------------------
    def push_events(self) -> None:
        """Keep each start, end and restart as an event until :meth:`reported` (see
        :mod:`berth.node.ledger`).  Called before :meth:`recover`, so ends found there are
        pushed too."""
        self._ledger.push_events()

    def add_event_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` whenever an event is added to those not yet reported."""
        self._ledger.add_event_listener(listener)

    def unreported(self) -> list[WorkloadEvent]:
        """The events not yet reported stored, oldest first."""
        return self._ledger.unreported()

    def reported(self, event: WorkloadEvent) -> None:
        """``event`` is stored: forget it — and for an end, the workload's journal entry —
        unless a newer event of its workload and kind replaced it meanwhile."""
        self._ledger.reported(event)

    # -- the lifecycle (berth.node.lifecycle) --------------------------------------------------
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
        """Mount, start, then admit owned by the workload — or bind ``reservation`` to it
        (the order and why: :mod:`berth.node.lifecycle`).

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
        order = RunOrder(
            spec, layers, boot, platforms, reservation=reservation, workload_id=workload_id
        )
        return await self.boot_order(order)

    async def boot_order(self, order: RunOrder) -> Booted:
        """:meth:`boot` of an order checked when it was made (the agent's, from the node-client
        port): the same boot, without checking its fields again."""
        return await self._boots.boot(
            order.spec,
            order.layers,
            order.boot,
            order.reservation,
            order.platforms,
            order.workload_id,
        )

    # -- a restart: the journal reconciled with the host (berth.node.recovery) ---------------
    async def recover(self) -> Recovery:
        """Reconcile the journal with the host, before this node admits anything: each entry's
        workload is **adopted** if it still runs (the runtime watches it again, its layers are
        mounted, its spec re-reserved under its old reservation id — unchecked, even past
        limits that shrank: :meth:`~berth.node.budget.NodeBudget.readopt`), else its **end is
        recorded** (the supervisor's exit status when it wrote one, else "ended while the
        agent was down, status unknown"; a runtime that cannot adopt — microVM, fake — has its
        workloads killed and ended as "not adoptable") and its entry removed.  Without a
        journal there is nothing to do."""
        return recover(
            self.name,
            self.budget,
            self.runtime,
            self.layers,
            self._workloads,
            self._ledger,
            self._ends,
        )

    # -- admission without a boot (the node client port) -------------------------------------
    def admit(
        self, spec: Spec, lease_ttl_s: float, platforms: Sequence[Platform] = ()
    ) -> Admission:
        """Reserve under a lease (the port's ``schedule`` confirmation)."""
        return self.admit_order(AdmitOrder(spec, lease_ttl_s, platforms))

    def admit_order(self, order: AdmitOrder) -> Admission:
        """:meth:`admit` of an order checked when it was made (the agent's, from the
        node-client port)."""
        with refused_by(self.name):
            return self.budget._admit_leased(
                order.spec, order.lease_ttl_s, order.platforms
            ).admission

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
                running = self._workloads.running.get(owner)
                if running is None:
                    raise Refused("unknown_workload", f"no workload {owner!r}")
                owner = self._workloads.owner(running.workload)  # its life, when it restarts
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
        await self._ends.stop(workload_id, checked_grace(grace_s))

    async def stop_all(self) -> None:
        """Stop every running workload (each end releases what it held)."""
        for workload_id in list(self._workloads.running):
            await self.stop(workload_id)

    def workloads(self) -> dict[str, WorkloadHandle]:
        """The running workloads by id."""
        running = self._workloads.running
        return {workload_id: entry.workload for workload_id, entry in running.items()}

    def status(self, workload_id: str) -> WorkloadStatus:
        """Whether ``workload_id`` runs here, ended (and how), or is unknown to this node."""
        return self._workloads.status(workload_id)

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
        running = self._workloads.running
        return {workload_id: entry.layer_ids for workload_id, entry in running.items()}

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
            running_digest=running_digest(self._workloads.running) if reporting else None,
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
        running = self._workloads.running.values()
        used = {layer_id for entry in running for layer_id in entry.layer_ids}
        if used != set(self.layers.mounted()):
            found.append("mounted layers differ from running workloads'")
        if self.layers.cached_bytes > self.layers.cache_budget_bytes:
            found.append("layer cache over its budget")
        found.extend(self.end_errors)
        return found

    def __repr__(self) -> str:
        return f"NodeCore({self.name!r}, {self.platform}, {len(self._workloads.running)} workloads)"


_LABELS: Rule[dict[str, str]] = Rule(Labels)
