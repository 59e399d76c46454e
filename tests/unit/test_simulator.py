"""The simulator: deterministic, budget-safe, fully released, and really driven by its policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from berth import Invalid, Platform, Spec
from berth.dataset import load_dockerhub
from berth.node.core import NodeCore
from berth.ownership import Lease
from berth.scheduler.policy import POLICIES, ClusterView, PlacementRequest, Policy, SeedLike, Slots
from berth.sim.report import build_report, write_outputs
from berth.sim.simulator import (
    InvariantViolated,
    NodeClass,
    SimConfig,
    SimResult,
    Simulation,
    layout,
    simulate_policies,
)
from berth.sim.workload import WorkloadConfig, generate_workload
from berth.units import GiB


def small(**overrides: object) -> SimConfig:
    """12 nodes, 150 requests: a couple of workload lifetimes, well under a second per run."""
    workload = WorkloadConfig(requests=150, rate=1.0, lifetime_mean=30.0, seed=3)
    fields: dict[str, object] = {"nodes": 12, "workload": workload, "seed": 3, "samples": 40}
    fields.update(overrides)
    return SimConfig(**fields)


def run(
    config: SimConfig, policy: str = "berth", check: bool = True
) -> tuple[SimResult, Simulation]:
    simulation = Simulation(config, policy, check_invariants=check)
    return simulation.run(), simulation


# -- determinism ------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(POLICIES))
def test_same_seed_same_placements(policy: str) -> None:
    first, _ = run(small(), policy, check=False)
    second, _ = run(small(), policy, check=False)
    assert first.placements() == second.placements()
    assert first.pulls == second.pulls
    assert np.array_equal(first.utilisation, second.utilisation)
    assert [d.start_latency for d in first.decisions] == [d.start_latency for d in second.decisions]


def test_another_seed_gives_another_run() -> None:
    first, _ = run(small(), check=False)
    other = small(
        seed=4, workload=WorkloadConfig(requests=150, rate=1.0, lifetime_mean=30.0, seed=4)
    )
    second, _ = run(other, check=False)
    assert first.placements() != second.placements()


def test_placements_do_not_depend_on_python_hash_randomisation(tmp_path: Path) -> None:
    """Layer sets are frozensets; nothing may depend on their iteration order."""
    script = (
        "import json, sys\n"
        "from berth.sim.simulator import SimConfig, Simulation\n"
        "from berth.sim.workload import WorkloadConfig\n"
        "config = SimConfig(nodes=8, seed=1, concurrency=2, staleness=2.0, "
        "workload=WorkloadConfig(requests=80, rate=2.0, lifetime_mean=20.0, seed=1))\n"
        "out = {name: Simulation(config, name).run().placements() for name in sys.argv[1:]}\n"
        "print(json.dumps(out))\n"
    )
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", script, "seed", "kube", "berth"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        outputs.append(json.loads(done.stdout))
    assert outputs[0] == outputs[1]


# -- safety: hard budgets, releases, layer refcounts -------------------------------------------


@pytest.mark.parametrize("policy", list(POLICIES))
def test_budgets_hold_at_every_event_and_everything_is_released(policy: str) -> None:
    # Overloaded and stale, so nodes fill up, refuse and race: the budget must still hold.
    config = small(
        nodes=6,
        concurrency=3,
        staleness=3.0,
        workload=WorkloadConfig(requests=200, rate=4.0, lifetime_mean=40.0, seed=5),
    )
    result, simulation = run(config, policy, check=True)  # checks every touched node per event
    assert sum(d.outcome == "no_capacity" for d in result.decisions) > 0
    for node in simulation.nodes.values():
        limits = node.budget.limits
        headroom = node.budget.headroom()
        assert (headroom.mem_free, headroom.disk_free) == (limits.mem_max, limits.disk_max)
        assert node.budget.reservations() == []
        assert node.layers.mounted() == frozenset()
        assert node.runtime.list() == ()
        assert node.layers.cached_bytes <= simulation.info[node.name].cache_bytes
    placed = [d for d in result.decisions if d.placed]
    assert placed and all(d.ends_at is not None and d.ends_at <= result.end_time for d in placed)
    peak = result.utilisation.max()
    assert 0 < peak <= 1.0


def test_the_invariant_check_catches_an_untracked_reservation() -> None:
    simulation = Simulation(small(), "seed")
    name, node = next(iter(simulation.nodes.items()))
    simulation.check(name)
    lease = Lease(60.0, node.budget.clock)
    node.budget.reserve(Spec(vcpus=1, mem=GiB, disk=GiB), lease)  # behind the simulator's back
    with pytest.raises(InvariantViolated, match="1 reservations for 0 workloads"):
        simulation.check(name)
    lease.end()
    simulation.check(name)


def test_the_invariant_check_catches_a_stray_mount() -> None:
    simulation = Simulation(small(), "seed")
    name, node = next(iter(simulation.nodes.items()))
    node.layers.mount("stray", 10)  # no workload holds it
    with pytest.raises(InvariantViolated, match="mounted layers differ"):
        simulation.check(name)


def test_every_node_is_a_node_core_with_the_simulated_load_model() -> None:
    # The simulator's nodes are the agent's core (one snapshot, one wiring); only the load
    # model — reserved sums — is the simulator's, plugged in as the budget's readings.
    simulation = Simulation(small(), "seed")
    name, node = next(iter(simulation.nodes.items()))
    assert isinstance(node, NodeCore)
    assert node.platform == Platform.parse(simulation.info[name].platform)
    lease = Lease(60.0, node.budget.clock)
    cores = node.budget.limits.cpu_capacity
    node.budget.reserve(Spec(vcpus=2, mem=GiB, disk=GiB, net_bw=1000), lease)
    state = node.snapshot(5.0)
    assert state.cpu_load == pytest.approx(2 / cores)
    assert state.net_bw_load == 1000 and state.published_at == 5.0
    assert state.admitted == 1 and state.generation == 2  # the initial snapshot was 1
    lease.end()
    assert node.snapshot(6.0).cpu_load == 0.0


def test_a_simulation_runs_once() -> None:
    simulation = Simulation(small(), "seed")
    simulation.run()
    with pytest.raises(Invalid):
        simulation.run()


# -- the simulator really uses the policy it is given --------------------------------------------


class LastNameFirst:
    """Test policy: fitting nodes in reverse name order."""

    name = "last-name-first"

    def order(self, view: ClusterView, request: PlacementRequest) -> Slots:
        by_name = view.name_order
        return by_name[request.fit[by_name]][::-1]


def last_name_first(seed: SeedLike) -> Policy:
    return LastNameFirst()


def test_swapping_the_policy_changes_the_outcome() -> None:
    arrivals = generate_workload(small().workload)
    results = {
        name: Simulation(small(), name, arrivals).run() for name in ("seed", "spread", "berth")
    }
    assert results["seed"].placements() != results["spread"].placements()
    assert results["seed"].placements() != results["berth"].placements()
    custom = Simulation(small(), last_name_first, arrivals).run()
    assert custom.policy == "last-name-first"
    first = custom.decisions[0]
    platform = first.platform
    serving = sorted(info.name for info, _ in layout(small()) if info.platform == platform)
    assert first.node == serving[-1]  # an empty cluster: the last node by name fits
    assert results["seed"].decisions[0].node == serving[0]


# -- staleness and concurrency -----------------------------------------------------------------


def test_stale_concurrent_schedulers_collide_and_fresh_ones_do_not() -> None:
    busy = WorkloadConfig(requests=200, rate=3.0, lifetime_mean=30.0, seed=2)
    fresh, _ = run(small(workload=busy), "seed", check=False)
    assert sum(len(d.refusals) for d in fresh.decisions) == 0
    stale, _ = run(small(workload=busy, concurrency=4, staleness=5.0), "seed", check=False)
    refusals = [reason for d in stale.decisions for _, reason in d.refusals]
    assert len(refusals) > 0
    assert set(refusals) <= {"mem_exhausted", "disk_exhausted", "cpu_saturated"}
    assert {d.scheduler for d in stale.decisions} == {0, 1, 2, 3}  # round-robin


def test_staleness_alone_produces_refusals_at_confirmation() -> None:
    busy = WorkloadConfig(requests=200, rate=3.0, lifetime_mean=30.0, seed=2)
    stale, _ = run(small(workload=busy, staleness=5.0, assume=False), "binpack", check=False)
    assert sum(len(d.refusals) for d in stale.decisions) > 0


def test_the_assume_cache_removes_a_lone_schedulers_own_collisions() -> None:
    # One scheduler, 5 s stale: without assuming its own placements it collides with itself;
    # with them, its view is exact except for releases, which only make it more cautious.
    busy = WorkloadConfig(requests=200, rate=3.0, lifetime_mean=30.0, seed=2)
    assumed, _ = run(small(workload=busy, staleness=5.0), "binpack", check=False)
    blind, _ = run(small(workload=busy, staleness=5.0, assume=False), "binpack", check=False)
    assert sum(len(d.refusals) for d in assumed.decisions) == 0
    assert sum(len(d.refusals) for d in blind.decisions) > 0


# -- outcomes, pulls and the lower bound ---------------------------------------------------------


def test_unserved_platforms_end_in_no_matching_platform() -> None:
    windows = WorkloadConfig(
        requests=20, rate=1.0, lifetime_mean=10.0, platforms=("windows/amd64",)
    )
    config = small(node_platforms={"linux/amd64": 1.0}, workload=windows)
    result, _ = run(config, "berth")
    assert {d.outcome for d in result.decisions} == {"no_matching_platform"}
    report = build_report({"berth": result})
    assert report.unserved_platforms == {"windows/amd64": 20}
    assert report.metrics["berth"].no_matching_platform == 20


def test_pulls_add_up_and_respect_the_lower_bound() -> None:
    arrivals = generate_workload(small().workload)
    images = {image.name: image for image in load_dockerhub().images}
    for name in ("seed", "berth"):
        result = Simulation(small(), name, arrivals).run()
        placed = [d for d in result.decisions if d.placed]
        distinct: dict[str, int] = {}
        for decision in placed:
            image = images[decision.image]
            assert decision.pulled_bytes + decision.local_bytes == image.size
            assert decision.start_latency is not None
            assert decision.start_latency >= small().boot_seconds
            for layer in image.layers:
                distinct[layer.id] = layer.size
        assert result.lower_bound_bytes == sum(distinct.values())
        assert result.pulled_bytes == sum(d.pulled_bytes for d in placed)
        assert result.pulled_bytes >= result.lower_bound_bytes
        totals = [total for _, total in result.pulls]
        assert totals == sorted(totals)


def test_pull_time_is_bytes_over_bandwidth() -> None:
    config = small(  # only the node's link limits: no latency, registry and unpacking free
        pull_bandwidth=10_000_000,
        boot_seconds=0.5,
        layer_latency=0.0,
        registry_bandwidth=10**15,
        unpack_bandwidth=10**15,
    )
    result, _ = run(config, "seed")
    first = result.decisions[0]
    assert first.placed and first.local_bytes == 0  # an empty cluster pulls everything
    assert first.start_latency == pytest.approx(first.pulled_bytes / 10_000_000 + 0.5)


def test_a_full_cluster_refuses_for_capacity() -> None:
    tiny = (
        NodeClass(name="one", mem="1GiB", disk="64GiB", cpus=4, disk_bw="1GiBps", net_bw="1GiBps"),
    )
    flood = WorkloadConfig(requests=40, rate=10.0, lifetime_mean=100.0, seed=1)
    result, _ = run(
        small(nodes=2, node_classes=tiny, workload=flood, node_platforms={"linux/amd64": 1})
    )
    outcomes = [d.outcome for d in result.decisions]
    assert "no_capacity" in outcomes and "placed" in outcomes


# -- configuration -----------------------------------------------------------------------------


def test_layout_splits_classes_and_platforms_by_weight() -> None:
    nodes = layout(SimConfig(nodes=100))
    classes = sorted(info.node_class for info, _ in nodes)
    platforms = sorted(info.platform for info, _ in nodes)
    assert (classes.count("small"), classes.count("medium"), classes.count("large")) == (50, 30, 20)
    assert platforms.count("linux/amd64") == 92
    assert platforms.count("linux/arm64/v8") == 4 and platforms.count("windows/amd64") == 4
    assert [info.name for info, _ in nodes][:2] == ["node-000", "node-001"]
    assert layout(SimConfig(nodes=100)) == nodes


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"nodes": 0}, "nodes"),
        ({"staleness": -1.0}, "staleness"),
        ({"concurrency": 0}, "concurrency"),
        ({"cache_bytes": "12XB"}, "cache_bytes"),
        ({"node_platforms": {"linux/amd46": 1.0}}, "node_platforms"),
        ({"node_platforms": {"linux/amd64": 0.0}}, "node_platforms"),
    ],
)
def test_bad_configs_are_invalid(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(Invalid) as error:
        SimConfig(**overrides)
    assert (error.value.field or "").startswith(field)


def test_unknown_policy_is_rejected_before_any_work() -> None:
    with pytest.raises(Invalid) as error:
        Simulation(small(), "nope")
    assert error.value.field == "policy"


# -- the report ----------------------------------------------------------------------------------


def test_report_json_and_plots(tmp_path: Path) -> None:
    config = small()
    results = simulate_policies(config, ["seed", "berth"])
    report = write_outputs(results, tmp_path)
    document = json.loads((tmp_path / "report.json").read_text())
    assert list(document) == [
        "scenario",
        "regime",
        "config",
        "definitions",
        "unserved_platforms",
        "policies",
        "goals",
        "plots",
    ]
    assert list(document["policies"]) == ["seed", "berth"]
    metrics = document["policies"]["berth"]
    for key in (
        "placed",
        "refused_no_capacity",
        "refused_at_confirmation",
        "no_matching_platform",
        "bytes_pulled",
        "lower_bound_bytes",
        "pull_ratio",
        "start_latency_p50_s",
        "start_latency_p99_s",
        "node_utilisation_std",
        "node_utilisation_cv",
        "decision_latency_p50_ms",
        "decision_latency_p99_ms",
    ):
        assert key in metrics
    assert metrics["pull_ratio"] == pytest.approx(
        metrics["bytes_pulled"] / metrics["lower_bound_bytes"]
    )
    assert document["config"]["nodes"] == 12
    assert document["regime"]["name"] == "moderate"
    assert metrics["pull_ratio_capacity"] == pytest.approx(
        metrics["bytes_pulled"] / metrics["capacity_bound_bytes"]
    )
    assert all("met" in goal and "missed_by" in goal for goal in document["goals"].values())
    for name in ("bytes_pulled.png", "utilisation.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert report.metrics["seed"].placed == metrics["placed"]
