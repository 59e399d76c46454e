"""Policies order exactly the fitting slots, deterministically, by the formulas they document,
on a read-only view that cannot touch the ranker behind it."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berth import Invalid, Layer, Platform, Spec
from berth.scheduler.engine import Engine
from berth.scheduler.policy import (
    POLICIES,
    SEED,
    BerthPolicy,
    ClusterView,
    KubePolicy,
    PlacementRequest,
    Policy,
    Weighted,
    policy,
)
from berth.scheduler.policy.base import Floats, Slots
from berth.scheduler.policy.baselines import Allocated, allocation
from berth.scheduler.policy.kube import (
    KUBE_MAX_CONTAINER_THRESHOLD,
    KUBE_MIN_THRESHOLD,
    ImageLocality,
    LeastAllocated,
    image_locality,
    least_allocated,
)
from berth.scheduler.reference import ReferenceRanker
from berth.state import NodeState
from berth.units import GiB, MiB

AMD64 = Platform.parse("linux/amd64")
LAYER_IDS = [f"sha256:{i:02x}" for i in range(16)]


def state(
    name: str,
    *,
    mem_free: int = 8 * GiB,
    mem_max: int = 16 * GiB,
    disk_free: int = 100 * GiB,
    disk_max: int = 400 * GiB,
    layers: frozenset[str] = frozenset(),
    cached: frozenset[str] = frozenset(),
    generation: int = 0,
    cpu_load: float = 0.0,
) -> NodeState:
    return NodeState(
        node=name,
        platform=AMD64,
        generation=generation,
        mem_free=mem_free,
        mem_max=mem_max,
        disk_free=disk_free,
        disk_max=disk_max,
        cpu_load=cpu_load,
        cpu_capacity=8.0,
        disk_bw_ceiling=1e9,
        net_bw_ceiling=1e9,
        layers=layers,
        cached_layers=cached,
    )


def request_for(
    view: ClusterView,
    layers: list[Layer],
    fit: npt.NDArray[np.bool_] | None = None,
    spec: Spec | None = None,
) -> PlacementRequest:
    mask = view.alive.copy() if fit is None else fit
    return PlacementRequest(spec, tuple(layers), (), mask, view.mounted_bytes(layers))


def order(
    engine: Engine, chosen: Policy, layers: list[Layer], spec: Spec | None = None
) -> list[str]:
    return list(engine.rank(spec, layers, policy=chosen))


def by_name(view: ClusterView, values: npt.NDArray[np.generic]) -> dict[str, float]:
    return {view.name(int(slot)): values[slot].item() for slot in view.name_order}


# -- every policy: only fitting slots, each once, deterministic per seed ---------------------

node_states = st.builds(
    lambda name, mem_max, used, disk_used, layers, cached: state(
        name,
        mem_max=mem_max * GiB,
        mem_free=(mem_max - min(used, mem_max)) * GiB,
        disk_max=100 * GiB,
        disk_free=(100 - disk_used) * GiB,
        layers=frozenset(layers),
        cached=frozenset(cached) - frozenset(layers),
    ),
    st.text(alphabet="abcdn-0123", min_size=1, max_size=5),
    st.sampled_from([4, 8, 16]),
    st.integers(0, 16),
    st.integers(0, 100),
    st.lists(st.sampled_from(LAYER_IDS), max_size=6),
    st.lists(st.sampled_from(LAYER_IDS), max_size=4),
)
request_layers = st.lists(
    st.tuples(st.sampled_from(LAYER_IDS), st.sampled_from([1, 5 * MiB, 30 * MiB, 400 * MiB])),
    unique_by=lambda pair: pair[0],
    max_size=6,
).map(lambda pairs: [Layer(id=i, size=s) for i, s in pairs])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(node_states, max_size=25, unique_by=lambda s: s.node),
    request_layers,
    st.data(),
    st.sampled_from(sorted(POLICIES)),
    st.integers(0, 3),
)
def test_every_policy_orders_exactly_the_fitting_slots_deterministically(
    states: list[NodeState], layers: list[Layer], data: st.DataObject, name: str, seed: int
) -> None:
    engine = Engine(capacity=4)
    for node in states:
        engine.upsert(node)
    view = engine.view()
    drawn = data.draw(st.lists(st.booleans(), min_size=view.size, max_size=view.size))
    request = request_for(view, layers, np.array(drawn, dtype=bool) & view.alive)
    first, second = policy(name, seed=seed), policy(name, seed=seed)
    for _ in range(3):  # a sequence of calls, not just the first
        slots = first.order(view, request)
        assert sorted(slots.tolist()) == np.flatnonzero(request.fit).tolist()
        assert np.array_equal(slots, second.order(view, request))


def test_random_policy_depends_on_its_seed() -> None:
    engine = Engine()
    for index in range(12):
        engine.upsert(state(f"n{index:02d}"))
    orders = {tuple(order(engine, policy("random", seed=seed), [])) for seed in range(5)}
    assert len(orders) > 1


def test_registry_names_and_unknown_policy() -> None:
    assert list(POLICIES) == ["seed", "random", "binpack", "spread", "kube", "berth"]
    assert policy("seed") is SEED
    for name in POLICIES:
        assert policy(name).name == name
    with pytest.raises(Invalid) as error:
        policy("nope")
    assert error.value.field == "policy"
    assert "unknown policy 'nope'" in str(error.value)
    assert "seed, random, binpack, spread, kube, berth" in str(error.value)


# -- the view: read-only, and the same picture from either ranker ------------------------------


class Vandal:
    """A policy that tries to write through what it is given."""

    name = "vandal"

    def __init__(self, target: str) -> None:
        self.target = target

    def order(self, view: ClusterView, request: PlacementRequest) -> Slots:
        if self.target == "fit":
            request.fit[:] = True
        elif self.target == "colocated":
            request.colocated[:] = 0
        else:
            getattr(view, self.target)[:] = 0
        return np.flatnonzero(request.fit)


@pytest.mark.parametrize(
    "target", ["mem_free", "alive", "name_rank", "name_order", "cpu_load", "fit", "colocated"]
)
def test_a_policy_cannot_write_through_the_view(target: str) -> None:
    engine = Engine()
    engine.upsert(state("a", layers=frozenset({"x"})))
    engine.upsert(state("b", mem_free=GiB))
    spec = Spec(vcpus=1, mem=2 * GiB, disk=1)
    layers = [Layer(id="x", size=5)]
    before = engine.rank(spec, layers).pairs()
    with pytest.raises(ValueError, match="read-only"):
        engine.rank(spec, layers, policy=Vandal(target))
    assert engine.rank(spec, layers).pairs() == before == [("a", 5)]
    assert engine.columns["mem_free"][engine.slot("a")] == 8 * GiB


def test_engine_and_reference_views_agree_node_by_node() -> None:
    states = [
        state("b", layers=frozenset({"x", "y"}), cached=frozenset({"z"}), mem_free=GiB),
        state("a", cached=frozenset({"x", "y"}), cpu_load=0.5),
        state("c", layers=frozenset({"z"}), disk_free=GiB),
    ]
    engine, reference = Engine(), ReferenceRanker()
    for node in states:
        engine.upsert(node)
        reference.upsert(node)
    engine.remove("b")
    reference.remove("b")
    engine.upsert(states[0].model_copy(update={"generation": 1}))  # b comes back, new slot
    reference.upsert(states[0].model_copy(update={"generation": 1}))
    layers = [Layer(id="x", size=3), Layer(id="y", size=5), Layer(id="z", size=7)]
    seen: list[dict[str, object]] = []

    class Recorder:
        name = "recorder"

        def order(self, view: ClusterView, request: PlacementRequest) -> Slots:
            assert view.count == 3
            seen.append(
                {
                    "names": [view.name(int(slot)) for slot in view.name_order],
                    "mounted": by_name(view, view.mounted_bytes(request.layers)),
                    "cached": by_name(view, view.cached_bytes(request.layers)),
                    "colocated": by_name(view, request.colocated),
                    "mem_free": by_name(view, view.mem_free),
                    "cpu_load": by_name(view, view.cpu_load),
                    "holding": {
                        layer.id: sorted(view.name(int(s)) for s in view.holding(layer.id))
                        for layer in request.layers
                    },
                    "holder_count": [view.holder_count(layer.id) for layer in request.layers],
                }
            )
            return np.flatnonzero(request.fit)

    engine.rank(None, layers, policy=Recorder())
    reference.rank(None, layers, policy=Recorder())
    assert seen[0] == seen[1]
    assert seen[0]["mounted"] == {"a": 0, "b": 8, "c": 7}
    assert seen[0]["cached"] == {"a": 8, "b": 7, "c": 0}
    assert seen[0]["holding"] == {"x": ["a", "b"], "y": ["a", "b"], "z": ["b", "c"]}


def test_the_seed_policy_on_a_view_equals_the_engines_fast_path() -> None:
    engine = Engine()
    for index, mounted in enumerate(["xy", "x", "", "y", "xy"]):
        engine.upsert(state(f"n{(7 * index) % 5}", layers=frozenset(mounted)))
    layers = [Layer(id="x", size=10), Layer(id="y", size=3)]
    view = engine.view()
    general = [view.name(int(s)) for s in SEED.order(view, request_for(view, layers))]
    assert general == list(engine.rank(None, layers)) == ["n0", "n3", "n2", "n1", "n4"]


# -- weighted scorers -------------------------------------------------------------------------


class CpuHeadroom:
    """A new rule is a new scorer: the CPU share left (``cpu_max_load − cpu_load``)."""

    name = "cpu_headroom"

    def score(self, view: ClusterView, request: PlacementRequest) -> Floats:
        headroom: Floats = view.cpu_max_load - view.cpu_load
        return headroom


def test_weighted_sums_weighted_scores_highest_first_ties_by_name() -> None:
    engine, reference = Engine(), ReferenceRanker()
    loads = {"d": 0.5, "c": 0.25, "b": 0.5, "a": 0.75}
    for name, load in loads.items():
        for ranker in (engine, reference):
            ranker.upsert(state(name, cpu_load=load, mem_free=(2 if name == "b" else 8) * GiB))
    headroom = Weighted([(CpuHeadroom(), 1.0)], name="headroom")
    assert order(engine, headroom, []) == ["c", "b", "d", "a"]
    assert list(reference.rank(None, [], policy=headroom)) == ["c", "b", "d", "a"]
    # Allocation weighted 2 (b 0.8125, the others 0.625) lifts the fuller b above c.
    mixed = Weighted([(CpuHeadroom(), 1.0), (Allocated(), 2.0)], name="mixed")
    view = engine.view()
    totals = by_name(view, mixed.scores(view, request_for(view, [])))
    alloc = by_name(view, allocation(view))
    assert totals == {name: 1.0 - loads[name] + 2 * alloc[name] for name in loads}
    assert order(engine, mixed, []) == ["b", "c", "d", "a"]


def test_weighted_rejects_bad_weights_and_misshapen_scores() -> None:
    with pytest.raises(Invalid) as error:
        Weighted([(CpuHeadroom(), float("nan"))], name="bad")
    assert error.value.field == "weight"

    class Short:
        name = "short"

        def score(self, view: ClusterView, request: PlacementRequest) -> Floats:
            return np.zeros(1)

    engine = Engine()
    engine.upsert(state("a"))
    engine.upsert(state("b"))
    with pytest.raises(ValueError, match="short"):
        engine.rank(None, [], policy=Weighted([(Short(), 1.0)], name="short"))


# -- allocation orders ------------------------------------------------------------------------


def allocation_cluster() -> Engine:
    engine = Engine()
    engine.upsert(state("a", mem_free=8 * GiB, disk_free=200 * GiB))  # alloc 0.5 mem, 0.5 disk
    engine.upsert(state("b", mem_free=16 * GiB, disk_free=400 * GiB))  # empty
    engine.upsert(state("c", mem_free=2 * GiB, disk_free=100 * GiB))  # fullest
    engine.upsert(state("d", mem_free=16 * GiB, disk_free=400 * GiB))  # empty, ties with b
    return engine


def test_allocation_is_the_mean_reserved_fraction_of_memory_and_disk() -> None:
    view = allocation_cluster().view()
    assert by_name(view, allocation(view)) == {
        "a": 0.5,
        "b": 0.0,
        "c": pytest.approx((14 / 16 + 3 / 4) / 2),
        "d": 0.0,
    }


def test_binpack_fills_the_fullest_first_and_spread_the_emptiest_ties_by_name() -> None:
    engine = allocation_cluster()
    assert order(engine, policy("binpack"), []) == ["c", "a", "b", "d"]
    assert order(engine, policy("spread"), []) == ["b", "d", "a", "c"]


def test_policies_never_return_unfit_nodes() -> None:
    engine = allocation_cluster()
    spec = Spec(vcpus=1, mem=4 * GiB, disk=GiB)  # c has only 2 GiB free
    for name in POLICIES:
        assert "c" not in order(engine, policy(name), [], spec)


# -- kube: the formula on a hand-computed example ---------------------------------------------


def kube_cluster() -> Engine:
    engine = Engine()
    # a mounts l1 and l2; b has l1 in its cache; c and d hold nothing.  4 nodes in total.
    engine.upsert(state("a", layers=frozenset({"l1", "l2"}), mem_free=8 * GiB, disk_free=100 * GiB))
    engine.upsert(state("b", cached=frozenset({"l1"}), mem_free=16 * GiB, disk_free=400 * GiB))
    engine.upsert(state("c", mem_free=12 * GiB, disk_free=300 * GiB))
    engine.upsert(state("d", mem_free=4 * GiB, disk_free=40 * GiB))
    return engine


def test_kube_scores_match_a_hand_computed_example() -> None:
    l1, l2 = Layer(id="l1", size=300 * MiB), Layer(id="l2", size=500 * MiB)
    view = kube_cluster().view()

    # ImageLocality: sum = Σ size·holders/total.  l1 is on 2 of 4 nodes, l2 on 1 of 4.
    a_sum = 300 * MiB * 2 // 4 + 500 * MiB // 4  # 275 MiB
    b_sum = 300 * MiB * 2 // 4  # 150 MiB
    span = KUBE_MAX_CONTAINER_THRESHOLD - KUBE_MIN_THRESHOLD
    thresholds = (KUBE_MIN_THRESHOLD, KUBE_MAX_CONTAINER_THRESHOLD)
    assert thresholds == (23 * MiB, 1000 * MiB)
    expected_image = {
        "a": 100 * (a_sum - 23 * MiB) // span,  # ⌊100·252/977⌋ = 25
        "b": 100 * (b_sum - 23 * MiB) // span,  # ⌊100·127/977⌋ = 12
        "c": 0,  # clamped up to the minimum threshold
        "d": 0,
    }
    assert expected_image == {"a": 25, "b": 12, "c": 0, "d": 0}
    assert by_name(view, image_locality(view, [l1, l2])) == expected_image

    # LeastAllocated with no request: ⌊(⌊100·mem_free/mem_max⌋ + ⌊100·disk_free/disk_max⌋) / 2⌋
    expected_least = {
        "a": (50 + 25) // 2,  # 37
        "b": (100 + 100) // 2,  # 100
        "c": (75 + 75) // 2,  # 75
        "d": (25 + 10) // 2,  # 17
    }
    assert by_name(view, least_allocated(view, None)) == expected_least

    # … and after placing a 4 GiB / 40 GiB request, as Kubernetes counts it (d: 0 left).
    spec = Spec(vcpus=1, mem=4 * GiB, disk=40 * GiB)
    assert by_name(view, least_allocated(view, spec)) == {
        "a": (25 + 15) // 2,  # ⌊100·4/16⌋, ⌊100·60/400⌋ → 20
        "b": (75 + 90) // 2,  # 82
        "c": (50 + 65) // 2,  # 57
        "d": (0 + 0) // 2,  # 0
    }

    # Equal weights: a 62, b 112, c 75, d 17 → b, c, a, d.
    request = request_for(view, [l1, l2])
    kube = KubePolicy(seed=0)
    assert by_name(view, kube.scores(view, request)) == {"a": 62, "b": 112, "c": 75, "d": 17}
    assert [view.name(int(s)) for s in kube.order(view, request)] == ["b", "c", "a", "d"]
    scorers = {scorer.name for scorer, _ in kube.terms}
    assert scorers == {ImageLocality.name, LeastAllocated.name}


def test_kube_least_allocated_counts_the_request() -> None:
    engine = Engine()
    engine.upsert(state("a-small", mem_free=4 * GiB, mem_max=4 * GiB, disk_free=400 * GiB))
    engine.upsert(state("b-large", mem_free=12 * GiB, mem_max=16 * GiB, disk_free=400 * GiB))
    spec = Spec(vcpus=1, mem=2 * GiB, disk=1)
    # Before the request a-small is emptier (100 vs 75); after it, b-large is (62 vs 50).
    assert order(engine, KubePolicy(), [], spec) == ["b-large", "a-small"]
    assert order(engine, KubePolicy(counts_request=False), [], spec) == ["a-small", "b-large"]
    assert order(engine, KubePolicy(), [], None) == ["a-small", "b-large"]  # no spec: nothing


def test_kube_clamps_at_the_maximum_threshold() -> None:
    big = Layer(id="big", size=3000 * MiB)
    engine = Engine()
    engine.upsert(state("a", layers=frozenset({"big"})))
    assert int(image_locality(engine.view(), [big])[0]) == 100


def test_kube_breaks_equal_scores_at_random_but_reproducibly() -> None:
    engine = Engine()
    for index in range(10):
        engine.upsert(state(f"n{index}"))
    runs = {tuple(order(engine, KubePolicy(seed=seed), [])) for seed in range(6)}
    assert len(runs) > 1  # ties are not resolved by name
    assert order(engine, KubePolicy(seed=3), []) == order(engine, KubePolicy(seed=3), [])


# -- berth ------------------------------------------------------------------------------------


def test_berth_counts_cached_layers_like_mounted_ones() -> None:
    image = [Layer(id="base", size=200 * MiB), Layer(id="app", size=100 * MiB)]
    engine = Engine()
    engine.upsert(state("empty", mem_free=16 * GiB))
    engine.upsert(state("mounted", layers=frozenset({"base"}), mem_free=2 * GiB))
    engine.upsert(state("cached", cached=frozenset({"base", "app"}), mem_free=2 * GiB))
    berth = BerthPolicy(seed=0, jitter=0.0, room_price=0.0)  # locality alone
    assert order(engine, berth, image) == ["cached", "mounted", "empty"]
    no_cache = BerthPolicy(seed=0, jitter=0.0, room_price=0.0, cached_weight=0.0)
    assert order(engine, no_cache, image)[0] == "mounted"
    # The seed's ranking sees mounted layers only.
    assert order(engine, SEED, image)[0] == "mounted"


def test_berth_sends_a_new_image_to_the_node_with_the_most_room() -> None:
    engine = Engine()
    engine.upsert(state("a-small-empty", mem_free=4 * GiB, mem_max=4 * GiB))
    engine.upsert(state("b-large-half", mem_free=8 * GiB, mem_max=16 * GiB))
    engine.upsert(state("c-large-empty", mem_free=16 * GiB, mem_max=16 * GiB))
    new_image = [Layer(id="never-seen", size=100 * MiB)]
    assert order(engine, BerthPolicy(jitter=0.0), new_image) == [
        "c-large-empty",
        "b-large-half",
        "a-small-empty",
    ]
    # spread (allocated fraction) would rank the small empty node first
    assert order(engine, policy("spread"), new_image)[0] in {"a-small-empty", "c-large-empty"}


def test_berth_tolerance_ignores_stray_bytes() -> None:
    image = [Layer(id="empty-layer", size=32), Layer(id="app", size=50 * MiB)]
    engine = Engine()
    engine.upsert(state("a-tiny-match", layers=frozenset({"empty-layer"}), mem_free=GiB))
    engine.upsert(state("b-roomy", mem_free=16 * GiB))
    berth = BerthPolicy(jitter=0.0, room_price=0.0)
    assert order(engine, berth, image) == ["b-roomy", "a-tiny-match"]
    exact = BerthPolicy(jitter=0.0, room_price=0.0, tolerance_bytes=1)
    assert order(engine, exact, image) == ["a-tiny-match", "b-roomy"]


def test_berth_prices_room_higher_as_the_cluster_fills() -> None:
    image = [Layer(id="img", size=500 * MiB)]

    def cluster(filler_free: int) -> Engine:
        engine = Engine()
        engine.upsert(state("holder", layers=frozenset({"img"}), mem_free=4 * GiB))
        engine.upsert(state("roomy", mem_free=8 * GiB))
        for index in range(8):
            engine.upsert(state(f"z{index}", mem_free=filler_free))
        return engine

    berth = BerthPolicy(jitter=0.0)
    quiet = cluster(filler_free=16 * GiB)  # U = 1 − 140/160 = 0.125
    assert berth.price(quiet.view()) == pytest.approx(berth.room_price * 0.125 / 0.875)
    assert order(quiet, berth, image)[0] == "holder"  # the 500 MiB pull is worth avoiding
    busy = cluster(filler_free=0)  # U = 1 − 12/160 = 0.925
    assert berth.price(busy.view()) == pytest.approx(berth.room_price * 0.925 / 0.075)
    assert order(busy, berth, image)[0] == "roomy"  # room is scarce: keep the holder's gap


def test_berth_jitter_is_drawn_per_request_reproducibly_and_varies_with_the_seed() -> None:
    engine = Engine()
    for index in range(20):
        engine.upsert(state(f"n{index:02d}", mem_free=16 * GiB))
    image = [Layer(id="img", size=10 * MiB)]
    berth = BerthPolicy(seed=1)
    replicas = [order(engine, berth, image) for _ in range(3)]  # one image, three requests
    assert len({tuple(each) for each in replicas}) == 3  # replicas no longer rank alike
    again = BerthPolicy(seed=1)
    assert [order(engine, again, image) for _ in range(3)] == replicas  # same seed, same draws
    assert len({tuple(order(engine, BerthPolicy(seed=s), image)) for s in range(5)}) > 1
    assert order(engine, BerthPolicy(seed=1, jitter=0.0), image) == sorted(replicas[0])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cached_weight": 2.0}, "cached_weight"),
        ({"room_price": -1.0}, "room_price"),
        ({"tolerance_bytes": 0}, "tolerance"),
        ({"jitter": 1.0}, "jitter"),
    ],
)
def test_berth_rejects_bad_parameters(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(Invalid) as error:
        BerthPolicy(**kwargs)  # type: ignore[arg-type]
    assert error.value.field == field
