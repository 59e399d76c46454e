"""Three agents in separate processes and two schedulers, through a real nats-server: the
issue's multi-process scenario.  Placements follow the ranking; ``kill -9`` of an agent takes
it out of both schedulers' replicas within three heartbeats and purges its routes; SIGSTOP
(a partition-like silence) is treated as death, and the resumed agent re-registers with its
reservations counted once."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from berth.errors import NoCapacity
from berth.model import Request, Spec
from berth.nats.connection import connect
from berth.processes.up import LocalCluster
from berth.registry.nats_routes import NatsRoutes
from berth.scheduler.nats import NatsScheduler
from berth.units import GiB, MiB

pytestmark = pytest.mark.slow  # starts a whole berth up

HEARTBEAT_S = 0.5
HALF = Spec(vcpus=0.01, mem=512 * MiB, disk=GiB)  # memory decides; CPU never does
SLACK_S = 1.5  # the replica's sweep, the census poll, a busy 2-core machine


async def _until(predicate: object, limit_s: float) -> float:
    """Seconds until ``predicate()`` (awaited) holds; fails after ``limit_s``."""
    started = time.monotonic()
    while not await predicate():  # type: ignore[operator]
        assert time.monotonic() - started < limit_s, f"not within {limit_s:g}s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def test_agents_in_processes_die_are_silenced_and_come_back() -> None:
    cluster = LocalCluster(
        3,
        schedulers=2,
        heartbeat_s=HEARTBEAT_S,
        auth=False,
        runtime="fake",
        lease_ttl_s=300,
        policy="seed",  # the name-order fill the placements below expect
    )
    with cluster:
        asyncio.run(_scenario(cluster))


async def _scenario(cluster: LocalCluster) -> None:
    client = await connect(cluster.url, name="test")
    try:
        scheduler = NatsScheduler(client)
        routes = await NatsRoutes(client).start()

        async def sees(present: set[str], absent: set[str]) -> bool:
            members = await scheduler.census(0.15)
            return len(members) == 2 and all(
                present <= set(nodes) and not absent & set(nodes) for nodes in members.values()
            )

        # -- placements follow the seed ranking: name order, each node filled in turn ---------
        # (whichever scheduler of the queue group answers, and however stale its replica)
        placed = {}
        for replica in range(6):
            request = Request(namespace="mp", name="any", replica=replica, spec=HALF)
            placed[request.key] = (await scheduler.schedule(request)).worker_node
        for replica in range(2):
            request = Request(
                namespace="mp",
                name="arm",
                replica=replica,
                spec=HALF,
                platforms=("linux/arm64",),
            )
            placed[request.key] = (await scheduler.schedule(request)).worker_node
        nodes = list(placed.values())
        assert nodes == ["node-00"] * 4 + ["node-01"] * 2 + ["node-02"] * 2, nodes
        for workload, node in placed.items():
            route = await routes.whereis(workload)
            assert route is not None and route.node == node

        # -- kill -9: gone from both replicas within 3 heartbeats, its routes purged ----------
        killed = cluster.agent_processes[1]
        os.kill(killed.pid, signal.SIGKILL)
        elapsed = await _until(lambda: sees({"node-00", "node-02"}, {"node-01"}), 10)
        print(f"kill -9: gone from both replicas after {elapsed:.2f}s")
        assert elapsed <= 3 * HEARTBEAT_S + SLACK_S, elapsed

        async def no_routes_on_node_01() -> bool:
            return not await routes.list("node-01")

        await _until(no_routes_on_node_01, 3)
        assert await routes.whereis("mp/any/0/0") is None

        # -- SIGSTOP: silence is death; SIGCONT: it re-registers, counted once ----------------
        silenced = cluster.agent_processes[2]
        os.kill(silenced.pid, signal.SIGSTOP)
        try:
            elapsed = await _until(lambda: sees({"node-00"}, {"node-01", "node-02"}), 10)
            print(f"SIGSTOP: gone from both replicas after {elapsed:.2f}s")
            assert elapsed <= 3 * HEARTBEAT_S + SLACK_S, elapsed
        finally:
            os.kill(silenced.pid, signal.SIGCONT)
        await _until(lambda: sees({"node-00", "node-02"}, {"node-01"}), 10)
        # node-02 (8 GiB) still holds its two 512 MiB leases: exactly 7 GiB fit, not a byte more
        exact = Spec(vcpus=0.01, mem=7 * GiB, disk=2**20)
        arm = ("linux/arm64",)
        fill = Request(namespace="mp", name="fill", spec=exact, platforms=arm)
        assert (await scheduler.schedule(fill)).worker_node == "node-02"
        one_more = Request(
            namespace="mp", name="more", spec=Spec(vcpus=0.01, mem=1, disk=1), platforms=arm
        )
        with pytest.raises(NoCapacity):
            await scheduler.schedule(one_more)

        # -- SIGTERM: an agent leaves at once (its key deleted), a scheduler exits cleanly ----
        leaving = cluster.agent_processes[0]
        leaving.send_signal(signal.SIGTERM)
        elapsed = await _until(lambda: sees({"node-02"}, {"node-00", "node-01"}), 5)
        assert elapsed < HEARTBEAT_S + 0.5, elapsed  # not waiting for the expiry
        assert await asyncio.to_thread(leaving.wait, 10) == 0
        first, second = cluster.scheduler_processes
        first.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(first.wait, 10) == 0
        assert second.poll() is None
        census = await scheduler.census(0.3)
        assert list(census.values()) == [("node-02",)]
        # the remaining scheduler serves alone: node-02 is full, so the answer is its refusal
        with pytest.raises(NoCapacity, match="insufficient memory"):
            await scheduler.schedule(one_more)
    finally:
        await client.close()
