"""NodeState and the seed's formulas: fits (exact fills fit), first failed check, colocation."""

from __future__ import annotations

import pytest

from berth import Invalid, Layer, Platform, Spec
from berth.state import NodeState, Overcommit, colocation_score, first_failed_check, fits
from berth.testing.store_contract import sample_state
from berth.units import GiB


def node(**changes: object) -> NodeState:
    defaults: dict[str, object] = {
        "mem_free": 4 * GiB,
        "disk_free": 10 * GiB,
        "cpu_load": 0.5,
        "cpu_capacity": 4.0,
        "cpu_max_load": 1.0,
        "disk_bw_load": 100.0,
        "disk_bw_ceiling": 1000.0,
        "net_bw_load": 10.0,
        "net_bw_ceiling": 100.0,
        "overcommit": None,
        "layers": frozenset({"a", "b"}),
    }
    defaults.update(changes)
    name = str(defaults.pop("node", "n"))
    return sample_state(name, 0, **defaults)


def spec(**changes: object) -> Spec:
    fields: dict[str, object] = {"vcpus": 1, "mem": GiB, "disk": GiB, "disk_bw": 100, "net_bw": 10}
    fields.update(changes)
    return Spec(**fields)


def test_exact_fills_fit() -> None:
    exact = spec(mem=4 * GiB, disk=10 * GiB, vcpus=2, disk_bw=900, net_bw=90)
    assert fits(node(), exact)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"mem": 4 * GiB + 1}, "mem_exhausted"),
        ({"disk": 10 * GiB + 1}, "disk_exhausted"),
        ({"vcpus": 2.01}, "cpu_saturated"),
        ({"disk_bw": 901}, "disk_bw_saturated"),
        ({"net_bw": 91}, "net_bw_saturated"),
    ],
)
def test_each_check_refuses_one_past_the_edge(changes: dict[str, object], reason: str) -> None:
    assert first_failed_check(node(), spec(**changes)) == reason
    assert not fits(node(), spec(**changes))


def test_hard_checks_come_before_soft_ones() -> None:
    both = spec(mem=5 * GiB, vcpus=100)
    assert first_failed_check(node(), both) == "mem_exhausted"


def test_the_platform_comes_first_and_alone_without_a_spec() -> None:
    amd64, arm64 = Platform.parse("linux/amd64"), Platform.parse("linux/arm64")
    full = node(mem_free=0)
    assert full.platform == amd64
    assert first_failed_check(full, spec(), [arm64]) == "platform_mismatch"
    assert first_failed_check(full, spec(), [arm64, amd64]) == "mem_exhausted"
    assert first_failed_check(full, None, [amd64]) is None  # no spec: the platform only
    assert fits(full, None) and not fits(full, None, [arm64])


def test_overcommit_stage_sits_between_hard_and_soft() -> None:
    over = Overcommit(vcpus_reserved=7.5, vcpus_ceiling=8.0)
    assert first_failed_check(node(overcommit=over), spec(vcpus=0.5)) is None
    assert first_failed_check(node(overcommit=over), spec(vcpus=1)) == "cpu_overcommitted"
    assert first_failed_check(node(overcommit=over, mem_free=0), spec(vcpus=1)) == "mem_exhausted"
    unbounded = Overcommit(vcpus_reserved=1000.0)
    assert first_failed_check(node(overcommit=unbounded), spec()) is None
    net = Overcommit(net_bw_reserved=50, net_bw_ceiling=55)
    assert first_failed_check(node(overcommit=net), spec(net_bw=10)) == "net_bw_overcommitted"


def test_colocation_counts_only_mounted_bytes() -> None:
    layers = [Layer(id="a", size=10), Layer(id="c", size=1000), Layer(id="b", size=5)]
    assert colocation_score(node(), layers) == 15
    assert colocation_score(node(layers=frozenset()), layers) == 0
    assert colocation_score(node(cached_layers=frozenset({"c"})), layers) == 15  # cache ≠ mounted


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cpu_load": 1.5}, "cpu_load"),
        ({"cpu_capacity": 0}, "cpu_capacity"),
        ({"mem_free": -1}, "mem_free"),
        ({"node": ""}, "node"),
        ({"platform": "linux/amd46"}, "platform"),
    ],
)
def test_bad_snapshots_are_invalid(changes: dict[str, object], field: str) -> None:
    with pytest.raises(Invalid) as caught:
        node(**changes)
    assert caught.value.field == field


def test_snapshot_json_round_trip() -> None:
    state = sample_state("n7", 4)
    assert NodeState.from_json(state.to_json()) == state
