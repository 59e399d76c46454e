"""The node agent: a node core plus the node's I/O — load monitor, advertiser, state store.

A node's state and lifecycle — budget, layers, runtime wiring, running workloads, snapshot,
the place-and-boot order — live in :class:`~berth.node.core.NodeCore`, which does no I/O so
the simulator runs the very same code.  The agent owns what touches the outside world:

* a :class:`~berth.node.monitor.LoadMonitor` feeding the budget live, smoothed load (unless
  readings are handed in),
* the *advertiser*: it publishes the core's snapshot through the state store port whenever
  the budget or the layers change, and on a heartbeat (``heartbeat_s``, wall-clock time) so a
  store with liveness by expiry keeps the node alive; each beat also reaps unbound leases,
* joining and leaving the cluster (first publication, removal on ``stop``);
* the node's maintenance state: a cordon (:meth:`Agent.cordon`) is kept in the core's budget
  (admission refuses ``cordoned``, snapshots say ``cordoned=True``) and, with a ``state_dir``,
  persisted as the file ``<state_dir>/cordoned`` — written before the cordon is
  acknowledged, removed on uncordon, read when the agent is built — so a cordon survives an
  agent restart (the node never advertises itself uncordoned in between).

**Surviving its own restart** (issue 20) — with a ``state_dir`` the agent keeps the node's
journal there (:mod:`berth.node.journal`) and, on :meth:`Agent.start`, before it admits
anything or publishes its state:

1. *takes the state directory*: an exclusive lock on ``<state_dir>/agent.lock`` (a second
   agent on one directory is an error naming it), then writes ``<state_dir>/agent.pid`` (its
   pid and start time), which every workload's supervisor watches;
2. *reconciles the journal with the host* (:meth:`~berth.node.core.NodeCore.recover`): each
   workload still running is adopted and re-reserved (over-committed if the limits shrank
   meanwhile: reported, and nothing more is admitted), each one that ended while the agent
   was down has its end recorded;
3. only then publishes its snapshot.

Until then ``try_run``, ``admit`` and ``bind`` are refused ``node_starting`` (the node's
subjects may already be answered), so an admission sent during a restart is refused or fits —
never an over-commit.  Without a state directory nothing of this happens: there is no journal,
and the process runtime's workloads die ``orphan_grace_s`` after their agent.

**Pushing ends** (issue 20, part 6) — with an :class:`~berth.events.port.EventSink`
(``events``) the agent publishes every workload's end and restart as an event
(:mod:`berth.events`): a *reporter* task takes the core's unreported events oldest first,
publishes each and tells the core once the sink stored it (the journal entry of an ended
workload goes only then); a sink that cannot be reached is tried again with a backoff
(:data:`REPORT_RETRY_S` doubling up to :data:`REPORT_RETRY_MAX_S`), the events kept
meanwhile — in memory and, marked ended, in the journal.  A clean stop stops the workloads,
then waits up to :data:`REPORT_FLUSH_S` for their ends to be stored (not at all once the sink
failed); what is still unreported then is published by the next start on the same state
directory.

``try_run``, ``admit``, ``bind``, ``release``, ``stop_workload``, ``workloads`` and
``snapshot`` are the core's (see :mod:`berth.node.core` for the try-run order: mount, start,
admit owned by the workload, stop on refusal).  The agent is deliberately not a scheduler (it
never looks at other nodes) and not a transport: the network driver of the node client port
will call these same methods.

The runtime driver is the configuration's (``[agent] runtime``); the microVM driver's module
— and with it QEMU's command line, erofs conversion and OCI reading — is imported only when
the configuration asks for it, so ``import berth`` loads none of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

from berth.boot import LIMIT_RULE, OFFSET_RULE, AdmitOrder, RunOrder, WorkloadLogs, WorkloadStatus
from berth.defaults import HEARTBEAT_S, LOG_CHUNK_BYTES
from berth.errors import Invalid
from berth.events.port import EventSink
from berth.loops import call_on
from berth.model import INTERVAL_RULE
from berth.node.budget import LoadReadings, NodeBudget
from berth.node.config import AgentConfig
from berth.node.core import NodeCore, Recovery
from berth.node.journal import Journal
from berth.node.layers import LayerRegistry
from berth.node.monitor import LoadMonitor
from berth.node.output import OutputKeeper, read_output
from berth.node.runtime import FakeRuntime, ProcessRuntime, Runtime, WorkloadHandle
from berth.node.runtime.port import ClosingRuntime, LoggingRuntime, checked_workload_id
from berth.node.runtime.supervisor import OWNER_FILE, write_owner
from berth.ownership import Admission, Owner, Refused, refused_by
from berth.platform import Platform
from berth.state import NodeState
from berth.store.port import StateStore
from berth.validation import shown

if TYPE_CHECKING:
    from berth.node.runtime.container import ContainerRuntime
    from berth.node.runtime.microvm import MicrovmRuntime

__all__ = ["REPORT_FLUSH_S", "REPORT_RETRY_MAX_S", "REPORT_RETRY_S", "Agent"]

log = logging.getLogger("berth.agent")

REPORT_RETRY_S = 0.25
"""The pause before publishing again after the event sink could not be reached (doubling)."""
REPORT_RETRY_MAX_S = 5.0
"""The longest pause between attempts to publish to an unreachable event sink."""
REPORT_FLUSH_S = 5.0
"""How long a clean stop waits for the ends of the workloads it stopped to be stored."""


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
        heartbeat_s: float = HEARTBEAT_S,
        wall_clock: Callable[[], float] = time.time,
        state_dir: Path | None = None,
        events: EventSink | None = None,
    ) -> None:
        heartbeat_s = INTERVAL_RULE(heartbeat_s, "heartbeat_s")
        if events is not None and not callable(getattr(events, "publish", None)):
            raise Invalid(f"{shown(events)} has no publish() method", field="events")
        if not callable(getattr(store, "publish", None)):
            raise Invalid(f"{shown(store)} has no publish() method", field="store")
        if not callable(wall_clock):
            raise Invalid(
                f"expected a function returning seconds, got {shown(wall_clock)}",
                field="wall_clock",
            )
        if state_dir is not None and not isinstance(state_dir, Path):
            raise Invalid(f"expected a directory path, got {shown(state_dir)}", field="state_dir")
        journal = None if state_dir is None else Journal(state_dir)
        self.core = NodeCore(
            name,
            platform,
            budget,
            runtime,
            layers=layers,
            labels=labels,
            journal=journal,
            wall_clock=wall_clock,
        )
        self.events = events
        if events is not None:
            self.core.push_events()  # before recover(): ends found there are pushed too
        self.state_dir = state_dir
        self.recovery: Recovery | None = None
        """What the last start found in the journal (``None`` before a start)."""
        self._ready = state_dir is None  # with a journal: only once it has been reconciled
        self._lock_fd: int | None = None
        if state_dir is not None and self._cordon_file(state_dir).exists():
            self.core.cordon(True)
            log.info("node %s starts cordoned (%s)", self.core.name, self._cordon_file(state_dir))
        self.store = store
        self.monitor = monitor
        self.heartbeat_s = heartbeat_s
        self._wall_clock = wall_clock
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._advertiser: asyncio.Task[None] | None = None
        self._output: OutputKeeper | None = None
        """Bounds the output its runtime keeps (a runtime with a log directory)."""
        self._stopping = False
        self.published = 0
        self.reported = 0
        """Events the sink stored (ends and restarts)."""
        self._unreported = asyncio.Event()
        self._reporter: asyncio.Task[None] | None = None
        self._reporting = False
        self._report_failed = False
        self.core.add_change_listener(self._mark_changed)
        self.core.add_event_listener(lambda: self._wake(self._unreported))

    # The core's parts, read-only here: the agent holds no second copy of the node's state.
    @property
    def name(self) -> str:
        return self.core.name

    @property
    def platform(self) -> Platform:
        return self.core.platform

    @property
    def budget(self) -> NodeBudget:
        return self.core.budget

    @property
    def layers(self) -> LayerRegistry:
        return self.core.layers

    @property
    def runtime(self) -> Runtime:
        return self.core.runtime

    @property
    def labels(self) -> dict[str, str]:
        return self.core.labels

    @classmethod
    def from_config(
        cls,
        config: AgentConfig,
        store: StateStore,
        *,
        runtime: Runtime | None = None,
        readings: LoadReadings | None = None,
        state_dir: Path | None = None,
        events: EventSink | None = None,
    ) -> Agent:
        """Build an agent from a validated configuration (live monitors unless ``readings``)."""
        if not isinstance(config, AgentConfig):
            raise Invalid(f"expected an AgentConfig, got {shown(config)}", field="config")
        options = config.agent
        monitor = None
        if readings is None:
            monitor = LoadMonitor(tau_s=options.tau_s, period_s=options.sample_period_s)
            readings = monitor
        if runtime is None:
            if options.runtime == "microvm":
                # the microVM stack (QEMU, erofs, OCI reading) is loaded only when asked for
                from berth.node.runtime.microvm import MicrovmRuntime

                runtime = MicrovmRuntime.from_config(
                    config, state_dir=state_dir, orphan_grace_s=options.orphan_grace_s
                )
            elif options.runtime == "container":
                # the container stack (runc, erofs mounts, OCI reading) only when asked for
                from berth.node.runtime.container import ContainerRuntime

                runtime = ContainerRuntime.from_config(config, state_dir=state_dir)
            elif options.runtime == "process":
                runtime = ProcessRuntime(
                    stop_grace_s=options.stop_grace_s,
                    state_dir=state_dir,
                    orphan_grace_s=options.orphan_grace_s,
                    user=config.process.run_as(),
                    scratch_dir=config.process.scratch(),
                    log_dir=config.process.logs(),
                )
            else:
                runtime = FakeRuntime(stop_grace_s=options.stop_grace_s)
        layers = LayerRegistry(options.layer_cache)
        labels = config.node.labels
        if _runs_from_layer_files(runtime):  # its layers are files; it states how it runs
            layers = runtime.layer_files.registry
            labels = {**runtime.labels, **labels}
        return cls(
            config.node.name,
            config.node.platform,
            NodeBudget(config.budget.limits(), readings, platform=config.node.platform),
            store,
            runtime,
            layers=layers,
            monitor=monitor,
            labels=labels,
            heartbeat_s=options.heartbeat_s,
            state_dir=state_dir,
            events=events,
        )

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Take the state directory and reconcile its journal (with a ``state_dir``), then
        start sampling load and advertising (publishes once before returning)."""
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        if self.state_dir is not None and self._lock_fd is None:
            self._take(self.state_dir)
            try:
                self.recovery = await self.core.recover()
            except BaseException:
                self._let_go()
                raise
            self._ready = True
        if self.events is not None and self._reporter is None:
            self._reporting = True
            self._reporter = asyncio.create_task(self._report(), name=f"report {self.name}")
        if self.monitor is not None:
            self.monitor.start()
        runtime = self.runtime
        if isinstance(runtime, LoggingRuntime) and runtime.log_dir is not None:
            if self._output is None:
                self._output = OutputKeeper(runtime.log_dir, self._running_output)
            self._output.start()
        await self.advertise()
        self._advertiser = asyncio.create_task(
            self._advertise_loop(), name=f"advertise {self.name}"
        )

    async def stop(self) -> None:
        """Stop every workload (their ends reported: up to :data:`REPORT_FLUSH_S`), stop
        advertising and leave the cluster."""
        await self.core.stop_all()
        if isinstance(self.core.runtime, ClosingRuntime):  # and what the runtime held
            await self.core.runtime.aclose()
        await self._stop_reporting()
        if self._advertiser is not None:
            # A flag and a wake-up, not cancel(): on Python 3.11 ``wait_for`` can swallow a
            # cancellation that lands as the awaited event fires, and the loop would go on.
            self._stopping = True
            self._changed.set()
            await self._advertiser
            self._advertiser = None
        if self.monitor is not None:
            await self.monitor.stop()
        if self._output is not None:
            await self._output.stop()
        try:
            await self.store.remove(self.name)
        finally:
            self._let_go()

    def _running_output(self) -> list[Path]:
        """The output files of the workloads that run now (the keeper never removes them)."""
        runtime = self.runtime
        if not isinstance(runtime, LoggingRuntime):
            return []
        return [path for id_ in self.workloads() if (path := runtime.log_of(id_)) is not None]

    def _take(self, state_dir: Path) -> None:
        """Lock ``state_dir`` for this agent (``Invalid`` naming it if another holds it) and
        record this process as its owner, for the supervisors that watch it."""
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(state_dir / "agent.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Invalid(
                f"another agent runs on state directory {state_dir}: one agent per directory",
                field="state_dir",
            ) from None
        self._lock_fd = fd
        write_owner(state_dir / OWNER_FILE)

    def _let_go(self) -> None:
        """Give the state directory up (a clean stop: its workloads have been stopped)."""
        if self._lock_fd is None:
            return
        assert self.state_dir is not None
        with contextlib.suppress(OSError):
            (self.state_dir / OWNER_FILE).unlink()
        os.close(self._lock_fd)
        self._lock_fd = None
        self._ready = False

    def _admitting(self) -> None:
        """Refuse ``node_starting`` until the journal has been reconciled."""
        if not self._ready:
            with refused_by(self.name):
                raise Refused("node_starting", "the agent is reconciling its journal")

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- reporting: the core's events published -----------------------------------------------
    async def _report(self) -> None:
        """Publish the core's unreported events, oldest first, until told to stop."""
        assert self.events is not None
        failures = 0
        while self._reporting:
            self._unreported.clear()
            pending = self.core.unreported()
            if not pending:
                await self._unreported.wait()
                continue
            for event in pending:
                try:
                    await self.events.publish(event)
                except Exception as error:  # Unavailable, or a driver's surprise: kept
                    failures += 1
                    self._report_failed = True
                    pause = min(REPORT_RETRY_MAX_S, REPORT_RETRY_S * 2 ** (failures - 1))
                    log.info(
                        "node %s: event %s not stored (%s); again in %.2gs",
                        self.name,
                        event.key,
                        error,
                        pause,
                    )
                    with contextlib.suppress(TimeoutError):  # a stop cuts the pause short
                        await asyncio.wait_for(self._unreported.wait(), pause)
                    break
                failures = 0
                self._report_failed = False
                self.core.reported(event)
                self.reported += 1

    async def _stop_reporting(self) -> None:
        reporter, self._reporter = self._reporter, None
        if reporter is None:
            return
        deadline = time.monotonic() + REPORT_FLUSH_S
        # an unreachable sink is not waited for: the journal keeps what it did not store
        while (
            self.core.unreported()
            and time.monotonic() < deadline
            and not reporter.done()
            and not self._report_failed
        ):
            await asyncio.sleep(0.02)
        left = len(self.core.unreported())
        if left:
            log.warning(
                "node %s stops with %d event(s) unreported; its next start publishes them",
                self.name,
                left,
            )
        # A flag and a wake-up, not cancel(): nats-py's wait_for can swallow a cancellation.
        self._reporting = False
        self._unreported.set()
        _, late = await asyncio.wait({reporter}, timeout=REPORT_FLUSH_S)
        for task in late:
            task.cancel()

    # -- advertising -------------------------------------------------------------------------
    @property
    def reporting(self) -> bool:
        """Whether this agent reports what it runs: not while an agent with a journal has
        not reconciled it yet (the workloads it is about to adopt would be missing)."""
        return self.state_dir is None or self.recovery is not None

    def snapshot(self) -> NodeState:
        """This node's state now (wall clock), with the next generation number and, once
        it reports (:attr:`reporting`), the digest of what it runs."""
        return self.core.snapshot(self._wall_clock(), reporting=self.reporting)

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
        self._wake(self._changed)

    def _wake(self, flag: asyncio.Event) -> None:
        """Set ``flag`` from this loop or from another thread (e.g. a future's callback)."""
        call_on(self._loop, flag.set)

    # -- the node's side of the node client port: the core's -----------------------------
    async def try_run(self, order: RunOrder) -> WorkloadHandle:
        """Mount, start, admit owned by the workload (or bind ``order.reservation``, a lease
        taken before, to it); stop it and refuse if admission fails.  ``order.workload_id`` (a
        ``Name``) is the caller's id for it: a run with the id of a workload this node runs,
        ran, or is booting boots nothing again and answers that workload (see
        :meth:`~berth.node.core.NodeCore.boot`)."""
        self._admitting()
        booted = await self.core.boot_order(order)
        return booted.workload

    def admit(self, order: AdmitOrder) -> Admission:
        """Reserve under a lease (the port's ``schedule`` confirmation)."""
        self._admitting()
        return self.core.admit_order(order)

    def bind(self, reservation_id: str, owner: Owner | str) -> None:
        """Tie a leased reservation to a workload (by id on this node, or an owner object)."""
        self._admitting()
        self.core.bind(reservation_id, owner)

    def release(self, reservation_id: str) -> bool:
        return self.core.release(reservation_id)

    async def stop_workload(self, workload_id: str, *, grace_s: float | None = None) -> None:
        """Stop a workload (SIGTERM, SIGKILL after ``grace_s``, ``None``: the runtime's
        configured grace); unknown or already stopped ids are harmless."""
        await self.core.stop(workload_id, grace_s=grace_s)

    def workloads(self) -> dict[str, WorkloadHandle]:
        """The running workloads by id."""
        return self.core.workloads()

    def status(self, workload_id: str) -> WorkloadStatus:
        """Whether a workload runs here, ended (and how), or is unknown to this node."""
        return self.core.status(workload_id)

    def logs(self, workload_id: str, offset: int = 0, limit: int = LOG_CHUNK_BYTES) -> WorkloadLogs:
        """Up to ``limit`` bytes of ``workload_id``'s output from ``offset``, as this node's
        runtime keeps it (:func:`~berth.node.output.read_output`); ``Invalid`` naming the
        argument when one is malformed."""
        workload_id = checked_workload_id(workload_id)
        offset, limit = OFFSET_RULE(offset, "offset"), LIMIT_RULE(limit, "limit")
        runtime = self.runtime
        path = runtime.log_of(workload_id) if isinstance(runtime, LoggingRuntime) else None
        return read_output(path, offset, limit)

    # -- node maintenance ----------------------------------------------------------------------
    @property
    def cordoned(self) -> bool:
        return self.core.cordoned

    def cordon(self, cordoned: bool = True) -> bool:
        """Cordon (``False``: uncordon) the node, persisted in ``state_dir`` when there is one
        (written before the budget changes, so an acknowledged cordon survives a restart).
        Whether it changed anything."""
        if not isinstance(cordoned, bool):
            raise Invalid(f"expected true or false, got {shown(cordoned)}", field="cordoned")
        if self.state_dir is not None:
            path = self._cordon_file(self.state_dir)
            if cordoned:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f"cordoned at {self._wall_clock():.3f}\n")
            else:
                path.unlink(missing_ok=True)
        return self.core.cordon(cordoned)

    @staticmethod
    def _cordon_file(state_dir: Path) -> Path:
        return state_dir / "cordoned"

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, {self.platform}, {len(self.core.workloads())} workloads)"


def _runs_from_layer_files(runtime: Runtime) -> TypeGuard[MicrovmRuntime | ContainerRuntime]:
    """Whether ``runtime`` is a driver that boots from the node's layer files (the microVM
    or container driver), asked without importing either: its class exists only once its
    module has been imported."""
    for name, kind in (
        ("berth.node.runtime.microvm", "MicrovmRuntime"),
        ("berth.node.runtime.container", "ContainerRuntime"),
    ):
        module = sys.modules.get(name)
        if module is not None and isinstance(runtime, getattr(module, kind)):
            return True
    return False
