"""The scheduler's Prometheus metrics: what each decision counts, what a scrape reads.

A ``ClusterScheduler`` over in-process budgets (``LocalNodes``) and the memory store, with a
``Metrics`` of its own: placements by outcome, decision and ranking latency, refusals at
confirmation by reason (a snapshot that promises more than the node's budget holds makes the
node refuse for real), attempts and re-rankings; the collector's nodes by state and
reservations, read at scrape time; the text exposition parsed back.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from berth import Invalid, Layer, NoCapacity, NoMatchingPlatform, Request, Spec
from berth.errors import Unavailable
from berth.node.budget import BudgetLimits, NodeBudget
from berth.nodeclient.local import LocalNodes
from berth.observability.metrics import DECISION_BUCKETS, MAX_REASONS, ClusterCollector, Metrics
from berth.observability.outcomes import outcome_of
from berth.ownership import Refused
from berth.platform import Platform
from berth.scheduler.multinode import ClusterScheduler
from berth.state import NodeState
from berth.store.memory import MemoryStore
from berth.testing.clock import FakeClock
from berth.units import GiB, MiB

SMALL = Spec(vcpus=0.1, mem=256 * MiB, disk=MiB)
NOW = 1_000_000.0


def snapshot(
    node: str,
    *,
    mem_free: int = 4 * GiB,
    published_at: float = NOW,
    cordoned: bool = False,
    generation: int = 1,
    admitted: int = 0,
) -> NodeState:
    return NodeState(
        node=node,
        platform="linux/amd64",
        generation=generation,
        admitted=admitted,
        published_at=published_at,
        mem_free=mem_free,
        disk_free=100 * GiB,
        mem_max=4 * GiB,
        disk_max=100 * GiB,
        cpu_capacity=4,
        disk_bw_ceiling=GiB,
        net_bw_ceiling=GiB,
        cordoned=cordoned,
    )


class Cluster:
    """Nodes a, b, c (4 GiB each by their snapshots) and a scheduler with its own metrics."""

    def __init__(self, *, budgets: dict[str, int] | None = None) -> None:
        self.store = MemoryStore()
        self.nodes = LocalNodes()
        self.metrics = Metrics()
        self.scheduler = ClusterScheduler(self.store, self.nodes, metrics=self.metrics)
        self.clock = FakeClock(NOW)
        self.collector = self.metrics.watch(self.scheduler, stale_after_s=10.0, clock=self.clock)
        for node in ("a", "b", "c"):
            mem = (budgets or {}).get(node, 4 * GiB)
            limits = BudgetLimits(
                mem_max=mem, disk_max=100 * GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
            )
            self.nodes.add(node, NodeBudget(limits, platform=Platform.parse("linux/amd64")))
            self.store.publish_now(snapshot(node))

    def value(self, name: str, **labels: str) -> float:
        found = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def schedule(self, request: Request) -> object:
        return asyncio.run(self.scheduler.schedule(request))


def request(name: str, spec: Spec = SMALL, **fields: object) -> Request:
    return Request(namespace="test", name=name, spec=spec, **fields)


def test_decisions_are_counted_by_outcome_and_timed() -> None:
    cluster = Cluster()
    for replica in range(3):
        cluster.schedule(request("ok", replica=replica))
    with pytest.raises(NoCapacity):
        cluster.schedule(request("huge", Spec(vcpus=0.1, mem=64 * GiB, disk=MiB)))
    with pytest.raises(NoMatchingPlatform):
        cluster.schedule(request("arm", platforms=("linux/arm64",)))

    assert cluster.value("berth_placements_total", outcome="placed") == 3
    assert cluster.value("berth_placements_total", outcome="no_capacity") == 1
    assert cluster.value("berth_placements_total", outcome="invalid") == 1
    assert cluster.value("berth_placements_total", outcome="unavailable") == 0
    assert cluster.value("berth_placement_seconds_count") == 5
    # every ranking is timed (the platform check fails inside the first one)
    assert cluster.value("berth_ranking_seconds_count") == 5
    assert 0 < cluster.value("berth_placement_seconds_sum") < 5
    # the first choice confirmed each of the three placements: one node asked each
    assert cluster.value("berth_confirmation_attempts_count") == 3
    assert cluster.value("berth_confirmation_attempts_sum") == 3
    assert cluster.value("berth_confirmation_attempts_bucket", le="1.0") == 3
    assert cluster.value("berth_rerankings_total") == 0


def test_refusals_at_confirmation_are_counted_by_reason() -> None:
    # a's and b's snapshots promise 4 GiB; their budgets hold 128 MiB: they refuse for real
    cluster = Cluster(budgets={"a": 128 * MiB, "b": 128 * MiB})
    placement = cluster.schedule(request("walks"))
    assert placement.worker_node == "c"  # type: ignore[attr-defined]
    assert cluster.value("berth_confirmation_refusals_total", reason="mem_exhausted") == 2
    assert cluster.value("berth_confirmation_attempts_sum") == 3  # a, b, then c
    assert cluster.value("berth_confirmation_attempts_bucket", le="1.0") == 0
    assert cluster.value("berth_confirmation_attempts_bucket", le="3.0") == 1

    cluster.nodes.discard("c")  # in the view, not reachable: unavailable at confirmation
    with pytest.raises(NoCapacity):
        cluster.schedule(request("nowhere", replica=1))
    assert cluster.value("berth_confirmation_refusals_total", reason="unavailable") == 1
    assert cluster.value("berth_confirmation_refusals_total", reason="mem_exhausted") == 4
    assert cluster.value("berth_placements_total", outcome="no_capacity") == 1


def test_a_walk_that_ranks_again_counts_a_reranking() -> None:
    cluster = Cluster()
    tried: list[str] = []

    async def attempt(node: str) -> str:
        tried.append(node)
        if node != "late":
            if len(tried) == 1:  # a node joins while the first pass is walked
                limits = BudgetLimits(
                    mem_max=4 * GiB,
                    disk_max=100 * GiB,
                    cpu_capacity=4,
                    disk_bw_cap=GiB,
                    net_bw_cap=GiB,
                )
                cluster.nodes.add("late", NodeBudget(limits, platform="linux/amd64"))
                cluster.store.publish_now(snapshot("late"))
            raise Refused("cpu_saturated", node=node)
        return node

    placed = asyncio.run(cluster.scheduler.place(SMALL, (), attempt))
    assert placed.node == "late" and tried[-1] == "late"
    assert cluster.value("berth_rerankings_total") == 1
    assert cluster.value("berth_ranking_seconds_count") == 2
    assert cluster.value("berth_confirmation_refusals_total", reason="cpu_saturated") == 3
    assert cluster.value("berth_placements_total", outcome="placed") == 1


def test_reason_labels_are_bounded() -> None:
    metrics = Metrics()
    metrics.refused(Refused("mem_exhausted", node="a"))
    metrics.refused(Refused("Not A Code\n{}", node="a"))  # from a misbehaving peer
    metrics.refused(Unavailable("node 'a' is not reachable"))
    for index in range(2 * MAX_REASONS):
        metrics.refused(Refused(f"code_{index}", node="a"))
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    reasons = {
        sample.labels["reason"]: sample.value
        for sample in families["berth_confirmation_refusals"].samples
        if sample.name.endswith("_total")
    }
    assert len(reasons) <= MAX_REASONS + 1
    assert reasons["mem_exhausted"] == 1 and reasons["unavailable"] == 1
    # the malformed code, and every code past the cap, counted as "other" (the cap counts
    # the three labels seen first: mem_exhausted, other, unavailable)
    assert reasons["other"] == 1 + (2 * MAX_REASONS - (MAX_REASONS - 3))
    assert reasons["code_0"] == 1 and "code_61" not in reasons


def test_outcomes_name_the_error_kinds() -> None:
    assert outcome_of(None) == "placed"
    assert outcome_of(NoCapacity("full", {})) == "no_capacity"
    assert outcome_of(NoMatchingPlatform(("linux/arm64",), "linux/amd64 on 3 nodes")) == "invalid"
    assert outcome_of(Invalid("bad", field="spec")) == "invalid"
    assert outcome_of(Unavailable("down")) == "unavailable"
    assert outcome_of(asyncio.CancelledError()) == "unavailable"  # a scheduler shutting down
    assert outcome_of(RuntimeError("bug")) == "error"


def test_nodes_by_state_and_reservations_are_read_at_scrape_time() -> None:
    cluster = Cluster()
    assert cluster.value("berth_nodes", state="ready") == 3
    cluster.store.publish_now(snapshot("b", cordoned=True, generation=2))
    cluster.store.publish_now(snapshot("c", published_at=NOW - 60, generation=2))
    # stale wins over cordoned: a silent node's cordon flag is as old as its snapshot
    cluster.store.publish_now(snapshot("d", published_at=NOW - 60, cordoned=True))
    assert cluster.value("berth_nodes", state="ready") == 1
    assert cluster.value("berth_nodes", state="cordoned") == 1
    assert cluster.value("berth_nodes", state="stale") == 2
    cluster.clock.now = NOW + 30  # time passes, nothing new published: every node is stale now
    assert cluster.value("berth_nodes", state="stale") == 4
    cluster.clock.now = NOW

    assert cluster.value("berth_capacity_bytes", resource="mem") == 4 * 4 * GiB
    assert cluster.value("berth_reserved_bytes", resource="mem", source="held") == 0
    placement = cluster.schedule(request("held"))
    node = placement.worker_node  # type: ignore[attr-defined]
    # confirmed, not yet in the node's snapshot: assumed
    assert cluster.value("berth_reservations", state="assumed") == 1
    assert cluster.value("berth_reserved_bytes", resource="mem", source="assumed") == SMALL.mem
    assert cluster.value("berth_reserved_bytes", resource="mem", source="held") == 0
    # the node's next snapshot counts it: held, no longer assumed
    covered = snapshot(node, mem_free=4 * GiB - SMALL.mem, generation=5, admitted=1)
    cluster.store.publish_now(covered)
    assert cluster.value("berth_reservations", state="assumed") == 0
    assert cluster.value("berth_reserved_bytes", resource="mem", source="assumed") == 0
    assert cluster.value("berth_reserved_bytes", resource="mem", source="held") == SMALL.mem

    cluster.store.remove_now("a")
    assert sum(cluster.value("berth_nodes", state=s) for s in ("ready", "cordoned", "stale")) == 3


def test_exposition_is_prometheus_text_with_every_family() -> None:
    cluster = Cluster()
    cluster.schedule(request("one", layers=(Layer(id="l1", size=10),)))
    text = cluster.metrics.exposition().decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert set(families) >= {
        "berth_placements",
        "berth_placement_seconds",
        "berth_ranking_seconds",
        "berth_confirmation_refusals",
        "berth_confirmation_attempts",
        "berth_rerankings",
        "berth_nodes",
        "berth_reservations",
        "berth_reserved_bytes",
        "berth_capacity_bytes",
    }
    assert families["berth_placement_seconds"].type == "histogram"
    buckets = [
        float(sample.labels["le"])
        for sample in families["berth_placement_seconds"].samples
        if sample.name.endswith("_bucket") and sample.labels["le"] != "+Inf"
    ]
    assert buckets == list(DECISION_BUCKETS) and buckets[0] == 50e-6
    # every outcome is exported from the start, at zero, so rates work from the first scrape
    outcomes = {
        sample.labels["outcome"]
        for sample in families["berth_placements"].samples
        if sample.name.endswith("_total")
    }
    assert outcomes == {"placed", "no_capacity", "invalid", "unavailable", "error"}


def test_each_metrics_has_its_own_registry_and_the_global_one_is_untouched() -> None:
    first, second = Cluster(), Cluster()
    first.schedule(request("only-in-first"))
    assert first.value("berth_placements_total", outcome="placed") == 1
    assert second.value("berth_placements_total", outcome="placed") == 0
    assert REGISTRY.get_sample_value("berth_placements_total", {"outcome": "placed"}) is None


def test_an_unmeasured_scheduler_has_no_metrics_and_places_alike() -> None:
    store, nodes = MemoryStore(), LocalNodes()
    scheduler = ClusterScheduler(store, nodes)
    assert scheduler.metrics is None
    limits = BudgetLimits(
        mem_max=4 * GiB, disk_max=100 * GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
    )
    nodes.add("a", NodeBudget(limits, platform="linux/amd64"))
    store.publish_now(snapshot("a"))
    assert asyncio.run(scheduler.schedule(request("plain"))).worker_node == "a"


def test_bad_arguments_are_invalid_naming_the_field() -> None:
    with pytest.raises(Invalid) as caught:
        ClusterScheduler(MemoryStore(), LocalNodes(), metrics="yes")  # type: ignore[arg-type]
    assert caught.value.field == "metrics"
    metrics = Metrics()
    scheduler = ClusterScheduler(MemoryStore(), LocalNodes(), metrics=metrics)
    with pytest.raises(Invalid) as caught:
        ClusterCollector(scheduler, stale_after_s=0)
    assert caught.value.field == "stale_after_s"
    with pytest.raises(Invalid) as caught:
        ClusterCollector(object(), stale_after_s=1)  # type: ignore[arg-type]
    assert caught.value.field == "scheduler"
    metrics.watch(scheduler, stale_after_s=1)
    with pytest.raises(Invalid) as caught:  # one view per registry: no duplicate series
        metrics.watch(scheduler, stale_after_s=1)
    assert caught.value.field == "scheduler"


def test_api_placements_are_counted_by_the_apis_outcome() -> None:
    metrics = Metrics()
    for outcome in ("placed", "placed", "unavailable", "refused", "no_capacity", "nonsense"):
        metrics.api_placement(outcome)
    value = metrics.registry.get_sample_value
    assert value("berth_api_placements_total", {"outcome": "placed"}) == 2
    assert value("berth_api_placements_total", {"outcome": "unavailable"}) == 1
    assert value("berth_api_placements_total", {"outcome": "refused"}) == 1
    assert value("berth_api_placements_total", {"outcome": "no_capacity"}) == 1
    assert value("berth_api_placements_total", {"outcome": "error"}) == 1  # an unknown word
    assert value("berth_api_placements_total", {"outcome": "invalid"}) == 0
    # the scheduler's own decisions are another family: nothing counted there
    assert value("berth_placements_total", {"outcome": "placed"}) == 0
