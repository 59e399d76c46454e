"""One reconciler at a time over a real nats-server: two scheduler services, each serving the
API (:func:`berth.api.server.scheduler_api`) on its own connection, contend for the lease in
``berth_leases``.  Exactly one reconciles — a ghost booted behind the API's back is stopped,
and only its passes are counted — and when its connection closes (what a killed process
leaves), it stops acting and the other takes over within the lease's TTL and a period.

Its own nats-server: the API's buckets and the lease are not namespaced (one API per server)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from berth.api.server import scheduler_api
from berth.boot import BootSpec
from berth.embedded import embedded_configs
from berth.model import Spec
from berth.nats.names import Names
from berth.observability.metrics import Metrics
from berth.scheduler.nats_server import SchedulerService
from berth.testing.cluster import NatsCluster, nats_cluster
from berth.testing.nats import running_server
from berth.units import MiB

PERIOD_S = 0.2
LEASE_TTL_S = 1.0
SPEC = Spec(vcpus=0.1, mem=16 * MiB, disk=MiB)


def passes(service: SchedulerService) -> float:
    metrics = service.scheduler.metrics
    assert isinstance(metrics, Metrics)
    value = metrics.registry.get_sample_value("berth_reconciler_passes_total", {"outcome": "done"})
    return 0.0 if value is None else value


async def ghost_stopped(cluster: NatsCluster, node: str, workload_id: str) -> float:
    """Boot ``workload_id`` on ``node`` behind the API; seconds until it is stopped."""
    boot = BootSpec(name=workload_id, command=("sleep", "60"))
    await cluster.nodes.try_run(node, SPEC, [], boot, workload_id=workload_id)
    started = time.monotonic()
    agent = cluster.node_services[node].agent
    while agent.status(workload_id).state == "running":
        assert time.monotonic() - started < 10.0, f"ghost {workload_id} never stopped"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def test_one_scheduler_reconciles_and_the_other_takes_over_when_it_is_gone() -> None:
    configs = embedded_configs(2, runtime="fake", heartbeat_s=0.5)
    names = Names.namespaced("reconcile")

    async def scenario() -> None:
        with running_server() as server:
            async with (
                nats_cluster(server.url, configs, schedulers=2, names=names) as cluster,
                contextlib.AsyncExitStack() as apis,
            ):
                services = cluster.scheduler_services
                for service in services:
                    await apis.enter_async_context(
                        scheduler_api(
                            service.client,
                            service,
                            host="127.0.0.1",
                            port=0,
                            token="reconcile-test-token-0123",
                            reconcile_every_s=PERIOD_S,
                            lease_ttl_s=LEASE_TTL_S,
                        )
                    )
                node = sorted(cluster.node_services)[0]
                took = await ghost_stopped(cluster, node, "w-00000000ab01")
                assert took < 2 * PERIOD_S + LEASE_TTL_S, took
                await asyncio.sleep(3 * PERIOD_S)
                counts = [passes(service) for service in services]
                assert sorted(count > 0 for count in counts) == [False, True], counts
                holder = services[counts.index(max(counts))]
                other = services[1 - services.index(holder)]
                await holder.client.close()  # what a killed scheduler process leaves
                before = passes(other)
                took = await ghost_stopped(cluster, node, "w-00000000ab02")
                assert took < LEASE_TTL_S + 3 * PERIOD_S + 1.0, took
                assert passes(other) > before
                print(f"taken over; the second ghost stopped after {took:.2f}s")

    asyncio.run(scenario())
