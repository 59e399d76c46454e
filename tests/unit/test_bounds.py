"""The lower bounds on bytes pulled: their arithmetic, and that no simulated run beats them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth import Layer, Platform
from berth.scheduler.policy import POLICIES
from berth.sim.bounds import (
    LayerUse,
    capacity_bound,
    distinct_layer_bound,
    nodes_needed,
    peak_memory,
)
from berth.sim.simulator import SimConfig, Simulation
from berth.sim.workload import WorkloadConfig, generate_workload
from berth.units import GiB

A = (Layer(id="a", size=100),)
AB = (Layer(id="a", size=100), Layer(id="b", size=7))


def test_peak_memory_counts_memory_held_at_the_same_instant() -> None:
    assert peak_memory([]) == 0
    assert peak_memory([(0, 10, GiB), (5, 15, GiB), (6, 7, 1)]) == 2 * GiB + 1  # at t = 6
    assert peak_memory([(0, 10, GiB), (10, 20, GiB)]) == GiB  # an end counts before a start


def test_nodes_needed_takes_the_largest_first() -> None:
    fleet = [16 * GiB] + [4 * GiB] * 9
    assert nodes_needed(1, fleet) == 1
    assert nodes_needed(20 * GiB, fleet) == 2
    assert nodes_needed(40 * GiB, fleet) == 7  # the ceil(40 / 16) = 3 is looser
    assert nodes_needed(10**15, fleet) == 10  # more than the fleet holds: every node
    for memory in range(0, 60 * GiB, GiB // 3):  # never below the ceil(M / largest)
        assert nodes_needed(memory, fleet) >= max(1, -(-memory // (16 * GiB)))


def test_capacity_bound_per_layer_and_platform() -> None:
    uses = [
        LayerUse(0, 10, 3 * GiB, "linux/amd64", AB),
        LayerUse(0, 10, 3 * GiB, "linux/amd64", A),
        LayerUse(0, 10, GiB, "linux/arm64/v8", A),
    ]
    mems = {"linux/amd64": [4 * GiB, 4 * GiB, 2 * GiB], "linux/arm64/v8": [8 * GiB]}
    # a: 6 GiB at once on amd64 -> 2 nodes, and 1 node of arm64; b: 3 GiB -> 1 node.
    assert capacity_bound(uses, mems) == 2 * 100 + 100 + 7
    assert distinct_layer_bound(uses) == 107
    seeded = {"linux/amd64": frozenset({"a"})}
    assert capacity_bound(uses, mems, seeded) == 100 + 7
    assert distinct_layer_bound(uses, seeded) == 107  # arm64 nodes still pull a


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 100),
            st.floats(0, 50),
            st.integers(1, 8 * GiB),
            st.sampled_from(["p", "q"]),
            st.sets(st.sampled_from("abcd"), min_size=1),
        ),
        max_size=25,
    )
)
def test_capacity_bound_is_at_least_the_distinct_bound(
    raw: list[tuple[float, float, int, str, set[str]]],
) -> None:
    sizes = {"a": 5, "b": 50, "c": 500, "d": 1}
    uses = [
        LayerUse(start, start + span, mem, platform, [Layer(id=i, size=sizes[i]) for i in ids])
        for start, span, mem, platform, ids in raw
    ]
    mems = {"p": [4 * GiB] * 3, "q": [16 * GiB, 2 * GiB]}
    assert capacity_bound(uses, mems) >= distinct_layer_bound(uses)


CASES = {
    "moderate": SimConfig(nodes=10, samples=10),
    "overload": SimConfig(nodes=6, samples=10),
    "stale": SimConfig(nodes=10, concurrency=3, staleness=5.0, samples=10),
    "preseeded-multi-arch": SimConfig(
        nodes=10,
        preseed_layers=4,
        samples=10,
        node_platforms={"linux/amd64": 0.5, "linux/arm64/v8": 0.5},
    ),
}
WORKLOADS = {
    "moderate": WorkloadConfig(requests=200, rate=0.3, lifetime_mean=120.0, seed=8),
    "overload": WorkloadConfig(requests=200, rate=2.0, lifetime_mean=120.0, seed=8),
    "stale": WorkloadConfig(requests=200, rate=0.3, lifetime_mean=120.0, seed=8),
    "preseeded-multi-arch": WorkloadConfig(
        requests=200,
        rate=0.3,
        lifetime_mean=120.0,
        seed=8,
        multi_platform=(Platform.parse("linux/amd64"), Platform.parse("linux/arm64/v8")),
        multi_platform_share=0.6,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_no_policy_run_beats_either_bound(case: str) -> None:
    config = CASES[case].model_copy(update={"workload": WORKLOADS[case]})
    arrivals = generate_workload(config.workload)
    for name in POLICIES:
        result = Simulation(config, name, arrivals).run()
        assert result.lower_bound_bytes > 0
        assert result.pulled_bytes >= result.capacity_bound_bytes >= result.lower_bound_bytes, name
