"""The NumPy engine ranks exactly like the literal reference, on any cluster and any history."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berth import Layer, Platform, Spec
from berth.scheduler.engine import Engine
from berth.scheduler.policy import POLICIES, SeedPolicy, policy
from berth.scheduler.reference import ReferenceRanker
from berth.state import NodeState, Overcommit

LAYER_IDS = [f"sha256:{i:02x}" for i in range(24)]
PLATFORMS = [Platform.parse(p) for p in ("linux/amd64", "linux/arm64", "windows/amd64")]

# Small integer grids make exact-fit edges (spec == headroom) common, not a fluke.
amounts = st.integers(0, 8).map(lambda x: x * 256)
loads = st.sampled_from([0.0, 0.25, 0.5, 0.75, 0.8, 1.0, 0.1 + 0.2])
caps = st.sampled_from([1.0, 2.0, 3.0, 4.0, 0.5])


@st.composite
def states(draw: st.DrawFn, node: str) -> NodeState:
    overcommit = draw(
        st.none()
        | st.builds(
            Overcommit,
            vcpus_reserved=st.sampled_from([0.0, 1.0, 2.5]),
            vcpus_ceiling=st.none() | st.sampled_from([2.0, 3.0, 4.0]),
            disk_bw_reserved=st.sampled_from([0.0, 512.0]),
            disk_bw_ceiling=st.none() | st.sampled_from([768.0, 1024.0]),
            net_bw_reserved=st.just(0.0),
            net_bw_ceiling=st.none() | st.just(512.0),
        )
    )
    return NodeState(
        node=node,
        platform=draw(st.sampled_from(PLATFORMS)),
        generation=draw(st.integers(0, 3)),
        mem_free=draw(amounts),
        disk_free=draw(amounts),
        cpu_load=draw(loads),
        cpu_capacity=draw(caps),
        cpu_max_load=draw(loads),
        disk_bw_load=draw(amounts).__float__(),
        disk_bw_ceiling=draw(amounts).__float__(),
        net_bw_load=draw(amounts).__float__(),
        net_bw_ceiling=draw(amounts).__float__(),
        layers=frozenset(draw(st.lists(st.sampled_from(LAYER_IDS), max_size=10))),
        cached_layers=frozenset(draw(st.lists(st.sampled_from(LAYER_IDS), max_size=3))),
        overcommit=overcommit,
        # Now and then: the engine keeps track of whether any slot is cordoned.
        cordoned=draw(st.sampled_from([False, False, False, True])),
    )


node_names = st.text(alphabet="abcnode-019", min_size=1, max_size=6)
specs = st.none() | st.builds(
    Spec,
    vcpus=st.sampled_from([0.25, 0.5, 1.0, 2.0, 0.1]),
    mem=amounts,
    disk=amounts,
    disk_bw=amounts,
    net_bw=amounts,
)
request_layers = st.lists(
    st.tuples(st.sampled_from(LAYER_IDS), st.sampled_from([0, 1, 7, 1024, 2**33])),
    unique_by=lambda pair: pair[0],
    max_size=8,
).map(lambda pairs: [Layer(id=i, size=s) for i, s in pairs])
platform_lists = st.lists(st.sampled_from(PLATFORMS), unique=True, max_size=2)


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, NodeState | str]]:
    """A sequence of snapshot publications and departures, like a store's event stream."""
    names = draw(st.lists(node_names, min_size=0, max_size=40, unique=True))
    events: list[tuple[str, NodeState | str]] = [("put", draw(states(name))) for name in names]
    for _ in range(draw(st.integers(0, 30))):
        if not names:
            break
        name = draw(st.sampled_from(names))
        if draw(st.integers(0, 5)) == 0:
            events.append(("delete", name))
        else:
            events.append(("put", draw(states(name))))
    return events


def play(kind: str, payload: NodeState | str, *rankers: Engine | ReferenceRanker) -> None:
    """One event of a history, fed to each of ``rankers``."""
    for ranker in rankers:
        if kind == "put":
            assert isinstance(payload, NodeState)
            ranker.upsert(payload)
        else:
            assert isinstance(payload, str)
            ranker.remove(payload)


def replay(events: list[tuple[str, NodeState | str]]) -> tuple[Engine, ReferenceRanker]:
    engine, reference = Engine(capacity=2), ReferenceRanker()
    for kind, payload in events:
        play(kind, payload, engine, reference)
    return engine, reference


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), specs, request_layers, platform_lists)
def test_engine_ranking_equals_reference(
    events: list[tuple[str, NodeState | str]],
    spec: Spec | None,
    layers: list[Layer],
    platforms: list[Platform],
) -> None:
    engine, reference = replay(events)
    expected = reference.rank(spec, layers, platforms)
    got = engine.rank(spec, layers, platforms)
    assert got.pairs() == expected.pairs()
    assert list(got) == list(expected)
    assert len(engine) == len(reference)
    assert engine.platforms() == reference.platforms()


@settings(max_examples=20, deadline=None)
@given(st.integers(150, 300), st.randoms(use_true_random=False), specs, request_layers)
def test_engine_equals_reference_on_a_few_hundred_nodes(
    count: int, rng: object, spec: Spec | None, layers: list[Layer]
) -> None:
    import random

    assert isinstance(rng, random.Random)
    engine, reference = Engine(), ReferenceRanker()
    for index in range(count):
        state = NodeState(
            node=f"node-{rng.randrange(10**6):06d}-{index}",
            platform=rng.choice(PLATFORMS),
            mem_free=rng.randrange(0, 9) * 256,
            disk_free=rng.randrange(0, 9) * 256,
            cpu_load=rng.choice([0.0, 0.5, 0.75]),
            cpu_capacity=rng.choice([1.0, 2.0, 4.0]),
            cpu_max_load=rng.choice([0.75, 1.0]),
            disk_bw_ceiling=float(rng.randrange(0, 9) * 256),
            net_bw_ceiling=float(rng.randrange(0, 9) * 256),
            layers=frozenset(rng.sample(LAYER_IDS, rng.randrange(0, 12))),
        )
        engine.upsert(state)
        reference.upsert(state)
    assert engine.rank(spec, layers).pairs() == reference.rank(spec, layers).pairs()


def test_older_generation_is_ignored_by_both() -> None:
    engine, reference = Engine(), ReferenceRanker()
    base = dict(
        platform=PLATFORMS[0],
        mem_free=1024,
        disk_free=1024,
        cpu_capacity=1.0,
        disk_bw_ceiling=1.0,
        net_bw_ceiling=1.0,
    )
    for ranker in (engine, reference):
        ranker.upsert(NodeState(node="n", generation=2, layers=frozenset({"x"}), **base))
        ranker.upsert(NodeState(node="n", generation=1, **base))
        assert ranker.rank(None, [Layer(id="x", size=5)]).pairs() == [("n", 5)]


def test_ties_go_to_node_name_order_and_empty_cluster_ranks_nothing() -> None:
    engine = Engine()
    assert list(engine.rank(None, [])) == []
    base = dict(
        platform=PLATFORMS[0],
        mem_free=1024,
        disk_free=1024,
        cpu_capacity=1.0,
        disk_bw_ceiling=1.0,
        net_bw_ceiling=1.0,
    )
    for name in ("c", "a", "b", "d"):
        layers = frozenset({"x"}) if name in ("b", "d") else frozenset()
        engine.upsert(NodeState(node=name, layers=layers, **base))
    assert list(engine.rank(None, [Layer(id="x", size=1)])) == ["b", "d", "a", "c"]
    engine.remove("b")
    engine.remove("b")
    assert list(engine.rank(None, [Layer(id="x", size=1)])) == ["d", "a", "c"]
    engine.upsert(NodeState(node="aa", layers=frozenset({"x"}), **base))
    assert list(engine.rank(None, [Layer(id="x", size=1)])) == ["aa", "d", "a", "c"]


def test_layer_index_follows_mounts_and_unmounts() -> None:
    engine = Engine()
    base = dict(
        platform=PLATFORMS[0],
        mem_free=1,
        disk_free=1,
        cpu_capacity=1.0,
        disk_bw_ceiling=1.0,
        net_bw_ceiling=1.0,
    )
    engine.upsert(NodeState(node="n", generation=0, layers=frozenset({"a", "b"}), **base))
    engine.upsert(NodeState(node="m", generation=0, layers=frozenset({"b"}), **base))
    engine.upsert(NodeState(node="n", generation=1, layers=frozenset({"b", "c"}), **base))
    assert sorted(engine.mounted.holders("b").tolist()) == [0, 1]
    assert engine.mounted.holders("a").size == 0
    assert engine.mounted.holders("c").tolist() == [0]
    assert engine.mounted.holders("never").size == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), specs, request_layers, st.sampled_from([None, 0, 1, 3]))
def test_engine_stays_equal_when_ranked_between_every_change(
    events: list[tuple[str, NodeState | str]],
    spec: Spec | None,
    layers: list[Layer],
    compact_after: int | None,
) -> None:
    """Ranking after every event exercises the incremental name order and compaction."""
    engine = Engine(capacity=2, compact_after=compact_after)
    reference = ReferenceRanker()
    for kind, payload in events:
        play(kind, payload, engine, reference)
        assert engine.rank(spec, layers).pairs() == reference.rank(spec, layers).pairs()


def test_popular_layers_use_dense_bitmaps_and_still_agree() -> None:
    import random

    rng = random.Random(3)
    engine, reference = Engine(), ReferenceRanker()
    popular = [f"base-{i}" for i in range(4)]
    for index in range(3000):
        mounted = {layer for layer in popular if rng.random() < 0.8}
        mounted |= set(rng.sample(LAYER_IDS, 3))
        state = NodeState(
            node=f"n{rng.randrange(10**9)}-{index}",
            platform=PLATFORMS[0],
            mem_free=1024,
            disk_free=1024,
            cpu_capacity=1.0,
            disk_bw_ceiling=1.0,
            net_bw_ceiling=1.0,
            layers=frozenset(mounted),
        )
        engine.upsert(state)
        reference.upsert(state)
    layers = [Layer(id=layer, size=size) for layer, size in zip(popular, (5, 7, 5, 1), strict=True)]
    layers += [Layer(id=LAYER_IDS[0], size=12)]
    assert engine.rank(None, layers).pairs() == reference.rank(None, layers).pairs()
    assert engine.mounted.bitmap("base-0", engine.size) is not None  # the dense path ran
    many = [Layer(id=f"sha256:{i:02x}", size=i + 1) for i in range(16)]  # > MASK_LAYERS
    assert engine.rank(None, many).pairs() == reference.rank(None, many).pairs()


def plain(name: str, **fields: object) -> NodeState:
    base: dict[str, object] = {
        "platform": PLATFORMS[0],
        "mem_free": 1024,
        "disk_free": 1024,
        "cpu_capacity": 1.0,
        "disk_bw_ceiling": 1.0,
        "net_bw_ceiling": 1.0,
    }
    base.update(fields)
    return NodeState(node=name, **base)


def test_compaction_renumbers_slots_into_name_order_and_keeps_answers() -> None:
    import random

    rng = random.Random(11)
    engine, reference = Engine(compact_after=None), ReferenceRanker()

    def both(state: NodeState) -> None:
        engine.upsert(state)
        reference.upsert(state)

    names = [f"n{rng.randrange(10**6):06d}" for _ in range(200)]
    for name in names:
        over = Overcommit(vcpus_ceiling=2.0) if rng.random() < 0.3 else None
        both(
            plain(
                name,
                platform=rng.choice(PLATFORMS),
                mem_free=rng.randrange(4) * 256,
                layers=frozenset(rng.sample(LAYER_IDS, 5)),
                overcommit=over,
            )
        )
    for name in names[::7]:
        engine.remove(name)
        reference.remove(name)
    layers = [Layer(id=LAYER_IDS[i], size=10 * i + 1) for i in range(6)]
    spec = Spec(vcpus=0.5, mem=256, disk=1)
    before = engine.rank(spec, layers).pairs()
    assert not engine.in_name_order
    engine.compact()
    assert engine.in_name_order
    assert [engine.name(int(s)) for s in engine.name_order()] == sorted(reference.rank(None, []))
    assert engine.rank(spec, layers).pairs() == before == reference.rank(spec, layers).pairs()
    both(plain("zzz", layers=frozenset(LAYER_IDS[:6])))
    assert engine.in_name_order  # appended after every name: still in order
    both(plain("a"))
    assert not engine.in_name_order
    assert engine.rank(spec, layers).pairs() == reference.rank(spec, layers).pairs()


# -- every policy ranks identically on both rankers ---------------------------------------------

# Sizes around kube's thresholds (23 MiB, 1000 MiB) and berth's 1 MiB tolerance, so locality
# (mounted and cached) decides orders rather than ties.
policy_layers = st.lists(
    st.tuples(st.sampled_from(LAYER_IDS), st.sampled_from([0, 7, 30 << 20, 400 << 20, 2**33])),
    unique_by=lambda pair: pair[0],
    max_size=8,
).map(lambda pairs: [Layer(id=i, size=s) for i, s in pairs])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    histories(),
    specs,
    policy_layers,
    platform_lists,
    st.sampled_from(sorted(POLICIES)),
    st.integers(0, 3),
    st.sampled_from([None, 0, 3]),
    st.data(),
)
def test_every_policy_ranks_identically_on_engine_and_reference(
    events: list[tuple[str, NodeState | str]],
    spec: Spec | None,
    layers: list[Layer],
    platforms: list[Platform],
    name: str,
    seed: int,
    compact_after: int | None,
    data: st.DataObject,
) -> None:
    """The same policy (a twin with the same seed for random, kube and berth) on the engine
    and on the reference, ranked after every event: free slots, reused slots, compaction.

    The seed's policy takes each ranker's own path (packed sort, literal sort); a subclass
    of it takes the general one, on each ranker's view, and must agree too.
    """
    engine, reference = Engine(capacity=2, compact_after=compact_after), ReferenceRanker()
    on_engine, on_reference = policy(name, seed=seed), policy(name, seed=seed)
    on_view = type("SeedOnTheView", (SeedPolicy,), {})()
    totals = st.none() | st.integers(0, 8).map(lambda extra: extra * 256)
    for kind, payload in events:
        if kind == "put":
            assert isinstance(payload, NodeState)
            mem_extra, disk_extra = data.draw(totals), data.draw(totals)
            payload = payload.model_copy(
                update={
                    "mem_max": None if mem_extra is None else payload.mem_free + mem_extra,
                    "disk_max": None if disk_extra is None else payload.disk_free + disk_extra,
                }
            )
            engine.upsert(payload)
            reference.upsert(payload)
        else:
            assert isinstance(payload, str)
            engine.remove(payload)
            reference.remove(payload)
        got = engine.rank(spec, layers, platforms, policy=on_engine)
        expected = reference.rank(spec, layers, platforms, policy=on_reference)
        assert got.pairs() == expected.pairs()
        if name == "seed":
            assert engine.rank(spec, layers, platforms, policy=on_view).pairs() == got.pairs()
            assert reference.rank(spec, layers, platforms, policy=on_view).pairs() == got.pairs()


# -- the lazy order's inputs: tie-breaks and the slot → name table -------------------------------


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.sampled_from([None, 0, 2]), st.integers(1, 3))
def test_tie_breaks_follow_name_order_through_every_change(
    events: list[tuple[str, NodeState | str]], compact_after: int | None, chunk: int
) -> None:
    """``tie_breaks`` (cached) is ``2**shift - 1 - name position`` for every live slot after
    any sequence of joins, leaves, reused slots and compactions, and a ranking read one node
    at a time with tiny chunks stays the reference's."""
    engine = Engine(capacity=2, compact_after=compact_after, chunk=chunk)
    reference = ReferenceRanker()
    layers = [Layer(id=LAYER_IDS[0], size=5), Layer(id=LAYER_IDS[1], size=5)]
    for kind, payload in events:
        play(kind, payload, engine, reference)
        ranking = engine.rank(None, layers)
        assert [ranking[i] for i in range(len(ranking))] == list(reference.rank(None, layers))
        shift = max(len(engine) - 1, 1).bit_length()
        ties = engine.tie_breaks(shift, np.uint32)
        by_name = engine.name_order()
        assert ties[by_name].tolist() == [(1 << shift) - 1 - i for i in range(by_name.size)]


def test_the_name_table_is_copied_on_write_and_grows_for_appends() -> None:
    engine = Engine(capacity=8, compact_after=None)
    for index in range(8):
        engine.upsert(plain(f"n{index}", layers=frozenset({"x"})))
    layers = [Layer(id="x", size=1)]
    before = engine.rank(None, layers)
    engine.remove("n3")
    engine.upsert(plain("m3", layers=frozenset({"x"})))  # reuses n3's slot
    for index in range(8, 40):  # appends past the capacity: the table grows
        engine.upsert(plain(f"n{index}", layers=frozenset({"x"})))
    assert list(before) == [f"n{index}" for index in range(8)]
    slot = engine.slot("m3")
    assert slot is not None and engine.name(slot) == "m3"
    expected = sorted(["m3", *(f"n{index}" for index in range(40) if index != 3)])
    assert list(engine.rank(None, layers)) == expected
