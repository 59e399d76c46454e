"""The fake runtime driver: workloads that "run" until stopped, finished or killed.

No processes at all: a test or the simulator ends a workload with :meth:`FakeRuntime.finish`
or :meth:`FakeRuntime.kill`, and chosen commands can be made to fail their boot.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable

from berth.errors import Invalid
from berth.node.runtime.port import (
    BootFailed,
    BootSpec,
    ExitListener,
    ExitListeners,
    Workload,
    WorkloadExit,
    WorkloadIds,
)

__all__ = ["FakeRuntime"]


class FakeRuntime:
    """Workloads that run until stopped, finished or killed — no processes at all.

    ``failing_commands`` holds programs (``command[0]``) whose boots fail with
    :class:`BootFailed`; it is a plain set, change it at any time.
    """

    def __init__(self, failing_commands: Iterable[str] = ()) -> None:
        self.failing_commands: set[str] = set(failing_commands)
        self._running: dict[str, Workload] = {}
        self._listeners = ExitListeners()
        self._ids = WorkloadIds()

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
