"""The node budget: admission, refusals, owners, leases, and no over-commit ever."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from berth import Invalid, Platform, Spec
from berth.node.budget import BudgetLimits, NodeBudget, StaticLoad
from berth.ownership import Lease, Refused

GiB = 2**30


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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
    return BudgetLimits(**fields)  # type: ignore[arg-type]


def spec(
    mem: int = GiB, disk: int = GiB, vcpus: float = 1, disk_bw: int = 0, net_bw: int = 0
) -> Spec:
    return Spec(vcpus=vcpus, mem=mem, disk=disk, disk_bw=disk_bw, net_bw=net_bw)


class Owned:
    """A minimal owner whose end the test triggers."""

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()

    def add_done_callback(self, fn: object) -> None:
        self.future.add_done_callback(lambda _: fn(self))  # type: ignore[operator]

    def end(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


def test_admit_reserves_and_owner_end_releases_exactly() -> None:
    budget = NodeBudget(limits())
    owner = Owned()
    budget.admit(spec(mem=GiB, disk=2 * GiB), owner)
    assert budget.headroom().mem_free == 3 * GiB
    assert budget.headroom().disk_free == 38 * GiB
    owner.end()
    assert budget.headroom().mem_free == 4 * GiB
    assert budget.headroom().disk_free == 40 * GiB
    assert budget.reservations() == []


def test_exact_fill_is_admitted_one_more_byte_is_not() -> None:
    budget = NodeBudget(limits())
    budget.admit(spec(mem=4 * GiB, disk=GiB), Owned())
    with pytest.raises(Refused) as caught:
        budget.admit(spec(mem=1, disk=1, vcpus=0.1), Owned())
    assert caught.value.reason == "mem_exhausted"
    with pytest.raises(Refused) as caught:
        NodeBudget(limits()).admit(spec(mem=1, disk=40 * GiB + 1), Owned())
    assert caught.value.reason == "disk_exhausted"


@pytest.mark.parametrize(
    ("load", "asked", "reason"),
    [
        (StaticLoad(cpu_load=0.6), spec(vcpus=1), "cpu_saturated"),  # 0.6 + 1/4 > 0.8
        (StaticLoad(disk_bw_load=450), spec(disk_bw=51), "disk_bw_saturated"),
        (StaticLoad(net_bw_load=500), spec(net_bw=1), "net_bw_saturated"),
    ],
)
def test_soft_checks_read_live_load(load: StaticLoad, asked: Spec, reason: str) -> None:
    budget = NodeBudget(limits(), load)
    with pytest.raises(Refused) as caught:
        budget.admit(asked, Owned())
    assert caught.value.reason == reason
    assert budget.reservations() == []  # nothing reserved by a refused admission
    load.cpu_load = load.disk_bw_load = load.net_bw_load = 0.0
    budget.admit(asked, Owned())  # the same request fits once the load drops


def test_checks_run_in_table_order_hard_before_soft() -> None:
    """Admission walks the one table (platform, hard, β_max, soft); it used to judge soft first."""
    budget = NodeBudget(
        limits(cpu_overcommit=0.25), StaticLoad(cpu_load=1.0), platform="linux/amd64"
    )
    asked = spec(mem=5 * GiB, vcpus=2)  # fails memory, the β_max ceiling and the load
    for platforms, reason in ((["linux/arm64"], "platform_mismatch"), ([], "mem_exhausted")):
        with pytest.raises(Refused) as caught:
            budget.admit(asked, Owned(), [Platform.parse(p) for p in platforms])
        assert caught.value.reason == reason
    with pytest.raises(Refused, match="cpu_overcommitted"):
        budget.admit(spec(vcpus=2), Owned())
    with pytest.raises(Refused, match="cpu_saturated"):
        budget.admit(spec(vcpus=1), Owned())


def test_reserve_judges_only_what_reservations_hold() -> None:
    budget = NodeBudget(
        limits(cpu_overcommit=0.5), StaticLoad(cpu_load=1.0), platform="linux/amd64"
    )
    budget.reserve(spec(vcpus=2), Owned())  # a saturated node: reserve skips the live load
    with pytest.raises(Refused) as caught:
        budget.reserve(spec(vcpus=1), Owned())
    assert caught.value.reason == "cpu_overcommitted"
    assert caught.value.detail == "2 + 1 vcpus reserved > ceiling 2"
    with pytest.raises(Refused, match="mem_exhausted"):
        budget.reserve(spec(mem=4 * GiB, vcpus=0.001), Owned())


def test_soft_edge_is_inclusive() -> None:
    budget = NodeBudget(limits(), StaticLoad(cpu_load=0.55))
    budget.admit(spec(vcpus=1), Owned())  # 0.55 + 0.25 == 0.8


def test_overcommit_stage_bounds_reserved_soft_sums() -> None:
    budget = NodeBudget(limits(cpu_overcommit=1.5))  # ceiling 6 vcpus
    for _ in range(3):
        budget.admit(spec(mem=1, disk=1, vcpus=2), Owned())
    with pytest.raises(Refused) as caught:
        budget.admit(spec(mem=1, disk=1, vcpus=0.5), Owned())
    assert caught.value.reason == "cpu_overcommitted"
    over = budget.overcommit()
    assert over is not None and over.vcpus_reserved == 6 and over.vcpus_ceiling == 6
    assert NodeBudget(limits()).overcommit() is None


def test_release_is_idempotent() -> None:
    budget = NodeBudget(limits())
    reservation = budget.admit(spec(), Owned())
    assert budget.release(reservation.id) is True
    assert budget.release(reservation.id) is False
    assert budget.release("never") is False
    assert budget.headroom().mem_free == 4 * GiB


def test_on_change_fires_on_reserve_and_release() -> None:
    changes: list[int] = []
    budget = NodeBudget(limits(), on_change=lambda: changes.append(1))
    owner = Owned()
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
    owner = Owned()
    bound.bind(owner)
    clock.now += 4.9
    assert budget.reap() == 0
    clock.now += 0.2
    assert budget.headroom().mem_free == 3 * GiB  # reaping ran: the unbound lease ended
    assert expiring.done() and not bound.done()
    with pytest.raises(Refused):
        expiring.bind(Owned())
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


def test_refused_message_names_reason() -> None:
    refused = Refused("mem_exhausted", "1 B asked, 0 B free", node="n3")
    assert (
        str(refused) == "node n3 refused: mem_exhausted (insufficient memory): 1 B asked, 0 B free"
    )


def test_threads_never_over_commit() -> None:
    budget = NodeBudget(limits(mem_max=100, disk_max=10**9))
    admitted: list[Owned] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(300):
            owner = Owned()
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
        self.budget = NodeBudget(limits(mem_max=1000, disk_max=500, cpu_overcommit=2.0),
                                 clock=self.clock)  # fmt: skip
        self.live: dict[str, tuple[Spec, object]] = {}

    @rule(mem=st.integers(0, 400), disk=st.integers(0, 200), vcpus=st.sampled_from([0.5, 1, 3]),
          kind=st.sampled_from(["owner", "lease"]))  # fmt: skip
    def admit(self, mem: int, disk: int, vcpus: float, kind: str) -> None:
        owner: object = Owned() if kind == "owner" else self.budget.lease(10.0)
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
    import subprocess
    import time

    import psutil

    from berth.ownership import process_owner

    budget = NodeBudget(limits())
    popen = subprocess.Popen(["sleep", "0.2"])
    budget.admit(spec(), process_owner(popen))
    other = subprocess.Popen(["sleep", "30"])
    budget.admit(spec(), process_owner(psutil.Process(other.pid)))
    assert budget.headroom().mem_free == 2 * GiB
    other.kill()
    other.wait()
    deadline = time.monotonic() + 5
    while budget.headroom().mem_free != 4 * GiB:
        assert time.monotonic() < deadline, "process owners did not release"
        time.sleep(0.01)

    async def with_asyncio() -> None:
        process = await asyncio.create_subprocess_exec("sleep", "0.1")
        budget.admit(spec(), process_owner(process))
        assert budget.headroom().mem_free == 3 * GiB
        await process.wait()
        for _ in range(100):
            if budget.headroom().mem_free == 4 * GiB:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the asyncio process owner did not release")

    asyncio.run(with_asyncio())


def test_admit_leased_then_bind_or_expire() -> None:
    clock = FakeClock()
    budget = NodeBudget(limits(), clock=clock)
    bound = budget.admit_leased(spec(), 5.0)
    loose = budget.admit_leased(spec(), 5.0)
    with pytest.raises(Refused, match="mem_exhausted"):
        budget.admit_leased(spec(mem=3 * GiB), 5.0)
    assert len(budget.reservations()) == 2  # a refused admission holds nothing
    owner = Owned()
    budget.bind(bound.id, owner)
    clock.now += 6
    assert budget.headroom().mem_free == 3 * GiB  # the unbound one expired
    with pytest.raises(Refused, match="lease_expired"):
        budget.bind(loose.id, Owned())
    owner.end()
    assert budget.headroom().mem_free == 4 * GiB
