"""Agents that survive their own restart (issue 20), with real processes on a real nats-server.

Each test runs ``berth agent --config F --nats URL --state-dir D`` as a child process with the
process runtime, runs ``sleep`` workloads on it through the node client over NATS, and
``kill -9``s it: restarted, it adopts every workload and publishes their reservations before it
admits anything; never restarted, its workloads (and what they spawned) are killed within the
orphan grace; a workload that exits while it is down is reported with its exit status.  Every
process a test starts is killed at its end, pass or fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from berth.boot import AdmitOrder, RunOrder
from berth.errors import BerthError
from berth.model import Layer, Spec
from berth.nats.connection import connect
from berth.node.runtime import BootSpec
from berth.node.runtime.supervisor import alive, read_record, start_ticks
from berth.nodeclient.nats import NatsNodes
from berth.processes.scheduler import scheduler_api
from berth.processes.up import berth_command
from berth.scheduler.nats_server import SchedulerService
from berth.state import NodeState
from berth.store.nats import NatsStore, bucket_ttl_s
from berth.testing.cluster import nats_cluster
from berth.testing.nats import NatsServer
from berth.units import MiB

pytestmark = pytest.mark.slow  # agent processes on a real nats-server, a few seconds each

NODE = "n1"
HEARTBEAT_S = 0.5
MEM_MAX = 1024 * MiB
QUARTER = Spec(vcpus=0.01, mem=256 * MiB, disk=MiB)
LAYERS = (Layer(id="sha256:base", size=1000),)
SLEEPER = BootSpec(name="w", command=("sleep", "600"))


def config_text(mem_max: int = MEM_MAX) -> str:
    return (
        f'[node]\nname = "{NODE}"\n\n'
        f'[budget]\nmem_max = {mem_max}\ndisk_max = "10GiB"\ncpu_max_load = 1.0\n'
        'cpu_max_cap = 4\ndisk_bw_cap = "1GiBps"\ndisk_bw_max_load = 1.0\nnet_bw_cap = "1GiBps"\n'
        "net_bw_max_load = 1.0\n\n"
        f'[agent]\nheartbeat_s = {HEARTBEAT_S}\nruntime = "process"\nstop_grace_s = 0.5\n'
    )


class Agents:
    """Agent processes on one state directory; every one started is killed at the end, and so
    is every workload its journal's supervisors named."""

    def __init__(self, tmp_path: Path, url: str, orphan_grace_s: float) -> None:
        self.url = url
        self.config = tmp_path / "agent.toml"
        self.config.write_text(config_text())
        self.state_dir = tmp_path / "state"
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.orphan_grace_s = orphan_grace_s
        self.started: list[subprocess.Popen[bytes]] = []
        self.seen: set[tuple[int, int]] = set()
        self.supervisors: set[tuple[int, int]] = set()

    def start(self) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"agent-{len(self.started)}.log", "wb")  # noqa: SIM115
        command = berth_command(
            "agent",
            "--config",
            str(self.config),
            "--nats",
            self.url,
            "--state-dir",
            str(self.state_dir),
            "--idle-load",
            "--orphan-grace",
            str(self.orphan_grace_s),
        )
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.started.append(process)
        return process

    @property
    def journal(self) -> Path:
        return self.state_dir / NODE / "workloads"

    def workload_processes(self) -> dict[str, tuple[int, int]]:
        """Each journaled workload's (pid, start ticks), from its supervisor's ``.run``."""
        found: dict[str, tuple[int, int]] = {}
        for path in self.journal.glob("*.run"):
            record = read_record(path) or {}
            started = record.get("workload")
            if isinstance(started, list) and len(started) == 2:
                found[path.stem] = (started[0], started[1])
                self.seen.add((started[0], started[1]))
            supervisor = record.get("supervisor")
            if isinstance(supervisor, list) and len(supervisor) == 2:
                self.seen.add((supervisor[0], supervisor[1]))
                self.supervisors.add((supervisor[0], supervisor[1]))
        return found

    def cleanup(self) -> None:
        self.workload_processes()
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        for pid, ticks in self.seen:
            if alive(pid, ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def log_text(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in sorted(self.logs.iterdir()))


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    with NatsServer() as server:
        made = Agents(tmp_path, server.url, orphan_grace_s=20.0)  # a restart fits in it
        try:
            yield made
        finally:
            made.cleanup()


@contextlib.asynccontextmanager
async def connected(url: str) -> AsyncIterator[tuple[NatsNodes, NatsStore]]:
    client = await connect(url, name="test")
    store = NatsStore(client, ttl_s=bucket_ttl_s(HEARTBEAT_S))
    try:
        await store.start()
        yield NatsNodes(client, timeout_s=1.0), store
    finally:
        await store.close()
        await client.close()


async def first_state_after(store: NatsStore, moment: float, limit_s: float = 20.0) -> NodeState:
    """The first snapshot of the node published after ``moment`` (wall clock)."""
    started = time.monotonic()
    while True:
        state = (await store.states()).get(NODE)
        if state is not None and state.published_at > moment:
            return state
        assert time.monotonic() - started < limit_s, "the agent published nothing"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def served_api(
    url: str, token: str, **options: Any
) -> AsyncIterator[tuple[SchedulerService, httpx.AsyncClient]]:
    """A scheduler service on ``url`` serving the API (port 0; ``options`` as
    :func:`~berth.processes.scheduler.scheduler_api` takes them) and a client of it, once the
    service sees the agent :data:`NODE`."""
    async with nats_cluster(url, [], schedulers=1) as cluster:
        service = cluster.scheduler_services[0]
        async with (
            scheduler_api(
                service.client, service, host="127.0.0.1", port=0, token=token, **options
            ) as api_server,
            httpx.AsyncClient(
                base_url=api_server.url, headers={"Authorization": f"Bearer {token}"}, timeout=20
            ) as api,
        ):
            for _ in range(400):
                if NODE in service.scheduler.states():
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the scheduler never saw the agent")
            yield service, api


def reserved(state: NodeState) -> int:
    """The memory a snapshot says is reserved."""
    assert state.mem_max is not None
    return state.mem_max - state.mem_free


def kill_9(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)


def test_a_restarted_agent_adopts_its_workloads_before_it_admits_anything(agents: Agents) -> None:
    async def scenario() -> None:
        async with connected(agents.url) as (nodes, store):
            agent = agents.start()
            await first_state_after(store, 0)
            ids = [await nodes.try_run(NODE, RunOrder(QUARTER, LAYERS, SLEEPER)) for _ in range(3)]
            running = agents.workload_processes()
            assert len(running) == 3
            kill_9(agent)
            assert all(alive(*found) for found in running.values())  # they outlive it...

            # an admission that would overflow, asked over and over through the restart window
            overflowing = Spec(vcpus=0.01, mem=512 * MiB, disk=MiB)
            admitted: list[str] = []
            refused: set[str] = set()
            stop = asyncio.Event()

            async def ask() -> None:
                while not stop.is_set():
                    try:
                        admission = await nodes.admit(NODE, AdmitOrder(overflowing, 60))
                        admitted.append(admission.reservation_id)
                    except BerthError as error:
                        refused.add(getattr(error, "reason", type(error).__name__))
                    await asyncio.sleep(0.01)

            asker = asyncio.create_task(ask())
            restarted_at = time.time()
            agents.start()
            first = await first_state_after(store, restarted_at)
            assert first.mem_max == MEM_MAX
            assert reserved(first) == 3 * QUARTER.mem  # before any admission
            await asyncio.sleep(1.0)
            stop.set()
            await asker
            assert admitted == [], f"over-committed: {admitted}"
            print(f"refused during and after the restart: {sorted(refused)}")
            assert refused & {"mem_exhausted"}, refused

            for workload_id in ids:  # ...and are adopted: running, stoppable, one reservation each
                assert (await nodes.status(NODE, workload_id)).state == "running"
            assert all(alive(*found) for found in running.values())
            fits = await nodes.admit(NODE, AdmitOrder(QUARTER, 60))
            assert await nodes.release(NODE, fits.reservation_id)
            await nodes.stop(NODE, ids[0])
            assert (await nodes.status(NODE, ids[0])).state == "ended"
            assert not alive(*running[ids[0]])
            again = await first_state_after(store, time.time())
            assert reserved(again) == 2 * QUARTER.mem
            fresh = await nodes.try_run(NODE, RunOrder(QUARTER, LAYERS, SLEEPER))
            assert fresh not in ids  # generated after the restart: no collision

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_an_agent_killed_for_good_takes_its_workloads_with_it_within_the_grace(
    agents: Agents,
) -> None:
    # a workload with a child in its group and one daemonised out of it (setsid)
    spawner = BootSpec(
        name="tree",
        command=("sh", "-c", "sleep 600 & setsid sleep 600 & echo started; wait"),
    )

    agents.orphan_grace_s = 2.0

    async def scenario() -> None:
        async with connected(agents.url) as (nodes, store):
            agent = agents.start()
            await first_state_after(store, 0)
            for _ in range(2):
                await nodes.try_run(NODE, RunOrder(QUARTER, LAYERS, spawner))
            await asyncio.sleep(0.3)  # the shells have forked their sleeps
            tree = _descendants_of_supervisors(agents)
            assert len(tree) >= 6, tree  # 2 × (sh, sleep, setsid sleep)
            killed_at = time.monotonic()
            kill_9(agent)
            bound_s = agents.orphan_grace_s + 1.0 + 2.0  # grace, the watch period, a busy host
            while any(alive(*found) for found in tree):
                assert time.monotonic() - killed_at < bound_s, "workloads outlived the bound"
                await asyncio.sleep(0.05)
            gone_after = time.monotonic() - killed_at
            print(f"workloads gone {gone_after:.2f}s after the agent's kill -9")
            assert gone_after >= agents.orphan_grace_s - 0.1  # not before the grace
            for path in agents.journal.glob("*.exit"):  # and the supervisor said why
                assert "no agent has owned" in str((read_record(path) or {}).get("orphaned"))
            assert "killing the workload" in agents.log_text()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_workload_that_exits_while_the_agent_is_down_is_reported_with_its_status(
    agents: Agents,
) -> None:
    quitter = BootSpec(name="quitter", command=("sh", "-c", "sleep 1; exit 7"))

    async def scenario() -> None:
        async with connected(agents.url) as (nodes, store):
            agent = agents.start()
            await first_state_after(store, 0)
            workload_id = await nodes.try_run(NODE, RunOrder(QUARTER, LAYERS, quitter))
            kept = await nodes.try_run(NODE, RunOrder(QUARTER, LAYERS, SLEEPER))
            kill_9(agent)
            await asyncio.sleep(1.5)  # the quitter exits meanwhile
            restarted_at = time.time()
            agents.start()
            first = await first_state_after(store, restarted_at)
            assert reserved(first) == QUARTER.mem  # only the sleeper's
            status = await nodes.status(NODE, workload_id)
            assert status.state == "ended" and status.exit_code == 7, status
            assert "while the agent was down" in (status.reason or "")
            assert (await nodes.status(NODE, kept)).state == "running"
            names = sorted(path.name for path in agents.journal.iterdir())
            assert [name for name in names if name.startswith("quitter")] == []

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_two_agents_on_one_state_directory_is_an_error_naming_it(agents: Agents) -> None:
    async def scenario() -> None:
        async with connected(agents.url) as (_, store):
            agents.start()
            await first_state_after(store, 0)
            second = agents.start()
            assert await asyncio.to_thread(second.wait, 20) != 0
            assert f"another agent runs on state directory {agents.state_dir / NODE}" in (
                agents.log_text()
            )

    asyncio.run(asyncio.wait_for(scenario(), 60))


def _descendants_of_supervisors(agents: Agents) -> list[tuple[int, int]]:
    """Every process below the journal's supervisors (the workloads and what they spawned),
    as (pid, start ticks)."""
    agents.workload_processes()
    roots = {pid for pid, ticks in agents.supervisors if alive(pid, ticks)}
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                text = Path(f"/proc/{name}/stat").read_bytes()
                parents[int(name)] = int(text[text.rfind(b")") + 2 :].split()[1])
    found = []
    for pid in parents:
        ancestor = parents.get(pid)
        while ancestor is not None and ancestor not in roots and ancestor > 1:
            ancestor = parents.get(ancestor)
        ticks = start_ticks(pid)
        if ancestor in roots and ticks is not None:
            found.append((pid, ticks))
    return found
