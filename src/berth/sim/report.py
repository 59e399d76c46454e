"""The comparison table, ``report.json`` and plots from simulated runs, and their goals.

This module owns turning runs into what people compare policies by — it runs nothing and
decides nothing: each policy's figures are :class:`~berth.sim.metrics.PolicyMetrics` (every
figure defined there, next to the code that computes it), the goals are
:mod:`berth.sim.goals`'s.

Outputs: a rich table, ``report.json`` (stable keys: ``scenario``, ``regime``, ``config``,
``definitions``, ``policies`` → metrics, ``goals`` — see :mod:`berth.sim.goals` — and
``plots``) and two PNGs drawn with matplotlib's Agg backend:
``bytes_pulled.png`` (cumulative bytes pulled over simulated time, per policy, with the lower
bound) and ``utilisation.png`` (distribution of node memory utilisation, per policy).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.table import Table

from berth.sim.goals import GOALS, Regime, check_goals, regime_of
from berth.sim.metrics import DEFINITIONS, PolicyMetrics
from berth.sim.simulator import SimConfig, SimResult

__all__ = [
    "Report",
    "build_report",
    "comparison_table",
    "plot_bytes_pulled",
    "plot_utilisation",
    "suite_markdown",
    "suite_table",
    "write_outputs",
]


@dataclass(frozen=True)
class Report:
    """Per-policy metrics of runs on the same workload, the goals checked, the config.

    ``scenario`` names the scenario (:mod:`berth.sim.scenarios`) and says what it is for;
    ``regime`` is judged from the offered load (:func:`berth.sim.goals.regime_of`).
    """

    config: SimConfig
    metrics: dict[str, PolicyMetrics]
    unserved_platforms: dict[str, int]
    goals: dict[str, Any]
    plots: dict[str, str]
    regime: Regime | None = None
    scenario: dict[str, str] | None = None

    @property
    def goals_met(self) -> tuple[int, int]:
        """(goals met, goals checked)."""
        checked = [goal for goal in self.goals.values() if isinstance(goal, dict)]
        return sum(bool(goal["met"]) for goal in checked), len(checked)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "regime": None if self.regime is None else self.regime.to_dict(),
            "config": self.config.model_dump(mode="json"),
            "definitions": dict(DEFINITIONS) | {f"goal.{k}": v for k, v in GOALS.items()},
            "unserved_platforms": dict(sorted(self.unserved_platforms.items())),
            "policies": {name: asdict(metrics) for name, metrics in self.metrics.items()},
            "goals": self.goals,
            "plots": self.plots,
        }


def build_report(
    results: Mapping[str, SimResult],
    plots: Mapping[str, str] | None = None,
    scenario: Mapping[str, str] | None = None,
) -> Report:
    """Metrics for every run (same workload), cross-policy refusals, the regime and the goals
    (:mod:`berth.sim.goals`); ``scenario`` (name, regime statement) is carried into it."""
    placed_by: dict[str, set[int]] = {
        name: {d.index for d in result.decisions if d.placed} for name, result in results.items()
    }
    metrics: dict[str, PolicyMetrics] = {}
    unserved: dict[str, int] = {}
    config: SimConfig | None = None
    for name, result in results.items():
        config = config or result.config
        others: set[int] = set().union(*(s for other, s in placed_by.items() if other != name))
        refused = {d.index for d in result.decisions if d.refused}
        metrics[name] = PolicyMetrics.of(result, len(refused & others))
        if not unserved:
            for decision in result.decisions:
                if decision.outcome == "no_matching_platform":
                    unserved[decision.platform] = unserved.get(decision.platform, 0) + 1
    config = config or SimConfig()
    regime = regime_of(config)
    return Report(
        config=config,
        metrics=metrics,
        unserved_platforms=unserved,
        goals=check_goals(metrics, regime),
        plots=dict(plots or {}),
        regime=regime,
        scenario=dict(scenario) if scenario is not None else None,
    )


def _gb(value: float) -> str:
    return f"{value / 1e9:.2f}"


def _num(value: float | None, spec: str) -> str:
    return "–" if value is None or math.isnan(value) else format(value, spec)


def comparison_table(report: Report, title: str = "policy comparison") -> Table:
    """The rich table of every policy's headline figures (fits an 80-column terminal)."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in (
        "policy",
        "placed",
        "refused\ncap/conf",
        "pulled\nGB",
        "×LB\ndist/cap",
        "start s\np50/p99",
        "util\nstd/CV",
        "decide ms\np50/p99",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, m in report.metrics.items():
        table.add_row(
            name,
            str(m.placed),
            f"{m.refused}/{m.refused_at_confirmation}",
            _gb(m.bytes_pulled),
            f"{_num(m.pull_ratio, '.2f')}/{_num(m.pull_ratio_capacity, '.2f')}",
            f"{_num(m.start_latency_p50_s, '.2f')}/{_num(m.start_latency_p99_s, '.1f')}",
            f"{m.node_utilisation_std:.2f}/{m.node_utilisation_cv:.1f}",
            f"{_num(m.decision_latency_p50_ms, '.2f')}/{_num(m.decision_latency_p99_ms, '.2f')}",
        )
    metrics = list(report.metrics.values())
    if metrics:
        bounds = {m.lower_bound_bytes for m in metrics}
        low, high = min(bounds), max(bounds)
        span = _gb(low) if low == high else f"{_gb(low)}–{_gb(high)}"
        utilisation = sum(m.cluster_utilisation for m in metrics) / len(metrics)
        table.caption_justify = "left"
        table.caption = (
            f"refused cap/conf: for lack of capacity (incl. gave up) / refusals at "
            f"confirmation.  ×LB dist/cap: pulled over the every-distinct-layer-once bound "
            f"({span} GB) / over the capacity-aware bound of the same run.  Memory "
            f"reserved: {utilisation:.0%} on average; util std/CV: its spread across nodes."
        )
    return table


def plot_bytes_pulled(results: Mapping[str, SimResult], path: Path) -> Path:
    """Cumulative bytes pulled over simulated time, one line per policy, with the bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.5), dpi=110)
    try:
        bound = 0
        for name, result in results.items():
            times = [0.0] + [at for at, _ in result.pulls] + [result.end_time]
            totals = [0] + [total for _, total in result.pulls] + [result.pulled_bytes]
            axes.step(times, np.array(totals) / 1e9, where="post", label=name)
            bound = max(bound, result.capacity_bound_bytes)
        if bound:
            axes.axhline(
                bound / 1e9, color="grey", linestyle="--", label="capacity-aware bound (largest)"
            )
        axes.set_xlabel("simulated time (s)")
        axes.set_ylabel("bytes pulled (GB, cumulative)")
        axes.set_title("Layer bytes pulled per policy")
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(path)
    finally:
        plt.close(figure)
    return path


def plot_utilisation(results: Mapping[str, SimResult], path: Path) -> Path:
    """Distribution of per-node memory utilisation (all samples) per policy, as box plots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=110)
    try:
        names = list(results)
        data = [results[name].utilisation.ravel() for name in names]
        axes.boxplot(data, whis=(5, 95), showfliers=False, showmeans=True)
        axes.set_xticks(range(1, len(names) + 1), names)
        axes.set_ylabel("node memory reserved / total")
        axes.set_ylim(-0.02, 1.02)
        axes.set_title("Per-node memory utilisation over the arrival window (whiskers 5–95 %)")
        axes.grid(axis="y", alpha=0.3)
        figure.tight_layout()
        figure.savefig(path)
    finally:
        plt.close(figure)
    return path


def write_outputs(
    results: Mapping[str, SimResult],
    out: Path,
    scenario: Mapping[str, str] | None = None,
    *,
    plots: bool = True,
) -> Report:
    """Write ``report.json`` (and, with ``plots``, ``bytes_pulled.png`` and
    ``utilisation.png``) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    drawn = (
        {
            "bytes_pulled": str(plot_bytes_pulled(results, out / "bytes_pulled.png")),
            "utilisation": str(plot_utilisation(results, out / "utilisation.png")),
        }
        if plots
        else {}
    )
    report = build_report(results, drawn, scenario)
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return report


def _suite_rows(reports: Mapping[str, Report]) -> list[list[str]]:
    rows: list[list[str]] = []
    for name, report in reports.items():
        met, checked = report.goals_met
        regime = report.regime.name if report.regime else "–"
        for policy, m in report.metrics.items():
            goals = f"{met}/{checked}" if policy == "berth" and checked else ""
            p99 = m.start_latency_p99_s
            rows.append(
                [
                    name,
                    regime,
                    policy,
                    _gb(m.bytes_pulled),
                    _num(m.pull_ratio, ".2f"),
                    _num(m.pull_ratio_capacity, ".2f"),
                    f"{m.refused} ({m.avoidable_refusals})",
                    _num(p99, ".2f"),
                    goals,
                ]
            )
    return rows


_SUITE_COLUMNS = (
    "scenario",
    "regime",
    "policy",
    "pulled GB",
    "x distinct LB",
    "x capacity LB",
    "refused (avoidable)",
    "start p99 s",
    "berth goals met",
)


def suite_table(reports: Mapping[str, Report]) -> Table:
    """Every scenario x policy of a suite run in one rich table."""
    table = Table(title="scenario suite", title_justify="left", box=box.SIMPLE_HEAD)
    for column in _SUITE_COLUMNS:
        table.add_column(column, justify="left" if column in _SUITE_COLUMNS[:3] else "right")
    for row in _suite_rows(reports):
        table.add_row(*row)
    return table


def suite_markdown(reports: Mapping[str, Report]) -> str:
    """The suite table as Markdown, then every missed goal of ``berth`` with its figures."""
    lines = [
        "| " + " | ".join(_SUITE_COLUMNS) + " |",
        "|" + "|".join("---" for _ in _SUITE_COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _suite_rows(reports)]
    misses = [
        f"- {name}: {goal} — {value['figure']:.4g} {value['unit']} against a target of "
        f"{value['target']:.4g} (missed by {value['missed_by']:.4g})"
        for name, report in reports.items()
        for goal, value in report.goals.items()
        if isinstance(value, dict) and not value["met"]
    ]
    if misses:
        lines += ["", "Goals missed by berth:", "", *misses]
    return "\n".join(lines) + "\n"
