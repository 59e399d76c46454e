"""Property tests of replica spreading (issue 12), against a model written from the rule.

Random small clusters (zones ``a``/``b``/``c`` or no label, one to four replicas of room per
node, some nodes holding the image's layer) and random histories of placements and releases
of two functions, each with a spread drawn from every setting (or none).  The model is the
rule of :mod:`berth.scheduler.spread` restated on the ground truth — the replicas the test
holds and the budgets' own free memory — so the scheduler is checked against what the
operator was promised, not against itself:

* hard per-node: a placement lands on a node without a replica of its function; a refusal
  happens only when every node with room holds one;
* hard per-label: a placement lands on a labelled node whose value stays within the skew;
  a refusal only when no node with room does;
* soft: a placement is refused only when no node has room, and keeps the spread whenever
  some node with room would;
* no spread: the placement is the seed's choice (the reference ranking's first node), exactly
  as before spreading existed;
* the engine and the reference ranker place every history identically.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berth.errors import NoCapacity
from berth.model import Layer, Placement, Request, Spec, Spread
from berth.node.budget import BudgetLimits, NodeBudget, StaticLoad
from berth.nodeclient.local import LocalNodes
from berth.scheduler.multinode import ClusterScheduler
from berth.scheduler.reference import ReferenceRanker
from berth.store.memory import MemoryStore
from berth.units import GiB
from tests.helpers import budget_state

SMALL = Spec(vcpus=0.01, mem=GiB // 8, disk=GiB)
LAYERS = (Layer(id="l1", size=10**6),)
SPREADS = (
    None,
    Spread(hard=True),
    Spread(hard=False),
    Spread(label="zone", hard=True),
    Spread(label="zone", hard=False),
    Spread(label="zone", hard=True, max_skew=2),
)
FUNCTIONS = ("fn", "other")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    zone: str | None
    slots: int
    has_layer: bool


@dataclass
class World:
    """One cluster with fresh snapshots, its scheduler, and the replicas the test holds."""

    nodes: tuple[NodeSpec, ...]
    ranker: str
    store: MemoryStore = field(default_factory=MemoryStore)
    local: LocalNodes = field(default_factory=LocalNodes)
    budgets: dict[str, NodeBudget] = field(default_factory=dict)
    held: list[tuple[str, Placement]] = field(default_factory=list)
    generation: int = 0

    def __post_init__(self) -> None:
        for spec in self.nodes:
            name = spec.name
            limits = BudgetLimits(
                mem_max=spec.slots * SMALL.mem,
                disk_max=100 * GiB,
                cpu_capacity=4,
                disk_bw_cap=GiB,
                net_bw_cap=GiB,
            )
            self.budgets[name] = NodeBudget(limits, StaticLoad(), on_change=self._publisher(name))
            self.local.add(spec.name, self.budgets[spec.name])
            self.publish(spec.name)
        self.scheduler = ClusterScheduler(self.store, self.local, ranker=self.ranker)  # type: ignore[arg-type]

    def _publisher(self, name: str) -> Callable[[], None]:
        return lambda: self.publish(name)

    def publish(self, name: str) -> None:
        spec = next(node for node in self.nodes if node.name == name)
        self.generation += 1
        layers = frozenset({"l1"}) if spec.has_layer else frozenset()
        state = budget_state(name, self.budgets[name], self.generation, spec.zone, layers)
        self.store.publish_now(state)

    # -- the ground truth --------------------------------------------------------------------
    def counts(self, function: str) -> Counter[str]:
        return Counter(p.worker_node for fn, p in self.held if fn == function)

    def with_room(self) -> list[str]:
        return [n.name for n in self.nodes if self.budgets[n.name].headroom().mem_free >= SMALL.mem]

    def keeps(self, spread: Spread, function: str, node: str) -> bool:
        """The rule, restated: would one more replica on ``node`` keep the spread?"""
        counts = self.counts(function)
        if spread.label is None:
            return counts[node] == 0
        zone_of = {n.name: n.zone for n in self.nodes if n.zone is not None}
        if node not in zone_of:
            return False
        per_zone = Counter({zone: 0 for zone in zone_of.values()})
        for name, count in counts.items():
            if name in zone_of:
                per_zone[zone_of[name]] += count
        least = min(per_zone.values())
        return per_zone[zone_of[node]] + 1 - least <= spread.max_skew


Op = tuple[str, int]


async def replay(world: World, spreads: dict[str, Spread | None], ops: list[Op]) -> list[str]:
    """Run ``ops`` on ``world``, checking every decision against the model; the outcomes."""
    outcomes: list[str] = []
    for kind, which in ops:
        if kind == "release":
            if world.held:
                _, placement = world.held.pop(which % len(world.held))
                assert await world.scheduler.release(placement)
            outcomes.append("released")
            continue
        function = FUNCTIONS[which % len(FUNCTIONS)]
        spread = spreads[function]
        request = Request(
            namespace="t",
            name=function,
            replica=len(outcomes),
            spec=SMALL,
            layers=LAYERS,
            spread=spread,
        )
        room = world.with_room()
        keeping = [node for node in room if spread is None or world.keeps(spread, function, node)]
        seed_first = ReferenceRanker()
        for state in world.scheduler.states().values():
            seed_first.upsert(state)
        seed_order = list(seed_first.rank(SMALL, LAYERS))
        try:
            placement = await world.scheduler.schedule(request)
        except NoCapacity as error:
            if spread is None or not spread.hard:
                assert not room, f"refused with room on {room}: {error}"
            else:
                assert not keeping, f"hard {spread} refused, yet {keeping} keep it: {error}"
                assert all(error.reasons[node] == "spread" for node in room)
            outcomes.append("refused")
            continue
        node = placement.worker_node
        assert node in room
        if spread is None:
            assert node == seed_order[0], (node, seed_order)
        elif spread.hard or keeping:
            assert node in keeping, f"{spread}: chose {node}, keeping {keeping}"
        world.held.append((function, placement))
        assert world.scheduler.replicas.where(("t", function)) == dict(world.counts(function))
        outcomes.append(node)
    return outcomes


nodes_strategy = st.lists(
    st.builds(
        lambda zone, slots, has_layer: (zone, slots, has_layer),
        st.sampled_from(["a", "b", "c", None]),
        st.integers(1, 4),
        st.booleans(),
    ),
    min_size=1,
    max_size=7,
).map(lambda rows: tuple(NodeSpec(f"n{i}", *row) for i, row in enumerate(rows)))
ops_strategy = st.lists(
    st.tuples(st.sampled_from(["place", "place", "place", "release"]), st.integers(0, 50)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=nodes_strategy,
    spreads=st.tuples(st.sampled_from(SPREADS), st.sampled_from(SPREADS)),
    ops=ops_strategy,
)
def test_spread_keeps_its_promise_and_both_rankers_agree(
    nodes: tuple[NodeSpec, ...],
    spreads: tuple[Spread | None, Spread | None],
    ops: list[Op],
) -> None:
    by_function = dict(zip(FUNCTIONS, spreads, strict=True))
    engine = asyncio.run(replay(World(nodes, "engine"), by_function, ops))
    reference = asyncio.run(replay(World(nodes, "reference"), by_function, ops))
    assert engine == reference


@settings(max_examples=40, deadline=None)
@given(nodes=nodes_strategy, ops=ops_strategy, spread=st.sampled_from(SPREADS[1:]))
def test_requests_without_spread_rank_as_before_whatever_replicas_exist(
    nodes: tuple[NodeSpec, ...], ops: list[Op], spread: Spread
) -> None:
    """Replicas of a spreading function change nothing for a request without a spread: its
    ranking is the reference ranking of the same view, node for node and byte for byte."""

    async def main() -> None:
        world = World(nodes, "engine")
        await replay(world, {"fn": spread, "other": spread}, ops)
        reference = ReferenceRanker()
        for state in world.scheduler.states().values():
            reference.upsert(state)
        assert world.scheduler.rank(SMALL, LAYERS).pairs() == reference.rank(SMALL, LAYERS).pairs()
        request = Request(namespace="t", name="fn", spec=SMALL, layers=LAYERS)
        explanation = world.scheduler.explain(request)
        assert explanation.spread is None
        assert all(v.spread is None for v in explanation.verdicts)

    asyncio.run(main())
