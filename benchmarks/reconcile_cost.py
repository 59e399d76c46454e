"""What the reconciler costs: a node's report of its workloads, and a pass over a cluster.

The reconciler (:mod:`berth.api.reconciler`) asks every node which workload ids it runs
(``berth.node.<node>.running``, :meth:`~berth.nodeclient.port.AgentClient.running`) and
compares the answers with the API's records.  Two measurements, on a real ``nats-server``
(:mod:`berth.testing.nats`) with agents (fake runtime, idle load) and a scheduler service in
this process, talking only through NATS:

* **one report** — a node running N workloads (``--workloads``, e.g. 0, 100, 1000): the
  request's and the reply's size in bytes (the request carries no fields; the reply is the
  sorted ids, ``w-`` and 12 hex digits each, about 17 bytes per workload) and the round
  trip's median and p99 over ``--calls`` calls;
* **one pass** — ``--nodes`` nodes with ``--per-node`` workloads each, every one recorded
  ``running`` in the API's registry (in memory: the registry's own listing is not what is
  measured), a :class:`~berth.api.reconciler.Reconciler` pass timed ``--passes`` times (a
  converged cluster: nothing to change, every node asked — a fresh reconciler each time,
  holding no report).  The extrapolation to 10,000
  nodes is linear in the nodes (``pass_s × 10000 / nodes``).  Every agent here answers on
  the benchmark's own event loop, so the pass's time includes all the nodes' work done on
  one core (on real machines it is done in parallel): the per-node figure grows with the
  nodes measured, and the extrapolation is of the loaded case.  (A profile of a 400-node pass
  puts most of it in listing the records: the memory registry deep-copies each one.)  The
  bytes per pass are the request and reply sizes summed over the nodes.

* **a pass at scale** (issue 36: a converged pass within 0.5 s at 10,000 nodes and 100,000
  records) — ``--scale-nodes`` simulated nodes (default 10,000) with ``--per-node``
  workloads each: no agents, but what a scheduler sees of them on the real server — every
  node's ``NodeState`` (berth's encoder, :func:`~berth.store.nats.encode_state`, with the
  digest of its report) published into the nodes bucket that a real scheduler service
  follows, and the nodes' ``running`` questions answered in berth's wire format by one
  subscription.  The records are the registry's watched copy
  (:class:`~berth.registry.port.RecordIndex`).  The first pass asks every node; before each
  later one every node publishes a snapshot (the heartbeat each sends within a period) with
  the same digest, and the pass is timed once the scheduler's replica holds them: a
  converged pass asks no node.  ``changed`` passes then alter ``--changed`` nodes' reports
  (one workload more each, a ghost) before their heartbeat: those nodes are asked.

``--json`` prints one JSON object; ``--quick`` is the CI smoke run (~15 s).  Exits 1 if a
report ever differs from what the node runs, if a converged pass changes anything or asks a
node, or if a changed pass asks other nodes than the changed ones.
Loopback only; it stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

from berth.api.backend import ClusterBackend
from berth.api.reconciler import Reconciler
from berth.boot import BootSpec, RunOrder
from berth.embedded import embedded_configs
from berth.model import Request, Spec
from berth.nats.connection import connect, settle
from berth.nats.names import Names
from berth.nats.wire import encode_request, node_token, ok_reply
from berth.platform import host
from berth.processes.scheduler import scheduler_service
from berth.registry.memory import MemoryImages, MemoryWorkloads
from berth.registry.port import StoredWorkload, new_workload_id
from berth.state import NodeState, running_digest
from berth.store.nats import encode_state
from berth.testing.cluster import NatsServices, nats_cluster
from berth.testing.nats import running_server, unique_name
from berth.units import GiB, KiB

SPEC = Spec(vcpus=0.0001, mem=64 * KiB, disk=64 * KiB)
EXTRAPOLATE_TO = 10_000


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def boot(cluster: NatsServices, node: str, count: int) -> list[str]:
    """``count`` workloads on ``node`` under fresh ids (a few at a time)."""
    ids = [new_workload_id() for _ in range(count)]
    for start in range(0, count, 50):
        await asyncio.gather(
            *(
                cluster.nodes.try_run(
                    node,
                    RunOrder(SPEC, [], BootSpec(name=i, command=("sleep", "600")), workload_id=i),
                )
                for i in ids[start : start + 50]
            )
        )
    return ids


async def one_report(url: str, workloads: list[int], calls: int) -> list[dict[str, Any]]:
    rows = []
    configs = embedded_configs(1, runtime="fake", heartbeat_s=1.0)
    names = Names.namespaced(unique_name("report"))
    async with nats_cluster(url, configs, names=names) as cluster:
        node = next(iter(cluster.node_services))
        running: list[str] = []
        for count in sorted(workloads):
            running += await boot(cluster, node, count - len(running))
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                report = await cluster.nodes.running(node)
                times.append(time.perf_counter() - started)
            if report != tuple(sorted(running)):
                raise SystemExit(f"node {node} reported {len(report)} ids, runs {len(running)}")
            rows.append(
                {
                    "workloads": count,
                    "request_bytes": len(encode_request({})),
                    "reply_bytes": len(ok_reply(list(report))),
                    "median_ms": statistics.median(times) * 1000,
                    "p99_ms": percentile(times, 0.99) * 1000,
                }
            )
    return rows


async def one_pass(url: str, nodes: int, per_node: int, passes: int) -> dict[str, Any]:
    configs = embedded_configs(nodes, runtime="fake", heartbeat_s=2.0)
    names = Names.namespaced(unique_name("pass"))
    async with nats_cluster(url, configs, names=names) as cluster:
        service = cluster.scheduler_services[0]
        workloads = MemoryWorkloads()
        backend = ClusterBackend(
            service.scheduler,
            service.scheduler.nodes,  # type: ignore[arg-type]  # NatsNodes: an AgentClient
            service.scheduler,
            workloads,
            MemoryImages(),
            metrics=service.scheduler.metrics,
        )
        request = Request(namespace="bench", name="w", spec=SPEC).model_dump(mode="json")
        booted = await asyncio.gather(
            *(boot(cluster, node, per_node) for node in sorted(cluster.node_services))
        )
        for node, ids in zip(sorted(cluster.node_services), booted, strict=True):
            for replica, workload_id in enumerate(ids):
                await workloads.record(stored(node, workload_id, replica, request))
        times, changed, unanswered = [], 0, 0
        for _ in range(passes):  # a reconciler of its own each: it holds no node's report
            report = await Reconciler(backend).reconcile()
            times.append(report.seconds)
            changed += sum(report.transitions.values()) + report.ghosts_seen
            unanswered += report.nodes_unanswered
        reply = len(ok_reply(booted[0]))
        median_s = statistics.median(times)
        return {
            "nodes": nodes,
            "per_node": per_node,
            "records": nodes * per_node,
            "passes": passes,
            "pass_median_ms": median_s * 1000,
            "pass_max_ms": max(times) * 1000,
            "per_node_ms": median_s * 1000 / nodes,
            "changed": changed,
            "unanswered": unanswered,
            "bytes_per_pass": nodes * (len(encode_request({})) + reply),
            f"extrapolated_{EXTRAPOLATE_TO}_nodes_s": median_s * EXTRAPOLATE_TO / nodes,
            f"extrapolated_{EXTRAPOLATE_TO}_nodes_bytes": EXTRAPOLATE_TO
            * (len(encode_request({})) + reply),
        }


def stored(node: str, workload_id: str, replica: int, request: dict[str, Any]) -> StoredWorkload:
    """The record of a workload ``node`` runs, as the API keeps it."""
    return StoredWorkload(
        id=workload_id,
        namespace="bench",
        name=f"w-{node}",
        replica=replica,
        node=node,
        node_workload_id=workload_id,
        colocated_bytes=0,
        rank=0,
        state="running",
        command=["sleep", "600"],
        restartable=False,
        created_at=time.time(),
        request=request,
    )


class SimulatedNodes:
    """``count`` nodes as a scheduler sees them over NATS: their snapshots in the nodes
    bucket, their ``running`` reports answered by one subscription (counted per node)."""

    def __init__(self, names: Names, count: int, per_node: int) -> None:
        self.names = names
        self.runs = {
            f"sim-{i:05d}": [new_workload_id() for _ in range(per_node)] for i in range(count)
        }
        self.generation = 0
        self.asked: dict[str, int] = {}
        self.platform = host()

    def state(self, node: str) -> NodeState:
        return NodeState(
            node=node,
            platform=self.platform,
            generation=self.generation,
            published_at=time.time(),
            mem_free=64 * GiB,
            disk_free=512 * GiB,
            cpu_capacity=64.0,
            disk_bw_ceiling=1e9,
            net_bw_ceiling=1e9,
            running_digest=running_digest(self.runs[node]),
        )

    async def answer(self, client: Any) -> None:
        prefix = f"{self.names.node_prefix}."

        async def on_request(msg: Any) -> None:
            node, _, operation = msg.subject[len(prefix) :].partition(".")  # a plain token
            if operation != "running" or node not in self.runs:
                return
            self.asked[node] = self.asked.get(node, 0) + 1
            await msg.respond(ok_reply(sorted(self.runs[node])))

        await client.subscribe(f"{prefix}*.running", cb=on_request)
        await settle(client)

    async def heartbeat(self, client: Any, scheduler: Any) -> None:
        """Every node publishes one snapshot; returns once the scheduler's replica has them."""
        self.generation += 1
        bucket = f"$KV.{self.names.nodes_bucket}."
        for node in self.runs:
            await client.publish(bucket + node_token(node), encode_state(self.state(node)))
        await client.flush()
        deadline = time.monotonic() + 60
        while True:
            states = scheduler.states()
            if len(states) == len(self.runs) and all(
                s.generation >= self.generation for s in states.values()
            ):
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"the replica holds {len(states)} of {len(self.runs)} nodes")
            await asyncio.sleep(0.05)


async def scale_pass(
    url: str, nodes: int, per_node: int, passes: int, changed: int
) -> dict[str, Any]:
    names = Names.namespaced(unique_name("scale"))
    simulated = SimulatedNodes(names, nodes, per_node)
    node_side = await connect(url, name="berth-simulated-nodes")
    scheduler_side = await connect(url, name="berth-scheduler")
    try:
        async with scheduler_service(
            scheduler_side,
            bucket=names.nodes_bucket,
            node_prefix=names.node_prefix,
            prefix=names.scheduler_prefix,
            heartbeat_s=30.0,
        ) as service:
            await simulated.answer(node_side)
            started = time.perf_counter()
            await simulated.heartbeat(node_side, service.scheduler)
            synced_s = time.perf_counter() - started
            workloads = MemoryWorkloads()
            request = Request(namespace="bench", name="w", spec=SPEC).model_dump(mode="json")
            for node, ids in simulated.runs.items():
                for replica, workload_id in enumerate(ids):
                    await workloads.record(stored(node, workload_id, replica, request))
            backend = ClusterBackend(
                service.scheduler,
                service.scheduler.nodes,  # type: ignore[arg-type]  # NatsNodes: an AgentClient
                service.scheduler,
                workloads,
                MemoryImages(),
                metrics=service.scheduler.metrics,
            )
            reconciler = Reconciler(backend, records=workloads)
            first = await reconciler.reconcile()
            converged, problems = [], []
            if first.nodes_asked != nodes or first.converged != nodes * per_node:
                problems.append(f"first pass: {first}")
            for _ in range(passes):
                await simulated.heartbeat(node_side, service.scheduler)
                report = await reconciler.reconcile()
                converged.append(report.seconds)
                if report.nodes_asked or report.transitions or report.ghosts_seen:
                    problems.append(f"converged pass: {report}")
            changed_times = []
            for _ in range(passes):
                altered = sorted(simulated.runs)[:changed]
                for node in altered:  # a ghost on each: its report's digest changes
                    simulated.runs[node].append(new_workload_id())
                simulated.asked.clear()
                await simulated.heartbeat(node_side, service.scheduler)
                report = await reconciler.reconcile()
                changed_times.append(report.seconds)
                if set(simulated.asked) != set(altered) or report.ghosts_seen != changed:
                    problems.append(f"changed pass asked {len(simulated.asked)}: {report}")
                for node in altered:
                    simulated.runs[node].pop()
                await simulated.heartbeat(node_side, service.scheduler)
                await reconciler.reconcile()  # back as recorded
    finally:
        await node_side.close()
        await scheduler_side.close()
    for problem in problems:
        print(problem, file=sys.stderr)
    return {
        "nodes": nodes,
        "records": nodes * per_node,
        "sync_s": synced_s,
        "first_pass_s": first.seconds,
        "converged_median_s": statistics.median(converged),
        "converged_max_s": max(converged),
        "changed_nodes": changed,
        "changed_median_s": statistics.median(changed_times),
        "changed_max_s": max(changed_times),
        "ok": not problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workloads", type=int, nargs="+", default=[0, 10, 100, 1000])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--per-node", type=int, default=10)
    parser.add_argument("--passes", type=int, default=10)
    parser.add_argument("--scale-nodes", type=int, default=EXTRAPOLATE_TO)
    parser.add_argument("--changed", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (CI)")
    args = parser.parse_args(argv)
    if args.quick:
        args.workloads, args.calls, args.nodes, args.per_node, args.passes = [0, 100], 50, 50, 4, 3
        args.scale_nodes, args.changed = 1000, 10

    async def run() -> dict[str, Any]:
        with running_server() as server:
            reports = await one_report(server.url, args.workloads, args.calls)
            cluster_pass = await one_pass(server.url, args.nodes, args.per_node, args.passes)
            scale = await scale_pass(
                server.url, args.scale_nodes, 10, min(args.passes, 5), args.changed
            )
        return {"reports": reports, "pass": cluster_pass, "scale": scale}

    result = asyncio.run(run())
    result["ok"] = (
        result["pass"]["changed"] == 0
        and result["pass"]["unanswered"] == 0
        and result["scale"]["ok"]
    )
    if args.json:
        print(json.dumps(result))
    else:
        for row in result["reports"]:
            print(
                f"report of {row['workloads']:>5} workloads: {row['reply_bytes']:>6} B reply, "
                f"median {row['median_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms"
            )
        p = result["pass"]
        print(
            f"pass over {p['nodes']} nodes × {p['per_node']}: median {p['pass_median_ms']:.1f} ms "
            f"({p['per_node_ms']:.3f} ms/node); 10,000 nodes ≈ "
            f"{p[f'extrapolated_{EXTRAPOLATE_TO}_nodes_s']:.2f} s, "
            f"{p[f'extrapolated_{EXTRAPOLATE_TO}_nodes_bytes'] / 1e6:.1f} MB per pass"
        )
        s = result["scale"]
        print(
            f"pass at scale, {s['nodes']} simulated nodes, {s['records']} records: first "
            f"{s['first_pass_s']:.2f} s (every node asked); converged median "
            f"{s['converged_median_s'] * 1000:.0f} ms, max {s['converged_max_s'] * 1000:.0f} ms; "
            f"{s['changed_nodes']} nodes changed: median {s['changed_median_s'] * 1000:.0f} ms, "
            f"max {s['changed_max_s'] * 1000:.0f} ms"
        )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
