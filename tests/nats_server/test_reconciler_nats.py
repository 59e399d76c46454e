"""One reconciler at a time over a real nats-server: two scheduler services, each serving the API
(:func:`berth.processes.scheduler.scheduler_api`) on its own connection, contend for the lease
in ``berth_leases``. Exactly one reconciles — a ghost booted behind the API's back is stopped,
and only its passes are counted — and when its connection closes (what a killed process leaves),
it stops acting and the other takes over within the lease's TTL and a period. And the issue's
fourth test: the API's scheduler (the reconciler too) loses its connection with creates in
flight — afterwards every workload a node runs is recorded ``running`` on it within the TTL and
two periods (the creates answered 503 after their boot are adopted).

Its own nats-server: the API's buckets and the lease are not namespaced (one API per server)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import httpx

from berth.api.server import ApiServer
from berth.boot import BootSpec, RunOrder
from berth.embedded import embedded_configs
from berth.model import Spec
from berth.nats.names import Names
from berth.observability.metrics import Metrics
from berth.processes.scheduler import scheduler_api
from berth.registry.nats import NatsWorkloads
from berth.scheduler.nats_server import SchedulerService
from berth.testing.cluster import NatsServices, nats_cluster
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


async def ghost_stopped(cluster: NatsServices, node: str, workload_id: str) -> float:
    """Boot ``workload_id`` on ``node`` behind the API; seconds until it is stopped."""
    boot = BootSpec(name=workload_id, command=("sleep", "60"))
    await cluster.nodes.try_run(node, RunOrder(SPEC, [], boot, workload_id=workload_id))
    started = time.monotonic()
    agent = cluster.node_services[node].agent
    while agent.status(workload_id).state == "running":
        assert time.monotonic() - started < 10.0, f"ghost {workload_id} never stopped"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


TOKEN = "reconcile-test-token-0123"


@contextlib.asynccontextmanager
async def two_apis(nodes: int = 2) -> AsyncIterator[tuple[NatsServices, list[ApiServer]]]:
    """``nodes`` agents and two scheduler services, each serving the API (port 0) and
    contending for the reconciler's lease, on a nats-server of their own."""
    configs = embedded_configs(nodes, runtime="fake", heartbeat_s=0.5)
    names = Names.namespaced("reconcile")
    with running_server() as server:
        async with (
            nats_cluster(server.url, configs, schedulers=2, names=names) as cluster,
            contextlib.AsyncExitStack() as stack,
        ):
            servers = [
                await stack.enter_async_context(
                    scheduler_api(
                        service.client,
                        service,
                        host="127.0.0.1",
                        port=0,
                        token=TOKEN,
                        reconcile_every_s=PERIOD_S,
                        lease_ttl_s=LEASE_TTL_S,
                    )
                )
                for service in cluster.scheduler_services
            ]
            yield cluster, servers


async def the_holder(services: list[SchedulerService]) -> int:
    """The index of the service that reconciles (once one has passed twice)."""
    for _ in range(100):
        counts = [passes(service) for service in services]
        if max(counts) >= 2:
            return counts.index(max(counts))
        await asyncio.sleep(0.05)
    raise AssertionError("no scheduler service reconciled")


def test_one_scheduler_reconciles_and_the_other_takes_over_when_it_is_gone() -> None:
    async def scenario() -> None:
        async with two_apis() as (cluster, _):
            services = cluster.scheduler_services
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


async def converged(cluster: NatsServices, workloads: NatsWorkloads, since: float) -> float:
    """Wait until every workload a node runs is named by a ``running`` record of that node;
    the seconds from ``since``."""
    while True:
        records = {r.id: r for r in await workloads.list()}
        unrecorded = [
            (node, workload_id)
            for node, service in cluster.node_services.items()
            for workload_id in service.agent.workloads()
            if workload_id not in records
            or records[workload_id].state != "running"
            or records[workload_id].node != node
        ]
        if not unrecorded:
            return time.monotonic() - since
        assert time.monotonic() - since < 10.0, unrecorded
        await asyncio.sleep(0.05)


def test_killing_the_api_scheduler_with_creates_in_flight_leaves_nothing_unrecorded() -> None:
    """The API's scheduler (also the reconciler) loses its connection while creates are in
    flight; the other service takes the lease over, and within its TTL and two periods every
    workload a node runs is named by a ``running`` record on that node."""

    async def scenario() -> None:
        async with two_apis(3) as (cluster, servers):
            services = cluster.scheduler_services
            index = await the_holder(services)
            url = servers[index].url
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=20) as api:

                async def create(replica: int) -> int:
                    body = {"name": "burst", "replica": replica, "type": "micro"}
                    try:
                        answer = await api.post("/v1/workloads", json={**body, "command": ["x"]})
                    except httpx.HTTPError:
                        return 0  # the API went away under it
                    return answer.status_code

                creates = [asyncio.create_task(create(replica)) for replica in range(24)]
                pending = set(creates)
                while pending:  # until the first workload booted, the others in flight
                    done, pending = await asyncio.wait(pending, return_when="FIRST_COMPLETED")
                    if any(task.result() == 201 for task in done):
                        break
                await services[index].client.close()  # the API's scheduler dies
                killed_at = time.monotonic()
                workloads = await NatsWorkloads(cluster.client).start()
                took = await converged(cluster, workloads, killed_at)
                statuses = await asyncio.gather(*creates)  # the dead API's answers
            assert await converged(cluster, workloads, killed_at) >= took  # and it holds
            running = sum(len(s.agent.workloads()) for s in cluster.node_services.values())
            assert running > 0  # some creates booted before the scheduler died
            print(f"statuses {sorted(statuses)}")
            print(f"{running} running, each recorded running {took:.2f}s after the kill")
            assert took < LEASE_TTL_S + 2 * PERIOD_S + 1.0, took  # the TTL, then two passes

    asyncio.run(scenario())
