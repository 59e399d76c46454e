"""Ends pushed as events, with real processes: a ``berth agent`` child process (process
runtime, a state directory) on a real nats-server, the API served by a scheduler service in
this process whose reconciler passes once an hour — so whatever moves a record here is an
event, not a pass, and the listing that shows it asks no node.

* a workload that exits is ``exited`` with its code in the listing within a second;
* the agent is ``kill -9``-ed with a workload running that exits while it is down; started
  again, it finds the end in its journal and publishes it: the listing says ``exited`` with
  the code the supervisor recorded — the end was not lost with the agent;
* the events stream is deleted under a live agent (a stream that is away): a workload's end
  then stays in the journal, marked ended, and reaches the record once the stream is back.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from berth.observability.metrics import Metrics
from berth.testing.nats import NatsServer
from tests.processes.test_agent_restart import (
    Agents,
    connected,
    first_state_after,
    kill_9,
    served_api,
)

pytestmark = pytest.mark.slow  # an agent process on a real nats-server, ~15 s

TOKEN = "events-nats-token-0123456789"


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    with NatsServer() as server:
        made = Agents(tmp_path, server.url, orphan_grace_s=30.0)
        try:
            yield made
        finally:
            made.cleanup()


async def _create(api: httpx.AsyncClient, name: str, script: str) -> str:
    body = {"name": name, "type": "micro", "command": ["sh", "-c", script]}
    created = await api.post("/v1/workloads", json=body)
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


async def _listed_until_ended(
    api: httpx.AsyncClient, workload_id: str, limit_s: float
) -> dict[str, Any]:
    started = time.monotonic()
    while True:
        response = await api.get("/v1/workloads")
        assert response.status_code == 200, response.text
        found = {item["id"]: item for item in response.json()["items"]}
        record = found[workload_id]
        if record["state"] not in ("pending", "running", "unknown"):
            return dict(record)
        assert time.monotonic() - started < limit_s, record
        await asyncio.sleep(0.05)


def test_ends_reach_the_listing_as_events_across_a_kill_9_and_a_missing_stream(
    agents: Agents,
) -> None:
    async def scenario() -> None:
        async with connected(agents.url) as (_, store):
            agent = agents.start()
            await first_state_after(store, 0)
            async with served_api(agents.url, TOKEN, reconcile_every_s=3600.0) as (service, api):
                # 1. pushed while the agent lives
                quick = await _create(api, "quick", "sleep 0.3; exit 3")
                created = time.monotonic()
                ended = await _listed_until_ended(api, quick, 10.0)
                print(f"an exit reached the listing {time.monotonic() - created:.2f}s after")
                assert ended["state"] == "exited" and ended["exit_code"] == 3, ended

                # 2. the end of a workload that exits while its agent is dead
                late = await _create(api, "late", "sleep 1.5; exit 4")
                kill_9(agent)
                journal = agents.journal
                for _ in range(200):  # the supervisor records the exit by itself
                    if list(journal.glob("*.exit")):
                        break
                    await asyncio.sleep(0.05)
                assert list(journal.glob("*.exit")), "the workload never exited"
                restarted_at = time.time()
                agent = agents.start()
                await first_state_after(store, restarted_at)
                ended = await _listed_until_ended(api, late, 15.0)
                assert ended["state"] == "exited" and ended["exit_code"] == 4, ended

                # 3. the stream away: the end waits in the journal, marked ended
                js = service.client.jetstream()
                held = await _create(api, "held", "sleep 1; exit 5")
                await js.delete_stream("berth_events")
                entry = journal / f"{held}.json"
                for _ in range(200):
                    if entry.exists() and json.loads(entry.read_text()).get("ended"):
                        break
                    await asyncio.sleep(0.05)
                marked = json.loads(entry.read_text())["ended"]
                assert marked["exit_code"] == 5, marked
                response = await api.get("/v1/workloads")
                found = {i["id"]: i for i in response.json()["items"]}
                assert found[held]["state"] == "running"  # not known yet, not guessed
                # the API's consumer makes the stream again; the agent's retry lands
                ended = await _listed_until_ended(api, held, 20.0)
                assert ended["state"] == "exited" and ended["exit_code"] == 5, ended
                for _ in range(100):
                    if not entry.exists():
                        break
                    await asyncio.sleep(0.05)
                assert not entry.exists(), "the entry outlived its stored end"

                metrics = service.scheduler.metrics
                assert isinstance(metrics, Metrics)
                applied = metrics.registry.get_sample_value(
                    "berth_events_applied_total", {"outcome": "applied"}
                )
                assert applied is not None and applied >= 3

    asyncio.run(asyncio.wait_for(scenario(), 120))
