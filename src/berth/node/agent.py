"""The node agent: one node's budget, monitors, layers and runtime, advertised as a whole.

The agent is the node's authority.  It owns

* the :class:`~berth.node.budget.NodeBudget` (hard reservations, soft checks against live
  load from the :class:`~berth.node.monitor.LoadMonitor`),
* the :class:`~berth.node.layers.LayerRegistry` (mounted layers and the LRU cache of recently
  unmounted ones),
* a :class:`~berth.node.runtime.Runtime` that boots workloads,

and keeps the cluster informed: the *advertiser* publishes this node's ``NodeState`` through
the state store port whenever the budget or the layers change, and on a heartbeat
(``heartbeat_s``) so a store with liveness by expiry keeps the node alive.

``try_run(spec, layers, boot)`` is the seed's try-run: mount the image's layers, start the
workload, then ``admit`` with the running workload as the owner; if admission refuses, stop
the workload.  Whenever a workload ends — it exits, is killed from outside, or is stopped —
its reservation and its layer references are released (the budget and the layer registry
both follow the workload's end) and the node re-advertises.

It is deliberately not a scheduler (it never looks at other nodes) and not a transport: the
network driver of the node client port will call these same methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence

from berth.errors import Invalid
from berth.model import Layer, Spec
from berth.node.budget import LoadReadings, NodeBudget
from berth.node.config import AgentConfig
from berth.node.layers import LayerRegistry
from berth.node.monitor import LoadMonitor
from berth.node.runtime import BootFailed, BootSpec, FakeRuntime, ProcessRuntime, Runtime, Workload
from berth.ownership import Admission, Owner, Refused, refused_by
from berth.platform import Platform
from berth.state import NodeState
from berth.store.port import StateStore

__all__ = ["Agent"]

log = logging.getLogger("berth.agent")


class Agent:
    """One node (see the module docstring).  Use ``async with agent:`` or ``start``/``stop``."""

    def __init__(
        self,
        name: str,
        platform: Platform | str,
        budget: NodeBudget,
        store: StateStore,
        runtime: Runtime,
        *,
        layers: LayerRegistry | None = None,
        monitor: LoadMonitor | None = None,
        labels: dict[str, str] | None = None,
        heartbeat_s: float = 5.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not name:
            raise Invalid("must not be empty", field="name")
        if heartbeat_s <= 0:
            raise Invalid(f"must be positive, got {heartbeat_s}", field="heartbeat_s")
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
        self.store = store
        self.runtime = runtime
        self.layers = layers or LayerRegistry()
        self.monitor = monitor
        self.labels = dict(labels or {})
        self.heartbeat_s = heartbeat_s
        self._wall_clock = wall_clock
        self._generation = 0
        self._generation_lock = threading.Lock()
        self._workloads: dict[str, Workload] = {}
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._advertiser: asyncio.Task[None] | None = None
        self._stopping = False
        self.published = 0
        budget.add_change_listener(self._mark_changed)
        self.layers.add_change_listener(self._mark_changed)

    @classmethod
    def from_config(
        cls,
        config: AgentConfig,
        store: StateStore,
        *,
        runtime: Runtime | None = None,
        readings: LoadReadings | None = None,
    ) -> Agent:
        """Build an agent from a validated configuration (live monitors unless ``readings``)."""
        options = config.agent
        monitor = None
        if readings is None:
            monitor = LoadMonitor(tau_s=options.tau_s, period_s=options.sample_period_s)
            readings = monitor
        if runtime is None:
            runtime = (
                ProcessRuntime(stop_grace_s=options.stop_grace_s)
                if options.runtime == "process"
                else FakeRuntime()
            )
        return cls(
            config.node.name,
            config.node.platform,
            NodeBudget(config.budget.limits(), readings, platform=config.node.platform),
            store,
            runtime,
            layers=LayerRegistry(options.layer_cache),
            monitor=monitor,
            labels=config.node.labels,
            heartbeat_s=options.heartbeat_s,
        )

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Start sampling load and advertising (publishes once before returning)."""
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        if self.monitor is not None:
            self.monitor.start()
        await self.advertise()
        self._advertiser = asyncio.create_task(
            self._advertise_loop(), name=f"advertise {self.name}"
        )

    async def stop(self) -> None:
        """Stop every workload, stop advertising and leave the cluster."""
        for workload_id in list(self._workloads):
            await self.runtime.stop(workload_id)
        if self._advertiser is not None:
            # A flag and a wake-up, not cancel(): on Python 3.11 ``wait_for`` can swallow a
            # cancellation that lands as the awaited event fires, and the loop would go on.
            self._stopping = True
            self._changed.set()
            await self._advertiser
            self._advertiser = None
        if self.monitor is not None:
            await self.monitor.stop()
        await self.store.remove(self.name)

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- advertising -------------------------------------------------------------------------
    def snapshot(self) -> NodeState:
        """This node's state now, with the next generation number."""
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
            published_at=self._wall_clock(),
            labels=self.labels,
            mem_free=headroom.mem_free,
            disk_free=headroom.disk_free,
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
        )

    async def advertise(self) -> None:
        """Publish the current snapshot now."""
        self._changed.clear()
        await self.store.publish(self.snapshot())
        self.published += 1

    async def _advertise_loop(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=self.heartbeat_s)
            if self._stopping:
                return
            self.budget.reap()  # expire unbound leases even when nothing else happens
            try:
                await self.advertise()
            except Exception:  # the store may be briefly unreachable; the heartbeat retries
                log.exception("node %s could not advertise", self.name)

    def _mark_changed(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._changed.set()
        else:  # a budget change from another thread (e.g. a future's callback)
            loop.call_soon_threadsafe(self._changed.set)

    # -- the node's side of the node client port ---------------------------------------------
    async def try_run(self, spec: Spec, layers: Sequence[Layer], boot: BootSpec) -> Workload:
        """Mount, start, admit owned by the workload; stop it and refuse if admission fails."""
        mounted: list[str] = []
        for layer in layers:
            self.layers.mount(layer.id, layer.size)
            mounted.append(layer.id)
        if boot.mem_limit is None:
            boot = boot.model_copy(update={"mem_limit": spec.mem or None})
        try:
            workload = await self.runtime.start(boot)
        except BootFailed as failed:
            self._unmount(mounted)
            raise Refused("boot_failed", failed.reason, node=self.name) from None
        self._workloads[workload.id] = workload
        workload.add_done_callback(lambda ended: self._ended(ended, mounted))
        try:
            self.budget.admit(spec, workload)
        except Refused as refused:
            log.info("node %s refused %s after boot: %s", self.name, workload.id, refused.reason)
            await self.runtime.stop(workload.id)
            raise Refused(refused.reason, refused.detail, node=self.name) from None
        return workload

    def admit(
        self, spec: Spec, lease_ttl_s: float, platforms: Sequence[Platform] = ()
    ) -> Admission:
        """Reserve under a lease (the port's ``schedule`` confirmation)."""
        with refused_by(self.name):
            return self.budget.admit_leased(spec, lease_ttl_s, platforms).admission

    def bind(self, reservation_id: str, owner: Owner | str) -> None:
        """Tie a leased reservation to a workload (by id on this node, or an owner object)."""
        with refused_by(self.name):
            if isinstance(owner, str):
                if self.budget.get(reservation_id) is None:  # say the likelier thing first
                    raise Refused("lease_expired", f"reservation {reservation_id} is gone")
                workload = self._workloads.get(owner)
                if workload is None:
                    raise Refused("unknown_workload", f"no workload {owner!r}")
                owner = workload
            self.budget.bind(reservation_id, owner)

    def release(self, reservation_id: str) -> bool:
        return self.budget.release(reservation_id)

    async def stop_workload(self, workload_id: str) -> None:
        """Stop a workload; unknown or already stopped ids are harmless."""
        await self.runtime.stop(workload_id)

    def workloads(self) -> dict[str, Workload]:
        """The running workloads by id."""
        return dict(self._workloads)

    def _ended(self, workload: Workload, mounted: list[str]) -> None:
        self._workloads.pop(workload.id, None)
        self._unmount(mounted)
        log.info("workload %s on %s ended: %s", workload.id, self.name, workload.reason)

    def _unmount(self, layer_ids: list[str]) -> None:
        for layer_id in layer_ids:
            self.layers.unmount(layer_id)

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, {self.platform}, {len(self._workloads)} workloads)"
