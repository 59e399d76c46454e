"""The placement-quality goals of the ``berth`` policy, and the regime a scenario is judged in.

This module owns two judgements made from a simulated run's figures — nothing here runs a
simulation:

**The regime is the load offered, not an outcome.**  By Little's law a workload keeps, on
average, ``λ · E[lifetime]`` requests alive, holding ``λ · E[lifetime] · E[mem]`` bytes of
memory; over the memory the nodes offer that is the *offered load* ρ.  Bursty arrivals
(:mod:`berth.sim.workload`) add, for the length of a burst ``D_b`` (at most one lifetime),
``(λ_burst − λ) · min(D_b, E[lifetime]) · E[mem]`` on top: the *peak* offered load.
Then::

    moderate   ρ_peak < 0.8        the cluster can hold everything with room to spare
    loaded     ρ < 1 ≤ ρ_peak  or  0.8 ≤ ρ_peak < 1    tight, or over capacity only in bursts
    overload   ρ ≥ 1               more is offered than the cluster holds on average

It is decided before any policy runs, so one policy's refusals cannot move a scenario into
another regime's goals (the earlier checker classified from refusals: a moderate run in
which ``berth`` alone refused a few requests was judged by the overload goals).

**The goals** (issue 12), each checked on every scenario and reported as ``{"met",
"figure", "target", "missed_by", "unit", "rule"}`` — ``missed_by`` is how far the figure is
on the wrong side of the target (0 when met):

* ``bytes_vs_seed`` — ``berth`` pulls ≤ 0.5× the bytes the seed's ordering pulls.  In the
  overload regime the policies place different requests, so bytes *per placed request* are
  compared there;
* ``capacity_bound`` — ``berth`` pulls ≤ 2× its run's capacity-aware lower bound
  (:mod:`berth.sim.bounds`);
* ``refusals_vs_others`` — ``berth`` refuses (no capacity, or gave up after bounded
  refusals) no more requests than any other policy;
* ``avoidable_refusals`` — no ``berth`` refusal while a node could have held the request
  without displacing anything (judged against the nodes' true state at that moment);
* ``start_p99`` — ``berth``'s start-latency p99 is no worse than the best other policy's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from berth.model import INSTANCE_TYPES
from berth.sim.metrics import PolicyMetrics
from berth.sim.simulator import SimConfig, layout

__all__ = ["GOALS", "Regime", "RegimeName", "check_goals", "regime_of"]

RegimeName = Literal["moderate", "loaded", "overload"]

GOALS: Mapping[str, str] = {
    "bytes_vs_seed": "berth pulls <= 0.5x the seed ordering's bytes (per placed, in overload)",
    "capacity_bound": "berth pulls <= 2x the capacity-aware lower bound of its run",
    "refusals_vs_others": "berth refuses no more requests for capacity than any other policy",
    "avoidable_refusals": "no berth refusal while a node could have held it displacing nothing",
    "start_p99": "berth's start-latency p99 is no worse than the best other policy's",
}
"""Every goal by name, with its rule (also written into ``report.json``)."""

MODERATE_BELOW = 0.8
"""Peak offered loads below this are the moderate regime."""


@dataclass(frozen=True)
class Regime:
    """A scenario's offered load and the regime it puts the scenario in (module docstring)."""

    name: RegimeName
    offered_load: float
    peak_offered_load: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "offered_load": self.offered_load,
            "peak_offered_load": self.peak_offered_load,
            "rule": (
                "offered load = rate x mean lifetime x mean request memory / cluster memory; "
                f"moderate: peak < {MODERATE_BELOW}; overload: mean >= 1; loaded: between"
            ),
        }


def regime_of(config: SimConfig) -> Regime:
    """The offered load of ``config`` and its regime (module docstring)."""
    workload = config.workload
    weights = workload.instance_types
    total_weight = sum(weights.values())
    mean_mem = sum(INSTANCE_TYPES[name].mem * w for name, w in weights.items()) / total_weight
    capacity = sum(info.mem_max for info, _ in layout(config))
    rate, lifetime = workload.rate, workload.lifetime_mean
    offered = rate * lifetime * mean_mem / capacity
    peak = offered
    if workload.arrival == "bursty":
        k, f = workload.burst_factor, workload.burst_fraction
        burst_rate = k * rate / (1 - f + f * k)
        burst_seconds = workload.burst_length / rate
        peak += (burst_rate - rate) * min(burst_seconds, lifetime) * mean_mem / capacity
    name: RegimeName
    if offered >= 1:
        name = "overload"
    elif peak < MODERATE_BELOW:
        name = "moderate"
    else:
        name = "loaded"
    return Regime(name, offered, peak)


def _goal(figure: float, target: float, unit: str, rule: str) -> dict[str, Any]:
    missed = max(0.0, figure - target)
    return {
        "met": figure <= target,
        "figure": figure,
        "target": target,
        "missed_by": missed,
        "unit": unit,
        "rule": rule,
    }


def check_goals(metrics: Mapping[str, PolicyMetrics], regime: Regime) -> dict[str, Any]:
    """The goals of the ``berth`` policy on one scenario (module docstring); ``{}`` when
    ``berth`` did not run.  A goal whose comparison policy did not run is left out."""
    berth = metrics.get("berth")
    if berth is None or berth.requests == 0:
        return {}
    others = {name: m for name, m in metrics.items() if name != "berth"}
    goals: dict[str, Any] = {}
    seed = metrics.get("seed")
    if seed is not None and seed.bytes_pulled:
        if regime.name == "overload" and seed.placed and berth.placed:
            figure = (berth.bytes_pulled / berth.placed) / (seed.bytes_pulled / seed.placed)
            rule = GOALS["bytes_vs_seed"] + " (per placed request: overload)"
        else:
            figure, rule = berth.bytes_pulled / seed.bytes_pulled, GOALS["bytes_vs_seed"]
        goals["bytes_vs_seed"] = _goal(figure, 0.5, "x seed", rule)
    if berth.capacity_bound_bytes:
        figure = berth.bytes_pulled / berth.capacity_bound_bytes
        goals["capacity_bound"] = _goal(figure, 2.0, "x bound", GOALS["capacity_bound"])
    if others:
        best = min(m.refused for m in others.values())
        goals["refusals_vs_others"] = _goal(
            berth.refused, best, "requests", GOALS["refusals_vs_others"]
        )
    goals["avoidable_refusals"] = _goal(
        berth.avoidable_refusals, 0, "requests", GOALS["avoidable_refusals"]
    )
    p99s = [m.start_latency_p99_s for m in others.values() if m.start_latency_p99_s is not None]
    if p99s and berth.start_latency_p99_s is not None:
        goals["start_p99"] = _goal(berth.start_latency_p99_s, min(p99s), "s", GOALS["start_p99"])
    return goals
