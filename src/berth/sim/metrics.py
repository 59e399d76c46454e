"""One policy's figures from one simulated run, and what each figure means.

This module owns turning one :class:`~berth.sim.simulator.SimResult` into the figures people
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

The comparison table, ``report.json`` and the plots are :mod:`berth.sim.report`'s; the goals
judged from these figures are :mod:`berth.sim.goals`'s (which is why the figures sit below
both).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from berth.sim.simulator import SimResult

__all__ = ["DEFINITIONS", "PolicyMetrics"]

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
