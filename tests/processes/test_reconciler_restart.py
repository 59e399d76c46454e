"""The reconciler beside an agent that survives its own restart, with real processes: a
``berth agent`` child process (process runtime, a state directory) on a real nats-server, a
scheduler service serving the API and reconciling every 0.3 s in this process.

Workloads created through the API run; the agent is ``kill -9``-ed and started again.  While
it is down its workloads may go ``unknown``; while it reconciles its journal its report is
refused ``node_starting`` and nothing is ended; once it has adopted them, every record is
``running`` again, every workload process still alive, and no ghost was stopped — the
reconciler never mistakes an adopted workload for one that ended, or for a ghost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from berth.node.runtime.supervisor import alive
from berth.observability.metrics import Metrics
from berth.registry.nats import NatsWorkloads
from berth.testing.nats import NatsServer
from tests.processes.test_agent_restart import (
    Agents,
    connected,
    first_state_after,
    kill_9,
    served_api,
)

pytestmark = pytest.mark.slow  # an agent process on a real nats-server, ~10 s

TOKEN = "reconcile-restart-token-0123"


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    with NatsServer() as server:
        made = Agents(tmp_path, server.url, orphan_grace_s=20.0)
        try:
            yield made
        finally:
            made.cleanup()


def test_a_restarted_agent_keeps_its_records_running_and_nothing_is_a_ghost(
    agents: Agents,
) -> None:
    async def scenario() -> None:
        async with connected(agents.url) as (_, store):
            agent = agents.start()
            await first_state_after(store, 0)
            async with served_api(agents.url, TOKEN, reconcile_every_s=0.3, lease_ttl_s=1.5) as (
                service,
                api,
            ):
                ids = []
                for replica in range(3):
                    body = {"name": "kept", "replica": replica, "type": "micro"}
                    body["command"] = ["sleep", "600"]
                    created = await api.post("/v1/workloads", json=body)
                    assert created.status_code == 201, created.text
                    ids.append(created.json()["id"])
                processes = agents.workload_processes()
                assert sorted(processes) == sorted(ids)
                kill_9(agent)
                await asyncio.sleep(1.0)  # down for a few passes
                restarted_at = time.time()
                agents.start()
                await first_state_after(store, restarted_at)
                workloads = await NatsWorkloads(service.client).start()
                deadline = time.monotonic() + 10.0
                seen: set[str] = set()
                while True:
                    states = {r.id: r.state for r in await workloads.list()}
                    seen |= set(states.values())
                    if all(states.get(i) == "running" for i in ids):
                        break
                    assert not any(states.get(i) not in ("running", "unknown") for i in ids)
                    assert time.monotonic() < deadline, states
                    await asyncio.sleep(0.1)
                print(f"states seen after the restart: {sorted(seen)}")
                await asyncio.sleep(1.0)  # a few more passes over the adopted workloads
                states = {r.id: r.state for r in await workloads.list()}
                assert all(states[i] == "running" for i in ids), states
                assert all(alive(*found) for found in processes.values())
                metrics = service.scheduler.metrics
                assert isinstance(metrics, Metrics)
                ghosts = metrics.registry.get_sample_value(
                    "berth_reconciler_ghosts_stopped_total", {"why": "ended"}
                )
                assert ghosts in (None, 0.0)
                done = metrics.registry.get_sample_value(
                    "berth_reconciler_passes_total", {"outcome": "done"}
                )
                assert done is not None and done >= 5

    asyncio.run(asyncio.wait_for(scenario(), 90))
