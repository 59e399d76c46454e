"""A hard per-node spread across several NATS schedulers: violations with and without sharing.

Each scheduler service counts, for spreading, the replicas in its own replica index.  Before
the route registry fed that index, a scheduler counted only its own placements, so with K
schedulers a hard "one replica per node" spread was broken whenever the queue group handed
two replicas of one function to different schedulers.  Now every service follows the
registry (``share_replicas=True``, the default) and counts the others' replicas as soon as
their routes land; that leaves the race between two schedulers deciding within the
propagation delay (a node's confirmation plus a KV round trip), which a hard per-node spread
then settles after the fact (``settle_races``: re-read the node's routes, the later route
gives the node up and places again).

The harness starts a real ``nats-server`` (:mod:`berth.testing.nats`), ``--nodes`` agents
(:class:`~berth.nodeclient.nats_node.NodeService`, fake runtime, idle load) and ``--schedulers``
scheduler services in one queue group, all in this process and talking only through NATS.
Each *trial* places ``--nodes`` replicas of a fresh function with ``Spread(hard=True)``
through the queue group — as many replicas as nodes, so a perfect spread puts one on every
node and refuses nothing.  Request ``i`` of a trial is sent ``i × gap`` after the first
(``gap`` 0: all at once, the worst case), without waiting for the others.  Per setting it
counts:

* ``violations`` — replicas placed on a node that already held one of the same trial
  (the ground truth: the placements returned);
* ``refused`` — ``NoCapacity`` answers (a scheduler that believes every node taken).

* ``yielded`` — nodes given up to a sibling placed first (``settle`` only);
* ``p50_ms``/``p99_ms`` — each request's latency as the caller sees it.

Three modes run in the same process on the same server, for every gap: ``own`` (each
scheduler counts its own replicas: before the registry fed them), ``watch`` (the registry
feeds every scheduler, no re-check) and ``settle`` (the default: both).  ``--json`` prints
one JSON object; ``--quick`` is a short smoke run for CI.  Exits 1 if one scheduler alone
ever violates, if ``watch`` does not reduce the paced (non-zero gap) violations of ``own``,
or if ``settle`` violates at all with several schedulers.  Loopback only; it stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from berth.embedded import embedded_configs
from berth.errors import NoCapacity
from berth.model import Placement, Request, Spec, Spread
from berth.nats.names import Names
from berth.nodeclient.nats_node import NodeService
from berth.scheduler.nats import NatsScheduler
from berth.scheduler.nats_server import SchedulerService
from berth.testing.cluster import nats_cluster
from berth.testing.nats import running_server, unique_name
from berth.units import MiB

SPEC = Spec(vcpus=0.001, mem=4 * MiB, disk=4 * MiB)
HARD = Spread(hard=True)
Mode = Literal["own", "watch", "settle"]
MODES: tuple[Mode, ...] = ("own", "watch", "settle")


@dataclass
class Row:
    schedulers: int
    mode: Mode
    gap_ms: float
    trials: int
    placed: int = 0
    violations: int = 0
    refused: int = 0
    yielded: int = 0
    latencies_ms: list[float] = field(default_factory=list, repr=False)

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return 0.0
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    @property
    def violation_rate(self) -> float:
        return self.violations / self.placed if self.placed else 0.0


@dataclass
class SpreadCluster:
    caller: NatsScheduler
    services: list[SchedulerService]
    nodes: dict[str, NodeService]


@contextlib.asynccontextmanager
async def spread_cluster(
    url: str, *, nodes: int, schedulers: int, mode: Mode = "settle"
) -> AsyncIterator[SpreadCluster]:
    """``nodes`` agents and ``schedulers`` scheduler services on the server at ``url``, under
    fresh bucket names and subjects; ``mode`` as in the module docstring."""
    configs = embedded_configs(nodes, runtime="fake", heartbeat_s=1.0)
    async with nats_cluster(
        url,
        configs,
        schedulers=schedulers,
        names=Names.namespaced(unique_name("spread")),
        share_replicas=mode != "own",
        settle_races=mode == "settle",
    ) as cluster:
        yield SpreadCluster(cluster.scheduler, cluster.scheduler_services, cluster.node_services)


async def trial(
    cluster: SpreadCluster, function: str, replicas: int, gap_s: float, row: Row
) -> tuple[list[Placement], int]:
    """Place ``replicas`` replicas of ``function`` under a hard per-node spread, request
    ``i`` sent ``i × gap_s`` after the first; the placements and the refusals."""

    async def one(replica: int) -> Placement | None:
        await asyncio.sleep(replica * gap_s)
        request = Request(
            namespace="spread", name=function, replica=replica, spec=SPEC, spread=HARD
        )
        started = time.perf_counter()
        try:
            return await cluster.caller.schedule(request)
        except NoCapacity:
            return None
        finally:
            row.latencies_ms.append((time.perf_counter() - started) * 1000)

    outcomes = await asyncio.gather(*(one(replica) for replica in range(replicas)))
    placements = [placement for placement in outcomes if placement is not None]
    return placements, len(outcomes) - len(placements)


def violations(placements: Sequence[Placement]) -> int:
    """Replicas placed on a node that already held a sibling."""
    per_node = Counter(placement.worker_node for placement in placements)
    return sum(count - 1 for count in per_node.values())


async def measure(
    url: str, *, nodes: int, schedulers: int, mode: Mode, gaps_s: Sequence[float], trials: int
) -> list[Row]:
    rows = []
    async with spread_cluster(url, nodes=nodes, schedulers=schedulers, mode=mode) as cluster:
        for gap_s in gaps_s:
            row = Row(schedulers, mode, gap_s * 1000, trials)
            yielded = sum(service.yielded for service in cluster.services)
            for index in range(trials):
                function = f"fn-{int(gap_s * 1e6)}-{index}"
                placements, refused = await trial(cluster, function, nodes, gap_s, row)
                row.placed += len(placements)
                row.refused += refused
                row.violations += violations(placements)
                await asyncio.gather(
                    *(
                        cluster.caller.release(placement, workload=f"spread/{function}/{i}")
                        for i, placement in enumerate(placements)
                    )
                )
            row.yielded = sum(service.yielded for service in cluster.services) - yielded
            rows.append(row)
    return rows


async def run(
    nodes: int, schedulers: Sequence[int], gaps_s: Sequence[float], trials: int
) -> list[Row]:
    rows: list[Row] = []
    with running_server() as server:
        for count in schedulers:
            for mode in MODES:
                rows += await measure(
                    server.url,
                    nodes=nodes,
                    schedulers=count,
                    mode=mode,
                    gaps_s=gaps_s,
                    trials=trials,
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--schedulers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--gaps-ms",
        type=float,
        nargs="+",
        default=[0.0, 5.0, 20.0],
        help="time between a trial's requests",
    )
    parser.add_argument("--trials", type=int, default=20, help="trials per setting")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (CI)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.quick:
        args.schedulers, args.trials, args.gaps_ms = [1, 4], 3, [0.0, 20.0]
    started = time.monotonic()
    rows = asyncio.run(
        run(args.nodes, args.schedulers, [g / 1000 for g in args.gaps_ms], args.trials)
    )
    elapsed = time.monotonic() - started

    def total(mode: Mode, paced: bool) -> int:
        return sum(
            row.violations
            for row in rows
            if row.mode == mode and (row.gap_ms > 0) is paced and row.schedulers > 1
        )

    single = sum(row.violations for row in rows if row.schedulers == 1)
    settled = sum(row.violations for row in rows if row.mode == "settle" and row.schedulers > 1)
    ok = (
        single == 0
        and (total("watch", True) < total("own", True) or total("own", True) == 0)
        and settled == 0
    )
    result = {
        "nodes": args.nodes,
        "trials": args.trials,
        "rows": [
            {key: value for key, value in asdict(row).items() if key != "latencies_ms"}
            | {
                "violation_rate": round(row.violation_rate, 3),
                "p50_ms": round(row.percentile(0.5), 2),
                "p99_ms": round(row.percentile(0.99), 2),
            }
            for row in rows
        ],
        "single_scheduler_violations": single,
        **{f"{mode}_paced_violations": total(mode, True) for mode in MODES},
        **{f"{mode}_burst_violations": total(mode, False) for mode in MODES},
        "seconds": round(elapsed, 1),
        "ok": ok,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{args.nodes} nodes, {args.trials} trials of {args.nodes} replicas per row "
            f"(hard per-node spread), {elapsed:.0f} s"
        )
        print(
            "schedulers    mode   gap ms  placed  violations   rate  refused  yielded"
            "  p50 ms  p99 ms"
        )
        for row in rows:
            print(
                f"{row.schedulers:>10}  {row.mode:>6}  {row.gap_ms:>7g}  {row.placed:>6}  "
                f"{row.violations:>10}  {row.violation_rate:>5.1%}  {row.refused:>7}  "
                f"{row.yielded:>7}  {row.percentile(0.5):>6.1f}  {row.percentile(0.99):>6.1f}"
            )
        print("ok" if ok else "FAILED: see the module docstring for what must hold")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
