"""Restart policies on the node: the node core restarts a workload that ended, under the same
id, reservation and layers, after an exponential backoff, at most so many times within an
interval — and never after a stop.  The policy value's own bounds are tested here too."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth import Invalid, Layer, Spec
from berth.boot import WorkloadStatus
from berth.model import ReschedulePolicy, RestartPolicy
from berth.node.budget import BudgetLimits, NodeBudget, StaticLoad
from berth.node.core import NodeCore
from berth.node.journal import Journal
from berth.node.layers import LayerRegistry
from berth.node.runtime import BootSpec, FakeRuntime, ProcessRuntime
from berth.ownership import Refused
from berth.testing.clock import FakeClock
from berth.units import GiB

SPEC = Spec(vcpus=0.5, mem=GiB, disk=GiB)
LAYERS = (Layer(id="base", size=100),)


class Backoff:
    """The sleep the core waits its backoffs with: it notes each delay and moves the fake
    clock by it, at once — or holds every wait until :meth:`release` when ``held``."""

    def __init__(self, clock: FakeClock, *, held: bool = False) -> None:
        self.clock = clock
        self.delays: list[float] = []
        self.held = held
        self._released = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if self.held:
            await self._released.wait()
        self.clock.advance(seconds)

    def release(self) -> None:
        self._released.set()


def make_core(
    runtime: FakeRuntime,
    clock: FakeClock,
    backoff: Callable[[float], Awaitable[None]],
    mem_max: int = 2 * GiB,
) -> NodeCore:
    limits = BudgetLimits(
        mem_max=mem_max, disk_max=10 * GiB, cpu_capacity=2, disk_bw_cap=GiB, net_bw_cap=GiB
    )
    budget = NodeBudget(limits, StaticLoad(), clock=clock)
    return NodeCore(
        "n1",
        "linux/amd64",
        budget,
        runtime,
        layers=LayerRegistry(1000),
        clock=clock,
        sleep=backoff,
    )


def boot(mode: str, **policy: Any) -> BootSpec:
    return BootSpec(
        name="w", command=("x",), restart=RestartPolicy.from_dict({"mode": mode, **policy})
    )


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


async def settle() -> None:
    """Let the restart tasks the core scheduled run to their next wait."""
    for _ in range(5):
        await asyncio.sleep(0)


def setup(held: bool = False) -> tuple[NodeCore, FakeRuntime, FakeClock, Backoff]:
    runtime, clock = FakeRuntime(), FakeClock(100.0)
    backoff = Backoff(clock, held=held)
    return make_core(runtime, clock, backoff), runtime, clock, backoff


# -- the policy value ------------------------------------------------------------------------


def test_the_backoff_doubles_up_to_its_maximum() -> None:
    policy = RestartPolicy(mode="on-failure", delay_s=0.5, max_delay_s=3.0)
    assert [policy.delay(k) for k in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert policy.delay(10_000) == 3.0


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"mode": "sometimes"}, "mode"),
        ({"attempts": -1}, "attempts"),
        ({"attempts": 10**6}, "attempts"),
        ({"interval_s": 0.0}, "interval_s"),
        ({"delay_s": -1.0}, "delay_s"),
        ({"delay_s": 5.0, "max_delay_s": 1.0}, "max_delay_s"),
        ({"attempts": True}, "attempts"),
    ],
)
def test_a_malformed_restart_policy_is_invalid_naming_its_field(
    policy: dict[str, object], field: str
) -> None:
    with pytest.raises(Invalid) as error:
        RestartPolicy.from_dict(policy)
    assert error.value.field == field


def test_which_ends_each_mode_restarts() -> None:
    never, failure, always = (RestartPolicy(mode=m) for m in ("never", "on-failure", "always"))
    assert not never.restarts_after(1, stopped=False)
    assert failure.restarts_after(1, stopped=False) and failure.restarts_after(None, False)
    assert not failure.restarts_after(0, stopped=False)
    assert always.restarts_after(0, stopped=False)
    assert not any(p.restarts_after(1, stopped=True) for p in (never, failure, always))


def test_a_reschedule_policy_allows_its_attempts_or_every_time() -> None:
    assert not ReschedulePolicy().enabled
    assert ReschedulePolicy(attempts=2).allows(1) and not ReschedulePolicy(attempts=2).allows(2)
    assert ReschedulePolicy(unlimited=True).allows(10**6)


# -- restarts on the node --------------------------------------------------------------------


def test_on_failure_restarts_with_backoff_under_the_same_id_and_reservation() -> None:
    async def test() -> None:
        core, runtime, _, backoff = setup()
        booted = await core.boot(SPEC, LAYERS, boot("on-failure", delay_s=1.0), workload_id="w1")
        reservation = booted.admission.reservation_id
        first = booted.workload
        for _ in range(3):
            runtime.finish("w1", code=1)
            await settle()
        assert backoff.delays == [1.0, 2.0, 4.0]
        (handle,) = runtime.list()
        assert handle.id == "w1" and handle is not first
        held = core.budget.reservations()
        assert [r.id for r in held] == [reservation]
        assert core.layers.mounted() == frozenset({"base"})
        status = core.status("w1")
        assert status == WorkloadStatus("running", 1, "exited with code 1", False, 3)
        assert core.problems() == []

    run(test)


def test_a_leased_boot_keeps_its_lease_bound_across_restarts() -> None:
    async def test() -> None:
        core, runtime, clock, _ = setup()
        lease = core.admit(SPEC, 30.0)
        policy = boot("on-failure", attempts=1)
        await core.boot(SPEC, LAYERS, policy, reservation=lease.reservation_id, workload_id="w1")
        runtime.finish("w1", code=1)
        await settle()
        clock.advance(60.0)  # past the lease's time to live: bound, it does not expire
        assert [r.id for r in core.budget.reservations()] == [lease.reservation_id]
        runtime.finish("w1", code=1)
        await settle()
        assert core.status("w1").exhausted and core.budget.reservations() == []

    run(test)


def test_restarts_exhausted_end_the_workload_failed_and_release_what_it_held() -> None:
    async def test() -> None:
        core, runtime, _, backoff = setup()
        await core.boot(SPEC, LAYERS, boot("on-failure", attempts=2), workload_id="w1")
        for _ in range(3):
            runtime.finish("w1", code=3)
            await settle()
        assert len(backoff.delays) == 2
        status = core.status("w1")
        assert status.state == "ended" and status.exhausted and status.restarts == 2
        assert status.exit_code == 3
        assert status.reason is not None and status.reason.startswith("restarts exhausted")
        assert core.budget.reservations() == [] and core.layers.mounted() == frozenset()
        assert core.problems() == []

    run(test)


def test_attempts_count_within_the_interval_only() -> None:
    async def test() -> None:
        core, runtime, clock, backoff = setup()
        policy = boot("on-failure", attempts=1, interval_s=60.0, delay_s=1.0)
        await core.boot(SPEC, LAYERS, policy, workload_id="w1")
        runtime.finish("w1", code=1)
        await settle()
        clock.advance(120.0)  # the run after the restart lasted past the interval
        runtime.finish("w1", code=1)
        await settle()
        assert core.status("w1").state == "running" and core.status("w1").restarts == 2
        assert backoff.delays == [1.0, 1.0]  # the doubling started again

    run(test)


def test_on_failure_does_not_restart_a_clean_exit_and_always_does() -> None:
    async def test() -> None:
        core, runtime, _, _ = setup()
        await core.boot(SPEC, LAYERS, boot("on-failure"), workload_id="clean")
        await core.boot(SPEC, LAYERS, boot("always"), workload_id="again")
        runtime.finish("clean", code=0)
        runtime.finish("again", code=0)
        await settle()
        assert core.status("clean") == WorkloadStatus("ended", 0, "exited with code 0")
        assert core.status("again").state == "running" and core.status("again").restarts == 1

    run(test)


def test_never_and_no_policy_do_not_restart() -> None:
    async def test() -> None:
        core, runtime, _, backoff = setup()
        await core.boot(SPEC, LAYERS, boot("never"), workload_id="never")
        await core.boot(SPEC, LAYERS, BootSpec(name="w", command=("x",)), workload_id="plain")
        runtime.finish("never", code=1)
        runtime.kill("plain")
        await settle()
        assert core.status("never").state == "ended" and core.status("plain").state == "ended"
        assert backoff.delays == [] and core.budget.reservations() == []

    run(test)


def test_a_kill_not_by_a_stop_restarts_on_failure() -> None:
    async def test() -> None:
        core, runtime, _, _ = setup()
        await core.boot(SPEC, LAYERS, boot("on-failure"), workload_id="w1")
        runtime.kill("w1", signal.SIGKILL)
        await settle()
        assert core.status("w1").state == "running"
        assert core.status("w1").reason == "killed by SIGKILL"

    run(test)


def test_a_stop_never_restarts_even_with_always() -> None:
    async def test() -> None:
        core, _, _, backoff = setup()
        await core.boot(SPEC, LAYERS, boot("always"), workload_id="w1")
        await core.stop("w1")
        await settle()
        status = core.status("w1")
        assert status.state == "ended" and status.stopped and backoff.delays == []
        assert core.budget.reservations() == []

    run(test)


def test_a_stop_during_the_backoff_cancels_the_restart_and_releases() -> None:
    async def test() -> None:
        core, runtime, _, backoff = setup(held=True)
        await core.boot(SPEC, LAYERS, boot("on-failure"), workload_id="w1")
        runtime.finish("w1", code=1)
        await settle()
        assert backoff.delays == [1.0] and core.status("w1").state == "running"
        await core.stop("w1")
        backoff.release()
        await settle()
        status = core.status("w1")
        assert status.state == "ended" and status.stopped and runtime.list() == ()
        assert core.budget.reservations() == [] and core.layers.mounted() == frozenset()
        assert core.problems() == []

    run(test)


def test_the_reservation_is_held_through_the_backoff_against_other_admissions() -> None:
    async def test() -> None:
        runtime, clock = FakeRuntime(), FakeClock(100.0)
        backoff = Backoff(clock, held=True)
        core = make_core(runtime, clock, backoff, mem_max=GiB)  # room for one workload only
        await core.boot(SPEC, LAYERS, boot("on-failure"), workload_id="w1")
        runtime.finish("w1", code=1)
        await settle()
        other = BootSpec(name="other", command=("y",))
        with pytest.raises(Exception, match="mem"):
            await core.boot(SPEC, (), other, workload_id="other")
        backoff.release()
        await settle()
        assert [handle.id for handle in runtime.list()] == ["w1"]
        assert len(core.budget.reservations()) == 1 and core.problems() == []

    run(test)


def test_a_failed_restart_ends_the_workload_with_the_reason() -> None:
    async def test() -> None:
        core, runtime, _, _ = setup()
        await core.boot(SPEC, LAYERS, boot("on-failure"), workload_id="w1")
        runtime.failing_commands.add("x")
        runtime.finish("w1", code=1)
        await settle()
        status = core.status("w1")
        assert status.state == "ended" and status.reason is not None
        assert status.reason.startswith("restart failed: simulated boot failure")
        assert core.budget.reservations() == [] and core.problems() == []

    run(test)


def test_a_repeated_run_of_a_restarted_id_boots_nothing() -> None:
    async def test() -> None:
        core, runtime, _, _ = setup()
        await core.boot(SPEC, LAYERS, boot("on-failure"), workload_id="w1")
        runtime.finish("w1", code=1)
        await settle()
        again = await core.boot(SPEC, LAYERS, boot("on-failure"), workload_id="w1")
        assert again.workload is runtime.list()[0] and len(runtime.list()) == 1

    run(test)


def test_the_status_with_restarts_round_trips_and_a_bad_count_is_invalid() -> None:
    status = WorkloadStatus("ended", 1, "restarts exhausted", False, 4, True)
    assert WorkloadStatus.from_dict(status.to_dict()) == status
    assert WorkloadStatus.from_dict({"state": "running"}) == WorkloadStatus("running")
    with pytest.raises(Invalid) as error:
        WorkloadStatus.from_dict({"state": "running", "restarts": -1})
    assert error.value.field == "status.restarts"


# -- real processes, the journal, and an agent's restart ---------------------------------------


def process_core(state_dir: Path) -> NodeCore:
    limits = BudgetLimits(
        mem_max=2 * GiB, disk_max=10 * GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
    )
    return NodeCore(
        "n1",
        "linux/amd64",
        NodeBudget(limits),
        ProcessRuntime(state_dir=state_dir, stop_grace_s=0.2),
        layers=LayerRegistry(GiB),
        journal=Journal(state_dir),
    )


async def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_a_failing_process_is_restarted_under_its_id_its_journal_entry_kept(
    tmp_path: Path,
) -> None:
    async def test() -> None:
        node = process_core(tmp_path)
        failing = BootSpec(
            name="f",
            command=("sh", "-c", "sleep 0.2; exit 1"),
            restart=RestartPolicy(mode="on-failure", attempts=1, delay_s=0.05),
        )
        booted = await node.boot(SPEC, LAYERS, failing, workload_id="w-f")
        first_pid = booted.workload.pid
        await until(lambda: node.status("w-f").restarts == 1)
        assert node.journal is not None
        (kept,) = node.journal.read()[0]
        assert kept.restarts == 1 and kept.boot.restart == failing.restart
        assert kept.locator is not None and kept.locator["workload"][0] != first_pid
        assert [r.id for r in node.budget.reservations()] == [booted.admission.reservation_id]
        await until(lambda: node.status("w-f").state == "ended")
        status = node.status("w-f")
        assert status.exhausted and status.exit_code == 1 and status.restarts == 1
        assert node.budget.reservations() == [] and os.listdir(tmp_path / "workloads") == []

    asyncio.run(asyncio.wait_for(test(), 30))


# -- any sequence of ends, stops and boots ------------------------------------------------------

OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["boot", "exit0", "exit1", "kill", "stop", "tick"]),
        st.sampled_from(["w1", "w2", "w3"]),
        st.sampled_from(["never", "on-failure", "always"]),
    ),
    max_size=40,
)


class Ticks:
    """A backoff that waits until the test's next :meth:`tick` (so stops, ends and boots
    can come while restarts wait)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.waiting: list[asyncio.Future[None]] = []

    async def __call__(self, seconds: float) -> None:
        waiting = asyncio.get_running_loop().create_future()
        self.waiting.append(waiting)
        await waiting
        self.clock.advance(seconds)

    def tick(self) -> None:
        waiting, self.waiting = self.waiting, []
        for future in waiting:
            if not future.done():
                future.set_result(None)


@given(OPERATIONS)
@settings(max_examples=150, deadline=None)
def test_any_sequence_keeps_one_reservation_per_workload_and_stops_stop(
    operations: list[tuple[str, str, str]],
) -> None:
    """Whatever ends, stops and boots come in whatever order, the node holds exactly one
    reservation per workload it counts as running (running or waiting for its restart), never
    more than its memory, no layer without a workload; a stopped workload never runs again
    until it is booted again; and a workload the runtime runs is one the node counts."""

    async def test() -> None:
        runtime, clock = FakeRuntime(), FakeClock(100.0)
        backoff = Ticks(clock)
        core = make_core(runtime, clock, backoff, mem_max=2 * GiB)
        stopped: set[str] = set()
        for operation, workload_id, mode in operations:
            running = {handle.id for handle in runtime.list()}
            if operation == "boot":
                with contextlib.suppress(Refused):
                    policy = boot(mode, attempts=2, interval_s=10.0)
                    await core.boot(SPEC, LAYERS, policy, workload_id=workload_id)
                    stopped.discard(workload_id)
            elif operation == "tick":  # every restart waiting for its backoff may go
                backoff.tick()
            elif operation == "stop":
                await core.stop(workload_id)
                if core.status(workload_id).state == "ended":
                    stopped.add(workload_id)
            elif workload_id in running:
                if operation == "kill":
                    runtime.kill(workload_id)
                else:
                    runtime.finish(workload_id, code=0 if operation == "exit0" else 1)
            await settle()
            clock.advance(1.0)
            counted = set(core.workloads())
            assert {handle.id for handle in runtime.list()} <= counted
            assert len(core.budget.reservations()) == len(counted)
            assert not stopped & {handle.id for handle in runtime.list()}
            assert core.problems() == []
        await core.stop_all()
        backoff.tick()
        await settle()
        assert core.budget.reservations() == [] and runtime.list() == ()

    run(test)
