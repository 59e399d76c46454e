"""A hard per-node spread across several NATS schedulers: violations with and without sharing.

Each scheduler service counts, for spreading, the replicas in its own replica index.  Before
the route registry fed that index, a scheduler counted only its own placements, so with K
schedulers a hard "one replica per node" spread was broken whenever the queue group handed
two replicas of one function to different schedulers.  Now every service follows the
registry (``share_replicas=True``, the default) and counts the others' replicas as soon as
their routes land; what is left is the race between two schedulers deciding within the
propagation delay (a node's confirmation plus a KV round trip).

The harness starts a real ``nats-server`` (:mod:`berth.testing.nats`), ``--nodes`` agents
(:class:`~berth.service.agent.NodeService`, fake runtime, idle load) and ``--schedulers``
scheduler services in one queue group, all in this process and talking only through NATS.
Each *trial* places ``--nodes`` replicas of a fresh function with ``Spread(hard=True)``
through the queue group — as many replicas as nodes, so a perfect spread puts one on every
node and refuses nothing.  Request ``i`` of a trial is sent ``i × gap`` after the first
(``gap`` 0: all at once, the worst case), without waiting for the others.  Per setting it
counts:

* ``violations`` — replicas placed on a node that already held one of the same trial
  (the ground truth: the placements returned);
* ``refused`` — ``NoCapacity`` answers (a scheduler that believes every node taken).

Both settings (``shared``: the registry feeds every scheduler; ``own``: each counts its own,
as before) run in the same process on the same server, for every gap.  ``--json`` prints one
JSON object; ``--quick`` is a short smoke run for CI.  Exits 1 if sharing does not reduce the
violations of the paced (non-zero gap) runs, or if one scheduler alone ever violates.
Loopback only; it stops by itself.
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
from dataclasses import asdict, dataclass

from nats.aio.client import Client

from berth.embedded import embedded_configs
from berth.errors import NoCapacity
from berth.model import Placement, Request, Spec, Spread
from berth.node.budget import IDLE
from berth.service.agent import NodeService
from berth.service.names import Names
from berth.service.routes import RouteRegistry
from berth.service.scheduler import NatsScheduler, SchedulerService, scheduler_service
from berth.store.nats_connection import connect
from berth.testing.nats import running_server, unique_name

MiB = 2**20
SPEC = Spec(vcpus=0.001, mem=4 * MiB, disk=4 * MiB)
HARD = Spread(hard=True)


@dataclass
class Row:
    schedulers: int
    shared: bool
    gap_ms: float
    trials: int
    placed: int
    violations: int
    refused: int

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
    url: str, *, nodes: int, schedulers: int, shared: bool
) -> AsyncIterator[SpreadCluster]:
    """``nodes`` agents and ``schedulers`` scheduler services on the server at ``url``, under
    fresh bucket names and subjects; ``shared`` feeds the route registry into every
    scheduler's replica index."""
    names = Names.namespaced(unique_name("spread"))
    configs = embedded_configs(nodes, runtime="fake", heartbeat_s=1.0)
    async with contextlib.AsyncExitStack() as stack:

        async def connection(name: str) -> Client:
            client = await connect(url, name=name)
            stack.push_async_callback(client.close)
            return client

        caller = await connection("spread-caller")
        agents = await connection("spread-agents")
        agent_routes = await RouteRegistry(agents, bucket=names.routes_bucket).start()
        node_services = {}
        for config in configs:
            node_services[config.node.name] = await stack.enter_async_context(
                NodeService(
                    agents,
                    config,
                    bucket=names.nodes_bucket,
                    prefix=names.node_prefix,
                    routes=agent_routes,
                    readings=IDLE,
                )
            )
        services = []
        for index in range(schedulers):
            client = await connection(f"spread-scheduler-{index}")
            routes = await RouteRegistry(client, bucket=names.routes_bucket).start()
            service = await stack.enter_async_context(
                scheduler_service(
                    client,
                    bucket=names.nodes_bucket,
                    node_prefix=names.node_prefix,
                    prefix=names.scheduler_prefix,
                    heartbeat_s=1.0,
                    routes=routes,
                    share_replicas=shared,
                )
            )
            services.append(service)
        deadline = time.monotonic() + 10.0
        while not all(len(s.scheduler.states()) >= nodes for s in services):
            if time.monotonic() > deadline:
                raise RuntimeError("the schedulers did not see every node within 10 s")
            await asyncio.sleep(0.01)
        caller_port = NatsScheduler(caller, prefix=names.scheduler_prefix)
        yield SpreadCluster(caller_port, services, node_services)


async def trial(
    cluster: SpreadCluster, function: str, replicas: int, gap_s: float
) -> tuple[list[Placement], int]:
    """Place ``replicas`` replicas of ``function`` under a hard per-node spread, request
    ``i`` sent ``i × gap_s`` after the first; the placements and the refusals."""

    async def one(replica: int) -> Placement | None:
        await asyncio.sleep(replica * gap_s)
        request = Request(namespace="spread", name=function, replica=replica, spec=SPEC,
                          spread=HARD)  # fmt: skip
        try:
            return await cluster.caller.schedule(request)
        except NoCapacity:
            return None

    outcomes = await asyncio.gather(*(one(replica) for replica in range(replicas)))
    placements = [placement for placement in outcomes if placement is not None]
    return placements, len(outcomes) - len(placements)


def violations(placements: Sequence[Placement]) -> int:
    """Replicas placed on a node that already held a sibling."""
    per_node = Counter(placement.worker_node for placement in placements)
    return sum(count - 1 for count in per_node.values())


async def measure(
    url: str, *, nodes: int, schedulers: int, shared: bool, gaps_s: Sequence[float], trials: int
) -> list[Row]:
    rows = []
    async with spread_cluster(url, nodes=nodes, schedulers=schedulers, shared=shared) as cluster:
        for gap_s in gaps_s:
            row = Row(schedulers, shared, gap_s * 1000, trials, 0, 0, 0)
            for index in range(trials):
                function = f"fn-{int(gap_s * 1e6)}-{index}"
                placements, refused = await trial(cluster, function, nodes, gap_s)
                row.placed += len(placements)
                row.refused += refused
                row.violations += violations(placements)
                await asyncio.gather(
                    *(
                        cluster.caller.release(placement, workload=f"spread/{function}/{i}")
                        for i, placement in enumerate(placements)
                    )
                )
            rows.append(row)
    return rows


async def run(
    nodes: int, schedulers: Sequence[int], gaps_s: Sequence[float], trials: int
) -> list[Row]:
    rows: list[Row] = []
    with running_server() as server:
        for count in schedulers:
            for shared in (False, True):
                rows += await measure(
                    server.url,
                    nodes=nodes,
                    schedulers=count,
                    shared=shared,
                    gaps_s=gaps_s,
                    trials=trials,
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--schedulers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--gaps-ms", type=float, nargs="+", default=[0.0, 5.0, 20.0],
        help="time between a trial's requests",
    )  # fmt: skip
    parser.add_argument("--trials", type=int, default=20, help="trials per setting")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (CI)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.quick:
        args.schedulers, args.trials, args.gaps_ms = [1, 4], 3, [0.0, 20.0]
    started = time.monotonic()
    rows = asyncio.run(run(args.nodes, args.schedulers, [g / 1000 for g in args.gaps_ms],
                           args.trials))  # fmt: skip
    elapsed = time.monotonic() - started

    def total(shared: bool, paced: bool, multi: bool = True) -> int:
        return sum(
            row.violations
            for row in rows
            if row.shared is shared and (row.gap_ms > 0) is paced and (row.schedulers > 1) is multi
        )

    single = sum(row.violations for row in rows if row.schedulers == 1)
    paced_own, paced_shared = total(False, True), total(True, True)
    ok = single == 0 and (paced_shared < paced_own or paced_own == 0)
    result = {
        "nodes": args.nodes,
        "trials": args.trials,
        "rows": [asdict(row) | {"violation_rate": round(row.violation_rate, 3)} for row in rows],
        "single_scheduler_violations": single,
        "paced_violations_own": paced_own,
        "paced_violations_shared": paced_shared,
        "burst_violations_own": total(False, False),
        "burst_violations_shared": total(True, False),
        "seconds": round(elapsed, 1),
        "ok": ok,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.nodes} nodes, {args.trials} trials of {args.nodes} replicas per row "
              f"(hard per-node spread), {elapsed:.0f} s")  # fmt: skip
        print("schedulers  replicas   gap ms   placed  violations  rate    refused")
        for row in rows:
            print(
                f"{row.schedulers:>10}  {'shared' if row.shared else 'own':>8}  "
                f"{row.gap_ms:>7g}  {row.placed:>7}  {row.violations:>10}  "
                f"{row.violation_rate:>5.1%}  {row.refused:>7}"
            )
        print(
            "ok" if ok else "FAILED: sharing did not reduce violations, or one scheduler violated"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
