"""The engine's lazy ranking reads exactly the seed's full order, however far it is read.

``Engine.rank`` orders the fitting nodes only as far as they are read (the first node is an
``argmax``; reading past it selects and sorts the next stretch).  These properties hold it to
the literal reference ranker and to its own full order: read node by node, by index in any
order, across chunk boundaries, after the engine changed underneath, and through
``ClusterScheduler.place()`` — including when every candidate refuses, so the walk reads the
whole ranking.  Small ``chunk`` sizes put many extensions inside small clusters.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berth import Layer, NoCapacity, NoMatchingPlatform, Platform, Spec
from berth.nodeclient.local import LocalNodes
from berth.ownership import Refused
from berth.scheduler.engine import Engine
from berth.scheduler.multinode import ClusterScheduler
from berth.scheduler.policy import policy
from berth.scheduler.policy.seed import SeedOrder, name_shift, seed_order
from berth.scheduler.reference import ReferenceRanker
from berth.state import NodeState
from berth.store.memory import MemoryStore

LAYER_IDS = [f"sha256:{i:02x}" for i in range(16)]
PLATFORMS = [Platform.parse(p) for p in ("linux/amd64", "linux/arm64")]
CHUNKS = st.sampled_from([1, 2, 3, 5, 32])

amounts = st.integers(0, 4).map(lambda x: x * 256)


@st.composite
def states(draw: st.DrawFn, node: str) -> NodeState:
    return NodeState(
        node=node,
        platform=draw(st.sampled_from(PLATFORMS)),
        generation=draw(st.integers(0, 2)),
        mem_free=draw(amounts),
        disk_free=draw(amounts),
        cpu_load=draw(st.sampled_from([0.0, 0.5, 1.0])),
        cpu_capacity=draw(st.sampled_from([1.0, 2.0])),
        cpu_max_load=draw(st.sampled_from([0.75, 1.0])),
        disk_bw_ceiling=float(draw(amounts)),
        net_bw_ceiling=float(draw(amounts)),
        # Few layers, few sizes: many nodes tie on colocated bytes, so the name tie-break
        # decides much of the order, across chunk boundaries.
        layers=frozenset(draw(st.lists(st.sampled_from(LAYER_IDS[:6]), max_size=4))),
    )


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, NodeState | str]]:
    """Publications and departures, like a store's event stream."""
    names = draw(
        st.lists(st.text(alphabet="abn-019", min_size=1, max_size=5), max_size=60, unique=True)
    )
    events: list[tuple[str, NodeState | str]] = [("put", draw(states(name))) for name in names]
    for _ in range(draw(st.integers(0, 20))):
        if not names:
            break
        name = draw(st.sampled_from(names))
        if draw(st.integers(0, 3)) == 0:
            events.append(("delete", name))
        else:
            events.append(("put", draw(states(name))))
    return events


specs = st.none() | st.builds(
    Spec,
    vcpus=st.sampled_from([0.25, 1.0]),
    mem=amounts,
    disk=amounts,
    disk_bw=st.just(0),
    net_bw=st.just(0),
)
request_layers = st.lists(
    st.tuples(st.sampled_from(LAYER_IDS[:6] + LAYER_IDS[-2:]), st.sampled_from([1, 7, 2**33])),
    unique_by=lambda pair: pair[0],
    max_size=6,
).map(lambda pairs: [Layer(id=i, size=s) for i, s in pairs])
platform_lists = st.lists(st.sampled_from(PLATFORMS), unique=True, max_size=1)


def replay(events: list[tuple[str, NodeState | str]], *rankers: Engine | ReferenceRanker) -> None:
    for kind, payload in events:
        for ranker in rankers:
            if kind == "put":
                assert isinstance(payload, NodeState)
                ranker.upsert(payload)
            else:
                assert isinstance(payload, str)
                ranker.remove(payload)


# -- the ranking value, read lazily -------------------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    histories(),
    specs,
    request_layers,
    platform_lists,
    CHUNKS,
    st.sampled_from([None, 0]),
    st.data(),
)
def test_lazy_reads_are_the_full_order_and_the_reference(
    events: list[tuple[str, NodeState | str]],
    spec: Spec | None,
    layers: list[Layer],
    platforms: list[Platform],
    chunk: int,
    compact_after: int | None,
    data: st.DataObject,
) -> None:
    """Iterated, indexed in any order, sliced, colocated: the same order and bytes as the
    reference and as the ranking's own full order, whatever was read first."""
    engine = Engine(capacity=2, compact_after=compact_after, chunk=chunk)
    reference = ReferenceRanker()
    replay(events, engine, reference)
    expected = reference.rank(spec, layers, platforms).pairs()
    names = [node for node, _ in expected]

    walked = engine.rank(spec, layers, platforms)
    depth = data.draw(st.integers(0, len(names)), label="depth")
    head: list[str] = []
    for node in walked:  # as place() reads it: stop after `depth` nodes
        if len(head) == depth:
            break
        head.append(node)
    assert head == names[:depth]
    assert walked.ordered() <= len(names)
    assert list(walked) == names  # a second, full read continues the same order
    assert walked.pairs() == expected

    indexed = engine.rank(spec, layers, platforms)
    assert len(indexed) == len(names)
    positions = data.draw(st.permutations(range(len(names))), label="positions")
    for position in positions[: data.draw(st.integers(0, len(names)), label="reads")]:
        assert indexed[position] == names[position]
        assert indexed.colocated(position) == expected[position][1]
        assert indexed[position - len(names)] == names[position]  # negative indices
    start, stop = sorted(data.draw(st.lists(st.integers(0, len(names)), min_size=2, max_size=2)))
    assert indexed[start:stop] == names[start:stop]
    assert indexed[::-1] == names[::-1]
    assert [indexed.colocated(i) for i in range(len(names))] == [b for _, b in expected]
    with pytest.raises(IndexError):
        indexed[len(names)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), histories(), specs, request_layers, CHUNKS, st.data())
def test_a_ranking_read_across_engine_changes_reads_the_order_it_was_made_with(
    events: list[tuple[str, NodeState | str]],
    later: list[tuple[str, NodeState | str]],
    spec: Spec | None,
    layers: list[Layer],
    chunk: int,
    data: st.DataObject,
) -> None:
    """Part of a ranking is read, the engine changes (joins, leaves, reused slots,
    compaction), the rest is read: still exactly the order of the moment it was made."""
    engine = Engine(capacity=2, compact_after=None, chunk=chunk)
    reference = ReferenceRanker()
    replay(events, engine, reference)
    expected = reference.rank(spec, layers).pairs()
    ranking = engine.rank(spec, layers)
    depth = data.draw(st.integers(0, len(expected)), label="depth")
    read = [ranking[i] for i in range(depth)]

    replay(later, engine)
    if data.draw(st.booleans(), label="compact"):
        engine.compact()
    engine.rank(spec, layers)  # another ranking meanwhile: the engine's caches move on

    read += [ranking[i] for i in range(depth, len(expected))]
    assert read == [node for node, _ in expected]
    assert ranking.pairs() == expected


# -- through ClusterScheduler.place() --------------------------------------------------------


def schedulers(
    events: list[tuple[str, NodeState | str]], chunk: int
) -> tuple[ClusterScheduler, ClusterScheduler]:
    """An engine scheduler and a reference scheduler following the same store."""
    store = MemoryStore()
    on_engine = ClusterScheduler(store, LocalNodes(), ranker=Engine(chunk=chunk))
    on_reference = ClusterScheduler(store, LocalNodes(), ranker="reference")
    for kind, payload in events:
        if kind == "put":
            assert isinstance(payload, NodeState)
            store.publish_now(payload)
        else:
            assert isinstance(payload, str)
            store.remove_now(payload)
    return on_engine, on_reference


def walk(
    scheduler: ClusterScheduler,
    spec: Spec | None,
    layers: list[Layer],
    platforms: list[Platform],
    accept_at: int | None,
    preferred: str | None = None,
) -> tuple[list[str], tuple[str, int, int] | None]:
    """The nodes ``place()`` tries (refusing all but the ``accept_at``-th) and what it placed."""
    tried: list[str] = []

    async def attempt(node: str) -> str:
        tried.append(node)
        if len(tried) - 1 == accept_at:
            return node
        raise Refused("cpu_saturated", node=node)

    try:
        placed = asyncio.run(scheduler.place(spec, layers, attempt, platforms, preferred))
    except NoCapacity:
        return tried, None
    return tried, (placed.node, placed.rank, placed.colocated_bytes)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), specs, request_layers, platform_lists, CHUNKS, st.data())
def test_place_walks_the_full_order_when_every_candidate_refuses(
    events: list[tuple[str, NodeState | str]],
    spec: Spec | None,
    layers: list[Layer],
    platforms: list[Platform],
    chunk: int,
    data: st.DataObject,
) -> None:
    on_engine, on_reference = schedulers(events, chunk)
    try:
        full = on_reference.candidates(spec, layers, platforms)
    except NoMatchingPlatform:
        with pytest.raises(NoMatchingPlatform):
            on_engine.candidates(spec, layers, platforms)
        return
    assert on_engine.candidates(spec, layers, platforms) == full

    tried, placed = walk(on_engine, spec, layers, platforms, accept_at=None)
    assert tried == full  # every candidate once, in order; the re-rank finds none untried
    assert placed is None
    assert walk(on_reference, spec, layers, platforms, accept_at=None) == (tried, None)

    if full:
        accept_at = data.draw(st.integers(0, len(full) - 1), label="accept_at")
        tried, placed = walk(on_engine, spec, layers, platforms, accept_at)
        assert tried == full[: accept_at + 1]
        assert placed is not None and placed[:2] == (full[accept_at], accept_at)
        assert walk(on_reference, spec, layers, platforms, accept_at) == (tried, placed)

        preferred = data.draw(st.sampled_from(full), label="preferred")
        tried, _ = walk(on_engine, spec, layers, platforms, None, preferred)
        assert tried == [preferred] + [node for node in full if node != preferred]


# -- laziness itself, and the paths small clusters do not reach ----------------------------------


def plain(name: str, layers: set[str], platform: str = "linux/amd64") -> NodeState:
    return NodeState(
        node=name,
        platform=platform,
        mem_free=1024,
        disk_free=1024,
        cpu_capacity=1.0,
        disk_bw_ceiling=1.0,
        net_bw_ceiling=1.0,
        layers=frozenset(layers),
    )


def test_a_walk_orders_only_what_it_reads() -> None:
    rng = np.random.default_rng(5)
    engine, reference = Engine(chunk=32), ReferenceRanker()
    for index in rng.permutation(3000).tolist():
        held = {f"l{j}" for j in range(6) if rng.random() < (0.9 if j < 2 else 0.2)}
        state = plain(f"n{index:05d}", held, "linux/arm64" if index % 7 == 0 else "linux/amd64")
        engine.upsert(state)
        reference.upsert(state)
    layers = [Layer(id=f"l{j}", size=size) for j, size in enumerate((50, 50, 3, 3, 1, 8))]
    amd64 = [Platform.parse("linux/amd64")]
    expected = list(reference.rank(None, layers, amd64))

    ranking = engine.rank(None, layers, amd64)
    assert ranking.ordered() == 0  # nothing sorted until read
    assert next(iter(ranking)) == expected[0]
    assert ranking.ordered() == 1  # the first node: one argmax
    assert ranking[1] == expected[1]
    assert ranking.ordered() == 1 + 32  # the next chunk, selected and sorted
    assert ranking[33] == expected[33]
    assert ranking.ordered() == len(expected)  # past the chunk: the rest at once
    assert list(ranking) == expected

    listed = engine.rank(None, layers, amd64)
    assert list(listed) == expected  # first node, one chunk, the rest

    # A policy other than the seed's orders everything up front (it is not lazy).
    spread = engine.rank(None, layers, amd64, policy=policy("spread"))
    assert spread.ordered() == len(spread)
    assert list(spread) == list(reference.rank(None, layers, amd64, policy=policy("spread")))


@pytest.mark.parametrize("layer_count", [0, 13])  # no layers: name order; > 12: no masks
def test_orders_without_subset_masks_are_the_reference(layer_count: int) -> None:
    engine, reference = Engine(chunk=2), ReferenceRanker()
    for index in range(200):
        state = plain(
            f"n{(index * 37) % 200:03d}", {f"l{j}" for j in range(13) if (index >> j) & 1}
        )
        engine.upsert(state)
        reference.upsert(state)
    layers = [Layer(id=f"l{j}", size=j % 4) for j in range(layer_count)]
    ranking = engine.rank(None, layers)
    assert [ranking[i] for i in range(10)] == list(reference.rank(None, layers))[:10]
    assert ranking.pairs() == reference.rank(None, layers).pairs()


class _Key:
    """A layer match without subset masks (the seed_order fallback reads ``key``)."""

    def __init__(self, key: npt.NDArray[Any]) -> None:
        self.layers = (Layer(id="x", size=1),)
        self.key = key
        self.key_limit = int(key.max(initial=0)) + 1

    def descending_keys(self, shift: int, dtype: Any) -> None:
        return None


@pytest.mark.parametrize("kind", ["uint32", "uint64"])
@pytest.mark.parametrize("in_name_order", [False, True])
@pytest.mark.parametrize("radix", [False, True])
def test_seed_order_selects_exactly_the_lexsort_order(
    kind: Literal["uint32", "uint64"], in_name_order: bool, radix: bool
) -> None:
    """Straight against ``lexsort`` on synthetic slots — including a cluster large enough
    that key and name position no longer fit 32 bits (a million nodes, 4,097 keys)."""
    rng = np.random.default_rng(9)
    count = 2**20 + 3 if kind == "uint64" else 50_000
    limit = 4097 if kind == "uint64" else 40
    key = rng.integers(0, limit - 1, count)
    key[0] = limit - 1
    fit = rng.random(count) < 0.6
    # slot by_name[i] is the i-th node by name
    by_name = np.arange(count) if in_name_order else rng.permutation(count)
    name_position = np.empty(count, dtype=np.int64)
    name_position[by_name] = np.arange(count)
    shift = name_shift(count)

    def ties(shift_: int, dtype: Any) -> npt.NDArray[Any]:
        assert shift_ == shift
        tie: npt.NDArray[Any] = ((1 << shift) - 1 - name_position).astype(dtype)
        return tie

    order = seed_order(fit, _Key(key), by_name, in_name_order, ties, chunk=3, radix=radix)
    assert isinstance(order, SeedOrder)
    assert order._rest.dtype == np.dtype(kind)  # the packing width under test
    fitting = np.flatnonzero(fit)
    expected = fitting[np.lexsort((name_position[fitting], key[fitting]))]
    assert len(order) == expected.size
    for length in (1, 2, 4, 40, 4000):
        assert order.prefix(length).tolist() == expected[:length].tolist()
    assert np.array_equal(order.prefix(len(order)), expected)
    everything = seed_order(fit, _Key(key), by_name, in_name_order, ties, radix=radix)
    assert np.array_equal(everything.prefix(len(order)), expected)  # sorted in one go


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 400),
    st.integers(1, 60),
    CHUNKS,
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(0, 450), max_size=6),
)
def test_seed_order_reads_the_lexsort_order_however_it_is_read(
    count: int,
    limit: int,
    chunk: int,
    in_name_order: bool,
    radix: bool,
    seed: int,
    reads: list[int],
) -> None:
    """Prefixes read in any sequence — the first node alone, chunk by chunk, everything at
    once — are the ``lexsort`` order, by the packed sort or by the radix sort of the key
    (the radix sort applies when slots are name positions and nothing was partitioned)."""
    rng = np.random.default_rng(seed)
    key = rng.integers(0, limit, count)
    fit = rng.random(count) < rng.random()
    by_name = np.arange(count) if in_name_order else rng.permutation(count)
    name_position = np.empty(count, dtype=np.int64)
    name_position[by_name] = np.arange(count)

    def ties(shift: int, dtype: Any) -> npt.NDArray[Any]:
        tie: npt.NDArray[Any] = ((1 << shift) - 1 - name_position).astype(dtype)
        return tie

    order = seed_order(fit, _Key(key), by_name, in_name_order, ties, chunk=chunk, radix=radix)
    fitting = np.flatnonzero(fit)
    expected = fitting[np.lexsort((name_position[fitting], key[fitting]))].tolist()
    assert len(order) == len(expected)
    for length in [*reads, len(expected)]:
        assert order.prefix(length).tolist() == expected[:length]
        assert order.ordered() >= min(length, len(expected))
