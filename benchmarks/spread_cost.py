"""What replica spreading costs in bytes pulled: each spread setting against none, same run.

Colocation and spreading pull in opposite directions: the seed's ranking (and berth's) sends
a function's next replica where its image's layers already are — usually beside its
siblings — while a spread sends it elsewhere, where the layers may have to be pulled.  This
benchmark measures the price.  Every arrival of the ``berth sim`` default workload (Docker Hub
images, 2,000 requests at 2/s, lifetimes of 300 s on average, 100 nodes in three zones) is
given the same ``Request.spread`` — each image is one function, its arrivals its replicas —
and the simulator (:mod:`berth.sim.simulator`: real schedulers, real node budgets) runs it
with each setting:

* ``none`` — no spread (the baseline every ratio divides by);
* ``soft-node`` / ``hard-node`` — one replica per node, preferred / required;
* ``soft-zone`` / ``hard-zone`` — across the ``zone`` label (``SimConfig.zones``), max skew 1.

Per setting and policy: bytes pulled (and ``bytes_ratio`` to ``none``), requests refused
(``NoCapacity`` or given up; ``refused_delta`` to ``none``), refusals at confirmation, start
latency p50/p99, and the spread's *violations* judged on the ground truth — a placement on a
node already running a replica of its image (``node_violations``), or into a zone that then
leads the least-loaded zone (among the nodes of the request's platforms) by more than one
(``zone_violations``).  With one scheduler a hard setting must have none (the benchmark
exits 1 otherwise); with K schedulers (``--schedulers 1,4``) each knows only its own
placements, and the violations that remain measure that.

Beside the simulation, the decision's own cost (``decision_us``): CPU time per in-process
``ClusterScheduler.schedule()`` of one function on ``--decision-nodes`` idle nodes in three
zones (the seed's ranking, the NumPy engine), ``--decision-placements`` placements per
setting, released between settings; ``decision_ratio`` is each setting's time over no
spread's, measured in the same run.

``--quick`` runs a small cluster in seconds (CI); ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from berth.model import Placement, Request, Spec, Spread
from berth.node.budget import BudgetLimits, NodeBudget, StaticLoad
from berth.nodeclient.local import LocalNodes
from berth.platform import Platform, matches_any
from berth.scheduler.multinode import ClusterScheduler
from berth.sim.metrics import PolicyMetrics
from berth.sim.simulator import SimConfig, SimResult, Simulation
from berth.sim.workload import Arrival, WorkloadConfig, generate_workload
from berth.state import NodeState
from berth.store.memory import MemoryStore
from berth.units import GiB, MiB

SETTINGS: dict[str, Spread | None] = {
    "none": None,
    "soft-node": Spread(hard=False),
    "hard-node": Spread(hard=True),
    "soft-zone": Spread(label="zone", hard=False),
    "hard-zone": Spread(label="zone", hard=True),
}


def with_spread(arrivals: Sequence[Arrival], spread: Spread | None) -> list[Arrival]:
    """``arrivals`` with every request asking ``spread`` (everything else unchanged)."""
    return [
        arrival.model_copy(
            update={"request": arrival.request.model_copy(update={"spread": spread})}
        )
        for arrival in arrivals
    ]


def violations(result: SimResult, arrivals: Sequence[Arrival]) -> tuple[int, int]:
    """``(node_violations, zone_violations)`` of ``result``'s placements on the ground truth:
    the replicas of each image running when each placement was made (ends come first at
    equal times, as in the simulator)."""
    zone_of = {info.name: info.zone for info in result.nodes}
    platform_of = {info.name: Platform.parse(info.platform) for info in result.nodes}
    running: dict[str, Counter[str]] = {}
    ends: list[tuple[float, str, str]] = []
    node_bad = zone_bad = 0
    for decision, arrival in zip(result.decisions, arrivals, strict=True):
        while ends and ends[0][0] <= decision.at:
            _, image, node = heapq.heappop(ends)
            running[image][node] -= 1
        if not decision.placed or decision.node is None or decision.ends_at is None:
            continue
        here = running.setdefault(decision.image, Counter())
        if here[decision.node] > 0:
            node_bad += 1
        platforms = arrival.request.platforms
        zones = {
            zone_of[name]
            for name in zone_of
            if zone_of[name] is not None and matches_any(platform_of[name], platforms)
        }
        zone = zone_of[decision.node]
        if zones and zone is not None:
            per_zone = Counter(dict.fromkeys(zones, 0))
            for name, count in here.items():
                if zone_of[name] in per_zone:
                    per_zone[zone_of[name]] += count
            if per_zone[zone] + 1 - min(per_zone.values()) > 1:
                zone_bad += 1
        here[decision.node] += 1
        heapq.heappush(ends, (decision.ends_at, decision.image, decision.node))
    return node_bad, zone_bad


def measure(
    *,
    nodes: int,
    zones: int,
    requests: int,
    rate: float,
    lifetime: float,
    policies: Sequence[str],
    schedulers: Sequence[int],
    staleness: float,
    seed: int,
) -> list[dict[str, Any]]:
    """One row per (policy, K, setting), all on the same arrivals."""
    workload = WorkloadConfig(requests=requests, rate=rate, lifetime_mean=lifetime, seed=seed)
    arrivals = generate_workload(workload)
    rows: list[dict[str, Any]] = []
    for policy in policies:
        for k in schedulers:
            config = SimConfig(
                nodes=nodes,
                zones=zones,
                concurrency=k,
                staleness=staleness if k > 1 else 0.0,
                seed=seed,
                workload=workload,
            )
            base: dict[str, Any] | None = None
            for name, spread in SETTINGS.items():
                spread_arrivals = with_spread(arrivals, spread)
                result = Simulation(config, policy, spread_arrivals).run()
                metrics = PolicyMetrics.of(result)
                node_bad, zone_bad = violations(result, spread_arrivals)
                row: dict[str, Any] = {
                    "policy": policy,
                    "schedulers": k,
                    "setting": name,
                    "placed": metrics.placed,
                    "refused": metrics.refused,
                    "refused_at_confirmation": metrics.refused_at_confirmation,
                    "bytes_pulled": metrics.bytes_pulled,
                    "start_p50_s": metrics.start_latency_p50_s,
                    "start_p99_s": metrics.start_latency_p99_s,
                    "node_violations": node_bad,
                    "zone_violations": zone_bad,
                }
                if base is None:
                    base = row
                row["bytes_ratio"] = (
                    row["bytes_pulled"] / base["bytes_pulled"] if base["bytes_pulled"] else None
                )
                row["refused_delta"] = row["refused"] - base["refused"]
                rows.append(row)
    return rows


def decision_cost(nodes: int, placements: int) -> dict[str, float]:
    """CPU microseconds per ``schedule()`` for each setting (see the module docstring)."""
    store, local = MemoryStore(), LocalNodes()
    for i in range(nodes):
        name = f"node-{i:05d}"
        limits = BudgetLimits(
            mem_max=1024 * GiB, disk_max=2**50, cpu_capacity=4096, disk_bw_cap=GiB, net_bw_cap=GiB
        )
        local.add(name, NodeBudget(limits, StaticLoad()))
        store.publish_now(
            NodeState(
                node=name,
                platform="linux/amd64",
                labels={"zone": f"z{i % 3}"},
                mem_free=1024 * GiB,
                disk_free=2**50,
                cpu_capacity=4096.0,
                disk_bw_ceiling=float(GiB),
                net_bw_ceiling=float(GiB),
                layers=frozenset({"base"}) if i % 7 == 0 else frozenset(),
            )
        )
    scheduler = ClusterScheduler(store, local)
    spec = Spec(vcpus=0.001, mem=MiB, disk=MiB)

    async def run() -> dict[str, float]:
        out: dict[str, float] = {}
        for name, spread in SETTINGS.items():
            request = Request(
                namespace="bench", name="fn", spec=spec, layers=(("base", 10**6),), spread=spread
            )
            placed: list[Placement] = []
            started = time.thread_time()
            for _ in range(placements):
                placed.append(await scheduler.schedule(request))
            out[name] = (time.thread_time() - started) / placements * 1e6
            for placement in placed:
                await scheduler.release(placement)
        return out

    return asyncio.run(run())


def checks(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What must hold: one scheduler never violates a hard spread on the ground truth."""
    hard_node = sum(
        r["node_violations"] for r in rows if r["setting"] == "hard-node" and r["schedulers"] == 1
    )
    hard_zone = sum(
        r["zone_violations"] for r in rows if r["setting"] == "hard-zone" and r["schedulers"] == 1
    )
    return {
        "hard_node_violations_k1": hard_node,
        "hard_zone_violations_k1": hard_zone,
        "targets": {"hard_node_violations_k1": 0, "hard_zone_violations_k1": 0},
        "met": {
            "hard_node_violations_k1": hard_node == 0,
            "hard_zone_violations_k1": hard_zone == 0,
        },
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table, one line per (policy, K, setting)."""
    lines = [
        "| policy | K | spread | pulled (GB) | × none | refused (Δ none) "
        "| refusals at confirmation | start p99 (s) | on a node with a sibling | zone skew > 1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = "—" if r["bytes_ratio"] is None else f"{r['bytes_ratio']:.2f}"
        p99 = "—" if r["start_p99_s"] is None else f"{r['start_p99_s']:.1f}"
        lines.append(
            f"| {r['policy']} | {r['schedulers']} | {r['setting']} "
            f"| {r['bytes_pulled'] / 1e9:.1f} | {ratio} | {r['refused']} ({r['refused_delta']:+d}) "
            f"| {r['refused_at_confirmation']} | {p99} | {r['node_violations']} "
            f"| {r['zone_violations']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--zones", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--lifetime", type=float, default=300.0)
    parser.add_argument("--policies", default="seed,berth")
    parser.add_argument("--schedulers", default="1,4", help="K values, comma-separated")
    parser.add_argument("--staleness", type=float, default=5.0, help="Δ in s, for K > 1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decision-nodes", type=int, default=10_000)
    parser.add_argument("--decision-placements", type=int, default=300)
    parser.add_argument("--json", action="store_true", help="print only one JSON object")
    parser.add_argument("--quick", action="store_true", help="small, seconds-long CI run")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.requests, args.rate, args.lifetime = 20, 200, 3.0, 30.0
        args.policies, args.schedulers = "seed", "1"
        args.decision_nodes, args.decision_placements = 1000, 50
    started = time.perf_counter()
    rows = measure(
        nodes=args.nodes,
        zones=args.zones,
        requests=args.requests,
        rate=args.rate,
        lifetime=args.lifetime,
        policies=[p for p in args.policies.split(",") if p],
        schedulers=[int(k) for k in args.schedulers.split(",") if k],
        staleness=args.staleness,
        seed=args.seed,
    )
    summary = checks(rows)
    decision_us = decision_cost(args.decision_nodes, args.decision_placements)
    output = {
        "benchmark": "spread_cost",
        "config": {
            "nodes": args.nodes,
            "zones": args.zones,
            "requests": args.requests,
            "rate": args.rate,
            "lifetime_s": args.lifetime,
            "staleness_s": args.staleness,
            "seed": args.seed,
            "quick": args.quick,
        },
        "rows": rows,
        "decision_nodes": args.decision_nodes,
        "decision_us": {name: round(us, 1) for name, us in decision_us.items()},
        "decision_ratio": {
            name: round(us / decision_us["none"], 2) for name, us in decision_us.items()
        },
        **summary,
        "seconds": round(time.perf_counter() - started, 2),
    }
    if args.json:
        print(json.dumps(output))
    else:
        print(table(rows))
        print()
        print(
            f"CPU µs per schedule() on {args.decision_nodes} nodes: "
            + ", ".join(
                f"{name} {us:.0f} ({us / decision_us['none']:.2f}×)"
                for name, us in decision_us.items()
            )
        )
        print()
        print(json.dumps({k: v for k, v in output.items() if k != "rows"}, indent=2))
    return 0 if all(summary["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
