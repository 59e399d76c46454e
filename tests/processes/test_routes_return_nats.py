"""A node that comes back gets its routes rewritten from its own report (issue 20), with
``berth agent`` processes on a real nats-server and two scheduler services that share their
replicas through the routes.

* ``SIGSTOP`` an agent for twice its heartbeat grace: it leaves both schedulers' views and
  they purge its routes; ``SIGCONT``: its routes come back with the same reservations,
  function fields and ``placed_at``, both schedulers count its replicas again, and a hard
  per-node spread is still refused on it (before the rewrite a third replica landed beside
  its sibling);
* ``kill -9`` an agent with the process runtime and a state directory, long enough for its
  routes to be purged, and start it again: it adopts its workloads and rewrites their routes
  from the copy it kept in its state directory.

Every process a test starts is killed at its end, pass or fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.aio.client import Client

from berth.boot import RunOrder
from berth.errors import NoCapacity
from berth.model import Layer, Placement, Request, Spec, Spread
from berth.nats.connection import connect
from berth.node.runtime import BootSpec
from berth.node.runtime.supervisor import alive, read_record
from berth.nodeclient.nats import NatsNodes
from berth.nodeclient.nats_node import ROUTES_FILE
from berth.processes.scheduler import scheduler_service
from berth.processes.up import berth_command
from berth.registry.nats_routes import NatsRoutes
from berth.registry.port import Route
from berth.scheduler.nats import NatsScheduler
from berth.scheduler.nats_server import SchedulerService
from berth.testing.nats import NatsServer
from berth.units import MiB

pytestmark = pytest.mark.slow  # agent processes on a real nats-server, several seconds each

HEARTBEAT_S = 0.5
GRACE_S = 3 * HEARTBEAT_S
"""How long a node's state lives without a heartbeat."""
SMALL = Spec(vcpus=0.01, mem=16 * MiB, disk=MiB)
HARD = Spread(hard=True)
FN = ("t", "fn")
LAYERS = (Layer(id="sha256:base", size=1000),)
SLEEPER = BootSpec(name="w", command=("sleep", "600"))


def config_text(node: str, runtime: str) -> str:
    return (
        f'[node]\nname = "{node}"\n\n'
        '[budget]\nmem_max = "1GiB"\ndisk_max = "10GiB"\ncpu_max_load = 1.0\n'
        'cpu_max_cap = 4\ndisk_bw_cap = "1GiBps"\ndisk_bw_max_load = 1.0\nnet_bw_cap = "1GiBps"\n'
        "net_bw_max_load = 1.0\n\n"
        f'[agent]\nheartbeat_s = {HEARTBEAT_S}\nruntime = "{runtime}"\nstop_grace_s = 0.5\n'
    )


class Agents:
    """``berth agent`` processes, one node each, on one state directory; every one started is
    killed at the end, and so is every workload its journal's supervisors named."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        self.tmp_path = tmp_path
        self.url = url
        self.state_dir = tmp_path / "state"
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.started: list[subprocess.Popen[bytes]] = []
        self.seen: set[tuple[int, int]] = set()

    def start(self, node: str, runtime: str = "fake") -> subprocess.Popen[bytes]:
        config = self.tmp_path / f"{node}.toml"
        config.write_text(config_text(node, runtime))
        log = open(self.logs / f"{node}-{len(self.started)}.log", "wb")  # noqa: SIM115
        command = berth_command(
            "agent",
            "--config",
            str(config),
            "--nats",
            self.url,
            "--state-dir",
            str(self.state_dir),
            "--idle-load",
            "--orphan-grace",
            "20",
        )
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.started.append(process)
        return process

    def copy_of_routes(self, node: str) -> set[str]:
        """The workloads whose routes the node's copy in its state directory holds."""
        try:
            document = json.loads((self.state_dir / node / ROUTES_FILE).read_text())
        except (OSError, ValueError):
            return set()
        return {entry["workload"] for entry in document["routes"]}

    def remember_workloads(self) -> None:
        for path in self.state_dir.glob("*/workloads/*.run"):
            record = read_record(path) or {}
            for role in ("workload", "supervisor"):
                found = record.get(role)
                if isinstance(found, list) and len(found) == 2:
                    self.seen.add((found[0], found[1]))

    def cleanup(self) -> None:
        self.remember_workloads()
        for process in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
            if process.poll() is None:
                process.kill()
                process.wait(10)
        for pid, ticks in self.seen:
            if alive(pid, ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    with NatsServer() as server:
        made = Agents(tmp_path, server.url)
        try:
            yield made
        finally:
            made.cleanup()


@dataclass
class Cluster:
    caller: NatsScheduler
    nodes: NatsNodes
    routes: NatsRoutes
    services: list[SchedulerService]

    def counts(self) -> list[dict[str, int]]:
        """Each scheduler's replicas of ``FN`` per node."""
        return [service.scheduler.replicas.where(FN) for service in self.services]

    def views(self) -> list[set[str]]:
        return [set(service.scheduler.states()) for service in self.services]


@contextlib.asynccontextmanager
async def schedulers(url: str, count: int) -> AsyncIterator[Cluster]:
    async with contextlib.AsyncExitStack() as stack:

        async def connection(name: str) -> Client:
            client = await connect(url, name=name)
            stack.push_async_callback(client.close)
            return client

        services = []
        for index in range(count):
            client = await connection(f"scheduler-{index}")
            routes = await NatsRoutes(client).start()
            services.append(
                await stack.enter_async_context(
                    scheduler_service(client, heartbeat_s=HEARTBEAT_S, routes=routes)
                )
            )
        caller = await connection("test")
        yield Cluster(
            NatsScheduler(caller),
            NatsNodes(caller, timeout_s=2.0),
            await NatsRoutes(caller).start(),
            services,
        )


async def until(predicate: Callable[[], Awaitable[bool]], limit_s: float, what: str) -> float:
    """Seconds until ``predicate()`` holds; fails naming ``what`` after ``limit_s``."""
    started = time.monotonic()
    while not await predicate():
        assert time.monotonic() - started < limit_s, f"{what}: not within {limit_s:g}s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def place_and_run(cluster: Cluster, request: Request) -> Placement:
    """Place ``request`` through the schedulers and run a workload under its reservation."""
    placement = await cluster.caller.schedule(request)
    await cluster.nodes.try_run(
        placement.worker_node,
        RunOrder(SMALL, LAYERS, SLEEPER, reservation=placement.reservation_id),
    )
    return placement


def test_a_silenced_agent_gets_its_routes_back_and_is_counted_for_spreading(
    agents: Agents,
) -> None:
    async def scenario() -> None:
        processes = {node: agents.start(node) for node in ("n1", "n2")}
        async with schedulers(agents.url, 2) as cluster:

            async def both_nodes_seen() -> bool:
                return all(view == {"n1", "n2"} for view in cluster.views())

            await until(both_nodes_seen, 20, "both agents in both views")
            placements = [
                await place_and_run(
                    cluster,
                    Request(namespace="t", name="fn", replica=replica, spec=SMALL, spread=HARD),
                )
                for replica in range(2)
            ]
            assert {p.worker_node for p in placements} == {"n1", "n2"}
            paused = placements[0].worker_node
            # and one of another function on it, only placed (a lease it holds)
            other = await cluster.caller.schedule(
                Request(namespace="t", name="other", spec=SMALL, preferred_node=paused, replica=0)
            )
            assert other.worker_node == paused

            async def copy_taken() -> bool:
                return agents.copy_of_routes(paused) == {"t/fn/0", "t/other/0"}

            await until(copy_taken, 10, "the node's pass read its routes")
            before = await cluster.routes.list(paused)
            assert len(before) == 2

            os.kill(processes[paused].pid, signal.SIGSTOP)
            paused_at = time.monotonic()
            try:

                async def purged() -> bool:
                    return (
                        all(paused not in view for view in cluster.views())
                        and all(paused not in counts for counts in cluster.counts())
                        and not await cluster.routes.list(paused)
                    )

                elapsed = await until(purged, 20, "out of every view, its routes purged")
                print(f"SIGSTOP: out of both views, routes purged after {elapsed:.2f}s")
                await asyncio.sleep(max(0.0, 2 * GRACE_S - (time.monotonic() - paused_at)))
                assert not await cluster.routes.list(paused)
            finally:
                os.kill(processes[paused].pid, signal.SIGCONT)
            resumed_at = time.monotonic()

            async def rewritten() -> bool:
                return await cluster.routes.list(paused) == before

            elapsed = await until(rewritten, 15, "its routes rewritten")
            print(f"SIGCONT: routes rewritten {elapsed:.2f}s after")
            expected = {p.worker_node: 1 for p in placements}

            async def counted() -> bool:
                return all(counts == expected for counts in cluster.counts())

            elapsed = await until(counted, 15, "both schedulers count its replica again")
            print(f"SIGCONT: counted again {time.monotonic() - resumed_at:.2f}s after")
            # the spread holds on the returned node: a third replica has nowhere to go
            with pytest.raises(NoCapacity, match="spread"):
                await cluster.caller.schedule(
                    Request(namespace="t", name="fn", replica=2, spec=SMALL, spread=HARD)
                )
            route = await cluster.routes.whereis("t/fn/0")
            assert route == Route(
                "t/fn/0",
                paused,
                placements[0].reservation_id,
                SMALL,
                before[0].placed_at,
                *FN,
            )

    asyncio.run(scenario())


def test_a_restarted_agent_rewrites_the_routes_of_the_workloads_it_adopted(
    agents: Agents,
) -> None:
    async def scenario() -> None:
        agent = agents.start("n1", runtime="process")
        async with schedulers(agents.url, 1) as cluster:

            async def seen() -> bool:
                return all(view == {"n1"} for view in cluster.views())

            await until(seen, 20, "the agent in the view")
            placements = [
                await place_and_run(
                    cluster, Request(namespace="t", name="fn", replica=replica, spec=SMALL)
                )
                for replica in range(2)
            ]
            agents.remember_workloads()

            async def copy_taken() -> bool:
                return agents.copy_of_routes("n1") == {"t/fn/0", "t/fn/1"}

            await until(copy_taken, 10, "the node's pass read its routes")
            before = await cluster.routes.list("n1")
            assert [route.reservation_id for route in before] == [
                p.reservation_id for p in placements
            ]

            agent.send_signal(signal.SIGKILL)
            agent.wait(10)

            async def purged() -> bool:
                return not await cluster.routes.list("n1") and not cluster.counts()[0]

            await until(purged, 20, "its routes purged")
            agents.start("n1", runtime="process")

            async def rewritten() -> bool:
                return await cluster.routes.list("n1") == before

            elapsed = await until(rewritten, 20, "its routes rewritten after the restart")
            print(f"restart: routes rewritten {elapsed:.2f}s after the agent started")
            await until(
                lambda: _true(cluster.counts() == [{"n1": 2}]), 10, "its replicas counted again"
            )

    asyncio.run(scenario())


async def _true(value: bool) -> bool:
    return value
