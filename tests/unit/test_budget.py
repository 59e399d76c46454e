"""The node budget: admission, refusals, owners, leases, and no over-commit ever."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import random
import threading
from collections.abc import Iterator

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from berth import Invalid, Platform, Spec
from berth.node.budget import BudgetLimits, NodeBudget, StaticLoad
from berth.ownership import Admission, Lease, Refused
from berth.state import Overcommit
from berth.testing.clock import FakeClock
from berth.testing.owner import ManualOwner
from berth.units import GiB, format_bandwidth


def limits(**changes: object) -> BudgetLimits:
    fields: dict[str, object] = {
        "mem_max": 4 * GiB,
        "disk_max": 40 * GiB,
        "cpu_capacity": 4.0,
        "cpu_max_load": 0.8,
        "disk_bw_cap": 1000,
        "disk_bw_max_load": 0.5,
        "net_bw_cap": 1000,
        "net_bw_max_load": 0.5,
    }
    fields.update(changes)
    return BudgetLimits(**fields)


def spec(
    mem: int = GiB, disk: int = GiB, vcpus: float = 1, disk_bw: int = 0, net_bw: int = 0
) -> Spec:
    return Spec(vcpus=vcpus, mem=mem, disk=disk, disk_bw=disk_bw, net_bw=net_bw)


def test_admit_reserves_and_owner_end_releases_exactly() -> None:
    budget = NodeBudget(limits())
    owner = ManualOwner()
    budget.admit(spec(mem=GiB, disk=2 * GiB), owner)
    assert budget.headroom().mem_free == 3 * GiB
    assert budget.headroom().disk_free == 38 * GiB
    owner.end()
    assert budget.headroom().mem_free == 4 * GiB
    assert budget.headroom().disk_free == 40 * GiB
    assert budget.reservations() == []


def test_exact_fill_is_admitted_one_more_byte_is_not() -> None:
    budget = NodeBudget(limits())
    budget.admit(spec(mem=4 * GiB, disk=GiB), ManualOwner())
    with pytest.raises(Refused) as caught:
        budget.admit(spec(mem=1, disk=1, vcpus=0.1), ManualOwner())
    assert caught.value.reason == "mem_exhausted"
    with pytest.raises(Refused) as caught:
        NodeBudget(limits()).admit(spec(mem=1, disk=40 * GiB + 1), ManualOwner())
    assert caught.value.reason == "disk_exhausted"


@pytest.mark.parametrize(
    ("readings", "asked", "reason"),
    [
        ({"cpu_load": 0.6}, {"vcpus": 1}, "cpu_saturated"),  # 0.6 + 1/4 > 0.8
        ({"disk_bw_load": 450}, {"disk_bw": 51}, "disk_bw_saturated"),
        ({"net_bw_load": 500}, {"net_bw": 1}, "net_bw_saturated"),
    ],
)
def test_soft_checks_read_live_load(
    readings: dict[str, float], asked: dict[str, float], reason: str
) -> None:
    # The load is built here, not in the parameters: the test lowers it, and parameters are
    # shared by every run of the test in one process (the suite used to fail when run twice).
    load = StaticLoad(**readings)
    budget = NodeBudget(limits(), load)
    with pytest.raises(Refused) as caught:
        budget.admit(spec(**asked), ManualOwner())  # type: ignore[arg-type]
    assert caught.value.reason == reason
    assert budget.reservations() == []  # nothing reserved by a refused admission
    load.cpu_load = load.disk_bw_load = load.net_bw_load = 0.0
    budget.admit(spec(**asked), ManualOwner())  # type: ignore[arg-type]  # fits once the load drops


def test_checks_run_in_table_order_hard_before_soft() -> None:
    """Admission walks the one table (platform, hard, β_max, soft); it used to judge soft first."""
    budget = NodeBudget(
        limits(cpu_overcommit=0.25), StaticLoad(cpu_load=1.0), platform="linux/amd64"
    )
    asked = spec(mem=5 * GiB, vcpus=2)  # fails memory, the β_max ceiling and the load
    for platforms, reason in ((["linux/arm64"], "platform_mismatch"), ([], "mem_exhausted")):
        with pytest.raises(Refused) as caught:
            budget.admit(asked, ManualOwner(), [Platform.parse(p) for p in platforms])
        assert caught.value.reason == reason
    with pytest.raises(Refused, match="cpu_overcommitted"):
        budget.admit(spec(vcpus=2), ManualOwner())
    with pytest.raises(Refused, match="cpu_saturated"):
        budget.admit(spec(vcpus=1), ManualOwner())


def test_reserve_judges_only_what_reservations_hold() -> None:
    budget = NodeBudget(
        limits(cpu_overcommit=0.5), StaticLoad(cpu_load=1.0), platform="linux/amd64"
    )
    budget.reserve(spec(vcpus=2), ManualOwner())  # a saturated node: reserve skips the live load
    with pytest.raises(Refused) as caught:
        budget.reserve(spec(vcpus=1), ManualOwner())
    assert caught.value.reason == "cpu_overcommitted"
    assert caught.value.detail == "asks 1 vCPU, 2 vCPUs reserved of a 2 vCPUs over-commit ceiling"
    with pytest.raises(Refused, match="mem_exhausted"):
        budget.reserve(spec(mem=4 * GiB, vcpus=0.001), ManualOwner())


def test_soft_edge_is_inclusive() -> None:
    budget = NodeBudget(limits(), StaticLoad(cpu_load=0.55))
    budget.admit(spec(vcpus=1), ManualOwner())  # 0.55 + 0.25 == 0.8


def test_overcommit_stage_bounds_reserved_soft_sums() -> None:
    budget = NodeBudget(limits(cpu_overcommit=1.5))  # ceiling 6 vcpus
    for _ in range(3):
        budget.admit(spec(mem=1, disk=1, vcpus=2), ManualOwner())
    with pytest.raises(Refused) as caught:
        budget.admit(spec(mem=1, disk=1, vcpus=0.5), ManualOwner())
    assert caught.value.reason == "cpu_overcommitted"
    over = budget.overcommit()
    assert over is not None and over.vcpus_reserved == 6 and over.vcpus_ceiling == 6
    assert NodeBudget(limits()).overcommit() is None


def test_release_is_idempotent() -> None:
    budget = NodeBudget(limits())
    reservation = budget.admit(spec(), ManualOwner())
    assert budget.release(reservation.id) is True
    assert budget.release(reservation.id) is False
    assert budget.release("never") is False
    assert budget.headroom().mem_free == 4 * GiB


def test_on_change_fires_on_reserve_and_release() -> None:
    changes: list[int] = []
    budget = NodeBudget(limits(), on_change=lambda: changes.append(1))
    owner = ManualOwner()
    budget.admit(spec(), owner)
    owner.end()
    assert len(changes) == 2


def test_asyncio_task_owner_releases_when_the_task_ends() -> None:
    async def main() -> None:
        budget = NodeBudget(limits())
        task = asyncio.create_task(asyncio.sleep(0.01))
        budget.admit(spec(), task)
        assert budget.headroom().mem_free == 3 * GiB
        await task
        await asyncio.sleep(0)  # done callbacks run on the next loop iteration
        assert budget.headroom().mem_free == 4 * GiB

        cancelled = asyncio.create_task(asyncio.sleep(10))
        budget.admit(spec(), cancelled)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        await asyncio.sleep(0)
        assert budget.headroom().mem_free == 4 * GiB

    asyncio.run(main())


def test_an_owner_that_already_ended_is_refused() -> None:
    budget = NodeBudget(limits())
    finished: concurrent.futures.Future[None] = concurrent.futures.Future()
    finished.set_result(None)
    with pytest.raises(Refused) as caught:
        budget.admit(spec(), finished)
    assert caught.value.reason == "owner_ended"
    assert budget.reservations() == []


def test_unbound_lease_expires_bound_lease_follows_its_owner() -> None:
    clock = FakeClock()
    budget = NodeBudget(limits(), clock=clock)
    expiring = budget.lease(5.0)
    budget.admit(spec(), expiring)
    bound = budget.lease(5.0)
    budget.admit(spec(), bound)
    owner = ManualOwner()
    bound.bind(owner)
    clock.now += 4.9
    assert budget.reap() == 0
    clock.now += 0.2
    assert budget.headroom().mem_free == 3 * GiB  # reaping ran: the unbound lease ended
    assert expiring.done() and not bound.done()
    with pytest.raises(Refused):
        expiring.bind(ManualOwner())
    owner.end()
    assert bound.done()
    assert budget.headroom().mem_free == 4 * GiB


def test_lease_renewal_and_explicit_end() -> None:
    clock = FakeClock()
    budget = NodeBudget(limits(), clock=clock)
    lease = budget.lease(1.0)
    budget.admit(spec(), lease)
    clock.now += 0.9
    lease.renew(1.0)
    clock.now += 0.9
    assert budget.reap() == 0
    lease.end()
    lease.end()
    assert budget.headroom().mem_free == 4 * GiB
    with pytest.raises(Invalid):
        budget.lease(0)


class PausingClock:
    """A fake clock whose next read, once armed, stops until the test lets it go on.

    ``pause_next_read()`` arms it; the next read (by whichever thread) sets ``paused`` and
    waits for ``resume`` before returning ``now`` *as it is then*.  So a test can put a whole
    operation of another thread between the moment a reader starts reading the time and the
    moment it acts on it — the interleaving the reaper once lost — with events, not sleeps.
    """

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.paused = threading.Event()
        self.resume = threading.Event()
        self._armed = False
        self._lock = threading.Lock()

    def pause_next_read(self) -> None:
        self.paused.clear()
        self.resume.clear()
        with self._lock:
            self._armed = True

    def __call__(self) -> float:
        with self._lock:
            pause, self._armed = self._armed, False
        if pause:
            self.paused.set()
            assert self.resume.wait(10), "the test never resumed the clock"
        return self.now


@contextlib.contextmanager
def reaper_paused_at_its_clock_read(budget: NodeBudget, clock: PausingClock) -> Iterator[list[int]]:
    """Run ``budget.reap()`` in a thread, stopped while it reads the time; the ``with`` body
    runs in that gap, and on leaving it the clock goes on (reading ``clock.now`` as the body
    left it) and the reaper finishes.  The list receives how many leases the reap ended."""
    ended: list[int] = []
    clock.pause_next_read()
    reaper = threading.Thread(target=lambda: ended.append(budget.reap()), name="reaper")
    reaper.start()
    try:
        assert clock.paused.wait(10), "the reaper never read the clock"
        yield ended
    finally:
        clock.resume.set()
        reaper.join(10)
    assert not reaper.is_alive()


def test_a_bind_during_the_reapers_clock_read_keeps_its_reservation() -> None:
    """The race of issue 15, forced: the reaper starts reading the time, a bind lands, time
    passes the deadline, the reaper acts.  The bind succeeded, so the lease must not expire
    (it used to: the reaper had read the deadline before the bind cleared it)."""
    clock = PausingClock()
    budget = NodeBudget(limits(), clock=clock)
    leased = budget.admit_leased(spec(), 5.0)  # deadline 1005
    owner = ManualOwner()
    clock.now = 1004.0
    with reaper_paused_at_its_clock_read(budget, clock) as ended:
        budget.bind(leased.id, owner)  # before the deadline: bound
        clock.now = 1010.0  # the reaper reads a time past the old deadline
    assert ended == [0]
    assert budget.get(leased.id) is not None  # the workload's memory is still reserved
    assert budget.headroom().mem_free == 3 * GiB
    owner.end()  # and it lives exactly as long as its owner
    assert budget.headroom().mem_free == 4 * GiB
    assert budget.release(leased.id) is False


def test_a_renew_during_the_reapers_clock_read_pushes_the_deadline() -> None:
    clock = PausingClock()
    budget = NodeBudget(limits(), clock=clock)
    lease = budget.lease(5.0)  # deadline 1005
    reservation = budget.admit(spec(), lease)
    clock.now = 1004.0
    with reaper_paused_at_its_clock_read(budget, clock) as ended:
        renewed = lease.renew(5.0)  # new deadline 1009
        clock.now = 1006.0  # past the old deadline, before the new one
    assert ended == [0]
    assert renewed is True
    assert not lease.done()
    assert budget.get(reservation.id) is not None
    clock.now = 1009.0  # the renewed deadline, exactly
    assert budget.reap() == 1
    assert lease.done() and budget.get(reservation.id) is None


def test_a_reaper_that_read_a_due_time_wins_over_a_later_bind() -> None:
    """The other order: the reaper's reading is past the deadline and the bind comes after
    it — the bind is refused and the reservation released exactly once."""
    clock = PausingClock()
    changes: list[int] = []
    budget = NodeBudget(limits(), clock=clock, on_change=lambda: changes.append(1))
    leased = budget.admit_leased(spec(), 5.0)
    clock.now = 1005.0  # due
    with reaper_paused_at_its_clock_read(budget, clock) as ended:
        pass
    assert ended == [1]
    with pytest.raises(Refused, match="lease_expired"):
        budget.bind(leased.id, ManualOwner())
    assert budget.headroom().mem_free == 4 * GiB
    assert len(changes) == 2  # one admission, one release


@pytest.mark.parametrize("ttl", [0, -1.0, math.nan, math.inf, -math.inf, True, "5"])
def test_a_lease_ttl_must_be_a_positive_finite_number(ttl: object) -> None:
    budget = NodeBudget(limits(), clock=FakeClock())
    for make in (budget.lease, lambda ttl: budget.admit_leased(spec(), ttl)):
        with pytest.raises(Invalid) as caught:
            make(ttl)  # type: ignore[arg-type]
        assert caught.value.field == "lease_ttl_s"
        assert "positive, finite number of seconds" in caught.value.message
    assert budget.reservations() == []  # nothing reserved by a malformed admission
    lease = budget.lease(1.0)
    with pytest.raises(Invalid) as caught:
        lease.renew(ttl)  # type: ignore[arg-type]
    assert caught.value.field == "lease_ttl_s"
    assert lease.deadline == 1001.0  # a malformed renewal changes nothing


def test_a_lease_is_over_exactly_at_its_deadline() -> None:
    clock = FakeClock()
    budget = NodeBudget(limits(), clock=clock)
    first, second = budget.admit_leased(spec(), 2.0), budget.admit_leased(spec(), 2.0)
    budget.admit_leased(spec(), 3.0)
    clock.now = 1001.75
    assert budget.reap() == 0
    clock.now = 1002.0  # the deadline of two of them
    assert budget.reap() == 2  # reap says how many it ended
    assert budget.get(first.id) is None and budget.get(second.id) is None
    assert budget.headroom().mem_free == 3 * GiB
    assert budget.reap() == 0


def test_a_due_lease_cannot_be_bound_even_before_any_reap() -> None:
    clock = FakeClock()
    changes: list[int] = []
    budget = NodeBudget(limits(), clock=clock, on_change=lambda: changes.append(1))
    leased = budget.admit_leased(spec(), 5.0)
    lease = budget.get(leased.id).owner  # type: ignore[union-attr]
    assert isinstance(lease, Lease)
    clock.now = 1005.0  # due, and nothing has reaped
    owner = ManualOwner()
    with pytest.raises(Refused) as caught:
        budget.bind(leased.id, owner)
    assert caught.value.reason == "lease_expired"
    assert caught.value.detail == "the lease's deadline passed before it was bound"
    assert lease.done() and lease.bound_to is None
    assert budget.get(leased.id) is None  # the bind that found it due ended it
    assert len(changes) == 2
    with pytest.raises(Refused) as caught:
        lease.bind(owner)  # and now it is simply over
    assert caught.value.detail == "the reservation ended before it was bound"
    with pytest.raises(Refused) as caught:
        budget.bind(leased.id, owner)
    assert caught.value.detail == f"reservation {leased.id} is gone"
    owner.end()
    assert budget.headroom().mem_free == 4 * GiB


def test_renew_reports_whether_the_lease_lives_on() -> None:
    clock = FakeClock()
    budget = NodeBudget(limits(), clock=clock)
    lease = budget.lease(2.0)
    reservation = budget.admit(spec(), lease)
    clock.now = 1001.5
    assert lease.renew(0.5) is True
    assert lease.deadline == 1002.0  # ttl from now, even if sooner than before
    clock.now = 1002.0
    assert lease.renew(5.0) is False  # due: over, as a reap would have found it
    assert lease.done() and budget.get(reservation.id) is None
    assert budget.reap() == 0
    assert lease.renew(5.0) is False  # and it stays over


def test_a_bound_lease_is_not_re_armed_by_renew() -> None:
    clock = FakeClock()
    budget = NodeBudget(limits(), clock=clock)
    lease = budget.lease(2.0)
    reservation = budget.admit(spec(), lease)
    owner = ManualOwner()
    lease.bind(owner)
    assert lease.renew(1.0) is True  # alive, and it keeps no deadline
    assert lease.deadline is None and lease.bound_to is owner
    clock.now += 1000
    assert budget.reap() == 0 and not lease.done()
    assert budget.get(reservation.id) is not None
    owner.end()
    assert lease.done() and budget.get(reservation.id) is None


def test_releasing_a_leased_reservation_ends_its_lease() -> None:
    clock = FakeClock()
    budget = NodeBudget(limits(mem_max=GiB), clock=clock)
    leased = budget.admit_leased(spec(), 5.0)
    lease = budget.get(leased.id).owner  # type: ignore[union-attr]
    assert isinstance(lease, Lease)
    assert budget.release(leased.id) is True
    assert lease.done()
    with pytest.raises(Refused, match="lease_expired"):
        lease.bind(ManualOwner())  # a bind may not succeed on memory that is free again
    budget.admit(spec(), ManualOwner())  # the memory is free: the node is full again
    assert budget.headroom().mem_free == 0
    assert lease.renew(5.0) is False


def test_an_owner_that_already_ended_is_refused_with_a_reason() -> None:
    finished: concurrent.futures.Future[None] = concurrent.futures.Future()
    finished.set_result(None)
    with pytest.raises(Refused) as caught:
        NodeBudget(limits()).admit(spec(), finished)
    assert caught.value.detail == "the workload ended before admission"


def test_the_node_platform_is_validated_naming_the_field() -> None:
    with pytest.raises(Invalid) as caught:
        NodeBudget(limits(), platform="linux/amd46")
    assert caught.value.field == "platform"
    assert str(NodeBudget(limits(), platform="linux/x86_64").platform) == "linux/amd64"
    assert NodeBudget(limits()).platform is None


def test_reservations_are_numbered_from_one_and_can_be_looked_up() -> None:
    budget = NodeBudget(limits(), incarnation="i0")
    assert budget.admitted == 0 and budget.get("r1.i0") is None
    owner = ManualOwner()
    first = budget.admit(spec(), owner)
    second = budget.reserve(spec(mem=2, disk=3, vcpus=0.5), ManualOwner())
    assert (first.id, first.seq, second.id, second.seq) == ("r1.i0", 1, "r2.i0", 2)
    assert first.admission == Admission("r1.i0", 1)
    assert budget.admitted == 2
    assert budget.get("r1.i0") is first and first.owner is owner
    assert budget.reservations() == [first, second]
    owner.end()
    assert budget.get("r1.i0") is None and budget.admitted == 2


def test_every_change_listener_hears_every_change() -> None:
    heard: list[str] = []
    budget = NodeBudget(limits())
    budget.add_change_listener(lambda: heard.append("a"))
    budget.add_change_listener(lambda: heard.append("b"))
    reservation = budget.admit(spec(), ManualOwner())
    budget.release(reservation.id)
    budget.release(reservation.id)  # nothing changed: nobody is told
    assert heard == ["a", "b", "a", "b"]
    with pytest.raises(Refused):
        budget.admit(spec(mem=5 * GiB), ManualOwner())
    assert len(heard) == 4


def test_the_vcpu_sum_is_exact_after_partial_releases_and_zero_when_empty() -> None:
    budget = NodeBudget(limits(cpu_overcommit=1.0, cpu_max_load=1.0))  # ceiling 4 vcpus
    owners = [ManualOwner() for _ in range(3)]
    for owner, vcpus in zip(owners, (0.1, 0.2, 1.5), strict=True):
        budget.admit(spec(mem=1, disk=1, vcpus=vcpus), owner)
    owners[2].end()  # a partial release leaves the others counted
    over = budget.overcommit()
    assert over is not None and over.vcpus_reserved == pytest.approx(0.3)
    owners[0].end()
    owners[1].end()
    over = budget.overcommit()
    assert over is not None and over.vcpus_reserved == 0.0  # exactly: no drift, no phantom
    budget.admit(spec(mem=1, disk=1, vcpus=4), ManualOwner())  # the whole ceiling fits again


@pytest.mark.parametrize(
    ("changes", "resource", "code", "ceiling"),
    [
        ({"disk_bw_overcommit": 1.0}, "disk_bw", "disk_bw_overcommitted", 2000),
        ({"net_bw_overcommit": 0.25}, "net_bw", "net_bw_overcommitted", 500),
    ],
)
def test_bandwidth_overcommit_ceilings_fill_exactly_and_free_on_release(
    changes: dict[str, float], resource: str, code: str, ceiling: int
) -> None:
    budget = NodeBudget(  # live load: up to 2000 B/s either way
        limits(
            disk_bw_cap=2000, disk_bw_max_load=1.0, net_bw_cap=2000, net_bw_max_load=1.0, **changes
        )
    )
    over = budget.overcommit()
    assert over is not None and getattr(over, f"{resource}_ceiling") == ceiling
    assert over.vcpus_ceiling is None  # factors not set stay unbounded
    quarter = ManualOwner()
    budget.admit(spec(mem=1, disk=1, **{resource: ceiling // 4}), quarter)
    rest = budget.admit(spec(mem=1, disk=1, **{resource: ceiling - ceiling // 4}), ManualOwner())
    over = budget.overcommit()
    assert over is not None and getattr(over, f"{resource}_reserved") == ceiling  # exact fill
    with pytest.raises(Refused) as caught:
        budget.admit(spec(mem=1, disk=1, **{resource: 1}), ManualOwner())
    assert caught.value.reason == code
    shown = format_bandwidth(ceiling)
    assert caught.value.detail == f"asks 1Bps, {shown} reserved of a {shown} over-commit ceiling"
    quarter.end()  # a release frees its bandwidth
    over = budget.overcommit()
    assert over is not None and getattr(over, f"{resource}_reserved") == ceiling - ceiling // 4
    budget.admit(spec(mem=1, disk=1, **{resource: ceiling // 4}), ManualOwner())
    budget.release(rest.id)
    over = budget.overcommit()
    assert over is not None and getattr(over, f"{resource}_reserved") == ceiling // 4


def test_overcommit_reports_every_sum_and_ceiling() -> None:
    budget = NodeBudget(limits(cpu_overcommit=2.0, disk_bw_overcommit=1.5, net_bw_overcommit=0.25))
    budget.admit(spec(mem=1, disk=1, vcpus=0.5, disk_bw=100, net_bw=200), ManualOwner())
    assert budget.overcommit() == Overcommit(
        vcpus_reserved=0.5,
        vcpus_ceiling=8.0,
        disk_bw_reserved=100,
        disk_bw_ceiling=1500.0,
        net_bw_reserved=200,
        net_bw_ceiling=250.0,
    )


def test_the_idle_readings_cannot_be_changed_by_one_budget_for_all() -> None:
    budget = NodeBudget(limits())
    assert (budget.readings.cpu_load, budget.readings.disk_bw_load) == (0.0, 0.0)
    with pytest.raises(AttributeError):
        budget.readings.cpu_load = 1.0  # type: ignore[misc]
    assert NodeBudget(limits()).readings.cpu_load == 0.0


def test_a_lease_tells_its_callbacks_it_ended_before_or_after_they_came() -> None:
    lease = Lease(1.0, FakeClock())
    assert lease.done() is False
    seen: list[object] = []
    lease.add_done_callback(seen.append)
    lease.end()
    lease.add_done_callback(seen.append)  # after the end: called at once
    assert seen == [lease, lease] and lease.done() is True
    with pytest.raises(Refused) as caught:
        lease.bind(ManualOwner())
    assert caught.value.reason == "lease_expired"


def test_refused_message_names_reason() -> None:
    refused = Refused("mem_exhausted", "1 B asked, 0 B free", node="n3")
    assert (
        str(refused) == "node n3 refused: mem_exhausted (insufficient memory): 1 B asked, 0 B free"
    )


def test_threads_never_over_commit() -> None:
    budget = NodeBudget(limits(mem_max=100, disk_max=10**9))
    admitted: list[ManualOwner] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(300):
            owner = ManualOwner()
            try:
                budget.admit(spec(mem=rng.randint(1, 30), disk=1, vcpus=0.001), owner)
            except Refused:
                pass
            else:
                with lock:
                    admitted.append(owner)
            held = sum(r.spec.mem for r in budget.reservations())
            assert held <= 100
            if rng.random() < 0.5:
                with lock:
                    victim = admitted.pop(rng.randrange(len(admitted))) if admitted else None
                if victim is not None:
                    victim.end()

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for owner in admitted:
        owner.end()
    assert budget.headroom().mem_free == 100
    assert budget.reservations() == []


class BudgetMachine(RuleBasedStateMachine):
    """Any sequence of admit / release / owner end / lease expiry keeps the budget exact."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.budget = NodeBudget(
            limits(mem_max=1000, disk_max=500, cpu_overcommit=2.0), clock=self.clock
        )
        self.live: dict[str, tuple[Spec, object]] = {}

    @rule(
        mem=st.integers(0, 400),
        disk=st.integers(0, 200),
        vcpus=st.sampled_from([0.5, 1, 3]),
        kind=st.sampled_from(["owner", "lease"]),
    )
    def admit(self, mem: int, disk: int, vcpus: float, kind: str) -> None:
        owner: object = ManualOwner() if kind == "owner" else self.budget.lease(10.0)
        held = self._held()
        try:
            reservation = self.budget.admit(spec(mem=mem, disk=disk, vcpus=vcpus), owner)  # type: ignore[arg-type]
        except Refused as refused:
            assert refused.reason in {"mem_exhausted", "disk_exhausted", "cpu_overcommitted"}
            if refused.reason == "mem_exhausted":
                assert held[0] + mem > 1000
            elif refused.reason == "disk_exhausted":
                assert held[1] + disk > 500
            return
        self.live[reservation.id] = (reservation.spec, owner)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def end_owner(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        _, owner = self.live.pop(rid)
        if isinstance(owner, Lease):
            owner.end()
        else:
            owner.end()  # type: ignore[attr-defined]

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), twice=st.booleans())
    def release(self, data: st.DataObject, twice: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.live.pop(rid)
        assert self.budget.release(rid)
        if twice:
            assert not self.budget.release(rid)

    @rule(seconds=st.floats(0, 20))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds
        self.budget.reap()
        for rid in [rid for rid, (_, owner) in self.live.items() if isinstance(owner, Lease)]:
            if self.live[rid][1].done():  # type: ignore[attr-defined]
                self.live.pop(rid)

    def _held(self) -> tuple[int, int]:
        return (
            sum(s.mem for s, _ in self.live.values()),
            sum(s.disk for s, _ in self.live.values()),
        )

    @invariant()
    def never_over_committed_and_exact(self) -> None:
        mem, disk = self._held()
        assert mem <= 1000 and disk <= 500
        headroom = self.budget.headroom()
        # headroom() reaps expired leases; account for those the model has not seen yet
        for rid in [rid for rid, (_, owner) in self.live.items() if isinstance(owner, Lease)]:
            if self.live[rid][1].done():  # type: ignore[attr-defined]
                self.live.pop(rid)
        mem, disk = self._held()
        assert headroom.mem_free == 1000 - mem
        assert headroom.disk_free == 500 - disk
        assert {r.id for r in self.budget.reservations()} == set(self.live)


TestBudgetMachine = BudgetMachine.TestCase
TestBudgetMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_os_process_handles_are_owners() -> None:
    # No timing: each process lives until this test kills it (a short sleep could end before
    # its admission, which then refuses owner_ended), and the test waits for the releases
    # themselves — a change listener's event, the owner task — never for a while.
    import subprocess

    import psutil

    from berth.ownership import process_owner

    budget = NodeBudget(limits())
    released = threading.Event()
    budget.add_change_listener(
        lambda: released.set() if budget.headroom().mem_free == 4 * GiB else None
    )
    popen = subprocess.Popen(["sleep", "600"])
    other = subprocess.Popen(["sleep", "600"])
    try:
        budget.admit(spec(), process_owner(popen))
        budget.admit(spec(), process_owner(psutil.Process(other.pid)))
        assert budget.headroom().mem_free == 2 * GiB
    finally:
        for process in (popen, other):
            process.kill()
            process.wait()
    assert released.wait(timeout=30), "process owners did not release"

    async def with_asyncio() -> None:
        process = await asyncio.create_subprocess_exec("sleep", "600")
        owner = process_owner(process)
        budget.admit(spec(), owner)
        assert budget.headroom().mem_free == 3 * GiB
        process.kill()
        await owner  # type: ignore[misc]  # the budget's callback came first: it has released
        assert budget.headroom().mem_free == 4 * GiB

    asyncio.run(with_asyncio())


def test_admit_leased_then_bind_or_expire() -> None:
    clock = FakeClock()
    budget = NodeBudget(limits(), clock=clock)
    bound = budget.admit_leased(spec(), 5.0)
    loose = budget.admit_leased(spec(), 5.0)
    with pytest.raises(Refused, match="mem_exhausted"):
        budget.admit_leased(spec(mem=3 * GiB), 5.0)
    assert len(budget.reservations()) == 2  # a refused admission holds nothing
    owner = ManualOwner()
    budget.bind(bound.id, owner)
    clock.now += 6
    assert budget.headroom().mem_free == 3 * GiB  # the unbound one expired
    with pytest.raises(Refused, match="lease_expired"):
        budget.bind(loose.id, ManualOwner())
    owner.end()
    assert budget.headroom().mem_free == 4 * GiB


# --- owner, spec and reservation id validation (issue 9; pins scripts/mutation.py) ----

# --- budget --------------------------------------------------------------------------------


class Refusing:
    """An owner that fails when told about its reservation."""

    def add_done_callback(self, fn: object) -> None:
        raise RuntimeError("owner is gone")


def test_owner_whose_callback_fails_gets_the_reservation_back() -> None:
    changes: list[int] = []
    budget = NodeBudget(limits(), on_change=lambda: changes.append(1))
    with pytest.raises(RuntimeError, match="owner is gone"):
        budget.admit(spec(), Refusing())
    assert budget.reservations() == []
    assert budget.headroom().mem_free == 4 * GiB
    assert budget.headroom().disk_free == 40 * GiB
    with pytest.raises(RuntimeError, match="owner is gone"):
        budget.reserve(spec(), Refusing())
    assert budget.reservations() == []
    assert budget.headroom().mem_free == 4 * GiB


@pytest.mark.parametrize("owner", [object(), 42, None, "task"])
def test_owner_without_add_done_callback_is_invalid(owner: object) -> None:
    budget = NodeBudget(limits())
    with pytest.raises(Invalid) as caught:
        budget.admit(spec(), owner)  # type: ignore[arg-type]
    assert caught.value.field == "owner"
    assert caught.value.message == (
        f"an owner reports its end through add_done_callback; {owner!r} does not"
    )
    assert budget.reservations() == []


def test_owner_with_a_non_callable_add_done_callback_is_invalid() -> None:
    class Odd:
        add_done_callback = 3

        def __repr__(self) -> str:
            return "Odd()"

    with pytest.raises(Invalid) as caught:
        NodeBudget(limits()).admit(spec(), Odd())  # type: ignore[arg-type]
    assert caught.value.field == "owner"
    assert caught.value.message.endswith("; Odd() does not")


@pytest.mark.parametrize("reservation_id", [None, 7, b"id"])
def test_reservation_id_must_be_a_string(reservation_id: object) -> None:
    budget = NodeBudget(limits())
    for call in (budget.release, budget.get):
        with pytest.raises(Invalid) as caught:
            call(reservation_id)  # type: ignore[arg-type]
        assert caught.value.field == "reservation_id"
        assert caught.value.message == (f"expected a reservation id string, got {reservation_id!r}")
    with pytest.raises(Invalid) as caught:
        budget.bind(reservation_id, concurrent.futures.Future())  # type: ignore[arg-type]
    assert caught.value.field == "reservation_id"


def test_a_reservation_needs_a_spec() -> None:
    budget = NodeBudget(limits())
    for admit in (budget.admit, budget.reserve):
        with pytest.raises(Invalid) as caught:
            admit(None, concurrent.futures.Future())  # type: ignore[arg-type]
        assert caught.value.field == "spec"
        said = "a reservation needs its resources (a Spec or an instance type), got None"
        assert caught.value.message == said
        assert str(caught.value) == f"spec: {said}"
    assert budget.reservations() == []


def test_budget_platform_error_names_the_platform_field() -> None:
    with pytest.raises(Invalid) as caught:
        NodeBudget(limits(), platform="linux")
    assert caught.value.field == "platform"
    with pytest.raises(Invalid) as caught:
        NodeBudget(limits(), platform="beos/amd64")
    assert caught.value.field == "platform"
