"""``place()``'s walk follows the ranking it started from, whatever happens to the cluster.

Between two attempts the walk awaits, and meanwhile nodes leave, others join (reusing a
departed node's engine slot) and the engine compacts.  The walk must still try exactly the
nodes of its original ranking, in order, never a platform the request excluded; a node that
left answers ``Unavailable`` and is reported as such.  Only when every one of them has said
no does ``place()`` rank again, and then it tries the nodes it has not tried yet (the amd64
newcomer), never one twice.  Also: an ``Invalid`` from an attempt is not a refusal, it
propagates.
"""

from __future__ import annotations

import asyncio
import math
from typing import ClassVar, Literal

import pytest

from berth import Invalid, Layer, NoCapacity, Spec
from berth.boot import AdmitOrder
from berth.errors import Unavailable
from berth.node.budget import BudgetLimits, NodeBudget
from berth.nodeclient.local import LocalNodes
from berth.ownership import Refused
from berth.platform import Platform
from berth.scheduler.decision import Decision
from berth.scheduler.engine import Engine
from berth.scheduler.multinode import ClusterScheduler
from berth.scheduler.ranking import NO_STAGES, Ranking, StagedRanking, Stages
from berth.state import NodeState
from berth.store.memory import MemoryStore
from berth.units import GiB, MiB

RankerName = Literal["engine", "reference"]
RANKERS: tuple[RankerName, ...] = ("engine", "reference")
AMD64 = (Platform.parse("linux/amd64"),)
SPEC = Spec(vcpus=0.25, mem=128 * MiB, disk=MiB)
LAYERS = (Layer(id="big", size=100), Layer(id="small", size=10))


def state(
    node: str, platform: str = "linux/amd64", layers: set[str] | None = None, generation: int = 1
) -> NodeState:
    return NodeState(
        node=node,
        platform=platform,
        generation=generation,
        mem_free=4 * GiB,
        disk_free=100 * GiB,
        cpu_capacity=4,
        disk_bw_ceiling=GiB,
        net_bw_ceiling=GiB,
        layers=frozenset(layers or ()),
    )


class Walk:
    """A scheduler over nodes a..e (amd64) and arm-1, ranked a, b, c, d, e for LAYERS."""

    ORIGINAL: ClassVar[list[str]] = ["a", "b", "c", "d", "e"]

    def __init__(self, ranker: RankerName) -> None:
        self.store = MemoryStore()
        self.nodes = LocalNodes()
        self.scheduler = ClusterScheduler(self.store, self.nodes, ranker=ranker)
        for node, layers in (
            ("a", {"big", "small"}),
            ("b", {"big"}),
            ("c", {"small"}),
            ("d", set()),
            ("e", set()),
        ):
            self.join(state(node, layers=layers))
        self.join(state("arm-1", "linux/arm64", {"big", "small"}))
        self.tried: list[str] = []

    def join(self, snapshot: NodeState) -> None:
        limits = BudgetLimits(
            mem_max=4 * GiB, disk_max=100 * GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
        )
        self.nodes.add(snapshot.node, NodeBudget(limits, platform=snapshot.platform))
        self.store.publish_now(snapshot)

    def leave(self, node: str) -> None:
        self.store.remove_now(node)
        self.nodes.discard(node)

    def churn(self) -> None:
        """``c`` leaves; an arm64 node and an amd64 node join, both holding every layer (each
        would rank first); the engine compacts, as a concurrent ranking triggers it."""
        self.leave("c")
        # Joins first into the slot ``c`` freed (engine), and sorts before every amd64 node.
        self.join(state("0-arm", "linux/arm64", {"big", "small"}))
        self.join(state("0-amd", "linux/amd64", {"big", "small"}))
        # A newer snapshot of a node still in the walk changes its layers meanwhile.
        self.store.publish_now(state("d", layers={"big", "small"}, generation=2))
        ranker = self.scheduler.ranker
        if isinstance(ranker, Engine):
            assert not ranker.in_name_order
            ranker.compact_after = 0
            self.scheduler.rank(SPEC, LAYERS, AMD64)  # another request's ranking compacts
            assert ranker.in_name_order
        now = self.scheduler.candidates(SPEC, LAYERS, AMD64)
        assert now == ["0-amd", "a", "d", "b", "e"]  # what a new walk would try

    async def attempt(self, node: str) -> str:
        """Churn during the first attempt; every node refuses except as ``accept`` says."""
        self.tried.append(node)
        if len(self.tried) == 1:
            self.churn()
            await asyncio.sleep(0)
            raise Refused("boot_failed", "first attempt", node=node)
        admission = await self.nodes.admit(node, AdmitOrder(SPEC, 30, AMD64))
        return admission.reservation_id


@pytest.mark.parametrize("ranker", RANKERS)
def test_walk_keeps_its_ranking_through_leave_join_and_compaction(ranker: RankerName) -> None:
    walk = Walk(ranker)
    assert walk.scheduler.candidates(SPEC, LAYERS, AMD64) == Walk.ORIGINAL

    async def attempt(node: str) -> str:
        reservation = await walk.attempt(node)
        if node != "e":
            await walk.nodes.release(node, reservation)
            raise Refused("cpu_saturated", node=node)
        return reservation

    placed = asyncio.run(walk.scheduler.place(SPEC, LAYERS, attempt, AMD64))
    assert walk.tried == Walk.ORIGINAL
    assert (placed.node, placed.rank, placed.colocated_bytes) == ("e", 4, 0)
    assert dict(placed.refusals) == {
        "a": "boot_failed",
        "b": "cpu_saturated",
        "c": "unavailable: node 'c' is not reachable",
        "d": "cpu_saturated",
    }


@pytest.mark.parametrize("ranker", RANKERS)
def test_walk_keeps_its_colocated_bytes_for_the_node_it_confirms(ranker: RankerName) -> None:
    walk = Walk(ranker)

    async def attempt(node: str) -> str:
        reservation = await walk.attempt(node)
        if node == "b":  # rank 1; the churn did not move it, its bytes are the ranking's
            return reservation
        raise AssertionError(f"walked to {node}")  # pragma: no cover

    placed = asyncio.run(walk.scheduler.place(SPEC, LAYERS, attempt, AMD64))
    assert (placed.node, placed.rank, placed.colocated_bytes) == ("b", 1, 100)


@pytest.mark.parametrize("ranker", RANKERS)
def test_walk_where_all_refuse_tries_the_original_nodes_then_the_newcomer(
    ranker: RankerName,
) -> None:
    walk = Walk(ranker)

    async def attempt(node: str) -> str:
        reservation = await walk.attempt(node)
        await walk.nodes.release(node, reservation)
        raise Refused("cpu_saturated", node=node)

    with pytest.raises(NoCapacity) as caught:
        asyncio.run(walk.scheduler.place(SPEC, LAYERS, attempt, AMD64))
    assert walk.tried == [*Walk.ORIGINAL, "0-amd"]  # the re-rank's only untried node
    reasons = caught.value.reasons
    assert {node: reasons[node] for node in ("a", "b", "d", "e")} == {
        "a": "boot_failed",
        "b": "cpu_saturated",
        "d": "cpu_saturated",
        "e": "cpu_saturated",
    }
    # The arm64 newcomer and the other arm64 node were never tried: filtered by platform.
    assert reasons["0-arm"] == reasons["arm-1"] and "platform" in reasons["arm-1"]


@pytest.mark.parametrize("ranker", RANKERS)
def test_no_capacity_reports_a_node_that_left_mid_walk(ranker: RankerName) -> None:
    walk = Walk(ranker)

    async def attempt(node: str) -> str:
        reservation = await walk.attempt(node)
        await walk.nodes.release(node, reservation)
        raise Refused("cpu_saturated", node=node)

    with pytest.raises(NoCapacity) as caught:
        asyncio.run(walk.scheduler.place(SPEC, LAYERS, attempt, AMD64))
    assert caught.value.reasons.get("c") == "unavailable: node 'c' is not reachable"
    assert "0/" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("ranker", RANKERS)
def test_preferred_node_walk_also_keeps_its_ranking(ranker: RankerName) -> None:
    walk = Walk(ranker)

    async def attempt(node: str) -> str:
        reservation = await walk.attempt(node)
        await walk.nodes.release(node, reservation)
        raise Refused("cpu_saturated", node=node)

    with pytest.raises(NoCapacity):
        asyncio.run(walk.scheduler.place(SPEC, LAYERS, attempt, AMD64, preferred_node="d"))
    assert walk.tried == ["d", "a", "b", "c", "e", "0-amd"]


@pytest.mark.parametrize("ranker", RANKERS)
def test_avoided_nodes_are_asked_last_in_their_ranked_order(ranker: RankerName) -> None:
    walk = Walk(ranker)

    async def attempt(node: str) -> str:
        reservation = await walk.attempt(node)
        await walk.nodes.release(node, reservation)
        raise Refused("cpu_saturated", node=node)

    with pytest.raises(NoCapacity):
        asyncio.run(
            walk.scheduler.place(SPEC, LAYERS, attempt, AMD64, avoid_nodes=["a", "c", "gone"])
        )
    # the first pass asks them last; a node that joined meanwhile gets a pass of its own
    assert walk.tried == ["b", "d", "e", "a", "c", "0-amd"]


def test_a_malformed_avoid_nodes_is_invalid_naming_it() -> None:
    walk = Walk(RANKERS[0])
    for bad in ("a", ["a", ""], [3]):
        with pytest.raises(Invalid) as caught:
            asyncio.run(walk.scheduler.place(SPEC, LAYERS, walk.attempt, AMD64, avoid_nodes=bad))  # type: ignore[arg-type]
        assert caught.value.field == "avoid_nodes"


# --- the ranking value itself ----------------------------------------------------------------


def engine_with(count: int, layer_ids: list[str]) -> Engine:
    engine = Engine(capacity=8, compact_after=None)
    for index in range(count):
        held = {layer for j, layer in enumerate(layer_ids) if (index + j) % 3 != 0}
        engine.upsert(state(f"n{index:04d}", layers=held | {"base"}))
    return engine


@pytest.mark.parametrize(
    ("count", "layer_count"),
    [(6, 2), (6, 13), (1100, 3)],  # subset-sum masks; the >12-layer fallback; dense bitmaps
)
def test_engine_ranking_is_a_value(count: int, layer_count: int) -> None:
    layer_ids = [f"l{j}" for j in range(layer_count)]
    layers = [Layer(id="base", size=1)] + [
        Layer(id=lid, size=10 * (j + 1)) for j, lid in enumerate(layer_ids)
    ]
    engine = engine_with(count, layer_ids)
    ranking = engine.rank(SPEC, layers)  # not read until the engine has changed
    before = engine.rank(SPEC, layers).pairs()  # the same ranking, read at once
    assert len(before) == count

    # Leave, join into the freed slots, change layers, compact, grow.
    departed = [before[0][0], before[len(before) // 2][0]]
    for node in departed:
        engine.remove(node)
    engine.upsert(state("aaa-newcomer", layers=set(layer_ids) | {"base"}))
    engine.upsert(state("arm-newcomer", "linux/arm64", set(layer_ids)))
    survivor = before[-1][0]
    engine.upsert(state(survivor, layers=set(layer_ids) | {"base"}, generation=2))
    engine.compact()
    for index in range(20):
        engine.upsert(state(f"late-{index}", layers={"base"}))

    assert ranking.pairs() == before
    assert list(ranking) == [node for node, _ in before]
    assert ranking[0] == before[0][0] and ranking[1:3] == [node for node, _ in before[1:3]]
    assert [ranking.colocated(i) for i in range(len(ranking))] == [b for _, b in before]
    fresh = engine.rank(SPEC, layers).pairs()
    assert fresh[0] in (
        ("aaa-newcomer", sum(layer.size for layer in layers)),
        (survivor, sum(layer.size for layer in layers)),
    )
    assert not set(departed) & {node for node, _ in fresh}


class Listed:
    """A filter or a tier by node name (the nodes listed), recording the nodes it judged."""

    code = "listed"
    described = "the list"

    def __init__(self, *nodes: str) -> None:
        self.nodes = set(nodes)
        self.judged: list[str] = []

    def exclusion(self, node: str) -> str | None:
        self.judged.append(node)
        return f"{node} is listed" if node in self.nodes else None

    demotion = exclusion


BASE = Ranking(["a", "b", "c", "d", "e"], [50, 40, 30, 20, 10])


def test_stages_leave_filtered_nodes_out_and_set_tiered_ones_back_as_far_as_read() -> None:
    out, back = Listed("b"), Listed("a", "d")
    ranking = Stages(filters=(out,), tiers=(back,)).apply(BASE)
    assert isinstance(ranking, StagedRanking)
    assert ranking[0] == "c"
    assert (out.judged, back.judged) == (["a", "b", "c"], ["a", "c"])  # lazily, b not tiered
    assert ranking.pairs() == [("c", 30), ("e", 10), ("a", 50), ("d", 20)]
    assert ranking.excluded == {"b": "b is listed"}
    assert ranking.demoted == {"a": "a is listed", "d": "d is listed"}
    assert NO_STAGES.apply(BASE) is BASE and not NO_STAGES


class Rules:
    """A request's rules for one test: fixed stages, and nodes a re-check now excludes."""

    def __init__(self, stages: Stages = NO_STAGES) -> None:
        self.fixed = stages
        self.taken: set[str] = set()
        self.passes = 0

    def for_pass(self) -> Rules:
        self.passes += 1
        return self

    def stages(self) -> Stages:
        return self.fixed

    def recheck(self, node: str) -> str | None:
        return "another replica landed there" if node in self.taken else None


async def confirm(node: str) -> str:
    return node


def test_a_decision_asks_the_preferred_node_first_and_never_a_refused_or_rechecked_one() -> None:
    rules = Rules()
    decision = Decision(SPEC, LAYERS, AMD64, confirm, preferred_node="d", rules=rules)
    decision.begin_pass()
    ranking = decision.judged(BASE)
    assert ranking is BASE and rules.passes == 1
    decision.refused("b", "cpu_saturated")
    rules.taken.add("e")
    assert list(decision.order(ranking)) == [(3, "d"), (0, "a"), (2, "c")]
    assert decision.refusals == {"b": "cpu_saturated"}
    assert decision.what == f"({SPEC})"


def test_a_preferred_node_its_rules_set_back_keeps_its_place_in_the_ranking() -> None:
    for stages in (Stages(tiers=(Listed("a", "d"),)), Stages(filters=(Listed("a", "d"),))):
        decision = Decision(SPEC, LAYERS, AMD64, confirm, preferred_node="d", rules=Rules(stages))
        decision.begin_pass()
        order = [node for _, node in decision.order(decision.judged(BASE))]
        assert order == (["b", "c", "e", "a", "d"] if stages.tiers else ["b", "c", "e"])


# --- errors that are not refusals ------------------------------------------------------------


@pytest.mark.parametrize("ranker", RANKERS)
def test_an_invalid_attempt_propagates_and_stops_the_walk(ranker: RankerName) -> None:
    walk = Walk(ranker)
    tried: list[str] = []

    async def attempt(node: str) -> str:
        tried.append(node)
        if node == "a":
            raise Refused("boot_failed", node=node)
        raise Invalid("the boot spec is malformed", field="command")

    with pytest.raises(Invalid) as caught:
        asyncio.run(walk.scheduler.place(SPEC, LAYERS, attempt, AMD64))
    assert caught.value.field == "command"
    assert not isinstance(caught.value, NoCapacity)
    assert tried == ["a", "b"]


@pytest.mark.parametrize("ranker", RANKERS)
def test_other_errors_propagate_but_unavailable_moves_on(ranker: RankerName) -> None:
    walk = Walk(ranker)

    async def broken(node: str) -> str:
        raise KeyError(node)

    with pytest.raises(KeyError):
        asyncio.run(walk.scheduler.place(SPEC, LAYERS, broken, AMD64))

    async def flaky(node: str) -> str:
        if node != "c":
            raise Unavailable(f"{node} timed out")
        return node

    placed = asyncio.run(walk.scheduler.place(SPEC, LAYERS, flaky, AMD64))
    assert (placed.node, [node for node, _ in placed.refusals]) == ("c", ["a", "b"])


@pytest.mark.parametrize("ttl", [0, 0.0, -1, math.nan, True])
def test_non_positive_lease_ttl_is_invalid(ttl: float) -> None:
    with pytest.raises(Invalid) as caught:
        ClusterScheduler(MemoryStore(), LocalNodes(), lease_ttl_s=ttl)
    assert caught.value.field == "lease_ttl_s"
    assert "lease_ttl_s" in str(caught.value)
