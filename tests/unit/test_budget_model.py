"""The node budget against a trivially correct model, under any sequence of operations.

Hypothesis drives one :class:`NodeBudget` through admissions (owned and leased), binds,
renewals, releases, owner deaths, load changes, clock steps and reaps, and holds it to a
model that keeps the reservations in a dict and judges every admission with exact fractions
in the order of the checks table.  All amounts lie on small grids (dyadic vcpus and times,
bandwidths in hundreds) so exact fills (``reserved + asked == ceiling``) and exact deadlines
(``now == deadline``) happen all the time, and the budget's floats are exact there too.

Every over-commit dimension is bounded in the main configuration (cpu, disk and network
bandwidth), a mixed one leaves some unbounded, and one runs no β_max stage at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from berth import Platform, Spec
from berth.node.budget import BudgetLimits, NodeBudget, StaticLoad
from berth.ownership import Lease, Refused
from berth.testing.clock import FakeClock
from berth.testing.owner import ManualOwner

AMD64, ARM64 = Platform.parse("linux/amd64"), Platform.parse("linux/arm64")

BASE: dict[str, Any] = {
    "mem_max": 1000,
    "disk_max": 600,
    "cpu_capacity": 4.0,
    "cpu_max_load": 0.75,
    "disk_bw_cap": 1000,
    "disk_bw_max_load": 0.5,  # live ceiling 500 B/s
    "net_bw_cap": 800,
    "net_bw_max_load": 0.75,  # live ceiling 600 B/s
}
CONFIGS: dict[str, dict[str, Any]] = {
    # every β_max ceiling: 6 vcpus, 750 B/s disk, 500 B/s network
    "all bounded": {"cpu_overcommit": 1.5, "disk_bw_overcommit": 0.75, "net_bw_overcommit": 0.625},
    "mixed": {"cpu_overcommit": 0.75, "disk_bw_overcommit": 0.5},  # 3 vcpus, 500 B/s disk
    "no stage": {},
}

# Small grids: sums land exactly on the limits above.
MEM = st.sampled_from([0, 1, 50, 100, 100, 250, 250, 500, 999, 1000])
DISK = st.sampled_from([0, 0, 100, 100, 200, 300, 600])
VCPUS = st.sampled_from([0.25, 0.5, 0.5, 1.0, 1.5, 3.0])
DISK_BW = st.sampled_from([0, 0, 125, 250, 250, 500])
NET_BW = st.sampled_from([0, 0, 100, 250, 250, 500])
PLATFORMS = st.sampled_from([(), (), (), (AMD64,), (ARM64,), (ARM64, AMD64)])
TTLS = st.sampled_from([0.5, 1.0, 2.0, 5.0])
STEPS = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 5.0])
CPU_LOADS = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])
BW_LOADS = st.sampled_from([0, 100, 250, 400, 500, 600])
SPECS = st.builds(Spec, vcpus=VCPUS, mem=MEM, disk=DISK, disk_bw=DISK_BW, net_bw=NET_BW)


@dataclass
class Held:
    """The model of one live reservation."""

    spec: Spec
    owner: ManualOwner | None  # the plain owner, or the owner a lease is bound to
    deadline: Fraction | None = None  # an unbound lease's deadline
    leased: bool = False


@dataclass
class Model:
    """What the budget must say: reservations in a dict, verdicts in exact fractions."""

    limits: BudgetLimits
    now: Fraction = Fraction(1000)
    held: dict[str, Held] = field(default_factory=dict)
    admitted: int = 0
    changes: int = 0
    load: dict[str, Fraction] = field(
        default_factory=lambda: dict.fromkeys(("cpu", "disk_bw", "net_bw"), Fraction(0))
    )

    def total(self, resource: str) -> Fraction:
        return sum((Fraction(getattr(h.spec, resource)) for h in self.held.values()), Fraction(0))

    def ceiling(self, factor: float | None, total: float) -> Fraction | None:
        return None if factor is None else Fraction(factor) * Fraction(total)

    def verdict(self, spec: Spec, platforms: tuple[Platform, ...]) -> str | None:
        """The first failing check, in table order; ``None`` when it fits."""
        lim = self.limits
        if platforms and AMD64 not in platforms:
            return "platform_mismatch"
        if self.total("mem") + spec.mem > lim.mem_max:
            return "mem_exhausted"
        if self.total("disk") + spec.disk > lim.disk_max:
            return "disk_exhausted"
        for resource, factor, total, code in (
            ("vcpus", lim.cpu_overcommit, lim.cpu_capacity, "cpu_overcommitted"),
            ("disk_bw", lim.disk_bw_overcommit, lim.disk_bw_cap, "disk_bw_overcommitted"),
            ("net_bw", lim.net_bw_overcommit, lim.net_bw_cap, "net_bw_overcommitted"),
        ):
            ceiling = self.ceiling(factor, total)
            if ceiling is not None and self.total(resource) + Fraction(getattr(spec, resource)) > (
                ceiling
            ):
                return code
        cpu = self.load["cpu"] + Fraction(spec.vcpus) / Fraction(lim.cpu_capacity)
        if cpu > Fraction(lim.cpu_max_load):
            return "cpu_saturated"
        if self.load["disk_bw"] + spec.disk_bw > Fraction(lim.disk_bw_max_load) * lim.disk_bw_cap:
            return "disk_bw_saturated"
        if self.load["net_bw"] + spec.net_bw > Fraction(lim.net_bw_max_load) * lim.net_bw_cap:
            return "net_bw_saturated"
        return None

    def admit(self, spec: Spec, owner: ManualOwner | None, deadline: Fraction | None) -> str:
        self.admitted += 1
        self.changes += 1
        rid = f"r{self.admitted}.model"
        self.held[rid] = Held(spec, owner, deadline, leased=deadline is not None)
        return rid

    def drop(self, rid: str) -> bool:
        if self.held.pop(rid, None) is None:
            return False
        self.changes += 1
        return True

    def due(self) -> list[str]:
        return [
            rid for rid, h in self.held.items() if h.deadline is not None and self.now >= h.deadline
        ]

    def reap(self) -> int:
        due = self.due()
        for rid in due:
            self.drop(rid)
        return len(due)


class BudgetModelMachine(RuleBasedStateMachine):
    """One budget, one model, the same operations; they must agree after every step."""

    reservations = Bundle("reservations")  # every id ever handed out, live or not
    owners = Bundle("owners")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.load = StaticLoad()
        self.budget: NodeBudget | None = None
        self.model: Model | None = None
        self.changes = 0

    @initialize(config=st.sampled_from(sorted(CONFIGS)))
    def start(self, config: str) -> None:
        limits = BudgetLimits(**BASE, **CONFIGS[config])
        self.budget = NodeBudget(
            limits,
            self.load,
            clock=self.clock,
            platform=AMD64,
            on_change=self._changed,
            incarnation="model",
        )
        self.model = Model(limits)

    def _changed(self) -> None:
        self.changes += 1

    @property
    def b(self) -> NodeBudget:
        assert self.budget is not None
        return self.budget

    @property
    def m(self) -> Model:
        assert self.model is not None
        return self.model

    def _lease(self, rid: str) -> Lease | None:
        reservation = self.b.get(rid)
        owner = None if reservation is None else reservation.owner
        return owner if isinstance(owner, Lease) else None

    # -- admission ---------------------------------------------------------------------------
    def _judge(
        self, spec: Spec, platforms: tuple[Platform, ...], take: Callable[[], str]
    ) -> str | None:
        self.m.reap()  # admission reaps first
        expected = self.m.verdict(spec, platforms)
        try:
            rid = take()
        except Refused as refused:
            assert refused.reason == expected, (refused, expected)
            return None
        assert expected is None, f"admitted, the model says {expected}"
        return rid

    @rule(target=reservations, spec=SPECS, platforms=PLATFORMS)
    def admit(self, spec: Spec, platforms: tuple[Platform, ...]) -> str:
        owner = ManualOwner()

        def take() -> str:
            reservation = self.b.admit(spec, owner, platforms)
            assert reservation.seq == self.m.admitted + 1
            assert reservation.owner is owner and reservation.spec == spec
            return reservation.id

        rid = self._judge(spec, platforms, take)
        if rid is None:
            return "never-admitted"
        assert rid == self.m.admit(spec, owner, None)
        return rid

    @rule(target=reservations, spec=SPECS, ttl=TTLS, platforms=PLATFORMS)
    def admit_leased(self, spec: Spec, ttl: float, platforms: tuple[Platform, ...]) -> str:
        def take() -> str:
            return self.b.admit_leased(spec, ttl, platforms).id

        rid = self._judge(spec, platforms, take)
        if rid is None:
            return "never-admitted"
        assert rid == self.m.admit(spec, None, self.m.now + Fraction(ttl))
        return rid

    # -- leases --------------------------------------------------------------------------------
    @rule(target=owners, rid=reservations)
    def bind(self, rid: str) -> ManualOwner:
        owner = ManualOwner()
        held = self.m.held.get(rid)
        lease = self._lease(rid)
        if held is None or not held.leased or held.owner is not None:
            # gone, never leased, or already bound: binding anew is only tried while unbound
            if held is not None and held.owner is not None:
                return owner
            try:
                self.b.bind(rid, owner)
            except Refused as refused:
                assert refused.reason == "lease_expired"
            else:
                raise AssertionError(f"bound {rid}, which the model says holds no open lease")
            return owner
        assert lease is not None
        try:
            self.b.bind(rid, owner)
        except Refused as refused:
            assert refused.reason == "lease_expired"
            assert held.deadline is not None and self.m.now >= held.deadline, "refused early"
            assert self.m.drop(rid)  # a due lease is ended by the bind that finds it
            assert lease.done()
            return owner
        assert held.deadline is not None and self.m.now < held.deadline, "bound a due lease"
        held.owner, held.deadline = owner, None
        assert lease.bound_to is owner and lease.deadline is None
        return owner

    @rule(rid=reservations, ttl=TTLS)
    def renew(self, rid: str, ttl: float) -> None:
        lease = self._lease(rid)
        held = self.m.held.get(rid)
        if lease is None:
            assert held is None or not held.leased
            return
        assert held is not None and held.leased
        renewed = lease.renew(ttl)
        if held.owner is not None:  # bound: nothing to push, and no deadline comes back
            assert renewed is True and lease.deadline is None
        elif held.deadline is not None and self.m.now >= held.deadline:
            assert renewed is False and lease.done()
            assert self.m.drop(rid)
        else:
            assert renewed is True
            held.deadline = self.m.now + Fraction(ttl)
            assert lease.deadline == held.deadline

    @rule(rid=reservations)
    def release(self, rid: str) -> None:
        lease = self._lease(rid)
        held = self.m.held.get(rid)
        if held is not None and held.deadline is not None and self.m.now >= held.deadline:
            # a release at or after the deadline finds the lease expired (reaped or not)
            self.m.drop(rid)
            expected = False
        else:
            expected = self.m.drop(rid)
        assert self.b.release(rid) is expected
        if lease is not None:
            assert lease.done()  # a released lease is over: no later bind can succeed
            assert lease.renew(1.0) is False

    @rule(rid=reservations)
    def owner_dies(self, rid: str) -> None:
        """The workload holding ``rid`` ends (its plain owner, or the owner a lease is bound to)."""
        held = self.m.held.get(rid)
        if held is None or held.owner is None:
            return
        held.owner.end()
        for other, h in list(self.m.held.items()):
            if h.owner is held.owner:  # one owner may hold several reservations
                self.m.drop(other)

    @rule(owner=consumes(owners))
    def stale_owner_dies(self, owner: ManualOwner) -> None:
        """An owner whose bind was refused (or that was bound and ended) ends: frees nothing."""
        owner.end()
        for rid, h in list(self.m.held.items()):
            if h.owner is owner:
                self.m.drop(rid)

    # -- time and load -------------------------------------------------------------------------
    @rule(step=STEPS)
    def time_passes(self, step: float) -> None:
        self.clock.now += step
        self.m.now += Fraction(step)

    @precondition(
        lambda self: (
            self.model is not None and any(h.deadline is not None for h in self.model.held.values())
        )
    )
    @rule(data=st.data())
    def time_reaches_a_deadline(self, data: st.DataObject) -> None:
        """Step to exactly one lease's deadline (when it lies ahead)."""
        deadlines = sorted({h.deadline for h in self.m.held.values() if h.deadline is not None})
        deadline = data.draw(st.sampled_from(deadlines))
        if deadline > self.m.now:
            self.m.now = deadline
            self.clock.now = float(deadline)
            assert self.clock.now == deadline

    @rule()
    def reap(self) -> None:
        assert self.b.reap() == self.m.reap()

    @rule(cpu=CPU_LOADS, disk_bw=BW_LOADS, net_bw=BW_LOADS)
    def load_changes(self, cpu: float, disk_bw: int, net_bw: int) -> None:
        self.load.cpu_load, self.load.disk_bw_load, self.load.net_bw_load = cpu, disk_bw, net_bw
        self.m.load = {
            "cpu": Fraction(cpu),
            "disk_bw": Fraction(disk_bw),
            "net_bw": Fraction(net_bw),
        }

    @rule()
    def headroom(self) -> None:
        self.m.reap()  # headroom reaps first
        headroom = self.b.headroom()
        assert headroom.mem_free == self.m.limits.mem_max - self.m.total("mem")
        assert headroom.disk_free == self.m.limits.disk_max - self.m.total("disk")

    # -- invariants (read-only: none of these reaps) -------------------------------------------
    @invariant()
    def same_reservations(self) -> None:
        if self.model is None:
            return
        held = {r.id: r.spec for r in self.b.reservations()}
        assert held == {rid: h.spec for rid, h in self.m.held.items()}
        assert self.b.admitted == self.m.admitted
        assert self.changes == self.m.changes

    @invariant()
    def never_over_committed(self) -> None:
        if self.model is None:
            return
        lim = self.m.limits
        assert self.m.total("mem") <= lim.mem_max and self.m.total("disk") <= lim.disk_max
        over = self.b.overcommit()
        if not lim.overcommit_enabled:
            assert over is None
            return
        assert over is not None
        for resource, factor, total in (
            ("vcpus", lim.cpu_overcommit, lim.cpu_capacity),
            ("disk_bw", lim.disk_bw_overcommit, lim.disk_bw_cap),
            ("net_bw", lim.net_bw_overcommit, lim.net_bw_cap),
        ):
            reserved = getattr(over, f"{resource}_reserved")
            ceiling = getattr(over, f"{resource}_ceiling")
            assert reserved == self.m.total(resource), resource  # exact: no drift, no phantom
            assert ceiling == self.m.ceiling(factor, total), resource
            if ceiling is not None:
                assert reserved <= ceiling

    @invariant()
    def leases_match(self) -> None:
        if self.model is None:
            return
        for rid, h in self.m.held.items():
            lease = self._lease(rid)
            assert (lease is not None) == h.leased
            if lease is not None:
                assert not lease.done()
                assert lease.deadline == h.deadline
                assert lease.bound_to is h.owner

    def teardown(self) -> None:
        if self.model is None:
            return
        for h in list(self.m.held.values()):
            if h.owner is not None:
                h.owner.end()
        for rid in list(self.m.held):
            self.b.release(rid)
        assert self.b.reservations() == []
        headroom = self.b.headroom()
        assert (headroom.mem_free, headroom.disk_free) == (1000, 600)
        over = self.b.overcommit()
        assert over is None or (
            over.vcpus_reserved,
            over.disk_bw_reserved,
            over.net_bw_reserved,
        ) == (
            0,
            0,
            0,
        )


TestBudgetModel = BudgetModelMachine.TestCase
TestBudgetModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
