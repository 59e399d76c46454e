"""Metrics, the comparison table, ``report.json`` and plots from simulated runs.

This module owns turning :class:`~berth.sim.simulator.SimResult` values into what people
compare policies by — it runs nothing and decides nothing.  Every figure is defined here, next
to the code that computes it:

* **placed / refused_no_capacity / gave_up / no_matching_platform** — arrivals by outcome.
  A request refused for capacity (the scheduler's view had no node, or every node it tried
  refused) or given up (``max_refusals`` refusals) is dropped, never retried; ``refused`` is
  the two together; ``no_matching_platform`` counts requests for platforms no node runs, the
  same for every policy on the same cluster.  ``avoidable_refusals`` counts refused requests
  that a node could have held right then without displacing anything (the simulator's
  counterfactual against the nodes' true state).
* **refused_at_confirmation** — node refusals during the walk of the candidates (a stale
  snapshot said the node fitted; its budget said no), whether or not another node then
  accepted; ``requests_with_refusals`` counts the decisions that saw at least one.
* **bytes_pulled** against two lower bounds of the same run (:mod:`berth.sim.bounds`):
  ``lower_bound_bytes`` — every distinct layer pulled once — and ``capacity_bound_bytes`` —
  a layer in use at once by requests holding M bytes of memory is on at least as many nodes
  of that platform as it takes, largest first, to hold M (≥ ⌈M / largest node memory⌉).
  ``pull_ratio`` divides by the first, ``pull_ratio_capacity`` by the second (1.0 is the
  best possible; the capacity bound is the tighter, so its ratio is the smaller and the
  fairer).  ``bytes_pulled_per_placed`` compares runs that placed different counts.
* **start latency** p50/p99 — modelled: time from arrival until the layers the workload needs
  are unpacked on the node (refusal round trips, pulls through the node's and the registry's
  shared bandwidth, unpacking, or another workload's pull still in flight) plus the fixed
  boot time; placed requests only.
* **utilisation** — memory reserved / memory total, sampled at evenly spaced times over the
  arrival window: ``cluster_utilisation`` is the cluster-wide fraction (Σ reserved / Σ total)
  averaged over samples; ``node_utilisation_std`` and ``node_utilisation_cv`` (std / mean) are
  the spread *across nodes* of each node's fraction, averaged over samples — high means hot
  spots next to idle nodes.
* **decision latency** p50/p99 — wall-clock time of the real ``ClusterScheduler.schedule``
  call (ranking, policy, walk and in-process admission), measured with ``perf_counter``.

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
from berth.sim.simulator import SimConfig, SimResult

__all__ = [
    "DEFINITIONS",
    "PolicyMetrics",
    "Report",
    "build_report",
    "comparison_table",
    "plot_bytes_pulled",
    "plot_utilisation",
    "suite_markdown",
    "suite_table",
    "write_outputs",
]

DEFINITIONS: Mapping[str, str] = {
    "lower_bound_bytes": (
        "every distinct layer once: sum of sizes of the distinct layers the policy's placed "
        "requests mounted, less those some node of the platform started with"
    ),
    "capacity_bound_bytes": (
        "capacity-aware: per layer and platform, size x the fewest nodes of the platform "
        "(largest first) whose memory holds the most memory placed requests using the layer "
        "hold at one instant (at least ceil(that memory / largest node memory))"
    ),
    "pull_ratio": "bytes_pulled / lower_bound_bytes (the every-distinct-layer-once bound)",
    "pull_ratio_capacity": "bytes_pulled / capacity_bound_bytes (the capacity-aware bound)",
    "refused": "refused_no_capacity + gave_up: requests not placed for lack of capacity",
    "gave_up": "placements abandoned at the max_refusals-th refusal at confirmation",
    "avoidable_refusals": (
        "refused requests that a node could have held at that moment without displacing "
        "anything (every fit check passed on its true state)"
    ),
    "refused_at_confirmation": (
        "node refusals during candidate walks (stale snapshot said it fits, the node's budget "
        "refused), whether or not the request was then placed elsewhere"
    ),
    "start_latency": (
        "modelled: refusal round trips + pulls (node and registry bandwidth shared, per-layer "
        "latency) + unpacking + boot"
    ),
    "cluster_utilisation": "time-averaged sum of reserved memory / sum of memory",
    "node_utilisation_std": "time-averaged std-dev across nodes of reserved/total memory",
    "node_utilisation_cv": "time-averaged (std / mean) across nodes of reserved/total memory",
    "decision_latency": "wall-clock time of ClusterScheduler.schedule (real code, perf_counter)",
    "refused_but_placed_by_another": (
        "requests this policy refused for capacity that at least one other policy placed"
    ),
}
"""What each reported figure means (also written into ``report.json``)."""


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass(frozen=True)
class PolicyMetrics:
    """One policy's figures (see the module docstring for each definition)."""

    policy: str
    requests: int
    placed: int
    refused_no_capacity: int
    gave_up: int
    refused: int
    avoidable_refusals: int
    no_matching_platform: int
    refused_at_confirmation: int
    requests_with_refusals: int
    refused_but_placed_by_another: int
    bytes_pulled: int
    lower_bound_bytes: int
    capacity_bound_bytes: int
    pull_ratio: float | None
    pull_ratio_capacity: float | None
    bytes_pulled_per_placed: float | None
    start_latency_p50_s: float | None
    start_latency_p99_s: float | None
    cluster_utilisation: float
    node_utilisation_std: float
    node_utilisation_cv: float
    decision_latency_p50_ms: float | None
    decision_latency_p99_ms: float | None
    simulated_seconds: float
    wall_seconds: float

    @classmethod
    def of(cls, result: SimResult, refused_but_placed_by_another: int = 0) -> PolicyMetrics:
        decisions = result.decisions
        placed = [d for d in decisions if d.placed]
        latencies = [d.start_latency for d in placed if d.start_latency is not None]
        decision_ms = [d.decision_seconds * 1000 for d in decisions]
        util = result.utilisation
        mem_max = np.array([node.mem_max for node in result.nodes], dtype=np.float64)
        if util.size:
            cluster = float(((util * mem_max).sum(axis=1) / mem_max.sum()).mean())
            std = util.std(axis=1)
            mean = util.mean(axis=1)
            cv = np.divide(std, mean, out=np.zeros_like(std), where=mean > 0)
            node_std, node_cv = float(std.mean()), float(cv.mean())
        else:
            cluster = node_std = node_cv = 0.0
        pulled, bound = result.pulled_bytes, result.lower_bound_bytes
        capacity = result.capacity_bound_bytes
        return cls(
            policy=result.policy,
            requests=len(decisions),
            placed=len(placed),
            refused_no_capacity=sum(d.outcome == "no_capacity" for d in decisions),
            gave_up=sum(d.outcome == "gave_up" for d in decisions),
            refused=sum(d.refused for d in decisions),
            avoidable_refusals=sum(d.refused and d.could_hold is not None for d in decisions),
            no_matching_platform=sum(d.outcome == "no_matching_platform" for d in decisions),
            refused_at_confirmation=sum(len(d.refusals) for d in decisions),
            requests_with_refusals=sum(bool(d.refusals) for d in decisions),
            refused_but_placed_by_another=refused_but_placed_by_another,
            bytes_pulled=pulled,
            lower_bound_bytes=bound,
            capacity_bound_bytes=capacity,
            pull_ratio=pulled / bound if bound else None,
            pull_ratio_capacity=pulled / capacity if capacity else None,
            bytes_pulled_per_placed=pulled / len(placed) if placed else None,
            start_latency_p50_s=_percentile(latencies, 50),
            start_latency_p99_s=_percentile(latencies, 99),
            cluster_utilisation=cluster,
            node_utilisation_std=node_std,
            node_utilisation_cv=node_cv,
            decision_latency_p50_ms=_percentile(decision_ms, 50),
            decision_latency_p99_ms=_percentile(decision_ms, 99),
            simulated_seconds=result.end_time,
            wall_seconds=result.wall_seconds,
        )


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
            axes.axhline(bound / 1e9, color="grey", linestyle="--",
                         label="capacity-aware bound (largest)")  # fmt: skip
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
