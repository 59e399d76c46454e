"""The scenario suite: every scenario runs (quick), writes its report with goals, and the
regime comes from the offered load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from berth.errors import Invalid
from berth.sim.goals import regime_of
from berth.sim.scenarios import SCENARIOS, run_scenario, scenario
from tests.helpers import sim_app

runner = CliRunner()
REQUIRED = {"default", "overload", "stale", "bursty", "multi-arch", "heterogeneous", "large"}
GOAL_KEYS = {
    "bytes_vs_seed",
    "capacity_bound",
    "refusals_vs_others",
    "avoidable_refusals",
    "start_p99",
}


def test_the_suite_has_the_issues_scenarios_at_their_sizes() -> None:
    assert set(SCENARIOS) >= REQUIRED
    large = SCENARIOS["large"].config
    assert large.nodes >= 1000 and large.workload.requests >= 20_000
    stale = SCENARIOS["stale"].config
    assert (stale.concurrency, stale.staleness) == (4, 5.0)
    multi = SCENARIOS["multi-arch"].config
    assert len(multi.node_platforms) >= 2 and len(multi.workload.multi_platform) >= 2
    assert len({c.mem for c in SCENARIOS["heterogeneous"].config.node_classes}) >= 3


def test_regimes_are_judged_from_the_offered_load() -> None:
    assert regime_of(SCENARIOS["default"].config).name == "moderate"
    assert regime_of(SCENARIOS["overload"].config).name == "overload"
    bursty = regime_of(SCENARIOS["bursty"].config)
    assert bursty.name == "loaded" and bursty.peak_offered_load > bursty.offered_load
    for each in SCENARIOS.values():  # the quick form keeps the load, hence the regime
        assert regime_of(each.quick().config).name == regime_of(each.config).name == each.intent


def test_unknown_scenarios_are_invalid() -> None:
    with pytest.raises(Invalid) as error:
        scenario("nope")
    assert error.value.field == "scenario" and "default" in error.value.message


def test_quick_suite_writes_a_report_per_scenario_with_goals(tmp_path: Path) -> None:
    result = runner.invoke(
        sim_app(), ["sim", "--scenario", "all", "--quick", "--quiet", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.stderr
    for name in SCENARIOS:
        document = json.loads((tmp_path / name / "report.json").read_text())
        assert document["scenario"]["name"] == name
        assert document["regime"]["name"] == SCENARIOS[name].intent
        assert set(document["goals"]) == GOAL_KEYS
        for goal in document["goals"].values():
            assert {"met", "figure", "target", "missed_by"} <= set(goal)
            assert goal["met"] == (goal["missed_by"] == 0)
        for policy, metrics in document["policies"].items():
            assert metrics["bytes_pulled"] >= metrics["capacity_bound_bytes"], (name, policy)
            assert metrics["capacity_bound_bytes"] >= metrics["lower_bound_bytes"], (name, policy)
    table = (tmp_path / "suite.md").read_text()
    assert all(f"| {name} |" in table for name in SCENARIOS)
    assert set(json.loads((tmp_path / "suite.json").read_text())) == set(SCENARIOS)


def test_one_scenario_writes_into_out_itself(tmp_path: Path) -> None:
    result = runner.invoke(
        sim_app(),
        [
            "sim",
            "--scenario",
            "stale",
            "--quick",
            "--quiet",
            "--policy",
            "seed,berth",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads((tmp_path / "report.json").read_text())
    assert list(document["policies"]) == ["seed", "berth"]
    assert document["config"]["concurrency"] == 4


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--scenario", "nope"], "--scenario"),
        (["--scenario", "default", "--nodes", "5"], "--nodes"),
        (["--scenario", "default", "--no-assume"], "--no-assume"),
        (["--quick"], "--quick"),
    ],
)
def test_bad_scenario_flags_are_one_line(tmp_path: Path, flags: list[str], named: str) -> None:
    result = runner.invoke(sim_app(), ["sim", *flags, "--quiet", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert named in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "report.json").exists()


def test_run_scenario_is_usable_as_a_library() -> None:
    results, report = run_scenario(scenario("default", quick=True), ["seed", "berth"])
    assert set(results) == {"seed", "berth"} and set(report.metrics) == {"seed", "berth"}
    assert report.scenario is not None and report.scenario["name"] == "default"
