"""The conformance suite of the workload ``Runtime`` port, shipped for every driver.

Subclass :class:`RuntimeContract` in a driver's test module and provide the driver-specific
hooks (how to build the runtime, a workload that runs until stopped, one whose boot fails, one
that exits by itself with a given code); pytest collects the inherited tests.  The guarantees
checked are the ones the node agent builds on: every workload's end is reported to every
``on_exit`` listener exactly once, whatever ended it; ``stop`` is idempotent and harmless on
unknown ids; a boot failure is a ``BootFailed`` naming the real reason; a caller's workload id
is the workload's, never two running under one (a generated id skips a caller's); a stop's own
grace is
what a workload that ignores the graceful signal gets before it is killed, and a malformed
grace is ``Invalid`` and stops nothing.

The grace case needs a workload that ignores the graceful signal
(:meth:`RuntimeContract.start_ignoring_term`); a driver that cannot offer one skips it, saying
why.  Its timing checks are one-sided or loose (a kill never comes *before* the grace; the
shorter grace kills first; the kill comes within :attr:`RuntimeContract.kill_slack_s` of it),
so a loaded machine does not fail them.

:class:`AdoptingRuntimeContract` is the suite of a driver whose workloads outlive their agent
(:class:`~berth.node.runtime.port.AdoptingRuntime`): a restarted agent's runtime adopts a
running workload, never one that ended or a process that merely has its pid.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from berth.errors import BerthError, Invalid
from berth.node.runtime import BootFailed, BootSpec, Runtime, WorkloadExit, WorkloadHandle
from berth.node.runtime.port import AdoptingRuntime

__all__ = ["AdoptingRuntimeContract", "ExitLog", "RuntimeContract", "run"]

T = TypeVar("T")


def run(scenario: Callable[[], Awaitable[T]], timeout_s: float = 5.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(scenario(), timeout_s)

    return asyncio.run(bounded())


class ExitLog:
    """An ``on_exit`` listener that records every call."""

    def __init__(self) -> None:
        self.ended: list[WorkloadHandle] = []

    def __call__(self, workload: WorkloadHandle) -> None:
        assert workload.done  # listeners see the final state
        self.ended.append(workload)

    def ids(self) -> list[str]:
        return [workload.id for workload in self.ended]


# --- the contract ----------------------------------------------------------------------------


class RuntimeContract:
    """What every ``Runtime`` driver guarantees.  Subclasses provide the driver-specific parts."""

    timeout_s: float = 5.0
    """How long one test's scenario may take (a driver that boots machines needs longer)."""

    def make_runtime(self) -> Runtime:
        raise NotImplementedError

    def long_running_spec(self) -> BootSpec:
        """A workload that runs until stopped."""
        raise NotImplementedError

    def failing_spec(self, runtime: Runtime) -> tuple[BootSpec, str]:
        """A workload whose boot fails, and a fragment of the reason the driver must give."""
        raise NotImplementedError

    async def exit_by_itself(self, runtime: Runtime, code: int) -> WorkloadHandle:
        """Start a workload that ends by itself with exit status ``code``."""
        raise NotImplementedError

    kill_slack_s: float = 10.0
    """How late after its grace a kill may land (and be reported) on a loaded machine."""

    async def start_ignoring_term(self, runtime: Runtime) -> WorkloadHandle:
        """Start a workload that ignores the graceful stop signal, returning once it does
        (e.g. once its ``trap '' TERM`` is set).  ``pytest.skip(reason)`` where the driver
        cannot (or where a test of its own covers it at less cost)."""
        pytest.skip("the driver offers no workload that ignores a graceful stop")

    def test_start_then_stop_reports_the_end_once(self) -> None:
        async def scenario() -> None:
            runtime = self.make_runtime()
            log = ExitLog()
            runtime.on_exit(log)
            workload = await runtime.start(self.long_running_spec())
            assert not workload.done
            assert workload.exit is None and workload.reason is None
            assert runtime.list() == (workload,)
            for grace in (-1.0, float("nan"), float("inf"), 3601.0, True, "5"):
                with pytest.raises(Invalid) as caught:
                    await runtime.stop(workload.id, grace_s=grace)  # type: ignore[arg-type]
                assert caught.value.field == "grace_s"
                assert not workload.done  # a malformed grace stops nothing
            await runtime.stop(workload.id)
            assert workload.done
            status = await workload.wait()
            assert status.stopped
            assert status.reason.startswith("stopped")
            assert runtime.list() == ()
            assert log.ids() == [workload.id]

        run(scenario, self.timeout_s)
        assert isinstance(self.make_runtime(), Runtime)

    def test_stop_is_idempotent_and_unknown_ids_are_harmless(self) -> None:
        async def scenario() -> None:
            runtime = self.make_runtime()
            log = ExitLog()
            runtime.on_exit(log)
            await runtime.stop("no-such-workload")
            workload = await runtime.start(self.long_running_spec())
            await asyncio.gather(runtime.stop(workload.id), runtime.stop(workload.id))
            await runtime.stop(workload.id)
            assert log.ids() == [workload.id]

        run(scenario, self.timeout_s)

    def test_exit_by_itself_is_reported_with_its_code(self) -> None:
        async def scenario() -> None:
            runtime = self.make_runtime()
            log = ExitLog()
            runtime.on_exit(log)
            workload = await self.exit_by_itself(runtime, 3)
            status = await workload.wait()
            assert status == WorkloadExit(code=3)
            assert workload.exit_code == 3
            assert workload.reason == "exited with code 3"
            assert log.ids() == [workload.id]
            assert runtime.list() == ()
            await runtime.stop(workload.id)  # already ended: harmless
            assert len(log.ended) == 1

        run(scenario, self.timeout_s)

    def test_boot_failure_names_the_reason(self) -> None:
        async def scenario() -> None:
            runtime = self.make_runtime()
            spec, fragment = self.failing_spec(runtime)
            with pytest.raises(BootFailed) as caught:
                await runtime.start(spec)
            assert str(caught.value).startswith("boot_failed: ")
            assert fragment in caught.value.reason
            assert isinstance(caught.value, BerthError)
            assert runtime.list() == ()

        run(scenario, self.timeout_s)

    def test_workload_ids_are_unique_and_listeners_can_unsubscribe(self) -> None:
        async def scenario() -> None:
            runtime = self.make_runtime()
            kept, dropped = ExitLog(), ExitLog()
            runtime.on_exit(kept)
            unsubscribe = runtime.on_exit(dropped)
            unsubscribe()
            unsubscribe()  # twice is harmless
            spec = self.long_running_spec()
            workloads = [await runtime.start(spec) for _ in range(3)]
            assert len({workload.id for workload in workloads}) == 3
            assert set(runtime.list()) == set(workloads)
            await asyncio.gather(*(runtime.stop(workload.id) for workload in workloads))
            assert sorted(kept.ids()) == sorted(workload.id for workload in workloads)
            assert dropped.ended == []

        run(scenario, self.timeout_s)

    def test_a_callers_workload_id_is_the_workloads_and_never_runs_twice(self) -> None:
        async def scenario() -> None:
            runtime = self.make_runtime()
            spec = self.long_running_spec()
            chosen = await runtime.start(spec, workload_id=f"{spec.name}-1")
            assert chosen.id == f"{spec.name}-1"
            generated = await runtime.start(spec)  # the driver's own id skips the caller's
            assert generated.id != chosen.id
            again = runtime.start(spec, workload_id=chosen.id)
            with pytest.raises(Invalid) as caught:
                await again
            assert caught.value.field == "workload_id"
            for bad in ("", "two words", 7):
                with pytest.raises(Invalid) as caught:
                    await runtime.start(spec, workload_id=bad)  # type: ignore[arg-type]
                assert caught.value.field == "workload_id"
            assert set(runtime.list()) == {chosen, generated}  # the refused starts ran nothing
            await runtime.stop(chosen.id)
            reused = await runtime.start(spec, workload_id=chosen.id)  # ended: the id is free
            assert reused.id == chosen.id and not reused.done
            await asyncio.gather(*(runtime.stop(w.id) for w in runtime.list()))

        run(scenario, self.timeout_s)

    def test_concurrent_starts_of_one_workload_id_run_it_once(self) -> None:
        async def scenario() -> None:
            runtime = self.make_runtime()
            spec = self.long_running_spec()
            outcomes = await asyncio.gather(
                runtime.start(spec, workload_id="twin"),
                runtime.start(spec, workload_id="twin"),
                return_exceptions=True,
            )
            started = [o for o in outcomes if isinstance(o, WorkloadHandle)]
            refused = [o for o in outcomes if isinstance(o, Invalid)]
            assert len(started) == 1 and len(refused) == 1, outcomes
            assert refused[0].field == "workload_id"
            assert runtime.list() == (started[0],)
            await runtime.stop("twin")

        run(scenario, self.timeout_s)

    def test_a_failing_listener_does_not_silence_the_others(self) -> None:
        async def scenario() -> None:
            runtime = self.make_runtime()

            def broken(workload: WorkloadHandle) -> None:
                raise RuntimeError("listener bug")

            log = ExitLog()
            runtime.on_exit(broken)
            runtime.on_exit(log)
            workload = await runtime.start(self.long_running_spec())
            await runtime.stop(workload.id)
            assert log.ids() == [workload.id]

        run(scenario, self.timeout_s)

    def test_a_stop_kills_a_workload_ignoring_sigterm_after_its_own_grace(self) -> None:
        # the driver's configured grace should lie between the two, so both are seen applied
        short, long = 0.2, 1.5

        async def stop(runtime: Runtime, workload: WorkloadHandle, grace: float) -> float:
            began = time.monotonic()
            await runtime.stop(workload.id, grace_s=grace)
            return time.monotonic() - began

        async def scenario() -> None:
            runtime = self.make_runtime()
            log = ExitLog()
            runtime.on_exit(log)
            first = await self.start_ignoring_term(runtime)
            second = await self.start_ignoring_term(runtime)
            order: list[str] = []
            for workload in (first, second):
                workload.add_done_callback(lambda ended: order.append(ended.id))
            waited = await asyncio.gather(stop(runtime, first, short), stop(runtime, second, long))
            for workload in (first, second):
                assert workload.exit is not None
                assert workload.exit.stopped and workload.exit.signal == signal.SIGKILL
                assert workload.reason == "stopped (killed by SIGKILL)"
            # one-sided: never killed before its grace, whatever the driver's own default
            assert waited[0] >= short - 0.05 and waited[1] >= long - 0.05
            assert order == [first.id, second.id]  # the shorter grace killed first
            assert waited[0] < short + self.kill_slack_s
            assert sorted(log.ids()) == sorted([first.id, second.id])
            assert runtime.list() == ()

        run(scenario, self.timeout_s + long + self.kill_slack_s)


# --- adoption: the contract of a runtime whose workloads outlive their agent -----------------


class AdoptingRuntimeContract:
    """What an :class:`~berth.node.runtime.port.AdoptingRuntime` guarantees: a second runtime
    on the same state directory (the restarted agent's) adopts a running workload from its
    locator — a handle that is not done, whose end it reports, that it can stop — and returns
    ``None`` for one that ended, whose end it can tell (``ended``), or for a locator naming a
    process that is not the one started (a recycled pid).  Subclasses provide the runtimes.
    """

    timeout_s: float = 10.0

    def make_runtime(self, state_dir: Path) -> AdoptingRuntime:
        """A fresh runtime on ``state_dir`` (with a live owner, so nothing is orphaned)."""
        raise NotImplementedError

    def long_running_spec(self) -> BootSpec:
        raise NotImplementedError

    def exiting_spec(self, code: int) -> BootSpec:
        """A workload that exits by itself with status ``code``."""
        raise NotImplementedError

    def test_a_second_runtime_adopts_a_running_workload_and_can_stop_it(
        self, tmp_path: Path
    ) -> None:
        async def scenario() -> None:
            first = self.make_runtime(tmp_path)
            started = await first.start(self.long_running_spec(), workload_id="kept-1")
            assert started.locator is not None
            second = self.make_runtime(tmp_path)
            log = ExitLog()
            second.on_exit(log)
            adopted = second.adopt("kept-1", started.spec, started.locator)
            assert adopted is not None and adopted.id == "kept-1" and not adopted.done
            assert second.list() == (adopted,)
            assert second.adopt("kept-1", started.spec, started.locator) is None  # once
            await second.stop("kept-1", grace_s=1.0)
            status = await adopted.wait()
            assert status.stopped and log.ids() == ["kept-1"]
            await asyncio.wait_for(started.wait(), self.timeout_s)  # the first sees it end too

        run(scenario, self.timeout_s)

    def test_an_ended_workload_is_not_adopted_and_its_end_is_known(self, tmp_path: Path) -> None:
        async def scenario() -> None:
            first = self.make_runtime(tmp_path)
            started = await first.start(self.exiting_spec(5), workload_id="done-1")
            await started.wait()
            second = self.make_runtime(tmp_path)
            assert second.adopt("done-1", started.spec, started.locator) is None
            assert (second.ended("done-1") or {}).get("code") == 5
            assert second.list() == ()

        run(scenario, self.timeout_s)

    def test_a_locator_naming_another_process_is_not_adopted(self, tmp_path: Path) -> None:
        async def scenario() -> None:
            first = self.make_runtime(tmp_path)
            started = await first.start(self.long_running_spec(), workload_id="moved-1")
            assert started.locator is not None
            # the same pids, other start times: what a recycled pid looks like
            forged = {
                key: [value[0], value[1] + 1] if isinstance(value, list) else value
                for key, value in started.locator.items()
            }
            second = self.make_runtime(tmp_path)
            run_record = Path(tmp_path)  # a driver may keep its own record: hide it
            for path in run_record.rglob("*.run"):
                path.unlink()
            assert second.adopt("moved-1", started.spec, forged) is None
            assert not started.done  # and the workload it did not adopt is untouched
            await first.stop("moved-1", grace_s=1.0)

        run(scenario, self.timeout_s)
