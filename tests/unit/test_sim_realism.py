"""The simulator's fleet model (issue 12): shared bandwidth, unpacking, a disk-sized cache,
pre-seeded layers, refusal round trips and a bounded walk, multi-platform variants, and the
counterfactual judged against the nodes' true state."""

from __future__ import annotations

import pytest

from berth import Invalid, Layer, Request
from berth.model import INSTANCE_TYPES
from berth.node.classes import NodeClass
from berth.platform import Platform
from berth.sim.simulator import SimConfig, SimResult, Simulation, layout
from berth.sim.workload import Arrival, WorkloadConfig, generate_workload
from berth.units import GiB

MB = 1_000_000
ONE_CLASS = (
    NodeClass(name="one", mem="1GiB", disk="64GiB", cpus=8, disk_bw="4GiBps", net_bw="4GiBps"),
)
AMD64 = {"linux/amd64": 1.0}


def arrival(
    at: float,
    image: str,
    layers: list[tuple[str, int]],
    *,
    instance: str = "micro",
    lifetime: float = 1000.0,
    replica: int = 0,
    variants: tuple[tuple[Platform, tuple[Layer, ...]], ...] = (),
) -> Arrival:
    request_layers = (
        tuple(layer for _, each in variants for layer in each)
        if variants
        else tuple(Layer(id=i, size=s) for i, s in layers)
    )
    request = Request(
        namespace="t",
        name=image,
        replica=replica,
        platforms=tuple(p for p, _ in variants) or (Platform.parse("linux/amd64"),),
        spec=INSTANCE_TYPES[instance],
        layers=request_layers,
    )
    return Arrival(
        at=at,
        request=request,
        lifetime=lifetime,
        image=image,
        instance_type=instance,
        variants=variants,
    )


def config(**overrides: object) -> SimConfig:
    fields: dict[str, object] = {
        "nodes": 1,
        "node_classes": ONE_CLASS,
        "node_platforms": AMD64,
        "pull_bandwidth": 100 * MB,
        "registry_bandwidth": 10**15,
        "unpack_bandwidth": 10**15,
        "layer_latency": 0.0,
        "boot_seconds": 0.0,
        "samples": 4,
    }
    fields.update(overrides)
    return SimConfig.model_validate(fields)


def run(cfg: SimConfig, arrivals: list[Arrival], policy: str = "seed") -> SimResult:
    return Simulation(cfg, policy, arrivals, check_invariants=True).run()


def test_concurrent_pulls_share_a_nodes_bandwidth() -> None:
    result = run(
        config(), [arrival(0.0, "a", [("la", 100 * MB)]), arrival(0.0, "b", [("lb", 300 * MB)])]
    )
    first, second = result.decisions
    assert first.start_latency == pytest.approx(1.0)
    assert second.start_latency == pytest.approx(4.0)  # waited for the first pull's second


def test_the_registry_bandwidth_is_shared_by_every_node() -> None:
    arrivals = [arrival(0.0, "a", [("la", 100 * MB)]), arrival(0.0, "b", [("lb", 100 * MB)])]
    alone = run(config(nodes=2), arrivals, "spread")
    assert [d.start_latency for d in alone.decisions] == pytest.approx([1.0, 1.0])
    assert alone.decisions[0].node != alone.decisions[1].node
    shared = run(config(nodes=2, registry_bandwidth=100 * MB), arrivals, "spread")
    assert [d.start_latency for d in shared.decisions] == pytest.approx([1.0, 2.0])


def test_latency_unpacking_and_boot_add_up() -> None:
    cfg = config(layer_latency=0.05, unpack_bandwidth=50 * MB, boot_seconds=0.25)
    result = run(cfg, [arrival(0.0, "a", [("la", 100 * MB)])])
    assert result.decisions[0].start_latency == pytest.approx(0.05 + 1.0 + 2.0 + 0.25)


def test_a_layer_being_pulled_is_waited_for_not_pulled_twice() -> None:
    result = run(
        config(),
        [arrival(0.0, "a", [("la", 200 * MB)]), arrival(0.5, "a", [("la", 200 * MB)], replica=1)],
    )
    first, second = result.decisions
    assert second.pulled_bytes == 0 and second.node == first.node
    assert second.start_latency == pytest.approx(1.5)  # ready at 2.0, arrived at 0.5


def test_the_cache_is_a_share_of_the_disk_and_charged_against_it() -> None:
    cfg = SimConfig(nodes=10, cache_fraction=0.25)
    for info, node_class in layout(cfg):
        assert info.cache_bytes == node_class.disk // 4
        assert info.disk_max == node_class.disk - info.cache_bytes
    simulation = Simulation(cfg, "seed", [])
    for name, node in simulation.nodes.items():
        info = simulation.info[name]
        assert node.budget.limits.disk_max == info.disk_max
        assert node.layers.cache_budget_bytes == info.cache_bytes
    fixed = SimConfig(nodes=10, cache_bytes="1GiB")
    assert {info.cache_bytes for info, _ in layout(fixed)} == {GiB}


def test_a_small_cache_evicts_and_pulls_again() -> None:
    layers = [("big1", 600 * MB), ("big2", 600 * MB)]
    arrivals = [
        arrival(0.0, "a", layers[:1], lifetime=10.0),
        arrival(20.0, "b", layers[1:], lifetime=10.0),
        arrival(40.0, "a", layers[:1], lifetime=10.0, replica=1),
    ]
    roomy = run(config(cache_bytes="2GiB"), arrivals)
    assert [d.pulled_bytes for d in roomy.decisions] == [600 * MB, 600 * MB, 0]
    tight = run(config(cache_bytes="1GiB"), arrivals)  # holds one of the two: big1 is evicted
    assert [d.pulled_bytes for d in tight.decisions] == [600 * MB, 600 * MB, 600 * MB]
    assert tight.capacity_bound_bytes == 1200 * MB  # the bound does not count re-pulls


def test_preseeded_layers_are_not_pulled_and_not_in_the_bounds() -> None:
    workload = WorkloadConfig(requests=120, rate=1.0, lifetime_mean=30.0, seed=4)
    arrivals = generate_workload(workload)
    cold = Simulation(SimConfig(nodes=8, workload=workload), "berth", arrivals).run()
    warm = Simulation(
        SimConfig(nodes=8, workload=workload, preseed_layers=6),
        "berth",
        arrivals,
        check_invariants=True,
    ).run()
    assert warm.preseeded and all(len(layers) <= 6 for layers in warm.preseeded.values())
    assert warm.pulled_bytes < cold.pulled_bytes
    assert warm.lower_bound_bytes < cold.lower_bound_bytes
    assert warm.pulled_bytes >= warm.capacity_bound_bytes >= warm.lower_bound_bytes


def stale_pair(**overrides: object) -> tuple[SimConfig, list[Arrival]]:
    """Two schedulers on views 100 s stale, one node that holds one deci request: the
    second scheduler confirms on a node its view says is empty, and is refused."""
    cfg = config(concurrency=2, staleness=100.0, assume=True, **overrides)
    arrivals = [
        arrival(0.0, "a", [("la", MB)], instance="deci", lifetime=10.0),
        arrival(1.0, "b", [("lb", MB)], instance="deci", lifetime=10.0),
    ]
    return cfg, arrivals


def test_a_refusal_is_judged_unavoidable_when_the_node_was_truly_full() -> None:
    cfg, arrivals = stale_pair()
    second = run(cfg, arrivals).decisions[1]
    assert second.outcome == "no_capacity" and second.refusals
    assert second.could_hold is None  # the only node really was full


def test_a_placement_gives_up_at_max_refusals() -> None:
    cfg, arrivals = stale_pair(max_refusals=1)
    second = run(cfg, arrivals).decisions[1]
    assert second.outcome == "gave_up" and len(second.refusals) == 1 and second.refused


def test_each_refusal_costs_a_round_trip() -> None:
    cfg = config(nodes=2, concurrency=2, staleness=100.0, refusal_rtt=0.5, node_classes=ONE_CLASS)
    arrivals = [
        arrival(0.0, "a", [("la", MB)], instance="deci", lifetime=50.0),
        arrival(1.0, "b", [("la", MB)], instance="deci", lifetime=50.0, replica=1),
    ]
    second = run(cfg, arrivals).decisions[1]
    assert second.placed and len(second.refusals) == 1
    assert second.start_latency == pytest.approx(0.5 + 1 * MB / (100 * MB))


def test_a_refusal_the_truth_could_have_held_is_recorded() -> None:
    # Snapshots 3 s late: at t = 5 the scheduler's view still shows "a" (published at 0,
    # received at 3), which ended at t = 4; its end reaches the view only at t = 7.
    cfg = config(staleness=3.0, assume=False)
    arrivals = [
        arrival(0.0, "a", [("la", MB)], instance="deci", lifetime=4.0),
        arrival(5.0, "b", [("lb", MB)], instance="deci", lifetime=2.0),
    ]
    second = run(cfg, arrivals).decisions[1]
    assert second.outcome == "no_capacity" and not second.refusals
    assert second.could_hold == "node-000"


def test_multi_platform_requests_mount_their_nodes_variant() -> None:
    workload = WorkloadConfig(
        requests=80,
        rate=1.0,
        lifetime_mean=30.0,
        seed=2,
        multi_platform=(Platform.parse("linux/amd64"), Platform.parse("linux/arm64/v8")),
        multi_platform_share=1.0,
    )
    cfg = SimConfig(
        nodes=6, workload=workload, node_platforms={"linux/amd64": 0.5, "linux/arm64/v8": 0.5}
    )
    result = Simulation(cfg, "berth", check_invariants=True).run()
    arm = [d for d in result.decisions if d.node_platform == "linux/arm64/v8"]
    amd = [d for d in result.decisions if d.node_platform == "linux/amd64"]
    assert arm and amd
    assert all(layer.id.startswith("synthetic:linux-arm64-v8:") for d in arm for layer in d.layers)
    assert not any(layer.id.startswith("synthetic:") for d in amd for layer in d.layers)
    assert result.pulled_bytes >= result.capacity_bound_bytes >= result.lower_bound_bytes


def test_a_cache_as_large_as_a_nodes_disk_is_invalid() -> None:
    with pytest.raises(Invalid) as error:
        SimConfig(nodes=4, cache_bytes="128GiB")  # the default small class's whole disk
    assert error.value.field == "cache_bytes" and "'small'" in error.value.message
