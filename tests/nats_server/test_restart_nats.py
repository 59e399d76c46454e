"""Failures the issue names, on a real nats-server: a server restart mid-traffic (every
request succeeds or fails typed; replicas resume; no reservation leaks), and two schedulers
racing on stale replicas for the last free memory of one node (exactly one wins)."""

from __future__ import annotations

import asyncio
import time

from berth.boot import RunOrder
from berth.embedded import embedded_configs
from berth.errors import BerthError, NoCapacity
from berth.model import Placement, Request, Spec
from berth.node.runtime import BootSpec
from berth.nodeclient.nats import NatsNodes
from berth.testing.cluster import Names, NatsServices, nats_cluster
from berth.testing.nats import NatsServer, unique_name
from berth.units import MiB

SMALL = Spec(vcpus=0.01, mem=16 * MiB, disk=16 * MiB)
HEARTBEAT_S = 1.0
LEASE_TTL_S = 2.0


def _reserved_mem(cluster: NatsServices, node: str) -> int:
    budget = cluster.node_services[node].agent.budget
    limits = budget.limits
    return int(limits.mem_max) - budget.headroom().mem_free


def test_server_restart_mid_traffic() -> None:
    configs = embedded_configs(3, runtime="fake", heartbeat_s=HEARTBEAT_S)
    with NatsServer() as server:

        async def scenario() -> None:
            async with nats_cluster(server.url, configs, lease_ttl_s=LEASE_TTL_S) as cluster:
                await _traffic_across_a_restart(server, cluster)

        asyncio.run(scenario())


async def _traffic_across_a_restart(server: NatsServer, cluster: NatsServices) -> None:
    service = cluster.scheduler_services[0]
    nodes = service.scheduler.nodes
    assert isinstance(nodes, NatsNodes)  # the agent operations of the scheduler's own client
    outcomes: dict[str, int] = {}
    stop = asyncio.Event()

    async def traffic(kind: str) -> None:
        index = 0
        while not stop.is_set():
            index += 1
            request = Request(namespace="rs", name=kind, replica=index, spec=SMALL)
            try:
                if kind == "lease":  # the placement port over NATS; leases left to expire
                    await asyncio.wait_for(cluster.scheduler.schedule(request), 15)
                else:  # place and boot: the workload owns its reservation on the node
                    boot = BootSpec(name=f"w{index}", command=("vm",))

                    async def run(node: str, boot: BootSpec = boot) -> str:
                        return await nodes.try_run(node, RunOrder(SMALL, [], boot))

                    await asyncio.wait_for(service.scheduler.place(SMALL, [], run), 15)
                outcome = "ok"
            except BerthError as error:  # typed: Unavailable, NoCapacity, Refused …
                outcome = type(error).__name__
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            await asyncio.sleep(0.01)

    workers = [asyncio.create_task(traffic(kind)) for kind in ("lease", "run", "run")]
    await asyncio.sleep(1.0)
    seen = {node: state.generation for node, state in service.scheduler.states().items()}
    await asyncio.to_thread(server.restart)  # same port, same store
    back = time.monotonic()
    while not all(
        (state := service.scheduler.states().get(node)) is not None and state.generation > gen
        for node, gen in seen.items()
    ):
        assert time.monotonic() - back < 2 * HEARTBEAT_S + 1.5, "the replica did not resume"
        await asyncio.sleep(0.05)
    resumed_s = time.monotonic() - back
    await asyncio.sleep(1.5)  # traffic after the restart
    stop.set()
    await asyncio.gather(*workers)  # none raised anything but a BerthError
    assert outcomes.get("ok", 0) > 10, outcomes
    print(f"outcomes {outcomes}; replica resumed {resumed_s:.2f}s after the server was back")

    await asyncio.sleep(LEASE_TTL_S + 0.5)  # unbound leases (and lost replies) expire
    for name, node in cluster.node_services.items():
        running = len(node.agent.workloads())
        assert _reserved_mem(cluster, name) == running * SMALL.mem, (name, running)


def test_two_schedulers_race_for_the_last_free_memory(nats_server: NatsServer) -> None:
    configs = embedded_configs(1, runtime="fake", heartbeat_s=5.0)  # node-00: 2 GiB
    names = Names.namespaced(unique_name("race"))

    async def scenario() -> None:
        async with nats_cluster(nats_server.url, configs, schedulers=2, names=names) as cluster:
            first, second = (s.scheduler for s in cluster.scheduler_services)
            mem_max = int(cluster.node_services["node-00"].agent.budget.limits.mem_max)
            fill = Spec(vcpus=0.01, mem=mem_max - 512 * MiB, disk=MiB)
            await first.schedule(Request(namespace="race", name="fill", spec=fill))
            last = Spec(vcpus=0.01, mem=512 * MiB, disk=MiB)
            for round_ in range(3):
                while any(s.states()["node-00"].mem_free != last.mem for s in (first, second)):
                    await asyncio.sleep(0.01)  # both replicas: exactly the last 512 MiB free
                requests = [
                    Request(namespace="race", name=name, replica=round_, spec=last)
                    for name in ("a", "b")
                ]
                results = await asyncio.gather(
                    first.schedule(requests[0]),
                    second.schedule(requests[1]),
                    return_exceptions=True,
                )
                wins = [r for r in results if isinstance(r, Placement)]
                losses = [r for r in results if isinstance(r, NoCapacity)]
                assert len(wins) == 1 and len(losses) == 1, results
                assert "mem_exhausted" in str(losses[0]) or "insufficient memory" in str(losses[0])
                assert _reserved_mem(cluster, "node-00") == mem_max  # full, never over
                winner = first if results[0] is wins[0] else second
                assert await winner.release(wins[0])

    asyncio.run(scenario())
