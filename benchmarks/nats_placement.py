"""End-to-end placement over NATS: placements per second and latency, next to in-process.

What is timed is the whole path a caller sees on a real deployment, over loopback:

    caller ──request──▶ nats-server ──queue group──▶ scheduler process (its own replica,
    rank, assume) ──admit request──▶ nats-server ──▶ agent process (the node's budget)
    ──reply──▶ scheduler ──placement──▶ caller

with 50 agents (in two agent processes, as ``berth up`` groups them above 8 nodes) and 1 then
2 scheduler processes in one queue group, started by :class:`berth.processes.up.LocalCluster`
(no authentication: the same subjects, without the server's permission checks).  The caller
keeps ``--concurrency`` requests in flight (a closed loop) and records each one's latency;
placements/s is completed placements over the wall time of the measured run.  Each
placement is a lease on the node (small, 16 MiB), so capacity never runs out in a run; every
admission makes the node re-advertise, so the replicas follow real traffic.

In the same run, the same requests go through the in-process driver (``EmbeddedCluster``:
``ClusterScheduler.schedule()`` on node agents in this process, in-memory store) for the
ratio.  Targets (issue 10), on this project's 2-core machine: ≥ 1,000 placements/s with one
scheduler, p99 ≤ 20 ms.  Everything (server, agents, schedulers, caller) shares the two
cores, so the figures are a floor for a real cluster, where they would not.

The same run once more on **three clustered nats-servers** (``berth up --nats-servers 3``:
R3 buckets, every write fsync'ed on each replica before it is acknowledged) with one
scheduler, for the ratio to one server (issue 21's target: ≥ 0.6), and once on one server
**with TLS** (``berth up --tls``: mutual TLS from the caller, every agent and the scheduler to
the server) for the ratio to plain text (issue 21's target: ≥ 0.8).

``--json`` prints one JSON object (``placements_per_s``, ``p50_ms``, ``p99_ms`` for one
scheduler, ``inprocess_placements_per_s``, ``ratio_to_inprocess``, per-scheduler-count
rows, the ``three_servers`` row and ``three_servers_ratio``, the ``tls`` row and
``tls_ratio``); ``--quick`` is a short smoke
run for CI (about 25 s, mostly process start-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import sys
import time
from typing import Any

from berth.defaults import HEARTBEAT_S, SCHEDULE_TIMEOUT_S
from berth.embedded import EmbeddedCluster
from berth.errors import BerthError
from berth.model import Request, Spec
from berth.nats.connection import connect
from berth.processes.up import LocalCluster
from berth.scheduler.nats import NatsScheduler
from berth.units import MiB

SPEC = Spec(vcpus=0.001, mem=16 * MiB, disk=16 * MiB)
TARGETS = {
    "placements_per_s": 1000.0,
    "p99_ms": 20.0,
    "three_servers_ratio": 0.6,
    "tls_ratio": 0.8,
}


def _request(index: int) -> Request:
    return Request(namespace="bench", name="fn", replica=index, spec=SPEC)


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


async def _inprocess(nodes: int, count: int) -> float:
    async with EmbeddedCluster.of_size(nodes, runtime="fake") as cluster:
        for index in range(min(200, count)):  # warm-up
            await cluster.scheduler.schedule(_request(10**6 + index))
        started = time.perf_counter()
        for index in range(count):
            await cluster.scheduler.schedule(_request(index))
        return count / (time.perf_counter() - started)


async def _over_nats(
    url: str, count: int, warmup: int, concurrency: int, tls: ssl.SSLContext | None = None
) -> dict[str, Any]:
    client = await connect(url, name="berth-bench", tls=tls)
    try:
        scheduler = NatsScheduler(client, timeout_s=SCHEDULE_TIMEOUT_S)
        latencies: list[float] = []
        failures: dict[str, int] = {}
        refusals: dict[str, int] = {}
        next_index = 0

        async def worker(until: int, record: bool) -> None:
            nonlocal next_index, refusals
            while next_index < until:
                index = next_index
                next_index += 1
                started = time.perf_counter()
                try:
                    placement = await scheduler.schedule(_request(index))
                except BerthError as error:
                    failures[type(error).__name__] = failures.get(type(error).__name__, 0) + 1
                    continue
                if record:
                    latencies.append(time.perf_counter() - started)
                    for _, reason in placement.refusals:
                        refusals[reason] = refusals.get(reason, 0) + 1

        await asyncio.gather(*(worker(warmup, False) for _ in range(concurrency)))
        started = time.perf_counter()
        await asyncio.gather(*(worker(warmup + count, True) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    finally:
        await client.close()
    latencies.sort()
    return {
        "placements_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(_percentile(latencies, 0.50) * 1e3, 2),
        "p99_ms": round(_percentile(latencies, 0.99) * 1e3, 2),
        "mean_ms": round(statistics.fmean(latencies) * 1e3, 2),
        "placements": len(latencies),
        "failures": failures,
        "refusals_at_confirmation": refusals,
        "concurrency": concurrency,
    }


def _measured(
    nodes: int,
    schedulers: int,
    nats_servers: int,
    count: int,
    warmup: int,
    concurrency: int,
    *,
    tls: bool = False,
) -> dict[str, Any]:
    cluster = LocalCluster(
        nodes,
        schedulers=schedulers,
        heartbeat_s=HEARTBEAT_S,
        auth=False,
        runtime="fake",
        per_process=25,
        nats_servers=nats_servers,
        tls=tls,
    )
    with cluster:
        row = asyncio.run(_over_nats(cluster.url, count, warmup, concurrency, cluster.client_tls()))
    return {"schedulers": schedulers, "nats_servers": nats_servers, "tls": tls, **row}


def run(
    *, nodes: int, count: int, warmup: int, concurrency: int, schedulers: list[int]
) -> dict[str, Any]:
    rows = [_measured(nodes, k, 1, count, warmup, concurrency) for k in schedulers]
    # the same run on three clustered nats-servers (R3 buckets, fsync always): issue 21
    three = _measured(nodes, 1, 3, count, warmup, concurrency)
    # and on one server with mutual TLS everywhere (berth up --tls): issue 21
    tls = _measured(nodes, 1, 1, count, warmup, concurrency, tls=True)
    inprocess = asyncio.run(_inprocess(nodes, count))
    one = rows[0]
    three_ratio = round(three["placements_per_s"] / one["placements_per_s"], 3)
    tls_ratio = round(tls["placements_per_s"] / one["placements_per_s"], 3)
    result: dict[str, Any] = {
        "nodes": nodes,
        "placements_per_s": one["placements_per_s"],
        "p50_ms": one["p50_ms"],
        "p99_ms": one["p99_ms"],
        "inprocess_placements_per_s": round(inprocess, 1),
        "ratio_to_inprocess": round(one["placements_per_s"] / inprocess, 3),
        "by_schedulers": rows,
        "three_servers": three,
        "three_servers_ratio": three_ratio,
        "tls": tls,
        "tls_ratio": tls_ratio,
        "targets": TARGETS,
        "met": {
            "placements_per_s": one["placements_per_s"] >= TARGETS["placements_per_s"],
            "p99_ms": one["p99_ms"] <= TARGETS["p99_ms"],
            "three_servers_ratio": three_ratio >= TARGETS["three_servers_ratio"],
            "tls_ratio": tls_ratio >= TARGETS["tls_ratio"],
        },
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--placements", type=int, default=5000, help="measured, per run")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (CI)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    count, warmup = (args.placements, 500) if not args.quick else (600, 100)
    result = run(
        nodes=args.nodes,
        count=count,
        warmup=warmup,
        concurrency=args.concurrency,
        schedulers=[1, 2],
    )
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.nodes} agents, {count} placements per run, {args.concurrency} in flight")
    for row in [*result["by_schedulers"], result["three_servers"], result["tls"]]:
        where = "" if row["nats_servers"] == 1 else f" on {row['nats_servers']} nats-servers"
        where += " with TLS" if row["tls"] else ""
        print(
            f"  {row['schedulers']} scheduler(s){where}: "
            f"{row['placements_per_s']:8.1f} placements/s  "
            f"p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.2f} ms  "
            f"refused on the way {row['refusals_at_confirmation'] or 0}  "
            f"failed {row['failures'] or 0}"
        )
    print(
        f"  in-process schedule(): {result['inprocess_placements_per_s']:8.1f} placements/s "
        f"(NATS / in-process = {result['ratio_to_inprocess']:.3f})"
    )
    print(f"  three servers / one: {result['three_servers_ratio']:.3f}")
    print(f"  TLS / plain text: {result['tls_ratio']:.3f}")
    print(f"  targets {TARGETS}: met {result['met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
