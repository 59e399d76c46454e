"""The workload runtime port: what a node needs from whatever boots its workloads.

This module owns *running* a workload on this node: booting it from a
:class:`~berth.boot.BootSpec`, stopping it, and reporting — to every ``on_exit``
listener, exactly once — when it ends for any reason: it exited by itself, something outside
killed it, or :meth:`Runtime.stop` did.  That last guarantee is what the node agent builds
on: a hard reservation lives exactly as long as its workload, so the agent releases it from
an exit listener, whatever ended the workload.

It is deliberately *not* admission (the budget decides whether a workload may start) nor
placement, and it does not pull image layers.  A boot that cannot happen raises
:class:`~berth.boot.BootFailed` with the real reason (``boot_failed: command not found:
'nosuchcmd'``), so a scheduler walking its candidates logs why a node refused rather than
mistaking a broken command for a full node.  ``BootSpec`` and ``BootFailed`` live in
:mod:`berth.boot`, below the node, because the node client port and the scheduler speak
them too; they are re-exported here as part of this port's signature.

Drivers, each in its own module beside this one: :mod:`~berth.node.runtime.process` (one OS
process group per workload) and :mod:`~berth.node.runtime.fake` (no processes; tests and the
simulator).  :class:`ExitListeners` and :class:`WorkloadIds` are the bookkeeping drivers share;
:mod:`berth.testing.runtime_contract` is the suite every driver passes.

A workload's id is the caller's when it names one (``start(spec, workload_id="web-7")``: the
node core passes the id a scheduler or the API chose, so a retried run is recognised) and
else the driver's own (:class:`WorkloadIds`: ``<name>-<n>``, never one already running).
:func:`checked_workload_id` is the check a driver applies to a caller's id: a ``Name`` not
already running here, else ``Invalid`` naming ``workload_id`` — a runtime never runs two
workloads under one id.

A stop may carry its own grace (``stop(id, grace_s=30)``): how long the workload gets between
the graceful signal (``SIGTERM``, a guest's poweroff) and the kill; ``None`` is the runtime's
configured default.  :data:`StopGrace` bounds it (finite, 0 to :data:`MAX_STOP_GRACE_S`) and
:func:`checked_grace` is the one check every boundary that receives one applies;
:func:`end_within_grace` is the wait-then-kill each driver's ``stop`` ends with.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import signal
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol, runtime_checkable

from pydantic import Field, Strict

from berth.boot import BootFailed, BootSpec
from berth.errors import Invalid
from berth.model import NAME_RULE
from berth.validation import Rule

__all__ = [
    "MAX_STOP_GRACE_S",
    "AdoptingRuntime",
    "BootFailed",
    "BootSpec",
    "ClosingRuntime",
    "ExitListener",
    "ExitListeners",
    "LoggingRuntime",
    "Runtime",
    "RuntimeDriver",
    "StopGrace",
    "WorkloadExit",
    "WorkloadHandle",
    "WorkloadIds",
    "checked_grace",
    "checked_workload_id",
    "end_within_grace",
    "stop_grace",
    "workload_hostname",
]

logger = logging.getLogger(__name__)

MAX_STOP_GRACE_S = 3600.0
"""The longest grace a stop may ask for: an hour; anything longer is a mistake, not a plan."""

StopGrace = Annotated[float, Strict(), Field(ge=0, le=MAX_STOP_GRACE_S, allow_inf_nan=False)]
"""Seconds between a stop's graceful signal and its kill: finite, 0 to an hour."""

_STOP_GRACE: Rule[float] = Rule(StopGrace)


def checked_grace(grace_s: object, *, field: str = "grace_s") -> float | None:
    """``grace_s`` as a :data:`StopGrace` (``None`` stays ``None``: the runtime's default).

    Raises ``Invalid`` naming ``field`` for anything else: a bool, a string, a negative,
    NaN or infinite number, more than :data:`MAX_STOP_GRACE_S`.
    """
    return None if grace_s is None else _STOP_GRACE(grace_s, field)


def configured_grace(value: object, *, field: str = "stop_grace_s") -> float:
    """A runtime's configured grace (its default for stops that name none): a
    :data:`StopGrace`, ``None`` refused too."""
    if value is None:
        raise Invalid("must be a number of seconds, got None", field=field)
    return _STOP_GRACE(value, field)


def stop_grace(grace_s: float | None, default: float) -> float:
    """The grace a driver applies: ``grace_s`` checked, or its configured ``default``."""
    checked = checked_grace(grace_s)
    return default if checked is None else checked


async def end_within_grace(
    workload: WorkloadHandle, grace_s: float, kill: Callable[[], object]
) -> None:
    """After a stop's graceful signal: wait up to ``grace_s`` for ``workload`` to end, else
    ``kill()`` it and wait for its end.  Concurrent stops: the shortest grace kills."""
    try:
        await asyncio.wait_for(asyncio.shield(workload.wait()), grace_s)
    except TimeoutError:
        kill()
        await workload.wait()


@dataclass(frozen=True, slots=True)
class WorkloadExit:
    """How a workload ended.

    ``code`` is its exit status when it exited by itself, ``signal`` the signal number that
    ended it otherwise; ``stopped`` says the runtime's ``stop`` had been asked to end it;
    ``detail`` is what the runtime knows of why (``out of memory: its limit is 64 MiB``).
    """

    code: int | None = None
    signal: int | None = None
    stopped: bool = False
    detail: str | None = None

    @classmethod
    def from_status(
        cls, status: int, *, stopped: bool = False, detail: str | None = None
    ) -> WorkloadExit:
        """The end a shell's (or ``runc``'s) exit ``status`` reports: 128 + N is signal N,
        anything else an exit code."""
        signum = status - 128
        if status > 128 and 0 < signum < signal.NSIG:
            return cls(signal=signum, stopped=stopped, detail=detail)
        return cls(code=status, stopped=stopped, detail=detail)

    @property
    def reason(self) -> str:
        """``exited with code 0``, ``killed by SIGKILL``, ``stopped (killed by SIGTERM)``…"""
        if self.signal is not None:
            try:
                how = f"killed by {signal.Signals(self.signal).name}"
            except ValueError:
                how = f"killed by signal {self.signal}"
        elif self.code is not None:
            how = f"exited with code {self.code}"
        else:
            how = ""
        if self.detail:
            how = f"{how}: {self.detail}" if how else self.detail
        if self.stopped:
            return f"stopped ({how})" if how else "stopped"
        return how or "ended"


class WorkloadHandle:
    """A handle on one started workload: ``id``, its ``spec``, and how it ends.

    ``pid`` is the OS process id for process-backed workloads (``None`` otherwise).  ``await
    wait()`` returns the :class:`WorkloadExit` once the workload has ended.
    """

    def __init__(self, workload_id: str, spec: BootSpec, pid: int | None = None) -> None:
        self.id = workload_id
        self.spec = spec
        self.pid = pid
        self.locator: dict[str, Any] | None = None
        """How a restarted agent finds this workload again (the driver's own record, kept in
        the node's journal); ``None`` for a driver whose workloads cannot outlive it."""
        self._exit: WorkloadExit | None = None
        self._ended = asyncio.Event()
        self._done_callbacks: list[Callable[[WorkloadHandle], object]] = []

    @property
    def done(self) -> bool:
        return self._exit is not None

    @property
    def exit(self) -> WorkloadExit | None:
        """How it ended; ``None`` while it runs."""
        return self._exit

    @property
    def exit_code(self) -> int | None:
        """Its exit status when it exited by itself; ``None`` while running or if signalled."""
        return None if self._exit is None else self._exit.code

    @property
    def reason(self) -> str | None:
        """Why it ended (``exited with code 1``, ``killed by SIGKILL``…); ``None`` while running."""
        return None if self._exit is None else self._exit.reason

    def add_done_callback(self, fn: Callable[[WorkloadHandle], object], /) -> None:
        """Call ``fn(self)`` when the workload ends (at once if it has): an ``Owner``.

        This is what lets a node budget hold a reservation for exactly the workload's life.
        """
        if self._exit is not None:
            fn(self)
        else:
            self._done_callbacks.append(fn)

    async def wait(self) -> WorkloadExit:
        await self._ended.wait()
        assert self._exit is not None
        return self._exit

    def _end(self, status: WorkloadExit) -> bool:
        # Drivers in this module call this exactly once per workload; False if already ended.
        if self._exit is not None:
            return False
        self._exit = status
        self._ended.set()
        callbacks, self._done_callbacks = self._done_callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                logger.exception("a done callback of workload %s failed", self.id)
        return True

    def __repr__(self) -> str:
        state = "running" if self._exit is None else self._exit.reason
        return f"WorkloadHandle(id={self.id!r}, command={self.spec.command!r}, {state})"


ExitListener = Callable[[WorkloadHandle], None]
"""Called once when a workload ends, for any reason; read ``workload.exit`` for how."""


@runtime_checkable
class Runtime(Protocol):
    """Starts and stops workloads on this node and reports every end to its listeners.

    * ``start(spec, workload_id=None)`` boots a workload or raises :class:`BootFailed` with
      the reason; its id is ``workload_id`` when given (a ``Name`` that is not running here,
      else ``Invalid``), else one the driver generates.
    * ``stop(workload_id, grace_s=None)`` ends it and returns once it has ended: the graceful
      signal first, the kill ``grace_s`` seconds later if it still runs (``None``: the
      driver's configured grace; checked with :func:`checked_grace`).  Stopping an unknown or
      already-ended workload is harmless.
    * ``list()`` — the workloads still running.
    * ``on_exit(listener)`` — ``listener(workload)`` is called exactly once per workload that
      ends after it was registered, whatever ended it; returns a function that unregisters it.
    """

    async def start(self, spec: BootSpec, workload_id: str | None = None) -> WorkloadHandle: ...

    async def stop(self, workload_id: str, *, grace_s: float | None = None) -> None: ...

    def list(self) -> tuple[WorkloadHandle, ...]: ...

    def on_exit(self, listener: ExitListener) -> Callable[[], None]: ...


@runtime_checkable
class AdoptingRuntime(Runtime, Protocol):
    """A runtime whose workloads outlive the agent, so a restarted one can take them back.

    * ``adopt(workload_id, spec, locator)`` — a handle watching (and able to stop) a workload
      a previous agent on this state directory started, found by ``locator`` (the handle's
      :attr:`WorkloadHandle.locator` it recorded); ``None`` when it no longer runs;
    * ``ended(workload_id, locator)`` — how one that no longer runs ended, if the driver
      recorded it (``code`` or ``signal``; ``orphaned``: why it was killed); the driver may
      clean up what it left then;
    * ``abandon(workload_id, locator)`` — kill one that will not be adopted, if it runs.
    """

    def adopt(
        self, workload_id: str, spec: BootSpec, locator: dict[str, Any] | None
    ) -> WorkloadHandle | None: ...

    def ended(
        self, workload_id: str, locator: dict[str, Any] | None = None
    ) -> dict[str, Any] | None: ...

    def abandon(self, workload_id: str, locator: dict[str, Any] | None) -> None: ...


@runtime_checkable
class ClosingRuntime(Runtime, Protocol):
    """A runtime that holds node resources beyond its workloads' lives (the container
    driver's layer mounts): ``aclose()`` stops every workload and lets them go."""

    async def aclose(self) -> None: ...


@runtime_checkable
class LoggingRuntime(Runtime, Protocol):
    """A runtime that keeps its workloads' output in files: ``log_of`` names the one of a
    workload (``None``: this runtime keeps none), all in ``log_dir`` (``<stem>.log``: a
    directory of the runtime's own, whose output the node bounds —
    :func:`~berth.node.output.keep_output`)."""

    @property
    def log_dir(self) -> Path | None: ...

    def log_of(self, workload_id: str) -> Path | None: ...


class ExitListeners:
    """The ``on_exit`` bookkeeping both drivers share."""

    def __init__(self) -> None:
        self._listeners: list[ExitListener] = []

    def add(self, listener: ExitListener) -> Callable[[], None]:
        self._listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    def notify(self, workload: WorkloadHandle) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(workload)
            except Exception:
                # One broken listener must not keep the others (e.g. the reservation
                # release) from hearing about the exit.
                logger.exception("exit listener %r failed for %s", listener, workload.id)


class WorkloadIds:
    """Workload ids unique within one runtime: ``<name>-<n>``, skipping ids in ``taken``
    (a caller may have chosen one of that form)."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def next(self, spec: BootSpec, taken: Container[str] = ()) -> str:
        while True:
            workload_id = f"{spec.name}-{next(self._counter)}"
            if workload_id not in taken:
                return workload_id

    def skip_past(self, workload_ids: Iterable[str]) -> None:
        """Generate only numbers above those of ``workload_ids`` of the form ``<name>-<n>``
        (ids a previous agent generated: a restarted node must not hand them out again)."""
        highest = 0
        for workload_id in workload_ids:
            _, _, number = workload_id.rpartition("-")
            if number.isdigit() and len(number) < 19:
                highest = max(highest, int(number))
        current = next(self._counter)
        self._counter = itertools.count(max(current, highest + 1))

    def choose(self, spec: BootSpec, workload_id: object, running: Container[str]) -> str:
        """The id a start runs under: the caller's ``workload_id`` checked
        (:func:`checked_workload_id`), else the next free generated one."""
        if workload_id is None:
            return self.next(spec, running)
        return checked_workload_id(workload_id, running)


class RuntimeDriver:
    """What this package's runtime drivers share: the stop's default grace
    (``stop_grace_s``, checked), their exit listeners (:meth:`on_exit`) and workload ids."""

    def __init__(self, stop_grace_s: float) -> None:
        self.stop_grace_s = configured_grace(stop_grace_s)
        self._listeners = ExitListeners()
        self._ids = WorkloadIds()

    def on_exit(self, listener: ExitListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def _grace(self, grace_s: float | None) -> float:
        """A stop's grace: ``grace_s``, else ``stop_grace_s``."""
        return stop_grace(grace_s, self.stop_grace_s)


def workload_hostname(workload_id: str) -> str:
    """The hostname a workload's machine or container gets: its id, cut to what a hostname
    may hold (letters, digits, ``-``; at most 63)."""
    return re.sub(r"[^A-Za-z0-9-]", "-", workload_id)[:63].strip("-") or "berth"


def checked_workload_id(workload_id: object, running: Container[str] = ()) -> str:
    """A caller's workload id: a ``Name`` (:data:`~berth.model.NAME_RULE`) not in ``running``;
    ``Invalid`` naming ``workload_id`` otherwise."""
    checked = NAME_RULE(workload_id, "workload_id")
    if checked in running:
        raise Invalid(f"a workload {checked!r} already runs here", field="workload_id")
    return checked
