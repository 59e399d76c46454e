"""The node core: one lifecycle (mount → start → admit/bind), its wiring, and its snapshot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from berth import Invalid, Layer, Spec
from berth.node.budget import BudgetLimits, NodeBudget, StaticLoad
from berth.node.core import NodeCore
from berth.node.layers import LayerRegistry, MountOutcome
from berth.node.runtime import BootSpec, FakeRuntime, WorkloadHandle
from berth.ownership import Lease, Refused
from berth.platform import Platform
from berth.testing.clock import FakeClock
from berth.units import GiB

SPEC = Spec(vcpus=0.5, mem=GiB, disk=GiB)
LAYERS = (Layer(id="base", size=100), Layer(id="app", size=10))
BOOT = BootSpec(name="w", command=("x",))
AMD64 = Platform.parse("linux/amd64")
ARM64 = Platform.parse("linux/arm64")


class WatchedRuntime(FakeRuntime):
    """A fake runtime that notes, at each start, what the node had mounted and reserved."""

    def __init__(self, core: Callable[[], NodeCore], failing: set[str] | None = None) -> None:
        super().__init__(failing or ())
        self._core = core
        self.seen: list[tuple[frozenset[str], int]] = []

    async def start(self, spec: BootSpec, workload_id: str | None = None) -> WorkloadHandle:
        node = self._core()
        self.seen.append((node.layers.mounted(), len(node.budget.reservations())))
        return await super().start(spec, workload_id)


def make_core(
    runtime: FakeRuntime | None = None,
    *,
    clock: FakeClock | None = None,
    load: StaticLoad | None = None,
    labels: dict[str, str] | None = None,
) -> NodeCore:
    limits = BudgetLimits(
        mem_max=2 * GiB, disk_max=10 * GiB, cpu_capacity=2, disk_bw_cap=GiB, net_bw_cap=GiB
    )
    budget = NodeBudget(limits, load or StaticLoad(), clock=clock or FakeClock(100.0))
    return NodeCore(
        "n1",
        "linux/amd64",
        budget,
        runtime or FakeRuntime(),
        layers=LayerRegistry(1000),
        labels=labels,
    )


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def watched(failing: set[str] | None = None) -> tuple[NodeCore, WatchedRuntime]:
    holder: list[NodeCore] = []
    runtime = WatchedRuntime(lambda: holder[0], failing)
    core = make_core(runtime)
    holder.append(core)
    return core, runtime


# -- the try-run path: mount, start, admit owned by the workload --------------------------------


def test_try_run_mounts_then_starts_then_admits_owned_by_the_workload() -> None:
    async def test() -> None:
        core, runtime = watched()
        booted = await core.boot(SPEC, LAYERS, BOOT)
        assert runtime.seen == [(frozenset({"base", "app"}), 0)]  # mounted, not yet admitted
        (reservation,) = core.budget.reservations()
        assert reservation.owner is booted.workload
        assert booted.admission == reservation.admission and booted.admission.seq == 1
        assert [m.outcome for m in booted.mounts] == [MountOutcome.PULLED] * 2
        assert booted.pulled_bytes == 110
        assert core.workloads() == {booted.workload.id: booted.workload}
        assert booted.workload.spec.mem_limit == SPEC.mem  # the hard memory budget, enforced
        assert core.problems() == []

    run(test)


def test_a_workloads_end_releases_its_reservation_and_unmounts_into_the_cache() -> None:
    async def test() -> None:
        runtime = FakeRuntime()
        core = make_core(runtime)
        first = await core.boot(SPEC, LAYERS, BOOT)
        second = await core.boot(SPEC, LAYERS[:1], BOOT)
        assert [m.outcome for m in second.mounts] == [MountOutcome.ALREADY_MOUNTED]
        assert second.pulled_bytes == 0
        runtime.finish(first.workload.id)
        assert core.budget.headroom().mem_free == GiB
        assert core.layers.mounted() == {"base"}  # still used by the second workload
        assert core.layers.cached() == {"app"}
        runtime.kill(second.workload.id)
        assert core.budget.reservations() == [] and core.workloads() == {}
        assert core.layers.mounted() == frozenset()
        assert core.layers.cached() == {"base", "app"}
        again = await core.boot(SPEC, LAYERS, BOOT)
        assert [m.outcome for m in again.mounts] == [MountOutcome.FROM_CACHE] * 2
        assert core.problems() == []

    run(test)


def test_an_admission_refusal_stops_the_workload_and_unmounts() -> None:
    async def test() -> None:
        runtime = FakeRuntime()
        core = make_core(runtime)
        with pytest.raises(Refused) as caught:
            await core.boot(Spec(vcpus=0.5, mem=3 * GiB, disk=GiB), LAYERS, BOOT)
        assert caught.value.reason == "mem_exhausted" and caught.value.node == "n1"
        assert runtime.list() == () and core.workloads() == {}
        assert core.budget.reservations() == []
        assert core.layers.mounted() == frozenset() and core.layers.cached() == {"base", "app"}
        assert core.problems() == []

    run(test)


def test_a_boot_failure_is_a_refusal_that_leaves_nothing_behind() -> None:
    async def test() -> None:
        core, runtime = watched(failing={"broken"})
        with pytest.raises(Refused) as caught:
            await core.boot(SPEC, LAYERS, BootSpec(name="w", command=("broken",)))
        assert caught.value.reason == "boot_failed" and caught.value.node == "n1"
        assert len(runtime.seen) == 1  # it was tried, after mounting
        assert core.budget.reservations() == [] and core.layers.mounted() == frozenset()

    run(test)


def test_a_platform_mismatch_is_refused_before_anything_is_touched() -> None:
    async def test() -> None:
        core, runtime = watched()
        with pytest.raises(Refused) as caught:
            await core.boot(SPEC, LAYERS, BOOT, platforms=(ARM64,))
        assert caught.value.reason == "platform_mismatch" and caught.value.node == "n1"
        assert runtime.seen == [] and core.layers.cached() == frozenset()
        booted = await core.boot(SPEC, LAYERS, BOOT, platforms=(ARM64, AMD64))
        assert not booted.workload.done

    run(test)


def test_the_budget_follows_the_node_platform() -> None:
    limits = BudgetLimits(mem_max=1, disk_max=1, cpu_capacity=1, disk_bw_cap=1, net_bw_cap=1)
    budget = NodeBudget(limits)
    NodeCore("n1", "linux/amd64", budget, FakeRuntime())
    assert budget.platform == AMD64
    with pytest.raises(Invalid) as error:
        NodeCore("n2", "linux/arm64", budget, FakeRuntime())
    assert error.value.field == "platform"
    with pytest.raises(Invalid) as error:
        NodeCore("", "linux/amd64", NodeBudget(limits), FakeRuntime())
    assert error.value.field == "name"


# -- the leased path: admitted under a lease first, then booted and bound -------------------------


def test_leased_boot_binds_the_lease_to_the_workload() -> None:
    async def test() -> None:
        clock = FakeClock(100.0)
        runtime = FakeRuntime()
        core = make_core(runtime, clock=clock)
        admission = core.admit(SPEC, 30.0)
        booted = await core.boot(SPEC, LAYERS, BOOT, reservation=admission.reservation_id)
        assert booted.admission == admission
        (reservation,) = core.budget.reservations()
        lease = reservation.owner
        assert isinstance(lease, Lease) and lease.bound_to is booted.workload
        clock.now += 3600  # bound: no more expiry
        assert core.budget.reap() == 0
        runtime.finish(booted.workload.id)
        assert core.budget.reservations() == [] and core.layers.mounted() == frozenset()

    run(test)


def test_leased_boot_with_the_order_mount_start_bind() -> None:
    async def test() -> None:
        core, runtime = watched()
        admission = core.admit(SPEC, 30.0)
        await core.boot(SPEC, LAYERS, BOOT, reservation=admission.reservation_id)
        # At start the layers were mounted and the lease (1 reservation) held, but unbound.
        assert runtime.seen == [(frozenset({"base", "app"}), 1)]

    run(test)


def test_an_expired_lease_is_refused_before_booting() -> None:
    async def test() -> None:
        clock = FakeClock(100.0)
        core_holder: list[NodeCore] = []
        runtime = WatchedRuntime(lambda: core_holder[0])
        core = make_core(runtime, clock=clock)
        core_holder.append(core)
        admission = core.admit(SPEC, 5.0)
        clock.now += 10  # past the deadline, not yet reaped
        with pytest.raises(Refused) as caught:
            await core.boot(SPEC, LAYERS, BOOT, reservation=admission.reservation_id)
        assert caught.value.reason == "lease_expired" and caught.value.node == "n1"
        assert runtime.seen == [] and core.budget.reservations() == []
        with pytest.raises(Refused, match="lease_expired"):
            core.bind(admission.reservation_id, "anything")

    run(test)


def test_a_failed_leased_boot_releases_the_lease() -> None:
    async def test() -> None:
        core = make_core(FakeRuntime(failing_commands={"broken"}))
        admission = core.admit(SPEC, 30.0)
        with pytest.raises(Refused, match="boot_failed"):
            await core.boot(
                SPEC,
                LAYERS,
                BootSpec(name="w", command=("broken",)),
                reservation=admission.reservation_id,
            )
        assert core.budget.reservations() == [] and core.layers.mounted() == frozenset()
        assert not core.release(admission.reservation_id)

    run(test)


def test_bind_by_workload_id_and_release() -> None:
    async def test() -> None:
        runtime = FakeRuntime()
        core = make_core(runtime)
        booted = await core.boot(SPEC, LAYERS, BOOT)
        extra = core.admit(SPEC, 30.0).reservation_id
        with pytest.raises(Refused, match="unknown_workload"):
            core.bind(extra, "ghost")
        core.bind(extra, booted.workload.id)
        assert core.budget.headroom().mem_free == 0
        other = core.admit(Spec(vcpus=0.1, mem=0, disk=1), 30.0).reservation_id
        assert core.release(other) and not core.release(other)
        with pytest.raises(Invalid) as error:
            core.admit(SPEC, 0)
        assert error.value.field == "lease_ttl_s"
        await core.stop_all()
        assert core.budget.headroom().mem_free == 2 * GiB  # both followed the workload

    run(test)


# -- idempotent by workload id: a repeated run boots nothing ----------------------------------


class GatedRuntime(FakeRuntime):
    """A fake runtime whose starts wait for ``gate`` (a boot caught in progress), counted."""

    def __init__(self, failing: set[str] | None = None) -> None:
        super().__init__(failing or ())
        self.gate = asyncio.Event()
        self.starts = 0

    async def start(self, spec: BootSpec, workload_id: str | None = None) -> WorkloadHandle:
        self.starts += 1
        await self.gate.wait()
        return await super().start(spec, workload_id)


def test_a_callers_workload_id_is_the_workloads_and_a_repeat_boots_nothing() -> None:
    async def test() -> None:
        core, runtime = watched()
        booted = await core.boot(SPEC, LAYERS, BOOT, workload_id="web-7")
        assert booted.workload.id == "web-7" and core.status("web-7").state == "running"
        again = await core.boot(SPEC, LAYERS, BOOT, workload_id="web-7")
        assert again is booted
        assert len(runtime.seen) == 1 and len(core.budget.reservations()) == 1
        plain = await core.boot(SPEC, LAYERS, BOOT)  # no id: the runtime's own, another boot
        assert plain.workload.id != "web-7" and len(runtime.seen) == 2
        assert core.problems() == []

    run(test)


def test_two_concurrent_runs_of_one_id_boot_once() -> None:
    async def test() -> None:
        runtime = GatedRuntime()
        core = make_core(runtime)
        first = asyncio.create_task(core.boot(SPEC, LAYERS, BOOT, workload_id="web-1"))
        second = asyncio.create_task(core.boot(SPEC, LAYERS, BOOT, workload_id="web-1"))
        await asyncio.sleep(0.01)
        assert runtime.starts == 1  # the second waits for the first's outcome
        runtime.gate.set()
        one, two = await asyncio.gather(first, second)
        assert one is two and one.workload.id == "web-1"
        assert runtime.starts == 1 and len(core.budget.reservations()) == 1

    run(test)


def test_a_refused_run_is_every_concurrent_callers_and_the_id_may_boot_again() -> None:
    async def test() -> None:
        runtime = GatedRuntime(failing={"broken"})
        core = make_core(runtime)
        broken = BootSpec(name="w", command=("broken",))
        calls = [
            asyncio.create_task(core.boot(SPEC, LAYERS, broken, workload_id="w-1"))
            for _ in range(2)
        ]
        await asyncio.sleep(0.01)
        runtime.gate.set()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert [getattr(o, "reason", o) for o in outcomes] == ["boot_failed", "boot_failed"]
        assert runtime.starts == 1
        assert core.budget.reservations() == [] and core.layers.mounted() == frozenset()
        booted = await core.boot(SPEC, LAYERS, BOOT, workload_id="w-1")  # nothing ran: boots
        assert booted.workload.id == "w-1" and runtime.starts == 2

    run(test)


def test_a_cancelled_first_run_lets_the_waiting_one_boot() -> None:
    async def test() -> None:
        runtime = GatedRuntime()
        core = make_core(runtime)
        first = asyncio.create_task(core.boot(SPEC, LAYERS, BOOT, workload_id="w-9"))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(core.boot(SPEC, LAYERS, BOOT, workload_id="w-9"))
        await asyncio.sleep(0.01)
        first.cancel()
        await asyncio.sleep(0.01)
        runtime.gate.set()
        booted = await second
        assert first.cancelled() and booted.workload.id == "w-9" and runtime.starts == 2
        assert len(core.budget.reservations()) == 1 and core.problems() == []

    run(test)


def test_a_repeated_leased_run_releases_the_new_lease_and_keeps_the_bound_one() -> None:
    async def test() -> None:
        core = make_core(FakeRuntime())
        bound = core.admit(SPEC, 30.0).reservation_id
        booted = await core.boot(SPEC, LAYERS, BOOT, reservation=bound, workload_id="w-2")
        await core.boot(SPEC, LAYERS, BOOT, reservation=bound, workload_id="w-2")
        assert core.budget.holds(bound)  # the repeat named the lease it holds: kept
        retry = core.admit(Spec(vcpus=0.1, mem=1, disk=0), 30.0).reservation_id
        again = await core.boot(SPEC, LAYERS, BOOT, reservation=retry, workload_id="w-2")
        assert again is booted and not core.budget.holds(retry)  # nothing will bind it
        assert [r.id for r in core.budget.reservations()] == [bound]

    run(test)


def test_a_run_of_an_id_that_ended_boots_nothing_and_answers_how_it_ended() -> None:
    async def test() -> None:
        runtime = FakeRuntime()
        core = make_core(runtime)
        booted = await core.boot(SPEC, LAYERS, BOOT, workload_id="job-1")
        runtime.finish("job-1", 3)
        again = await core.boot(SPEC, LAYERS, BOOT, workload_id="job-1")
        assert again is booted and again.workload.exit_code == 3
        assert runtime.list() == () and core.budget.reservations() == []
        assert core.status("job-1").exit_code == 3

    run(test)


@pytest.mark.parametrize("bad", ["", "has space", "x" * 300, 7, b"w-1"])
def test_a_malformed_workload_id_is_invalid_and_touches_nothing(bad: object) -> None:
    async def test() -> None:
        core, runtime = watched()
        with pytest.raises(Invalid) as caught:
            await core.boot(SPEC, LAYERS, BOOT, workload_id=bad)  # type: ignore[arg-type]
        assert caught.value.field == "workload_id"
        assert runtime.seen == [] and core.layers.mounted() == frozenset()
        assert core.budget.reservations() == []

    run(test)


# -- the snapshot ---------------------------------------------------------------------------------


def test_snapshot_fields_generation_and_admitted() -> None:
    async def test() -> None:
        load = StaticLoad(cpu_load=1.5, disk_bw_load=-3.0, net_bw_load=7.0)
        runtime = FakeRuntime()
        core = make_core(runtime, load=load, labels={"zone": "a"})
        changes: list[int] = []
        core.add_change_listener(lambda: changes.append(1))
        first = core.snapshot(1.0)
        assert (first.generation, first.admitted, first.published_at) == (1, 0, 1.0)
        assert first.node == "n1" and first.platform == AMD64 and first.labels == {"zone": "a"}
        assert (first.mem_free, first.mem_max, first.disk_max) == (2 * GiB, 2 * GiB, 10 * GiB)
        assert first.cpu_load == 1.0 and first.disk_bw_load == 0.0  # clamped
        assert first.net_bw_load == 7.0 and first.overcommit is None
        load.cpu_load = 0.0
        booted = await core.boot(SPEC, LAYERS, BOOT)
        assert changes  # the budget and the layers both report changes
        second = core.snapshot(2.0)
        assert (second.generation, second.admitted) == (2, 1) and core.generation == 2
        assert second.mem_free == GiB and second.layers == {"base", "app"}
        runtime.finish(booted.workload.id)
        third = core.snapshot(3.0)
        assert (third.generation, third.admitted) == (3, 1)  # admitted counts, never drops
        assert third.layers == frozenset() and third.cached_layers == {"base", "app"}

    run(test)


def test_problems_report_a_bookkeeping_error_at_a_workloads_end() -> None:
    async def test() -> None:
        runtime = FakeRuntime()
        core = make_core(runtime)
        booted = await core.boot(SPEC, LAYERS, BOOT)
        core.layers.unmount("app")  # behind the core's back
        assert core.problems() == ["mounted layers differ from running workloads'"]
        runtime.finish(booted.workload.id)  # now its own unmount of "app" fails
        problems = core.problems()
        assert len(problems) == 1 and "'app' is not mounted" in problems[0]

    run(test)
