"""What the assume cache buys: refusals at confirmation and bytes pulled, with and without it.

A scheduler confirms every placement on the chosen node, whose admission is the authority;
its own view of the cluster is the node snapshots, which arrive ``staleness`` seconds late.
Without the assume step a scheduler does not see its own confirmed placements until then, so
deterministic policies pile onto the same node and pay in refusals at confirmation.  With it
(:mod:`berth.scheduler.assume`) each scheduler applies its confirmed reservations to its own
view at once; only the *other* schedulers' placements can still surprise it.

The grid: every policy × K schedulers × staleness Δ × assume on/off, all on the same arrivals
(the ``berth sim`` defaults: 100 nodes, 2,000 requests at 2/s, Docker Hub layers), each cell
a full :class:`~berth.sim.simulator.Simulation` with real node budgets.  Reported per cell:
refusals at confirmation, requests refused for capacity, bytes pulled.

Targets (ratios in the same run, so they hold on any machine):

* ``k1_refusals_with_assume`` — one scheduler with the assume step is never refused at
  confirmation, however stale its view (0 over every policy and Δ);
* ``refusal_reduction`` — over the whole grid, the assume step removes at least half of the
  refusals at confirmation (``1 − with / without ≥ 0.5``).

``--quick`` runs a small grid in seconds (CI); ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from berth.scheduler.policy import POLICIES
from berth.sim.simulator import SimConfig, Simulation
from berth.sim.workload import WorkloadConfig, generate_workload


def grid(
    *,
    nodes: int,
    requests: int,
    rate: float,
    lifetime: float,
    policies: Sequence[str],
    schedulers: Sequence[int],
    staleness: Sequence[float],
    seed: int,
) -> list[dict[str, Any]]:
    """One row per (policy, K, Δ, assume): the decision counts of a full simulation."""
    workload = WorkloadConfig(requests=requests, rate=rate, lifetime_mean=lifetime, seed=seed)
    arrivals = generate_workload(workload)
    rows: list[dict[str, Any]] = []
    for policy in policies:
        for k in schedulers:
            for delta in staleness:
                for assume in (False, True):
                    config = SimConfig(
                        nodes=nodes,
                        concurrency=k,
                        staleness=delta,
                        assume=assume,
                        seed=seed,
                        workload=workload,
                    )
                    result = Simulation(config, policy, arrivals).run()
                    decisions = result.decisions
                    rows.append(
                        {
                            "policy": policy,
                            "schedulers": k,
                            "staleness_s": delta,
                            "assume": assume,
                            "refused_at_confirmation": sum(len(d.refusals) for d in decisions),
                            "refused_no_capacity": sum(
                                d.outcome == "no_capacity" for d in decisions
                            ),
                            "placed": sum(d.placed for d in decisions),
                            "bytes_pulled": result.pulled_bytes,
                        }
                    )
    return rows


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Targets and whether they were met (see the module docstring)."""
    with_assume = sum(r["refused_at_confirmation"] for r in rows if r["assume"])
    without = sum(r["refused_at_confirmation"] for r in rows if not r["assume"])
    k1 = sum(r["refused_at_confirmation"] for r in rows if r["assume"] and r["schedulers"] == 1)
    reduction = 1.0 - with_assume / without if without else None
    return {
        "refusals_without_assume": without,
        "refusals_with_assume": with_assume,
        "k1_refusals_with_assume": k1,
        "refusal_reduction": reduction,
        "targets": {"k1_refusals_with_assume": 0, "refusal_reduction": 0.5},
        "met": {
            "k1_refusals_with_assume": k1 == 0,
            "refusal_reduction": None if reduction is None else reduction >= 0.5,
        },
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table: one line per (policy, K, Δ), without → with the assume step."""
    lines = [
        "| policy | K | Δ (s) | refusals at confirmation | refused (capacity) | pulled (GB) |",
        "|---|---|---|---|---|---|",
    ]
    paired: dict[tuple[str, int, float], dict[bool, dict[str, Any]]] = {}
    for row in rows:
        key = (row["policy"], row["schedulers"], row["staleness_s"])
        paired.setdefault(key, {})[row["assume"]] = row
    for (policy, k, delta), pair in paired.items():
        off, on = pair[False], pair[True]
        lines.append(
            f"| {policy} | {k} | {delta:g} "
            f"| {off['refused_at_confirmation']} → **{on['refused_at_confirmation']}** "
            f"| {off['refused_no_capacity']} → {on['refused_no_capacity']} "
            f"| {off['bytes_pulled'] / 1e9:.2f} → {on['bytes_pulled'] / 1e9:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--lifetime", type=float, default=300.0)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--schedulers", default="1,2,4", help="K values, comma-separated")
    parser.add_argument("--staleness", default="0,1,2,5", help="Δ values in s, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print only one JSON object")
    parser.add_argument("--quick", action="store_true", help="small, seconds-long CI run")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.requests, args.rate, args.lifetime = 20, 150, 3.0, 30.0
        args.policies, args.schedulers, args.staleness = "seed,berth", "1,2", "0,5"
    started = time.perf_counter()
    rows = grid(
        nodes=args.nodes,
        requests=args.requests,
        rate=args.rate,
        lifetime=args.lifetime,
        policies=[p for p in args.policies.split(",") if p],
        schedulers=[int(k) for k in args.schedulers.split(",")],
        staleness=[float(d) for d in args.staleness.split(",")],
        seed=args.seed,
    )
    result = {
        "config": {
            "nodes": args.nodes,
            "requests": args.requests,
            "rate": args.rate,
            "lifetime_s": args.lifetime,
            "seed": args.seed,
            "quick": args.quick,
        },
        **summarise(rows),
        "rows": rows,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(table(rows))
        print()
        print({key: value for key, value in result.items() if key != "rows"})
    return 0 if all(v is not False for v in result["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
