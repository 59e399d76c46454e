"""The fake runtime driver: workloads that "run" until stopped, finished or killed.

No processes at all: a test or the simulator ends a workload with :meth:`FakeRuntime.finish`
or :meth:`FakeRuntime.kill`, and chosen commands can be made to fail their boot.

A stop's grace means here what it means for real workloads, with the workload's answer to the
graceful signal simulated: a workload honours it at once (``stopped (killed by SIGTERM)``)
unless its program is one of ``ignoring_term``; such a workload ends only when the grace runs
out (``stopped (killed by SIGKILL)``) or when a test ends it first.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

from berth.defaults import STOP_GRACE_S
from berth.errors import Invalid
from berth.node.runtime.port import (
    BootFailed,
    BootSpec,
    RuntimeDriver,
    WorkloadExit,
    WorkloadHandle,
    end_within_grace,
)

__all__ = ["FakeRuntime"]


class FakeRuntime(RuntimeDriver):
    """Workloads that run until stopped, finished or killed — no processes at all.

    ``failing_commands`` holds programs (``command[0]``) whose boots fail with
    :class:`BootFailed`; ``ignoring_term`` programs whose workloads ignore a stop's graceful
    signal, so a stop ends them only after its grace (``grace_s``, else ``stop_grace_s``).
    Both are plain sets; change them at any time.
    """

    def __init__(
        self,
        failing_commands: Iterable[str] = (),
        *,
        ignoring_term: Iterable[str] = (),
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.failing_commands: set[str] = set(failing_commands)
        self.ignoring_term: set[str] = set(ignoring_term)
        super().__init__(stop_grace_s)
        self._running: dict[str, WorkloadHandle] = {}

    def list(self) -> tuple[WorkloadHandle, ...]:
        return tuple(self._running.values())

    async def start(self, spec: BootSpec, workload_id: str | None = None) -> WorkloadHandle:
        workload_id = self._ids.choose(spec, workload_id, self._running)
        program = spec.command[0] if spec.command else ""  # "": the image's Cmd
        if program in self.failing_commands:
            raise BootFailed(f"simulated boot failure of {program!r}")
        workload = WorkloadHandle(workload_id, spec)
        self._running[workload.id] = workload
        return workload

    async def stop(self, workload_id: str, *, grace_s: float | None = None) -> None:
        grace = self._grace(grace_s)
        workload = self._running.get(workload_id)
        if workload is None:
            return
        if (workload.spec.command or ("",))[0] not in self.ignoring_term:
            self._end(workload, WorkloadExit(signal=signal.SIGTERM, stopped=True))
            return

        def kill() -> None:
            if self._running.get(workload_id) is workload:  # not ended by a test meanwhile
                self._end(workload, WorkloadExit(signal=signal.SIGKILL, stopped=True))

        await end_within_grace(workload, grace, kill)

    def finish(self, workload_id: str, code: int = 0) -> None:
        """End a running workload as if it exited with ``code``."""
        self._end(self._get(workload_id), WorkloadExit(code=code))

    def kill(self, workload_id: str, signum: int = signal.SIGKILL) -> None:
        """End a running workload as if something outside the runtime killed it."""
        self._end(self._get(workload_id), WorkloadExit(signal=signum))

    def _get(self, workload_id: str) -> WorkloadHandle:
        try:
            return self._running[workload_id]
        except KeyError:
            raise Invalid(f"no running workload {workload_id!r}", field="workload_id") from None

    def _end(self, workload: WorkloadHandle, status: WorkloadExit) -> None:
        del self._running[workload.id]
        if workload._end(status):
            self._listeners.notify(workload)

    def __repr__(self) -> str:
        return f"FakeRuntime(running={len(self._running)})"
