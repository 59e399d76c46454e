"""The process runtime driver: one OS process group per workload.

Stopping a workload reaches every process it spawned: ``SIGTERM`` to the group, ``SIGKILL``
after a grace period (the stop's own ``grace_s``, else ``stop_grace_s``).  When the group leader
ends, any process left in its group is killed too, so nothing outlives the workload's
reservation.  Workloads do not inherit the agent's environment (it may hold credentials); they
get ``base_env`` (default: ``PATH`` only) overlaid with the spec's ``env``.  ``mem_limit`` is
enforced as ``RLIMIT_AS`` (address space) set between fork and exec: a coarse ceiling that needs
no privileges.  A cgroup v2 ``memory.max`` would bound resident memory exactly, but needs a
delegated cgroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from berth.defaults import STOP_GRACE_S
from berth.node.runtime.port import (
    BootFailed,
    BootSpec,
    ExitListener,
    ExitListeners,
    WorkloadExit,
    WorkloadHandle,
    WorkloadIds,
    configured_grace,
    end_within_grace,
    file_stem,
    stop_grace,
)

__all__ = ["ProcessRuntime"]

logger = logging.getLogger(__name__)


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
    workload: WorkloadHandle
    process: asyncio.subprocess.Process
    stop_requested: bool = False


class ProcessRuntime:
    """Each workload is a real OS process, leader of its own process group.

    ``stop_grace_s`` is how long ``stop`` waits after ``SIGTERM`` before ``SIGKILL`` when the
    stop names no ``grace_s`` of its own.
    ``base_env`` is the environment every workload starts from (default: this process's
    ``PATH`` only).  ``log_dir``, when given, receives each workload's stdout and stderr in
    ``<workload id>.log``; otherwise output is discarded.
    """

    def __init__(
        self,
        *,
        stop_grace_s: float = STOP_GRACE_S,
        base_env: Mapping[str, str] | None = None,
        log_dir: str | Path | None = None,
    ) -> None:
        self.stop_grace_s = configured_grace(stop_grace_s)
        self.base_env = (
            dict(base_env) if base_env is not None else {"PATH": os.environ.get("PATH", os.defpath)}
        )
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._running: dict[str, _Running] = {}
        self._starting: set[str] = set()
        self._watchers: set[asyncio.Task[None]] = set()
        self._listeners = ExitListeners()
        self._ids = WorkloadIds()

    def on_exit(self, listener: ExitListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def list(self) -> tuple[WorkloadHandle, ...]:
        return tuple(entry.workload for entry in self._running.values())

    async def start(self, spec: BootSpec, workload_id: str | None = None) -> WorkloadHandle:
        """Spawn ``spec.command`` as ``workload_id`` (else a generated id); :class:`BootFailed`
        when it cannot be executed."""
        workload_id = self._ids.choose(spec, workload_id, self._taken())
        self._starting.add(workload_id)  # a concurrent start of this id is refused meanwhile
        try:
            return await self._spawn(spec, workload_id)
        finally:
            self._starting.discard(workload_id)

    def _taken(self) -> set[str]:
        return self._running.keys() | self._starting

    async def _spawn(self, spec: BootSpec, workload_id: str) -> WorkloadHandle:
        program = spec.command[0]
        output: IO[bytes] | int = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            output = open(self.log_dir / f"{file_stem(workload_id)}.log", "ab")  # noqa: SIM115
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
        workload = WorkloadHandle(workload_id, spec, pid=process.pid)
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

    async def stop(self, workload_id: str, *, grace_s: float | None = None) -> None:
        """``SIGTERM`` the workload's group, ``SIGKILL`` after the grace period (``grace_s``,
        else ``stop_grace_s``); wait for it.  Concurrent stops: the shortest grace kills."""
        grace = stop_grace(grace_s, self.stop_grace_s)
        entry = self._running.get(workload_id)
        if entry is None or entry.workload.done:
            return
        entry.stop_requested = True
        pgid = entry.process.pid
        _signal_group(pgid, signal.SIGTERM)
        await end_within_grace(entry.workload, grace, lambda: _signal_group(pgid, signal.SIGKILL))

    async def aclose(self) -> None:
        """Stop every running workload."""
        await asyncio.gather(*(self.stop(workload.id) for workload in self.list()))

    def __repr__(self) -> str:
        return f"ProcessRuntime(running={len(self._running)}, stop_grace_s={self.stop_grace_s})"
