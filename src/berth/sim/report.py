"""Metrics, the comparison table, ``report.json`` and plots from simulated runs.

This module owns turning :class:`~berth.sim.simulator.SimResult` values into what people
compare policies by — it runs nothing and decides nothing.  Every figure is defined here, next
to the code that computes it:

* **placed / refused_no_capacity / no_matching_platform** — arrivals by outcome.  A request
  refused for capacity is dropped (never retried); ``no_matching_platform`` counts requests
  for platforms no node runs, the same for every policy on the same cluster.
* **refused_at_confirmation** — node refusals during the walk of the candidates (a stale
  snapshot said the node fitted; its budget said no), whether or not another node then
  accepted; ``requests_with_refusals`` counts the decisions that saw at least one.
* **bytes_pulled** against **lower_bound_bytes** = Σ sizes of the distinct layers among the
  policy's placed requests: every node starts empty, so each such layer is pulled at least
  once somewhere, whatever the policy.  ``pull_ratio = bytes_pulled / lower_bound_bytes``
  (1.0 is perfect).  ``bytes_pulled_per_placed`` compares runs that placed different counts.
* **start latency** p50/p99 — modelled: time from arrival until the layers the workload needs
  are on the node (its own pulls at the configured bandwidth, or another workload's pull still
  in flight) plus the fixed boot time; placed requests only.
* **utilisation** — memory reserved / memory total, sampled at evenly spaced times over the
  arrival window: ``cluster_utilisation`` is the cluster-wide fraction (Σ reserved / Σ total)
  averaged over samples; ``node_utilisation_std`` and ``node_utilisation_cv`` (std / mean) are
  the spread *across nodes* of each node's fraction, averaged over samples — high means hot
  spots next to idle nodes.
* **decision latency** p50/p99 — wall-clock time of the real ``ClusterScheduler.schedule``
  call (ranking, policy, walk and in-process admission), measured with ``perf_counter``.

Outputs: a rich table, ``report.json`` (stable keys: ``config``, ``definitions``,
``policies`` → metrics, ``goals``, ``plots``) and two PNGs drawn with matplotlib's Agg backend:
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

from berth.sim.simulator import SimConfig, SimResult

__all__ = [
    "DEFINITIONS",
    "PolicyMetrics",
    "Report",
    "build_report",
    "comparison_table",
    "plot_bytes_pulled",
    "plot_utilisation",
    "write_outputs",
]

DEFINITIONS: Mapping[str, str] = {
    "lower_bound_bytes": (
        "sum of sizes of the distinct layers among the policy's placed requests: every node "
        "starts empty, so each is pulled at least once"
    ),
    "pull_ratio": "bytes_pulled / lower_bound_bytes (1.0 is optimal)",
    "refused_at_confirmation": (
        "node refusals during candidate walks (stale snapshot said it fits, the node's budget "
        "refused), whether or not the request was then placed elsewhere"
    ),
    "start_latency": "modelled: wait for the needed layers (pull at pull_bandwidth) + boot",
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
    no_matching_platform: int
    refused_at_confirmation: int
    requests_with_refusals: int
    refused_but_placed_by_another: int
    bytes_pulled: int
    lower_bound_bytes: int
    pull_ratio: float | None
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
        return cls(
            policy=result.policy,
            requests=len(decisions),
            placed=len(placed),
            refused_no_capacity=sum(d.outcome == "no_capacity" for d in decisions),
            no_matching_platform=sum(d.outcome == "no_matching_platform" for d in decisions),
            refused_at_confirmation=sum(len(d.refusals) for d in decisions),
            requests_with_refusals=sum(bool(d.refusals) for d in decisions),
            refused_but_placed_by_another=refused_but_placed_by_another,
            bytes_pulled=pulled,
            lower_bound_bytes=bound,
            pull_ratio=pulled / bound if bound else None,
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
    """Per-policy metrics of runs on the same workload, the goals checked, the config."""

    config: SimConfig
    metrics: dict[str, PolicyMetrics]
    unserved_platforms: dict[str, int]
    goals: dict[str, Any]
    plots: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.model_dump(mode="json"),
            "definitions": dict(DEFINITIONS),
            "unserved_platforms": dict(sorted(self.unserved_platforms.items())),
            "policies": {name: asdict(metrics) for name, metrics in self.metrics.items()},
            "goals": self.goals,
            "plots": self.plots,
        }


def _goals(metrics: Mapping[str, PolicyMetrics]) -> dict[str, Any]:
    """The issue's goals for the ``berth`` policy, each with its figures and verdict."""
    berth = metrics.get("berth")
    if berth is None or berth.requests == 0:
        return {}
    refused = [m.refused_no_capacity / m.requests for m in metrics.values() if m.requests]
    regime = (
        "moderate"
        if max(refused) == 0
        else "overload"
        if sum(refused) / len(refused) >= 0.3
        else "loaded"
    )
    goals: dict[str, Any] = {"regime": regime}
    seed, kube = metrics.get("seed"), metrics.get("kube")
    if seed is not None and seed.bytes_pulled:
        share = berth.bytes_pulled / seed.bytes_pulled
        if regime == "overload":
            goals["fewer_bytes_than_seed"] = {"berth_over_seed": share, "met": share < 1}
        else:
            goals["at_most_half_of_seed"] = {"berth_over_seed": share, "met": share <= 0.5}
    if berth.pull_ratio is not None and regime != "overload":
        goals["within_1_5x_lower_bound"] = {
            "pull_ratio": berth.pull_ratio,
            "met": berth.pull_ratio <= 1.5,
        }
    if regime == "overload":
        if kube is not None:
            goals["refuses_no_more_than_kube"] = {
                "berth": berth.refused_no_capacity,
                "kube": kube.refused_no_capacity,
                "met": berth.refused_no_capacity <= kube.refused_no_capacity,
            }
    elif len(metrics) > 1:
        goals["refuses_nothing_another_places"] = {
            "count": berth.refused_but_placed_by_another,
            "met": berth.refused_but_placed_by_another == 0,
        }
    return goals


def build_report(
    results: Mapping[str, SimResult], plots: Mapping[str, str] | None = None
) -> Report:
    """Metrics for every run (same workload), cross-policy refusals and the goals."""
    placed_by: dict[str, set[int]] = {
        name: {d.index for d in result.decisions if d.placed} for name, result in results.items()
    }
    metrics: dict[str, PolicyMetrics] = {}
    unserved: dict[str, int] = {}
    config: SimConfig | None = None
    for name, result in results.items():
        config = config or result.config
        others: set[int] = set().union(*(s for other, s in placed_by.items() if other != name))
        refused = {d.index for d in result.decisions if d.outcome == "no_capacity"}
        metrics[name] = PolicyMetrics.of(result, len(refused & others))
        if not unserved:
            for decision in result.decisions:
                if decision.outcome == "no_matching_platform":
                    unserved[decision.platform] = unserved.get(decision.platform, 0) + 1
    return Report(
        config=config or SimConfig(),
        metrics=metrics,
        unserved_platforms=unserved,
        goals=_goals(metrics),
        plots=dict(plots or {}),
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
        "×LB",
        "start s\np50/p99",
        "util\nstd/CV",
        "decide ms\np50/p99",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, m in report.metrics.items():
        table.add_row(
            name,
            str(m.placed),
            f"{m.refused_no_capacity}/{m.refused_at_confirmation}",
            _gb(m.bytes_pulled),
            _num(m.pull_ratio, ".2f"),
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
            f"refused cap/conf: for lack of capacity / refusals at confirmation.  ×LB: pulled "
            f"over the lower bound, {span} GB of distinct layers among placed requests.  Memory "
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
            bound = max(bound, result.lower_bound_bytes)
        if bound:
            axes.axhline(bound / 1e9, color="grey", linestyle="--", label="lower bound")
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


def write_outputs(results: Mapping[str, SimResult], out: Path) -> Report:
    """Write ``report.json``, ``bytes_pulled.png`` and ``utilisation.png`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    plots = {
        "bytes_pulled": str(plot_bytes_pulled(results, out / "bytes_pulled.png")),
        "utilisation": str(plot_utilisation(results, out / "utilisation.png")),
    }
    report = build_report(results, plots)
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return report
