"""Replica spreading (issue 12): the request field, the rule, the scheduler's replica index,
the walk under concurrency, the explanations — example tests; the properties are in
``test_spread_properties.py``."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from berth.boot import AdmitOrder
from berth.errors import Invalid, NoCapacity
from berth.model import Placement, Request, Spec, Spread
from berth.node.budget import BudgetLimits, NodeBudget, StaticLoad
from berth.nodeclient.local import LocalNodes
from berth.ownership import Admission
from berth.platform import Platform
from berth.scheduler.multinode import ClusterScheduler
from berth.scheduler.spread import SPREAD, LabelIndex, Replicas
from berth.state import NodeState
from berth.store.memory import MemoryStore
from berth.testing.clock import FakeClock
from berth.units import GiB
from tests.helpers import budget_state

SMALL = Spec(vcpus=0.01, mem=GiB // 8, disk=GiB)
HARD_NODE = Spread(hard=True)
SOFT_NODE = Spread(hard=False)
HARD_ZONE = Spread(label="zone", hard=True)
SOFT_ZONE = Spread(label="zone", hard=False)


class Cluster:
    """Budgets whose every change is published at once (a fresh view), one scheduler."""

    def __init__(
        self,
        nodes: dict[str, str | None],
        *,
        mem: int = 4 * GiB,
        layers: dict[str, frozenset[str]] | None = None,
        client: LocalNodes | None = None,
    ) -> None:
        self.clock = FakeClock(0.0)
        self.store = MemoryStore(clock=self.clock)
        self.local = LocalNodes()
        self.budgets: dict[str, NodeBudget] = {}
        self.zones = dict(nodes)
        self.layers = layers or {}
        self.generation = 0
        self.silent: set[str] = set()  # nodes whose changes are not published (a stale view)
        for name in nodes:
            self.add(name, nodes[name], mem=mem)
        self.scheduler = ClusterScheduler(self.store, client or self.local, clock=self.clock)

    def add(self, name: str, zone: str | None, *, mem: int = 4 * GiB) -> None:
        limits = BudgetLimits(
            mem_max=mem, disk_max=100 * GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
        )
        self.zones[name] = zone
        self.budgets[name] = NodeBudget(
            limits, StaticLoad(), clock=self.clock, on_change=lambda: self.publish(name)
        )
        self.local.add(name, self.budgets[name])
        self.publish(name)

    def publish(self, name: str) -> None:
        if name in self.silent:
            return
        self.generation += 1
        layers = self.layers.get(name, frozenset())
        state = budget_state(name, self.budgets[name], self.generation, self.zones[name], layers)
        self.store.publish_now(state)

    async def place(self, spread: Spread | None, replica: int = 0, name: str = "fn") -> str:
        request = Request(
            namespace="default",
            name=name,
            replica=replica,
            spec=SMALL,
            layers=(("l1", 10**6),),
            spread=spread,
        )
        return (await self.scheduler.schedule(request)).worker_node


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


# -- the request field ---------------------------------------------------------------------------
def test_spread_is_part_of_the_request_and_round_trips_through_json() -> None:
    request = Request(
        namespace="a", name="b", spread={"label": "zone", "hard": False, "max_skew": 2}
    )
    assert request.spread == Spread(label="zone", hard=False, max_skew=2)
    assert Request.from_json(request.to_json()) == request
    assert Request(namespace="a", name="b").spread is None
    assert str(HARD_NODE) == "hard spread (one replica per node)"
    assert str(SOFT_ZONE) == "soft spread over label 'zone' (max skew 1)"


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ({}, "spread.hard", "required"),
        ({"hard": 1}, "spread.hard", "true or false"),
        ({"hard": "yes"}, "spread.hard", "true or false"),
        ({"hard": True, "max_skew": 2}, "spread.max_skew", "label spread only"),
        ({"hard": True, "label": "zone", "max_skew": 0}, "spread.max_skew", "greater than"),
        ({"hard": True, "label": "zone", "max_skew": 1025}, "spread.max_skew", "less than"),
        ({"hard": True, "label": "zone", "max_skew": True}, "spread.max_skew", "whole number"),
        ({"hard": True, "label": ""}, "spread.label", "empty"),
        ({"hard": True, "label": "a b"}, "spread.label", "whitespace"),
        ({"hard": True, "label": "z" * 254}, "spread.label", "253"),
        ({"hard": True, "topology": "zone"}, "spread.topology", "unknown key"),
        ("zone", "spread", "table"),
    ],
)
def test_a_bad_spread_is_invalid_naming_the_field(value: object, field: str, words: str) -> None:
    with pytest.raises(Invalid) as caught:
        Request(namespace="a", name="b", spread=value)
    assert caught.value.field == field
    assert words in caught.value.message


# -- per node --------------------------------------------------------------------------------------
def test_hard_per_node_spread_puts_one_replica_per_node_then_refuses_naming_spread() -> None:
    async def main() -> None:
        cluster = Cluster({"n1": None, "n2": None, "n3": None})
        placed = [await cluster.place(HARD_NODE, replica) for replica in range(3)]
        assert sorted(placed) == ["n1", "n2", "n3"]
        with pytest.raises(NoCapacity) as caught:
            await cluster.place(HARD_NODE, 3)
        assert caught.value.reasons == {"n1": SPREAD, "n2": SPREAD, "n3": SPREAD}
        assert "0/3 nodes can run it: 3 excluded by hard spread (one replica per node)" in str(
            caught.value
        )
        # Another function is not affected, nor a request of this one without a spread.
        assert await cluster.place(HARD_NODE, 0, name="other") in placed
        assert await cluster.place(None, 4) in placed

    run(main())


def test_without_spread_replicas_colocate_and_soft_spread_prefers_empty_nodes() -> None:
    async def main() -> None:
        layers = {"n1": frozenset({"l1"})}
        plain = Cluster({"n1": None, "n2": None, "n3": None}, layers=layers)
        assert [await plain.place(None, r) for r in range(4)] == ["n1"] * 4
        soft = Cluster({"n1": None, "n2": None, "n3": None}, layers=layers)
        # Colocation orders each tier: n1 (has the layer) first, then n2, n3 by name.
        assert [await soft.place(SOFT_NODE, r) for r in range(5)] == ["n1", "n2", "n3", "n1", "n1"]

    run(main())


def test_release_ended_failed_bind_and_node_leaving_free_the_spread() -> None:
    async def main() -> None:
        cluster = Cluster({"n1": None, "n2": None})
        scheduler = cluster.scheduler
        request = Request(namespace="d", name="fn", spec=SMALL, spread=HARD_NODE)
        first = await scheduler.schedule(request)
        second = await scheduler.schedule(request)
        assert {first.worker_node, second.worker_node} == {"n1", "n2"}
        with pytest.raises(NoCapacity):
            await scheduler.schedule(request)
        assert await scheduler.release(first)
        third = await scheduler.schedule(request)
        assert third.worker_node == first.worker_node
        # ended(): the node released it itself (a workload that ended), no call to the node.
        assert scheduler.ended(second)
        assert not scheduler.ended(second)
        fourth = await scheduler.schedule(request)
        assert fourth.worker_node == second.worker_node
        # A failed bind forgets the replica (the lease is released on the node too).
        with pytest.raises(Exception):  # noqa: B017 - whatever the node says, the view agrees
            await scheduler.bind(fourth, "no-such-workload")
        assert (await scheduler.schedule(request)).worker_node == fourth.worker_node
        # A node that leaves takes its replicas with it; its budget goes too.
        cluster.store.remove_now(third.worker_node)
        cluster.local.discard(third.worker_node)
        assert scheduler.replicas.where(("d", "fn")) == {fourth.worker_node: 1}

    run(main())


def test_an_unbound_lease_stops_counting_when_it_expires_and_a_bound_one_does_not() -> None:
    async def main() -> None:
        cluster = Cluster({"n1": None, "n2": None})
        scheduler = cluster.scheduler
        request = Request(namespace="d", name="fn", spec=SMALL, spread=HARD_NODE)
        bound = await scheduler.schedule(request)
        owner: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await scheduler.bind(bound, owner)
        unbound = await scheduler.schedule(request)
        assert scheduler.replicas.where(("d", "fn")) == {"n1": 1, "n2": 1}
        cluster.clock.now += scheduler.lease_ttl_s + 1
        assert scheduler.replicas.where(("d", "fn")) == {bound.worker_node: 1}
        assert (await scheduler.schedule(request)).worker_node == unbound.worker_node
        owner.set_result(None)

    run(main())


def test_expired_leases_are_dropped_even_when_no_request_asks_for_a_spread() -> None:
    """The replica index forgets unbound leases as they run out on every decision, not only
    when a spread reads it: a scheduler that never sees a spread must not grow without end."""

    async def main() -> None:
        cluster = Cluster({"n1": None, "n2": None})
        scheduler = cluster.scheduler
        request = Request(namespace="d", name="fn", spec=SMALL)
        for _ in range(3):
            await scheduler.schedule(request)  # leases never bound: they run out
        assert len(scheduler.replicas) == 3
        cluster.clock.now += scheduler.lease_ttl_s + 1
        await scheduler.schedule(request)
        assert len(scheduler.replicas) == 1

    run(main())


def test_a_lease_bound_just_before_its_deadline_keeps_counting() -> None:
    """The node binds the lease in time, but its answer arrives after the scheduler's copy of
    the deadline and another decision has meanwhile run the replica index's expiry: the
    replica runs, so it must still count."""

    class LateReplies(LocalNodes):
        async def bind(self, node: str, reservation_id: str, owner: object) -> None:
            await super().bind(node, reservation_id, owner)  # type: ignore[arg-type]
            cluster.clock.now += cluster.scheduler.lease_ttl_s + 1  # the reply is late
            cluster.scheduler.replicas.expire()  # another decision ran meanwhile

    async def main() -> None:
        placed = await cluster.scheduler.schedule(
            Request(namespace="d", name="fn", spec=SMALL, spread=HARD_NODE)
        )
        owner: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await cluster.scheduler.bind(placed, owner)
        assert cluster.scheduler.replicas.where(("d", "fn")) == {placed.worker_node: 1}
        owner.set_result(None)  # the workload ends: now it stops counting
        for _ in range(3):
            await asyncio.sleep(0)
        assert cluster.scheduler.replicas.where(("d", "fn")) == {}

    nodes = LateReplies()
    cluster = Cluster({"n1": None}, client=nodes)
    for name, budget in cluster.budgets.items():
        nodes.add(name, budget)
    run(main())


def test_a_bound_replica_stops_counting_when_its_owner_ends() -> None:
    async def main() -> None:
        cluster = Cluster({"n1": None, "n2": None})
        scheduler = cluster.scheduler
        request = Request(namespace="d", name="fn", spec=SMALL, spread=HARD_NODE)
        placement = await scheduler.schedule(request)
        owner: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await scheduler.bind(placement, owner)
        assert scheduler.replicas.where(("d", "fn")) == {placement.worker_node: 1}
        owner.set_result(None)  # the workload ended: the node released its reservation
        for _ in range(3):
            await asyncio.sleep(0)
        assert not cluster.budgets[placement.worker_node].reservations()
        assert scheduler.replicas.where(("d", "fn")) == {}
        assert (await scheduler.schedule(request)).worker_node == placement.worker_node

    run(main())


class SlowNodes(LocalNodes):
    """Budgets that answer after a pause, so concurrent walks interleave at every admit."""

    async def admit(self, node: str, order: AdmitOrder) -> Admission:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return await super().admit(node, order)


def test_concurrent_requests_of_one_function_never_share_a_node_under_hard_spread() -> None:
    async def main() -> None:
        nodes = SlowNodes()
        cluster = Cluster({f"n{i}": None for i in range(6)}, client=nodes)
        for name, budget in cluster.budgets.items():
            nodes.add(name, budget)
        requests = [
            Request(namespace="d", name="fn", replica=r, spec=SMALL, spread=HARD_NODE)
            for r in range(10)
        ]
        results = await asyncio.gather(
            *(cluster.scheduler.schedule(r) for r in requests), return_exceptions=True
        )
        placed = [r.worker_node for r in results if isinstance(r, Placement)]
        refused = [r for r in results if isinstance(r, NoCapacity)]
        assert len(placed) == 6 and len(set(placed)) == 6
        assert len(refused) == 4
        # Every budget holds exactly one reservation: no hold leaked, none doubled.
        assert all(len(b.reservations()) == 1 for b in cluster.budgets.values())
        assert len(cluster.scheduler.replicas) == 6

    run(main())


def test_a_refusal_drops_the_hold() -> None:
    async def main() -> None:
        cluster = Cluster({"n1": None, "n2": None}, mem=GiB // 8)  # room for one SMALL each
        cluster.silent.add("n1")
        cluster.budgets["n1"].admit_leased(SMALL, 30.0)  # behind the scheduler's back
        request = Request(namespace="d", name="fn", spec=SMALL, spread=HARD_NODE)
        placement = await cluster.scheduler.schedule(request)
        assert placement.worker_node == "n2"
        assert placement.refusals == (("n1", "mem_exhausted"),)
        assert cluster.scheduler.replicas.where(("d", "fn")) == {"n2": 1}

    run(main())


# -- per label value -------------------------------------------------------------------------------
def test_hard_zone_spread_keeps_the_skew_and_skips_unlabelled_nodes() -> None:
    async def main() -> None:
        cluster = Cluster(
            {"a1": "a", "a2": "a", "b1": "b", "bare": None},
            layers={"a1": frozenset({"l1"}), "a2": frozenset({"l1"})},
        )
        zones = {"a1": "a", "a2": "a", "b1": "b"}
        placed = [await cluster.place(HARD_ZONE, r) for r in range(6)]
        per_zone = Counter(zones[node] for node in placed)
        assert per_zone == {"a": 3, "b": 3}
        assert "bare" not in placed
        explanation = cluster.scheduler.explain(
            Request(namespace="default", name="fn", spec=SMALL, spread=HARD_ZONE)
        )
        bare = next(v for v in explanation.verdicts if v.node == "bare")
        assert bare.verdict == SPREAD
        assert bare.description == (
            "excluded by the spread: the node has no label 'zone' to spread default/fn over"
        )

    run(main())


def test_a_full_zone_holds_a_hard_zone_spread_back_and_a_soft_one_goes_on() -> None:
    async def main() -> None:
        for spread, expected in ((HARD_ZONE, None), (SOFT_ZONE, "a1")):
            cluster = Cluster({"a1": "a", "b1": "b"})
            cluster.add("b1", "b", mem=GiB // 8)  # room for one replica in zone b
            assert sorted([await cluster.place(spread, 0), await cluster.place(spread, 1)]) == [
                "a1",
                "b1",
            ]
            assert await cluster.place(spread, 2) == "a1"  # a: 2, b: 1 — skew 1
            if expected is None:
                with pytest.raises(NoCapacity) as caught:
                    await cluster.place(spread, 3)
                assert caught.value.reasons == {"a1": SPREAD, "b1": "mem_exhausted"}
                assert "zone='a' holds 2 replicas of default/fn, the least-loaded value 1" in (
                    cluster.scheduler.explain(
                        Request(namespace="default", name="fn", spec=SMALL, spread=spread)
                    )
                    .verdicts[0]
                    .description
                )
            else:
                assert await cluster.place(spread, 3) == expected

    run(main())


def test_max_skew_two_and_a_new_zone_counts_from_zero() -> None:
    async def main() -> None:
        spread = Spread(label="zone", hard=True, max_skew=2)
        cluster = Cluster({"a1": "a", "b1": "b"}, layers={"a1": frozenset({"l1"})})
        placed = [await cluster.place(spread, r) for r in range(4)]
        assert placed == ["a1", "a1", "b1", "a1"]  # colocation wins while the skew allows
        cluster.add("c1", "c")  # a: 3, b: 1, c: 0 — a is out until c catches up
        # b1 has the layer (assumed on its way) and keeps within the skew: it comes first.
        placed = [await cluster.place(spread, r) for r in range(4, 8)]
        assert placed == ["b1", "c1", "b1", "c1"]
        assert cluster.scheduler.replicas.where(("default", "fn")) == {"a1": 3, "b1": 3, "c1": 2}

    run(main())


def test_soft_spread_demotes_the_preferred_node_and_explains_why() -> None:
    async def main() -> None:
        cluster = Cluster({"n1": None, "n2": None})
        request = Request(
            namespace="d", name="fn", spec=SMALL, spread=SOFT_NODE, preferred_node="n1"
        )
        assert (await cluster.scheduler.schedule(request)).worker_node == "n1"
        assert (await cluster.scheduler.schedule(request)).worker_node == "n2"
        verdicts = {v.node: v for v in cluster.scheduler.explain(request).verdicts}
        assert verdicts["n1"].verdict == "fits"
        assert verdicts["n1"].description.startswith(
            "fits, tried after the nodes that keep the spread: 1 replica of d/fn"
        )

    run(main())


# -- the replica index alone -----------------------------------------------------------------------
def test_replica_index_counts_holds_leases_and_bindings() -> None:
    clock = FakeClock(0.0)
    replicas = Replicas(10.0, clock=clock)
    fn = ("d", "fn")
    token = replicas.hold(fn, "n1")
    assert replicas.where(fn) == {"n1": 1} and len(replicas) == 1
    replicas.drop(token)
    assert replicas.where(fn) == {} and len(replicas) == 0
    token = replicas.hold(fn, "n1")
    replicas.confirm(token, "r1")
    replicas.add(fn, "n2", "r1", bound=True)
    replicas.add(fn, "n2", "r1", bound=True)  # idempotent
    assert replicas.where(fn) == {"n1": 1, "n2": 1}
    clock.now = 10.0
    assert replicas.where(fn) == {"n2": 1}
    assert not replicas.bound("n1", "r1")
    replicas.drop_node("n2")
    assert replicas.where(fn) == {} and len(replicas) == 0


def test_rule_domains_are_the_label_values_of_nodes_on_the_requests_platforms() -> None:
    def state(name: str, zone: str, platform: str) -> NodeState:
        return NodeState(
            node=name,
            platform=platform,
            labels={"zone": zone},
            mem_free=GiB,
            disk_free=GiB,
            cpu_capacity=1.0,
            disk_bw_ceiling=1.0,
            net_bw_ceiling=1.0,
        )

    index = LabelIndex()
    index.update(state("x", "a", "linux/amd64"))
    index.update(state("y", "b", "linux/arm64"))
    amd = index.rule(HARD_ZONE, ("d", "fn"), (Platform.parse("linux/amd64"),))
    assert amd.domains == {"a"}
    every = index.rule(HARD_ZONE, ("d", "fn"))
    assert every.domains == {"a", "b"}
    # One replica in a: with b a domain, a is one ahead; b is the least loaded.
    assert every.judge({"x": 1}).violation("x") is not None
    assert every.judge({"x": 1}).violation("y") is None
    assert amd.judge({"x": 1}).violation("x") is None


def test_label_index_follows_joins_relabels_and_leaves_and_rules_stay_values() -> None:
    def state(name: str, zone: str | None, generation: int = 0) -> NodeState:
        return NodeState(
            node=name,
            platform="linux/amd64",
            generation=generation,
            labels={} if zone is None else {"zone": zone},
            mem_free=GiB,
            disk_free=GiB,
            cpu_capacity=1.0,
            disk_bw_ceiling=1.0,
            net_bw_ceiling=1.0,
        )

    index = LabelIndex()
    index.update(state("x", "a"))
    index.update(state("y", "b"))
    before = index.rule(HARD_ZONE, ("d", "fn"))
    assert before.domains == {"a", "b"} and dict(before.values) == {"x": "a", "y": "b"}
    assert index.rule(HARD_ZONE, ("d", "fn")).values is before.values  # frozen, shared
    index.update(state("y", "c", generation=1))  # relabelled
    index.update(state("z", None))  # joined without the label
    after = index.rule(HARD_ZONE, ("d", "fn"))
    assert after.domains == {"a", "c"} and dict(after.values) == {"x": "a", "y": "c"}
    assert dict(before.values) == {"x": "a", "y": "b"}  # a rule made earlier is unchanged
    index.remove("x")
    assert index.rule(HARD_ZONE, ("d", "fn")).domains == {"c"}
    assert index.rule(HARD_NODE, ("d", "fn")).domains == frozenset()
