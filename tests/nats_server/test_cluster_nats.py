"""Agents and schedulers that meet only through a real nats-server, in one process: the
placement port over NATS passes the placement contract; routes follow reservations; typed
errors cross the network; a stopped node leaves the replicas and its routes go."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from berth.embedded import embedded_configs
from berth.errors import NoCapacity, NoMatchingPlatform, Unavailable
from berth.model import Request, Spec
from berth.platform import Platform
from berth.scheduler.nats import NatsScheduler
from berth.scheduler.port import Scheduler
from berth.testing.cluster import Names, NatsServices, nats_cluster
from berth.testing.nats import NatsServer, unique_name
from berth.testing.placement_contract import SchedulerContract
from berth.units import MiB

SMALL = Spec(vcpus=0.01, mem=16 * MiB, disk=16 * MiB)


def cluster(
    url: str, nodes: int = 3, schedulers: int = 1
) -> AbstractAsyncContextManager[NatsServices]:
    configs = embedded_configs(nodes, runtime="fake", heartbeat_s=1.0)
    return nats_cluster(
        url, configs, schedulers=schedulers, names=Names.namespaced(unique_name("c"))
    )


class TestNatsSchedulerContract(SchedulerContract):
    @pytest.fixture(autouse=True)
    def _server(self, nats_server: NatsServer) -> None:
        self.url = nats_server.url

    def node_platforms(self) -> set[Platform]:
        return {Platform.parse("linux/amd64"), Platform.parse("linux/arm64")}

    def valid_spec(self) -> Spec | None:
        return SMALL

    def open_scheduler(self) -> AbstractAsyncContextManager[Scheduler]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[Scheduler]:
            async with cluster(self.url) as running:
                yield running.scheduler

        return opened()


async def _eventually(predicate: object, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        outcome = predicate()  # type: ignore[operator]
        if not isinstance(outcome, bool):
            outcome = await outcome
        if outcome:
            return
        assert asyncio.get_running_loop().time() < deadline, "did not happen in time"
        await asyncio.sleep(0.02)


def test_routes_follow_placements_and_releases(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        async with cluster(nats_server.url) as running:
            requests = [Request(namespace="t", name="fn", replica=i, spec=SMALL) for i in range(4)]
            placements = [await running.scheduler.schedule(r) for r in requests]
            for request, placement in zip(requests, placements, strict=True):
                route = await running.routes.whereis(request.key)
                assert route is not None and route.node == placement.worker_node
                assert route.reservation_id == placement.reservation_id and route.spec == SMALL
            assert [r.workload for r in await running.routes.list()] == [r.key for r in requests]
            assert await running.scheduler.release(placements[0], workload=requests[0].key)
            assert await running.routes.whereis(requests[0].key) is None
            # released on the node directly: the node notices within a heartbeat
            node, reservation = placements[1].worker_node, placements[1].reservation_id
            assert reservation is not None
            assert await running.nodes.release(node, reservation) is True

            async def gone() -> bool:
                return await running.routes.whereis(requests[1].key) is None

            await _eventually(gone, 3.0)
            assert await running.routes.whereis("t/nothing/0") is None

    asyncio.run(scenario())


def test_typed_errors_cross_the_network(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        async with cluster(nats_server.url) as running:
            with pytest.raises(NoMatchingPlatform, match="linux/s390x"):
                await running.scheduler.schedule(
                    Request(namespace="t", name="x", platforms=("linux/s390x",), spec=SMALL)
                )
            huge = Spec(vcpus=0.01, mem=64 * 2**30, disk=1)
            with pytest.raises(NoCapacity) as caught:
                await running.scheduler.schedule(Request(namespace="t", name="x", spec=huge))
            assert set(caught.value.reasons) == set(running.node_services)
            assert "insufficient memory" in str(caught.value)
            reply = await running.client.request(
                f"{running.names.scheduler_prefix}.schedule", b'{"v":1,"request":{"name":""}}', 2
            )
            error = json.loads(reply.data)["error"]
            assert error["kind"] == "invalid" and error["field"].startswith("request.")
            assert running.scheduler_services[0].rejected == 1
            nobody = NatsScheduler(running.client, prefix=unique_name("none"), timeout_s=0.5)
            with pytest.raises(Unavailable, match="no scheduler"):
                await nobody.schedule(Request(namespace="t", name="x"))

    asyncio.run(scenario())


def test_a_stopped_node_leaves_the_replicas_and_its_routes_go(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        async with cluster(nats_server.url, nodes=3, schedulers=2) as running:
            placed = []
            for replica in range(6):
                request = Request(namespace="t", name="fn", replica=replica, spec=SMALL)
                placed.append((request, await running.scheduler.schedule(request)))
            victim = placed[0][1].worker_node
            await running.node_services[victim].stop()
            for service in running.scheduler_services:
                await _eventually(lambda s=service: victim not in s.scheduler.states(), 2.0)
            await _eventually(lambda: _no_routes_on(running, victim), 3.0)
            for request, placement in placed:
                if placement.worker_node != victim:
                    assert await running.routes.whereis(request.key) is not None
            running.node_services.pop(victim)

    asyncio.run(scenario())


async def _no_routes_on(running: NatsServices, node: str) -> bool:
    return not await running.routes.list(node)
