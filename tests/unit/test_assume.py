"""The assume cache: its arithmetic and bookkeeping, then through a ClusterScheduler whose
snapshots are stale (nodes that never re-publish after admitting)."""

from __future__ import annotations

import asyncio
import math

import pytest

from berth import Invalid, Layer, Request, Spec
from berth.boot import AdmitOrder
from berth.model import Placement
from berth.node.budget import BudgetLimits, NodeBudget
from berth.nodeclient.local import LocalNodes
from berth.nodeclient.recording import RecordingNodes
from berth.ownership import Admission, Refused
from berth.scheduler.assume import AssumeCache, Assumption, apply
from berth.scheduler.multinode import ClusterScheduler
from berth.state import NodeState, Overcommit
from berth.store.memory import MemoryStore
from berth.testing.clock import FakeClock
from berth.testing.owner import ManualOwner
from berth.units import GiB, MiB


def snapshot(**changes: object) -> NodeState:
    fields: dict[str, object] = {
        "node": "n1",
        "platform": "linux/amd64",
        "generation": 7,
        "admitted": 3,
        "mem_free": 1000,
        "disk_free": 2000,
        "cpu_load": 0.1,
        "cpu_capacity": 4.0,
        "disk_bw_load": 10.0,
        "disk_bw_ceiling": 1e9,
        "net_bw_load": 20.0,
        "net_bw_ceiling": 1e9,
        "layers": frozenset({"a"}),
        "cached_layers": frozenset({"b", "c"}),
    }
    fields.update(changes)
    return NodeState(**fields)


def assumption(spec: Spec, layers: set[str], seq: int = 4, rid: str = "r4") -> Assumption:
    return Assumption("n1", rid, seq, spec, frozenset(layers), expires_at=60.0)


ONE = Spec(vcpus=1, mem=300, disk=500, disk_bw=5, net_bw=7)
TWO = Spec(vcpus=0.5, mem=200, disk=100, disk_bw=1, net_bw=2)


# --- apply -----------------------------------------------------------------------------------


def test_apply_subtracts_and_adds_every_assumption() -> None:
    base = snapshot(overcommit=Overcommit(vcpus_reserved=1, vcpus_ceiling=16, net_bw_reserved=3))
    view = apply(base, [assumption(ONE, {"b"}), assumption(TWO, {"d"}, 5, "r5")])
    assert (view.mem_free, view.disk_free) == (1000 - 500, 2000 - 600)
    # Live load stays the node's reading: admission checks live load, which the assumed
    # workloads have not raised yet; only the reserved (β_max) sums grow.
    assert (view.cpu_load, view.disk_bw_load, view.net_bw_load) == (0.1, 10, 20)
    # Layers on their way count as mounted, and so are no longer merely cached.
    assert view.layers == {"a", "b", "d"}
    assert view.cached_layers == {"c"}
    assert view.overcommit is not None
    over = view.overcommit
    assert (over.vcpus_reserved, over.disk_bw_reserved, over.net_bw_reserved) == (2.5, 6, 12)
    assert (over.vcpus_ceiling, over.disk_bw_ceiling) == (16, None)  # ceilings stay
    # The node's own figures: the next snapshot replaces the view, and coverage is by seq.
    assert (view.generation, view.admitted, view.node) == (7, 3, "n1")
    assert (view.mem_max, view.cpu_capacity, view.disk_bw_ceiling) == (None, 4.0, 1e9)
    assert base.mem_free == 1000 and base.layers == {"a"}  # the snapshot is untouched


def test_apply_without_assumptions_is_the_snapshot_itself() -> None:
    base = snapshot()
    assert apply(base, []) is base
    assert apply(base, iter(())) is base
    assert apply(base, [assumption(ONE, set())]).overcommit is None


def test_apply_clamps_at_empty() -> None:
    hog = Spec(vcpus=64, mem=5000, disk=9000, disk_bw=2 * 10**9)
    view = apply(snapshot(), [assumption(hog, set())])
    assert (view.mem_free, view.disk_free, view.cpu_load) == (0, 0, 0.1)
    assert NodeState.model_validate(view.model_dump()) == view  # still a valid snapshot


def test_over_commit_sums_of_assumptions_can_exhaust_the_ceiling() -> None:
    from berth.state import fits

    base = snapshot(mem_free=10 * GiB, overcommit=Overcommit(vcpus_reserved=6, vcpus_ceiling=8))
    small = Spec(vcpus=1, mem=1, disk=1)
    assert fits(base, small)
    view = apply(base, [assumption(small, set(), 4, "r4"), assumption(small, set(), 5, "r5")])
    assert view.overcommit is not None and view.overcommit.vcpus_reserved == 8
    assert not fits(view, small)


# --- the cache -------------------------------------------------------------------------------


def test_ttl_must_be_positive() -> None:
    for ttl in (0, -1.0, math.nan):
        with pytest.raises(Invalid) as caught:
            AssumeCache(ttl)
        assert caught.value.field == "assume_ttl_s"


def test_covered_once_a_snapshot_has_admitted_at_least_seq() -> None:
    cache = AssumeCache(30, clock=FakeClock())
    cache.assume("n1", Admission("r4", 4), ONE, [Layer(id="b", size=1)])
    cache.assume("n1", Admission("r5", 5), TWO, [])
    cache.assume("n2", Admission("r1", 1), TWO, [])
    assert len(cache) == 3
    # An older snapshot (taken before the admissions) covers nothing: re-apply everything.
    older = snapshot(admitted=3, generation=8)
    assert cache.covered(older) is False
    assert [a.reservation_id for a in cache.pending("n1")] == ["r4", "r5"]
    view = apply(older, cache.pending("n1"))
    assert (view.mem_free, view.layers) == (500, frozenset({"a", "b"}))
    # One that saw the first admission covers exactly that one.
    assert cache.covered(snapshot(admitted=4, generation=9)) is True
    assert [a.reservation_id for a in cache.pending("n1")] == ["r5"]
    assert cache.covered(snapshot(admitted=9, generation=10)) is True
    assert cache.pending("n1") == ()
    assert cache.covered(snapshot(admitted=99)) is False  # nothing left for n1
    assert [a.node for a in cache.pending("n2")] == ["n2"]  # other nodes untouched
    assert len(cache) == 1


def test_forget_and_drop_node() -> None:
    cache = AssumeCache(30, clock=FakeClock())
    cache.assume("n1", Admission("r4", 4), ONE, [])
    cache.assume("n1", Admission("r5", 5), ONE, [])
    assert cache.forget("n1", "r4") is True
    assert cache.forget("n1", "r4") is False
    assert cache.forget("elsewhere", "r4") is False
    assert [a.reservation_id for a in cache.pending("n1")] == ["r5"]
    cache.drop_node("n1")
    cache.drop_node("n1")
    assert cache.pending("n1") == () and len(cache) == 0


def test_expiry_follows_the_clock() -> None:
    clock = FakeClock(100.0)
    cache = AssumeCache(10, clock=clock)
    first = cache.assume("n1", Admission("r1", 1), ONE, [])
    assert first.expires_at == 110.0
    clock.advance(4)
    cache.assume("n2", Admission("r1", 1), ONE, [])
    cache.assume("n3", Admission("r1", 1), ONE, [])
    cache.forget("n3", "r1")  # forgotten before its deadline: skipped, no change reported
    clock.advance(5.9)
    assert cache.expire() == set()
    clock.advance(0.1)  # exactly the deadline
    assert cache.expire() == {"n1"}
    assert cache.pending("n1") == () and len(cache.pending("n2")) == 1
    clock.advance(4)
    assert cache.expire() == {"n2"}
    assert len(cache) == 0 and cache.expire() == set()


def test_a_reused_reservation_id_keeps_its_own_deadline() -> None:
    """A restarted node counts r1 anew: the old r1's deadline must not expire the new one."""
    clock = FakeClock(0.0)
    cache = AssumeCache(30, clock=clock)
    cache.assume("n1", Admission("r1", 1), ONE, [])
    cache.drop_node("n1")  # the node left (and restarts)
    clock.advance(20)
    cache.assume("n1", Admission("r1", 1), TWO, [])
    clock.advance(10)  # the old entry's deadline
    assert cache.expire() == set()
    assert [a.spec for a in cache.pending("n1")] == [TWO]
    clock.advance(20)
    assert cache.expire() == {"n1"}


# --- through the scheduler, with snapshots that go stale -------------------------------------


REQUEST = Request(namespace="ns", name="fn", spec="micro", layers=(("l", 50 * MiB),))
MICRO = 128 * MiB


class StaleCluster:
    """Node ``a`` (holds the layer, room for one micro) and ``b`` (room for many), each
    published once: their budgets never re-publish, so the scheduler's snapshots go stale."""

    def __init__(self, *, assume: bool = True) -> None:
        self.clock = FakeClock()
        self.store = MemoryStore()
        self.local = LocalNodes()
        self.nodes = RecordingNodes(self.local)
        self.budgets: dict[str, NodeBudget] = {}
        self.generation = 0
        self.scheduler = ClusterScheduler(
            self.store, self.nodes, assume=assume, lease_ttl_s=30, clock=self.clock
        )
        self.add("a", 200 * MiB, {"l"})
        self.add("b", 4 * GiB, set())

    def add(self, name: str, mem: int, layers: set[str]) -> None:
        limits = BudgetLimits(
            mem_max=mem, disk_max=100 * GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
        )
        budget = NodeBudget(limits, clock=self.clock, platform="linux/amd64")
        self.budgets[name] = budget
        self.local.add(name, budget)
        self.publish(name, layers)

    def publish(self, name: str, layers: set[str] | None = None, **overrides: object) -> None:
        """A snapshot of the budget as it is now (``overrides`` fake an older one)."""
        budget = self.budgets[name]
        self.generation += 1
        fields: dict[str, object] = {
            "node": name,
            "platform": "linux/amd64",
            "generation": self.generation,
            "admitted": budget.admitted,
            "mem_free": budget.headroom().mem_free,
            "disk_free": budget.headroom().disk_free,
            "cpu_capacity": 4.0,
            "disk_bw_ceiling": float(GiB),
            "net_bw_ceiling": float(GiB),
            "layers": frozenset(layers or ()),
        }
        fields.update(overrides)
        self.store.publish_now(NodeState(**fields))

    def schedule(self) -> Placement:
        return asyncio.run(self.scheduler.schedule(REQUEST))

    def viewed_mem_free(self, node: str) -> int:
        return self.scheduler.states()[node].mem_free


def test_assume_keeps_a_stale_scheduler_off_the_node_it_just_filled() -> None:
    cluster = StaleCluster()
    first, second = cluster.schedule(), cluster.schedule()
    assert (first.worker_node, second.worker_node) == ("a", "b")
    assert first.refusals == second.refusals == ()
    assert cluster.nodes.refusals == []  # zero refusals at confirmation
    assert cluster.viewed_mem_free("a") == 200 * MiB - MICRO
    assert cluster.scheduler.states()["b"].layers == {"l"}  # counted as mounted on b now
    assert cluster.store.states_now()["a"].mem_free == 200 * MiB  # still the stale snapshot


def test_without_assume_the_stale_view_costs_a_refusal_at_confirmation() -> None:
    cluster = StaleCluster(assume=False)
    first, second = cluster.schedule(), cluster.schedule()
    assert (first.worker_node, second.worker_node) == ("a", "b")
    assert second.refusals == (("a", "mem_exhausted"),)
    assert cluster.nodes.refusals == [("a", "mem_exhausted")]
    assert cluster.viewed_mem_free("a") == 200 * MiB  # the view is the stale snapshot


def test_a_covering_snapshot_replaces_the_assumption_without_counting_twice() -> None:
    cluster = StaleCluster()
    cluster.schedule()
    # A heartbeat taken before the admission but delivered after it: the assumption stays.
    cluster.publish("a", {"l"}, admitted=0, mem_free=200 * MiB)
    assert cluster.viewed_mem_free("a") == 200 * MiB - MICRO
    assert len(cluster.scheduler.assumed or ()) == 1
    cluster.publish("a", {"l"})  # the node's own figures now include the reservation
    assert cluster.viewed_mem_free("a") == 200 * MiB - MICRO
    assert len(cluster.scheduler.assumed or ()) == 0
    assert cluster.schedule().worker_node == "b"


def test_release_undoes_the_assumption() -> None:
    cluster = StaleCluster()
    first = cluster.schedule()
    assert asyncio.run(cluster.scheduler.release(first)) is True
    assert cluster.viewed_mem_free("a") == 200 * MiB
    assert cluster.budgets["a"].headroom().mem_free == 200 * MiB
    assert asyncio.run(cluster.scheduler.release(first)) is False
    again = cluster.schedule()
    assert (again.worker_node, again.refusals, cluster.nodes.refusals) == ("a", (), [])


def test_a_failed_bind_undoes_the_assumption() -> None:
    cluster = StaleCluster()
    first = cluster.schedule()
    cluster.clock.advance(30)  # the lease expires on the node before the workload binds
    with pytest.raises(Refused) as caught:
        asyncio.run(cluster.scheduler.bind(first, ManualOwner()))
    assert caught.value.reason == "lease_expired"
    assert cluster.viewed_mem_free("a") == 200 * MiB
    assert len(cluster.scheduler.assumed or ()) == 0
    again = cluster.schedule()
    assert (again.worker_node, cluster.nodes.refusals) == ("a", [("a", "lease_expired")])


def test_a_bind_refused_for_an_unknown_workload_also_undoes_it() -> None:
    cluster = StaleCluster()
    first = cluster.schedule()
    with pytest.raises(Refused, match="unknown_workload"):
        asyncio.run(cluster.scheduler.bind(first, "no-such-workload"))
    assert cluster.viewed_mem_free("a") == 200 * MiB


def test_a_successful_bind_keeps_the_assumption() -> None:
    cluster = StaleCluster()
    first = cluster.schedule()
    owner = ManualOwner()
    asyncio.run(cluster.scheduler.bind(first, owner))
    cluster.clock.advance(29)
    assert cluster.viewed_mem_free("a") == 200 * MiB - MICRO
    assert cluster.schedule().worker_node == "b"
    assert cluster.nodes.refusals == []


def test_assumptions_expire_when_no_snapshot_covers_them() -> None:
    cluster = StaleCluster()
    first = cluster.schedule()
    assert first.worker_node == "a"
    cluster.clock.advance(29.9)
    assert "a" not in cluster.scheduler.candidates(REQUEST.spec, REQUEST.layers)
    cluster.clock.advance(0.1)  # the assume ttl defaults to the lease ttl
    assert cluster.scheduler.candidates(REQUEST.spec, REQUEST.layers)[0] == "a"
    assert cluster.viewed_mem_free("a") == 200 * MiB


def test_a_node_that_leaves_takes_its_assumptions_along() -> None:
    cluster = StaleCluster()
    cluster.schedule()
    cluster.store.remove_now("a")
    assert len(cluster.scheduler.assumed or ()) == 0
    cluster.budgets["a"] = NodeBudget(cluster.budgets["a"].limits, clock=cluster.clock)
    cluster.local.add("a", cluster.budgets["a"])
    cluster.publish("a", {"l"})  # back, empty, counting admissions from zero
    assert cluster.viewed_mem_free("a") == 200 * MiB


def test_requests_without_resources_assume_nothing() -> None:
    cluster = StaleCluster()
    bare = Request(namespace="ns", name="fn", layers=(("l", 1),))
    placement = asyncio.run(cluster.scheduler.schedule(bare))
    assert (placement.worker_node, placement.reservation_id) == ("a", None)
    assert len(cluster.scheduler.assumed or ()) == 0


def test_a_snapshot_that_beats_the_admission_reply_is_not_assumed_again() -> None:
    # Over a network the node's snapshot (admitted >= seq) can reach the replica before the
    # reply to the admission it reflects; assuming it then would count it twice.
    cluster = StaleCluster()
    admission = cluster.local.admit_now("a", AdmitOrder(REQUEST.spec, 30))  # type: ignore[arg-type]
    cluster.publish("a", {"l"})  # the node's snapshot, already counting the reservation
    cluster.scheduler.assume("a", admission, REQUEST.spec, REQUEST.layers)  # type: ignore[arg-type]
    assert len(cluster.scheduler.assumed or ()) == 0
    assert cluster.viewed_mem_free("a") == 200 * MiB - MICRO  # counted once
