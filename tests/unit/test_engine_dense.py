"""Engine == reference where the engine takes its dense-bitmap branches.

A layer held by at least ``max(_DENSE_MIN, size // _DENSE_SHARE)`` slots (1,024 nodes, or an
eighth of the slots) gets a dense boolean bitmap over the slots, kept in step by every mount
and unmount, grown with the slot arrays, renumbered by compaction and dropped when the layer
turns rare again (held by fewer than ``size // 32``).  The property tests of
``test_engine.py`` work on clusters of tens or hundreds of nodes, which never reach those
branches; these build clusters of 1,300–1,500 nodes on which a few base layers sit on most
nodes — as on real Docker Hub data — and hold the engine to the literal reference through:

* the first ranking (bitmaps built from the holder lists),
* mounts and unmounts on nodes that already have bitmaps (kept in step),
* new nodes past the slot capacity (bitmaps grown with the arrays),
* departures and compaction (bitmaps renumbered),
* a popular layer unmounted almost everywhere (bitmap dropped, holder list used again),

for request layers of up to 8 (uint8 masks), 9–12 (uint16 masks) and more than 12 (the
per-slot sum fallback), with and without a spec, under the seed, kube and berth policies.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berth import Layer, Platform, Spec
from berth.scheduler.engine import Engine
from berth.scheduler.layer_index import _DENSE_MIN, _DENSE_SHARE
from berth.scheduler.policy import policy
from berth.scheduler.reference import ReferenceRanker
from berth.state import NodeState

PLATFORMS = [Platform.parse(p) for p in ("linux/amd64", "linux/arm64")]
POPULAR = [f"sha256:base-{i}" for i in range(6)]
RARE = [f"sha256:rare-{i:02d}" for i in range(40)]
SIZES = (0, 1, 7, 1024, 5 * 2**20, 2**33)


def dense_threshold(engine: Engine) -> int:
    return max(_DENSE_MIN, engine.size // _DENSE_SHARE)


def node_state(
    rng: random.Random, name: str, generation: int, share: dict[str, float]
) -> NodeState:
    mounted = {layer for layer, p in share.items() if rng.random() < p}
    mounted |= set(rng.sample(RARE, rng.randrange(0, 4)))
    return NodeState(
        node=name,
        platform=rng.choice(PLATFORMS),
        generation=generation,
        mem_free=rng.randrange(0, 9) * 256,
        disk_free=rng.randrange(0, 9) * 256,
        cpu_load=rng.choice([0.0, 0.5]),
        cpu_capacity=rng.choice([1.0, 4.0]),
        disk_bw_ceiling=float(rng.randrange(0, 9) * 256),
        net_bw_ceiling=float(rng.randrange(0, 9) * 256),
        layers=frozenset(mounted),
        cached_layers=frozenset(rng.sample(POPULAR + RARE, rng.randrange(0, 3))),
    )


def request_layers(rng: random.Random, count: int) -> list[Layer]:
    # At least one popular layer, so every request reaches a dense bitmap.
    ids = [rng.choice(POPULAR[:3])]
    ids += rng.sample([i for i in POPULAR + RARE if i != ids[0]], count - 1)
    return [Layer(id=layer_id, size=rng.choice(SIZES)) for layer_id in ids]


specs = st.sampled_from(
    [None, Spec(vcpus=0.5, mem=512, disk=256), Spec(vcpus=1.0, mem=1024, disk=1024, disk_bw=256)]
)


def agree(
    engine: Engine, reference: ReferenceRanker, spec: Spec | None, layers: list[Layer], name: str
) -> None:
    expected = reference.rank(spec, layers)
    assert engine.rank(spec, layers).pairs() == expected.pairs()
    if name != "seed":  # a policy twin per ranker, same seed: same random choices
        on_engine, on_reference = policy(name, seed=3), policy(name, seed=3)
        got = engine.rank(spec, layers, policy=on_engine).pairs()
        assert got == reference.rank(spec, layers, policy=on_reference).pairs()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1300, 1500),
    st.integers(0, 2**32),  # seeds the cluster's layout (thousands of draws: too many for
    specs,  # Hypothesis to hold as data, and shrinking a layout helps nobody here)
    st.sampled_from([3, 8, 11, 16]),
    st.sampled_from(["seed", "kube", "berth"]),
)
def test_engine_equals_reference_through_the_dense_bitmap_lifecycle(
    count: int, seed: int, spec: Spec | None, width: int, name: str
) -> None:
    rng = random.Random(seed)
    # The first nodes fill the starting capacity exactly, so the next ones grow the arrays —
    # and the bitmaps with them; compaction after one stable ranking renumbers them.
    first = count - 100
    engine, reference = Engine(capacity=first, compact_after=1), ReferenceRanker()
    share = {POPULAR[0]: 0.97, POPULAR[1]: 0.9, POPULAR[2]: 0.8, POPULAR[3]: 0.2}
    names = [f"node-{rng.randrange(10**6):06d}-{index}" for index in range(count)]
    generation = 0

    def put(node: str) -> None:
        state = node_state(rng, node, generation, share)
        engine.upsert(state)
        reference.upsert(state)

    for node in names[:first]:
        put(node)
    layers = request_layers(rng, width)
    agree(engine, reference, spec, layers, name)
    assert engine.mounted.count(POPULAR[0]) >= dense_threshold(engine)
    assert engine.mounted.bitmap(POPULAR[0], engine.size) is not None  # the dense path ran

    # Mounts and unmounts on nodes with bitmaps, then 100 new nodes past the capacity.
    generation += 1
    for node in rng.sample(names[:first], 200):
        put(node)
    for node in names[first:]:
        put(node)
    agree(engine, reference, spec, layers, name)

    # Departures, then rankings until the engine compacts (slots and bitmaps renumbered).
    for node in rng.sample(names, 60):
        engine.remove(node)
        reference.remove(node)
        names.remove(node)
    for _ in range(3):
        agree(engine, reference, spec, layers, name)
    assert engine.in_name_order  # compacted

    # New nodes without the popular layers take the slots past the compacted ones: a bitmap
    # bit left over there would count layers they do not hold.
    popular, share = share, dict.fromkeys(POPULAR, 0.0)
    for index in range(40):
        names.append(f"late-{index:02d}")
        put(names[-1])
    agree(engine, reference, spec, request_layers(rng, width), name)

    # The most popular layer is unmounted almost everywhere: its bitmap is dropped and the
    # holder list takes over again, and it must still rank exactly.
    generation += 1
    share = {**popular, POPULAR[0]: 0.01}
    for node in names:
        put(node)
    assert engine.mounted.bitmap(POPULAR[0], engine.size) is None
    agree(engine, reference, spec, [Layer(id=POPULAR[0], size=9), *layers[1:]], name)
    assert engine.mounted.bitmap(POPULAR[1], engine.size) is not None  # still dense
