"""The workload runtime port, and its two drivers: real OS processes and a fake for simulation.

This module owns *running* a workload on this node: booting it from a :class:`BootSpec`,
stopping it, and reporting — to every ``on_exit`` listener, exactly once — when it ends for
any reason: it exited by itself, something outside killed it, or :meth:`Runtime.stop` did.
That last guarantee is what the node agent builds on: a hard reservation lives exactly as long
as its workload, so the agent releases it from an exit listener, whatever ended the workload.

It is deliberately *not* admission (the budget decides whether a workload may start) nor
placement, and it does not pull image layers.  A boot that cannot happen raises
:class:`BootFailed` with the real reason (``boot_failed: command not found: 'nosuchcmd'``), so
a scheduler walking its candidates logs why a node refused rather than mistaking a broken
command for a full node.

Drivers:

* :class:`ProcessRuntime` — one OS process per workload, in its own process group so that
  stopping it reaches every process it spawned: ``SIGTERM`` to the group, ``SIGKILL`` after a
  grace period.  When the group leader ends, any process left in its group is killed too, so
  nothing outlives the workload's reservation.  Workloads do not inherit the agent's
  environment (it may hold credentials); they get ``base_env`` (default: ``PATH`` only)
  overlaid with the spec's ``env``.  ``mem_limit`` is enforced as ``RLIMIT_AS`` (address space)
  set between fork and exec: a coarse ceiling that needs no privileges.  A cgroup v2
  ``memory.max`` would bound resident memory exactly, but needs a delegated cgroup.
* :class:`FakeRuntime` — no processes: workloads "run" until stopped or until the test or
  simulator calls :meth:`FakeRuntime.finish` / :meth:`FakeRuntime.kill`; chosen commands can be
  made to fail their boot.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import resource
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Any, Protocol, runtime_checkable

from pydantic import BeforeValidator, Field, StrictInt, field_validator

from berth.errors import BerthError, Invalid
from berth.units import parse_information
from berth.validation import BerthModel

__all__ = [
    "BootFailed",
    "BootSpec",
    "ExitListener",
    "FakeRuntime",
    "ProcessRuntime",
    "Runtime",
    "Workload",
    "WorkloadExit",
]

logger = logging.getLogger(__name__)


class BootFailed(BerthError):
    """A workload could not be started; ``reason`` says why (``command not found: 'x'``)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"boot_failed: {reason}")


def _information(value: Any) -> Any:
    return parse_information(value) if isinstance(value, str) else value


def _workload_name(value: str) -> str:
    if not value:
        raise Invalid("must not be empty")
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise Invalid(f"must not contain whitespace or control characters, got {value!r}")
    return value


class BootSpec(BerthModel):
    """How to boot one workload.

    ``name`` — a label (workload ids are derived from it); ``command`` — the program and its
    arguments, never empty; ``env`` — environment variables for the workload; ``mem_limit`` —
    a memory ceiling in bytes (or a unit string such as ``"256MiB"``), ``None`` for none.
    """

    name: str
    command: Annotated[tuple[str, ...], Field(min_length=1)]
    env: dict[str, str] = Field(default_factory=dict)
    mem_limit: Annotated[StrictInt, BeforeValidator(_information), Field(gt=0)] | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        return _workload_name(name)

    @field_validator("command")
    @classmethod
    def _check_command(cls, command: tuple[str, ...]) -> tuple[str, ...]:
        if not command[0]:
            raise Invalid("the program (first element) must not be empty")
        if any("\0" in part for part in command):
            raise Invalid("must not contain NUL characters")
        return command

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not key or "=" in key or "\0" in key:
                raise Invalid(f"variable names must be non-empty without '=' or NUL: {key!r}")
            if "\0" in value:
                raise Invalid(f"the value of {key!r} must not contain NUL characters")
        return env


@dataclass(frozen=True, slots=True)
class WorkloadExit:
    """How a workload ended.

    ``code`` is its exit status when it exited by itself, ``signal`` the signal number that
    ended it otherwise; ``stopped`` says the runtime's ``stop`` had been asked to end it.
    """

    code: int | None = None
    signal: int | None = None
    stopped: bool = False

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
        if self.stopped:
            return f"stopped ({how})" if how else "stopped"
        return how or "ended"


class Workload:
    """A handle on one started workload: ``id``, its ``spec``, and how it ends.

    ``pid`` is the OS process id for process-backed workloads (``None`` otherwise).  ``await
    wait()`` returns the :class:`WorkloadExit` once the workload has ended.
    """

    def __init__(self, workload_id: str, spec: BootSpec, pid: int | None = None) -> None:
        self.id = workload_id
        self.spec = spec
        self.pid = pid
        self._exit: WorkloadExit | None = None
        self._ended = asyncio.Event()
        self._done_callbacks: list[Callable[[Workload], object]] = []

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

    def add_done_callback(self, fn: Callable[[Workload], object], /) -> None:
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
        return f"Workload(id={self.id!r}, command={self.spec.command!r}, {state})"


ExitListener = Callable[[Workload], None]
"""Called once when a workload ends, for any reason; read ``workload.exit`` for how."""


@runtime_checkable
class Runtime(Protocol):
    """Starts and stops workloads on this node and reports every end to its listeners.

    * ``start(spec)`` boots a workload or raises :class:`BootFailed` with the reason.
    * ``stop(workload_id)`` ends it and returns once it has ended; stopping an unknown or
      already-ended workload is harmless.
    * ``list()`` — the workloads still running.
    * ``on_exit(listener)`` — ``listener(workload)`` is called exactly once per workload that
      ends after it was registered, whatever ended it; returns a function that unregisters it.
    """

    async def start(self, spec: BootSpec) -> Workload: ...

    async def stop(self, workload_id: str) -> None: ...

    def list(self) -> tuple[Workload, ...]: ...

    def on_exit(self, listener: ExitListener) -> Callable[[], None]: ...


class _Listeners:
    """The ``on_exit`` bookkeeping both drivers share."""

    def __init__(self) -> None:
        self._listeners: list[ExitListener] = []

    def add(self, listener: ExitListener) -> Callable[[], None]:
        self._listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    def notify(self, workload: Workload) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(workload)
            except Exception:
                # One broken listener must not keep the others (e.g. the reservation
                # release) from hearing about the exit.
                logger.exception("exit listener %r failed for %s", listener, workload.id)


class _Ids:
    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def next(self, spec: BootSpec) -> str:
        return f"{spec.name}-{next(self._counter)}"


# --- real processes -------------------------------------------------------------------------


def _limit_address_space(limit_bytes: int) -> Callable[[], None]:
    # Runs in the child between fork and exec, where little is safe: keep it to one call.
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return apply


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


@dataclass
class _Running:
    workload: Workload
    process: asyncio.subprocess.Process
    stop_requested: bool = False


class ProcessRuntime:
    """Each workload is a real OS process, leader of its own process group.

    ``stop_grace_s`` is how long ``stop`` waits after ``SIGTERM`` before ``SIGKILL``.
    ``base_env`` is the environment every workload starts from (default: this process's
    ``PATH`` only).  ``log_dir``, when given, receives each workload's stdout and stderr in
    ``<workload id>.log``; otherwise output is discarded.
    """

    def __init__(
        self,
        *,
        stop_grace_s: float = 2.0,
        base_env: Mapping[str, str] | None = None,
        log_dir: str | Path | None = None,
    ) -> None:
        if isinstance(stop_grace_s, bool) or not isinstance(stop_grace_s, int | float):
            raise Invalid(
                f"must be a number of seconds, got {stop_grace_s!r}", field="stop_grace_s"
            )
        if not stop_grace_s >= 0:
            raise Invalid(f"must not be negative, got {stop_grace_s!r}", field="stop_grace_s")
        self.stop_grace_s = float(stop_grace_s)
        self.base_env = (
            dict(base_env) if base_env is not None else {"PATH": os.environ.get("PATH", os.defpath)}
        )
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._running: dict[str, _Running] = {}
        self._watchers: set[asyncio.Task[None]] = set()
        self._listeners = _Listeners()
        self._ids = _Ids()

    def on_exit(self, listener: ExitListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def list(self) -> tuple[Workload, ...]:
        return tuple(entry.workload for entry in self._running.values())

    async def start(self, spec: BootSpec) -> Workload:
        """Spawn ``spec.command``; :class:`BootFailed` when it cannot be executed."""
        workload_id = self._ids.next(spec)
        program = spec.command[0]
        output: IO[bytes] | int = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            output = open(self.log_dir / f"{workload_id}.log", "ab")  # noqa: SIM115
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.command,
                env={**self.base_env, **spec.env},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,
                preexec_fn=_limit_address_space(spec.mem_limit) if spec.mem_limit else None,
            )
        except FileNotFoundError:
            raise BootFailed(f"command not found: {program!r}") from None
        except PermissionError:
            raise BootFailed(f"permission denied executing {program!r}") from None
        except OSError as error:
            raise BootFailed(f"cannot execute {program!r}: {error.strerror or error}") from None
        except subprocess.SubprocessError as error:  # the memory limit could not be applied
            raise BootFailed(f"cannot prepare {program!r}: {error}") from None
        finally:
            if not isinstance(output, int):
                output.close()
        workload = Workload(workload_id, spec, pid=process.pid)
        entry = _Running(workload, process)
        self._running[workload_id] = entry
        watcher = asyncio.get_running_loop().create_task(
            self._watch(entry), name=f"berth-workload-{workload_id}"
        )
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return workload

    async def _watch(self, entry: _Running) -> None:
        returncode = await entry.process.wait()
        # The leader is gone; take any straggler it left in its group with it.
        _signal_group(entry.process.pid, signal.SIGKILL)
        status = WorkloadExit(
            code=returncode if returncode >= 0 else None,
            signal=-returncode if returncode < 0 else None,
            stopped=entry.stop_requested,
        )
        self._running.pop(entry.workload.id, None)
        if entry.workload._end(status):
            self._listeners.notify(entry.workload)

    async def stop(self, workload_id: str) -> None:
        """``SIGTERM`` the workload's group, ``SIGKILL`` after the grace period; wait for it."""
        entry = self._running.get(workload_id)
        if entry is None or entry.workload.done:
            return
        entry.stop_requested = True
        pgid = entry.process.pid
        _signal_group(pgid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(entry.workload.wait()), self.stop_grace_s)
        except TimeoutError:
            _signal_group(pgid, signal.SIGKILL)
            await entry.workload.wait()

    async def aclose(self) -> None:
        """Stop every running workload."""
        await asyncio.gather(*(self.stop(workload.id) for workload in self.list()))

    def __repr__(self) -> str:
        return f"ProcessRuntime(running={len(self._running)}, stop_grace_s={self.stop_grace_s})"


# --- fake, for tests and simulation ---------------------------------------------------------


class FakeRuntime:
    """Workloads that run until stopped, finished or killed — no processes at all.

    ``failing_commands`` holds programs (``command[0]``) whose boots fail with
    :class:`BootFailed`; it is a plain set, change it at any time.
    """

    def __init__(self, failing_commands: Iterable[str] = ()) -> None:
        self.failing_commands: set[str] = set(failing_commands)
        self._running: dict[str, Workload] = {}
        self._listeners = _Listeners()
        self._ids = _Ids()

    def on_exit(self, listener: ExitListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def list(self) -> tuple[Workload, ...]:
        return tuple(self._running.values())

    async def start(self, spec: BootSpec) -> Workload:
        program = spec.command[0]
        if program in self.failing_commands:
            raise BootFailed(f"simulated boot failure of {program!r}")
        workload = Workload(self._ids.next(spec), spec)
        self._running[workload.id] = workload
        return workload

    async def stop(self, workload_id: str) -> None:
        workload = self._running.get(workload_id)
        if workload is not None:
            self._end(workload, WorkloadExit(signal=signal.SIGTERM, stopped=True))

    def finish(self, workload_id: str, code: int = 0) -> None:
        """End a running workload as if it exited with ``code``."""
        self._end(self._get(workload_id), WorkloadExit(code=code))

    def kill(self, workload_id: str, signum: int = signal.SIGKILL) -> None:
        """End a running workload as if something outside the runtime killed it."""
        self._end(self._get(workload_id), WorkloadExit(signal=signum))

    def _get(self, workload_id: str) -> Workload:
        try:
            return self._running[workload_id]
        except KeyError:
            raise Invalid(f"no running workload {workload_id!r}", field="workload_id") from None

    def _end(self, workload: Workload, status: WorkloadExit) -> None:
        del self._running[workload.id]
        if workload._end(status):
            self._listeners.notify(workload)

    def __repr__(self) -> str:
        return f"FakeRuntime(running={len(self._running)})"
