"""The cluster driver: the port's contract, the seed's place/run, explanations and errors."""

from __future__ import annotations

import asyncio
import logging
from typing import ClassVar

import pytest

from berth import Invalid, Layer, NoCapacity, NoMatchingPlatform, Platform, Request, Spec
from berth.errors import Unavailable
from berth.node.budget import BudgetLimits, NodeBudget, StaticLoad
from berth.nodeclient.local import LocalNodes
from berth.ownership import Refused
from berth.scheduler.multinode import ClusterScheduler
from berth.scheduler.port import Scheduler
from berth.state import NodeState
from berth.store.memory import MemoryStore
from berth.testing.clock import FakeClock
from berth.testing.placement_contract import SchedulerContract
from berth.units import GiB


class Cluster:
    """Budgets, their snapshots in a memory store, and a scheduler over both."""

    def __init__(self, ranker: str = "engine") -> None:
        self.clock = FakeClock(0.0)
        self.store = MemoryStore()
        self.nodes = LocalNodes()
        self.budgets: dict[str, NodeBudget] = {}
        self.layers: dict[str, frozenset[str]] = {}
        self.platforms: dict[str, str] = {}
        self.scheduler = ClusterScheduler(self.store, self.nodes, ranker=ranker)  # type: ignore[arg-type]

    def add(
        self,
        name: str,
        platform: str = "linux/amd64",
        mem: int = 4 * GiB,
        layers: frozenset[str] = frozenset(),
        load: StaticLoad | None = None,
    ) -> NodeBudget:
        limits = BudgetLimits(
            mem_max=mem, disk_max=100 * GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
        )
        budget = NodeBudget(
            limits, load or StaticLoad(), clock=self.clock, on_change=lambda: self.publish(name)
        )
        self.budgets[name], self.layers[name], self.platforms[name] = budget, layers, platform
        self.nodes.add(name, budget)
        self.publish(name)
        return budget

    def publish(self, name: str, **overrides: object) -> None:
        budget = self.budgets[name]
        headroom = budget.headroom()
        fields: dict[str, object] = {
            "node": name,
            "platform": self.platforms[name],
            "generation": int(self.clock.now * 1000) + len(budget.reservations()),
            "admitted": budget.admitted,
            "mem_free": headroom.mem_free,
            "disk_free": headroom.disk_free,
            "cpu_load": budget.readings.cpu_load,
            "cpu_capacity": budget.limits.cpu_capacity,
            "disk_bw_ceiling": budget.limits.disk_bw_ceiling,
            "net_bw_ceiling": budget.limits.net_bw_ceiling,
            "layers": self.layers[name],
        }
        fields.update(overrides)
        self.store.publish_now(NodeState(**fields))


class TestClusterContract(SchedulerContract):
    def make_scheduler(self) -> Scheduler:
        cluster = Cluster()
        cluster.add("amd-1")
        cluster.add("amd-2", layers=frozenset({"l1"}))
        cluster.add("arm-1", platform="linux/arm64")
        return cluster.scheduler

    def node_platforms(self) -> set[Platform]:
        return {Platform.parse("linux/amd64"), Platform.parse("linux/arm64")}

    def valid_spec(self) -> Spec | None:
        return Spec(vcpus=0.01, mem=2**20, disk=2**20)


class TestClusterContractWithoutResources(TestClusterContract):
    def valid_spec(self) -> Spec | None:
        return None


class TestReferenceRankerContract(TestClusterContract):
    ranker: ClassVar[str] = "reference"

    def make_scheduler(self) -> Scheduler:
        cluster = Cluster(ranker="reference")
        cluster.add("amd-1")
        cluster.add("arm-1", platform="linux/arm64")
        return cluster.scheduler


def micro(**layers: int) -> Request:
    return Request(namespace="ns", name="fn", spec="micro", layers=tuple(layers.items()))


def test_candidates_most_colocated_first_and_schedule_reserves() -> None:
    cluster = Cluster()
    cluster.add("a")
    cluster.add("b", layers=frozenset({"small"}))
    cluster.add("c", layers=frozenset({"big", "small"}))
    request = micro(big=100, small=10)
    assert cluster.scheduler.candidates(request.spec, request.layers) == ["c", "b", "a"]
    placement = asyncio.run(cluster.scheduler.schedule(request))
    assert (placement.worker_node, placement.colocated_bytes, placement.rank) == ("c", 110, 0)
    assert placement.reservation_id is not None
    assert cluster.budgets["c"].headroom().mem_free == 4 * GiB - 128 * 2**20


def test_unbound_lease_expires_and_frees_the_node() -> None:
    cluster = Cluster()
    budget = cluster.add("a", mem=128 * 2**20)
    asyncio.run(cluster.scheduler.schedule(micro()))
    with pytest.raises(NoCapacity):
        asyncio.run(cluster.scheduler.schedule(micro()))
    cluster.clock.now += cluster.scheduler.lease_ttl_s + 1
    assert budget.reap() == 1
    assert asyncio.run(cluster.scheduler.schedule(micro())).worker_node == "a"


def test_place_walks_past_refusals_and_logs_real_reasons(caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster()
    for name in ("a", "b", "c"):
        cluster.add(name)
    tried: list[str] = []

    async def attempt(node: str) -> str:
        tried.append(node)
        if node == "a":
            raise Refused("boot_failed", "kernel panic", node=node)
        if node == "b":
            raise Unavailable("node b timed out")
        return f"vm-on-{node}"

    with caplog.at_level(logging.INFO, logger="berth.scheduler"):
        placed = asyncio.run(cluster.scheduler.place(None, [], attempt))
    assert tried == ["a", "b", "c"]
    assert (placed.node, placed.result, placed.rank) == ("c", "vm-on-c", 2)
    assert dict(placed.refusals) == {"a": "boot_failed", "b": "unavailable: node b timed out"}
    assert "node a refused" in caplog.text and "boot_failed" in caplog.text


def test_all_refusing_gives_no_capacity_with_every_reason() -> None:
    cluster = Cluster()
    cluster.add("only")

    async def attempt(node: str) -> None:
        raise Refused("boot_failed", "no kernel")

    with pytest.raises(NoCapacity) as caught:
        asyncio.run(cluster.scheduler.place(None, [], attempt))
    assert "0/1 nodes can run it: 1 refused at confirmation (boot_failed)" in str(caught.value)
    assert caught.value.reasons == {"only": "boot_failed"}


def test_stale_snapshot_is_overruled_by_the_node() -> None:
    cluster = Cluster()
    cluster.add("busy")
    cluster.add("idle")
    # The node filled up, but its snapshot still advertises room: admission refuses.
    hog = Spec(vcpus=0.1, mem=4 * GiB - 2**20, disk=1)
    lease = cluster.budgets["busy"].lease(60)
    cluster.budgets["busy"].admit(hog, lease)
    cluster.publish("busy", generation=10**9, mem_free=4 * GiB)
    cluster.publish("idle", generation=10**9, layers=frozenset())
    request = micro()
    assert cluster.scheduler.candidates(request.spec, request.layers)[0] == "busy"
    placement = asyncio.run(cluster.scheduler.schedule(request))
    assert placement.worker_node == "idle"
    assert placement.rank == 1
    assert placement.refusals == (("busy", "mem_exhausted"),)


def test_no_capacity_message_summarises_every_node() -> None:
    cluster = Cluster()
    for index in range(3):
        cluster.add(f"small-{index}", mem=64 * 2**20)
    cluster.add("arm", platform="linux/arm64")
    cluster.add("hot", load=StaticLoad(cpu_load=1.0))
    request = Request(namespace="ns", name="fn", spec="micro", platforms=("linux/amd64",))
    with pytest.raises(NoCapacity) as caught:
        asyncio.run(cluster.scheduler.schedule(request))
    message = str(caught.value)
    assert "0/5 nodes can run it" in message
    assert "3 insufficient memory" in message
    assert "1 platform linux/amd64 not offered" in message
    assert "1 cpu saturated" in message
    assert caught.value.reasons["arm"] == "platform_mismatch"
    assert all(budget.reservations() == [] for budget in cluster.budgets.values())


def test_spec_bigger_than_any_node_and_empty_cluster() -> None:
    cluster = Cluster()
    with pytest.raises(NoCapacity, match="0/0 nodes can run it: the cluster has no live nodes"):
        asyncio.run(cluster.scheduler.schedule(micro()))
    cluster.add("a")
    with pytest.raises(NoCapacity, match="1 insufficient memory"):
        asyncio.run(cluster.scheduler.schedule(Request(namespace="n", name="x", spec="tera")))
    assert cluster.budgets["a"].reservations() == []


def test_no_matching_platform_is_invalid_and_names_what_is_offered() -> None:
    cluster = Cluster()
    cluster.add("a")
    cluster.add("b", platform="linux/arm64")
    request = Request(namespace="n", name="x", platforms=("linux/s390x",))
    with pytest.raises(NoMatchingPlatform) as caught:
        asyncio.run(cluster.scheduler.schedule(request))
    assert isinstance(caught.value, Invalid)
    for part in ("linux/s390x", "linux/amd64", "linux/arm64/v8"):
        assert part in str(caught.value)


def test_preferred_node_is_tried_first_when_it_fits() -> None:
    cluster = Cluster()
    cluster.add("a", layers=frozenset({"l"}))
    cluster.add("b")
    cluster.add("tiny", mem=1)
    base = {"namespace": "n", "name": "x", "spec": "micro", "layers": (("l", 5),)}
    preferred = Request(**base, preferred_node="b")
    assert asyncio.run(cluster.scheduler.schedule(preferred)).worker_node == "b"
    cannot = Request(**base, preferred_node="tiny")
    assert asyncio.run(cluster.scheduler.schedule(cannot)).worker_node == "a"


def test_an_avoided_node_is_asked_only_when_no_other_takes_the_request() -> None:
    cluster = Cluster()
    cluster.add("a", layers=frozenset({"l"}))
    cluster.add("b")
    base = {"namespace": "n", "name": "x", "spec": "micro", "layers": (("l", 5),)}
    assert asyncio.run(cluster.scheduler.schedule(Request(**base))).worker_node == "a"
    avoiding = Request(**base).avoiding("a")
    assert avoiding.avoid_nodes == ("a",)
    assert asyncio.run(cluster.scheduler.schedule(avoiding)).worker_node == "b"
    both = avoiding.avoiding("b")  # a soft hint: with every node avoided, the best one
    assert both.avoid_nodes == ("a", "b")
    assert asyncio.run(cluster.scheduler.schedule(both)).worker_node == "a"
    many = Request(**base)
    for index in range(40):
        many = many.avoiding(f"n{index}")
    assert len(many.avoid_nodes) == 16 and many.avoid_nodes[-1] == "n39"


def test_explain_gives_every_verdict_with_rank() -> None:
    cluster = Cluster()
    cluster.add("a", layers=frozenset({"l"}))
    cluster.add("b")
    cluster.add("full", mem=1)
    cluster.add("arm", platform="linux/arm64")
    request = Request(
        namespace="n", name="x", spec="micro", layers=(("l", 7),), platforms=("linux/amd64",)
    )
    explanation = cluster.scheduler.explain(request)
    table = [(v.node, v.verdict, v.colocated_bytes, v.rank) for v in explanation.verdicts]
    assert table == [
        ("a", "fits", 7, 0),
        ("b", "fits", 0, 1),
        ("arm", "platform_mismatch", 0, None),
        ("full", "mem_exhausted", 0, None),
    ]
    assert explanation.summary() == (
        "2/4 nodes can run it: 1 platform linux/amd64 not offered, 1 insufficient memory"
    )
    # each verdict says its figures, as the node's refusal would
    described = {v.node: v.description for v in explanation.verdicts}
    assert described["full"] == "insufficient memory: asks 128MiB, 1B free"
    assert described["arm"].startswith("platform not offered: node runs linux/arm64")
    assert described["a"] == "fits"


class Workload:
    """A started workload whose end the test controls (an owner for the budget)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.callbacks: list[object] = []
        self.stopped = False

    def add_done_callback(self, fn: object) -> None:
        self.callbacks.append(fn)

    def end(self) -> None:
        self.stopped = True
        for fn in self.callbacks:
            fn(self)  # type: ignore[operator]


def test_run_starts_admits_and_stops_on_refusal() -> None:
    cluster = Cluster()
    cluster.add("a", layers=frozenset({"l"}))
    cluster.add("b")
    started: list[Workload] = []

    async def start(node: str) -> Workload:
        workload = Workload(node)
        started.append(workload)
        return workload

    async def stop(workload: Workload) -> None:
        workload.end()

    # "a" advertises room but is actually full: the started workload must be stopped there.
    cluster.budgets["a"].admit(Spec(vcpus=0.1, mem=4 * GiB, disk=1), cluster.budgets["a"].lease(60))
    cluster.publish("a", generation=10**9, mem_free=4 * GiB)
    spec = Spec(vcpus=0.25, mem=GiB, disk=GiB)
    placed = asyncio.run(cluster.scheduler.run(spec, [Layer(id="l", size=1)], start, stop))
    assert placed.node == "b"
    assert [w.node for w in started] == ["a", "b"]
    assert started[0].stopped and not started[1].stopped
    assert dict(placed.refusals) == {"a": "mem_exhausted"}
    assert cluster.budgets["b"].headroom().mem_free == 3 * GiB
    placed.result.end()  # the workload dies: its reservation goes with it
    assert cluster.budgets["b"].headroom().mem_free == 4 * GiB


def test_boot_failure_is_not_mistaken_for_capacity() -> None:
    cluster = Cluster()
    cluster.add("only")

    async def start(node: str) -> Workload:
        raise Refused("boot_failed", "exec format error")

    async def stop(workload: Workload) -> None:  # pragma: no cover - never started
        workload.end()

    with pytest.raises(NoCapacity, match=r"refused at confirmation \(boot_failed\)"):
        asyncio.run(cluster.scheduler.run(Spec(vcpus=1, mem=1, disk=1), [], start, stop))
    assert cluster.budgets["only"].reservations() == []


def test_departed_nodes_are_not_candidates() -> None:
    cluster = Cluster()
    cluster.add("a")
    cluster.add("b")
    asyncio.run(cluster.store.remove("a"))
    assert cluster.scheduler.candidates(None, []) == ["b"]
    cluster.scheduler.close()
    cluster.add("c")
    assert cluster.scheduler.candidates(None, []) == ["b"]  # no longer following the store


def test_every_ranker_takes_the_policy() -> None:
    from berth.scheduler.policy import BerthPolicy

    cluster = Cluster()
    cluster.add("a", mem=4 * GiB, layers=frozenset({"x"}))
    cluster.add("b", mem=16 * GiB)
    cluster.add("c", mem=8 * GiB)
    layers = [Layer(id="x", size=1)]
    assert cluster.scheduler.candidates(None, layers) == ["a", "b", "c"]  # the seed's
    for ranker in ("engine", "reference"):
        roomiest = BerthPolicy(jitter=0.0)  # one stray byte is no reason to skip room
        scheduler = ClusterScheduler(cluster.store, cluster.nodes, ranker=ranker, policy=roomiest)
        assert scheduler.candidates(None, layers) == ["b", "c", "a"]


def test_direct_api_rejects_bad_layers_and_platforms() -> None:
    cluster = Cluster()
    cluster.add("a", layers=frozenset({"x"}))
    spec = Spec(vcpus=1, mem=1, disk=1)
    with pytest.raises(Invalid) as caught:
        cluster.scheduler.candidates(spec, [Layer(id="x", size=1), Layer(id="x", size=1)])
    assert caught.value.field == "layers"
    with pytest.raises(Invalid):
        cluster.scheduler.candidates(spec, [("x", -5)])  # type: ignore[list-item]
    with pytest.raises(Invalid) as caught:
        cluster.scheduler.candidates(spec, [], ["linux/amd46"])  # type: ignore[list-item]
    assert caught.value.field == "platforms"
    assert cluster.scheduler.rank(spec, [("x", 9)]).pairs() == [("a", 9)]  # type: ignore[list-item]


def test_place_with_plain_pairs_explains_its_failure() -> None:
    cluster = Cluster()
    cluster.add("small", mem=1)

    async def attempt(node: str) -> None:  # pragma: no cover - nothing fits
        raise AssertionError(node)

    spec = Spec(vcpus=1, mem=2, disk=1)
    with pytest.raises(NoCapacity, match="1 insufficient memory"):
        asyncio.run(cluster.scheduler.place(spec, [("x", 5)], attempt, ["linux/amd64"]))  # type: ignore[list-item]
