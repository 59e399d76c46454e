"""Observability overhead: ``ClusterScheduler.schedule()`` with and without its instruments.

What it measures, in one run, on one in-process cluster (``LocalNodes`` budgets and the memory
store; nodes and requests drawn from the bundled Docker Hub data by ``decision_latency``'s
generator, so the decisions are the same kind that benchmark times):

* ``bare_us`` — the median time of one ``schedule()`` (rank, walk, admission on the node's
  budget, assume) on a scheduler built without metrics, tracing off: the uninstrumented walk
  (the probe is the shared no-op);
* ``metrics_us`` — the same on a scheduler with a :class:`berth.observability.metrics.Metrics`
  and its scrape-time collector, tracing off: what ``berth scheduler`` runs when no exporter
  is configured (``scheduler_service`` always measures);
* ``traced_us`` — metrics plus tracing on, an SDK tracer provider recording every span
  (place, rank, confirm) and exporting none: the cost of making the spans, without the
  exporter's thread;
* ``metrics_ratio`` = metrics / bare in this thread's CPU time (target ≤ 1.10; CPU time,
  because on a shared machine a wall-clock batch can lose the CPU to another process), with
  ``metrics_ratio_wall`` beside it, and ``traced_ratio`` (CPU time too);
* ``scrape_ms`` — one ``GET /metrics`` body (``Metrics.exposition()``), the collector walking
  every node of the view.

The three schedulers share the store and the budgets; each round times a batch of placements
on each of them in turn (the order rotated from round to round, so machine noise hits them
alike), then releases the batch untimed so the cluster never fills up.  Medians are taken
over rounds of per-placement means, with the garbage collector off while timing.  ``--json``
prints exactly one JSON object on stdout; ``--quick`` is a seconds-long CI run.

    python benchmarks/observability_overhead.py                 # 1,000 nodes
    python benchmarks/observability_overhead.py --nodes 10000
    python benchmarks/observability_overhead.py --quick --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from berth.dataset import load_dockerhub
from berth.errors import NoCapacity
from berth.model import Placement, Request
from berth.nodeclient.local import LocalNodes
from berth.observability import tracing
from berth.observability.metrics import Metrics
from berth.scheduler.multinode import ClusterScheduler
from berth.store.memory import MemoryStore
from decision_latency import (  # benchmarks/ is the script's own directory
    ClusterGenerator,
    local_cluster,
)

TARGET_METRICS_RATIO = 1.10
VARIANTS = ("bare", "metrics", "traced")


@dataclass(frozen=True)
class Config:
    nodes: int
    layers_per_node: int
    request_layers: int
    rounds: int
    batch: int
    seed: int


def build(config: Config) -> tuple[MemoryStore, LocalNodes, list[Request]]:
    generator = ClusterGenerator(load_dockerhub(), config.seed)
    store, clients = local_cluster(generator.nodes(config.nodes, config.layers_per_node))
    requests = [
        probe.request for probe in generator.probes(4 * config.batch, config.request_layers)
    ]
    return store, clients, requests


async def timed_batch(scheduler: ClusterScheduler, batch: list[Request]) -> tuple[float, float]:
    """Seconds per placement over ``batch`` (failures included), wall clock and this thread's
    CPU time; then the batch is released, untimed."""
    held: list[Placement] = []
    gc.collect()
    gc.disable()
    try:
        start, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
        for request in batch:
            with contextlib.suppress(NoCapacity):
                held.append(await scheduler.schedule(request))
        elapsed, cpu = time.perf_counter_ns() - start, time.thread_time_ns() - start_cpu
    finally:
        gc.enable()
    for placement in held:
        await scheduler.release(placement)
    return elapsed / 1e9 / len(batch), cpu / 1e9 / len(batch)


def measure(config: Config) -> dict[str, Any]:
    store, clients, requests = build(config)
    metrics = {name: Metrics() for name in ("metrics", "traced")}
    schedulers = {
        "bare": ClusterScheduler(store, clients),
        "metrics": ClusterScheduler(store, clients, metrics=metrics["metrics"]),
        "traced": ClusterScheduler(store, clients, metrics=metrics["traced"]),
    }
    for name, measured in metrics.items():
        measured.watch(schedulers[name], stale_after_s=3600)
    provider = TracerProvider()  # records spans; no processor, so none is exported

    async def run() -> dict[str, list[tuple[float, float]]]:
        per_placement: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
        for name in VARIANTS:  # warm-up: caches, code paths, the collector's first scrape
            tracing.use(provider if name == "traced" else None)
            await timed_batch(schedulers[name], requests[: config.batch])
        tracing.use(None)
        for round_index in range(config.rounds):
            offset = (round_index * config.batch) % len(requests)
            batch = (requests + requests)[offset : offset + config.batch]
            order = VARIANTS[round_index % 3 :] + VARIANTS[: round_index % 3]
            for name in order:
                tracing.use(provider if name == "traced" else None)
                try:
                    per_placement[name].append(await timed_batch(schedulers[name], batch))
                finally:
                    tracing.use(None)
        return per_placement

    try:
        per_placement = asyncio.run(run())
    finally:
        for scheduler in schedulers.values():
            scheduler.close()
    scrapes = []
    for _ in range(5):
        start = time.perf_counter_ns()
        body = metrics["metrics"].exposition()
        scrapes.append((time.perf_counter_ns() - start) / 1e6)
    medians = {
        name: statistics.median(wall for wall, _ in times) * 1e6
        for name, times in per_placement.items()
    }
    cpu = {
        name: statistics.median(cpu for _, cpu in times) * 1e6
        for name, times in per_placement.items()
    }
    metrics_ratio = cpu["metrics"] / cpu["bare"]
    placed = metrics["metrics"].registry.get_sample_value(
        "berth_placements_total", {"outcome": "placed"}
    )
    return {
        "benchmark": "observability_overhead",
        "nodes": config.nodes,
        "layers_per_node": config.layers_per_node,
        "request_layers": config.request_layers,
        "rounds": config.rounds,
        "batch": config.batch,
        "bare_us": round(medians["bare"], 2),
        "metrics_us": round(medians["metrics"], 2),
        "traced_us": round(medians["traced"], 2),
        "bare_cpu_us": round(cpu["bare"], 2),
        "metrics_cpu_us": round(cpu["metrics"], 2),
        "traced_cpu_us": round(cpu["traced"], 2),
        "metrics_ratio": round(metrics_ratio, 3),
        "metrics_ratio_wall": round(medians["metrics"] / medians["bare"], 3),
        "traced_ratio": round(cpu["traced"] / cpu["bare"], 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "scrape_ms": round(statistics.median(scrapes), 3),
        "scrape_bytes": len(body),
        "placed_counted": placed,
        "targets": {"metrics_ratio": {"value": TARGET_METRICS_RATIO, "op": "<="}},
        "met": {"metrics_ratio": bool(metrics_ratio <= TARGET_METRICS_RATIO)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, help="cluster size (default 1000; quick 200)")
    parser.add_argument("--layers-per-node", type=int, default=30)
    parser.add_argument("--request-layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, help="timed rounds per variant (default 150)")
    parser.add_argument("--batch", type=int, default=20, help="placements per round")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print only one JSON object")
    parser.add_argument("--quick", action="store_true", help="small, seconds-long CI run")
    args = parser.parse_args()
    config = Config(
        nodes=args.nodes or (200 if args.quick else 1000),
        layers_per_node=args.layers_per_node,
        request_layers=args.request_layers,
        rounds=args.rounds or (30 if args.quick else 150),
        batch=args.batch,
        seed=args.seed,
    )
    if min(config.nodes, config.rounds, config.batch, config.layers_per_node) < 1:
        parser.error("--nodes, --rounds, --batch and --layers-per-node must be at least 1")
    print(
        f"observability overhead: {config.nodes} nodes, {config.rounds} rounds of "
        f"{config.batch} placements per variant…",
        file=sys.stderr,
    )
    result = measure(config)
    if args.json:
        print(json.dumps(result))
        return
    print("                       wall       CPU   ratio (CPU)")
    print(f"schedule() bare      {result['bare_us']:7.1f} µs {result['bare_cpu_us']:7.1f} µs")
    print(
        f"schedule() metrics   {result['metrics_us']:7.1f} µs {result['metrics_cpu_us']:7.1f} µs"
        f"   ×{result['metrics_ratio']:.3f}  (target ≤ {TARGET_METRICS_RATIO:.2f}: "
        f"{'met' if result['met']['metrics_ratio'] else 'MISSED'})"
    )
    print(
        f"schedule() traced    {result['traced_us']:7.1f} µs {result['traced_cpu_us']:7.1f} µs"
        f"   ×{result['traced_ratio']:.3f}  (spans recorded, none exported)"
    )
    print(f"one scrape           {result['scrape_ms']:9.3f} ms   ({result['scrape_bytes']} bytes)")


if __name__ == "__main__":
    main()
