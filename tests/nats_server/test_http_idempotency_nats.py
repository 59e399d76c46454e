"""A create's ``Idempotency-Key`` across API processes: two applications, each over its own
scheduler service, connection and registries, sharing one real nats-server with
authentication as ``berth up`` sets it up (each API connects as the scheduler's user: its
grants cover the key claims, ``k.<sha256>`` in ``berth_api``).

The same key sent to both at once creates one workload — every other answer is that
workload (``201``, replayed) or ``409`` in progress, never a second create — and a claim
whose create died before recording anything is taken over by the other API after the bound
(0.5 s here)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from berth.api import idempotency
from berth.api.app import create_app
from berth.api.backend import ClusterBackend
from berth.api.idempotency import key_name, request_hash
from berth.api.schemas import WorkloadCreate
from berth.embedded import embedded_configs
from berth.nats.auth import ClusterAuth, generate
from berth.nodeclient.nats import NatsNodes
from berth.registry.nats import NatsImages, NatsWorkloads
from berth.registry.port import KeyClaim, new_workload_id
from berth.scheduler.nats import NatsScheduler
from berth.testing.cluster import NatsServices, nats_cluster
from berth.testing.nats import NatsServer

TOKEN = "berth-test-token-0123456789abcdef"
ABANDONED_AFTER_S = 0.5
NODES = ["node-00", "node-01"]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsServer, ClusterAuth]]:
    directory: Path = tmp_path_factory.mktemp("auth")
    auth = generate(NODES)
    paths = auth.write(directory)
    with NatsServer(config_file=paths["server"]) as server:
        yield server, auth


@contextlib.asynccontextmanager
async def two_apis(
    server: NatsServer, auth: ClusterAuth
) -> AsyncIterator[tuple[NatsServices, list[ClusterBackend], list[httpx.AsyncClient]]]:
    configs = embedded_configs(len(NODES), runtime="fake", heartbeat_s=0.5)
    async with (
        nats_cluster(server.url, configs, schedulers=2, auth=auth) as running,
        contextlib.AsyncExitStack() as stack,
    ):
        backends, clients = [], []
        for service in running.scheduler_services:  # as processes.scheduler_api wires one
            assert isinstance(service.scheduler.nodes, NatsNodes)
            backend = ClusterBackend(
                service.scheduler,
                service.scheduler.nodes,
                NatsScheduler(service.client, prefix=service.prefix),
                await NatsWorkloads(service.client).start(),
                await NatsImages(service.client).start(),
                idempotency_abandoned_after_s=ABANDONED_AFTER_S,
            )
            transport = httpx.ASGITransport(app=create_app(backend, token=TOKEN))
            client = httpx.AsyncClient(
                base_url="http://berth.test",
                transport=transport,
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=20.0,
            )
            backends.append(backend)
            clients.append(await stack.enter_async_context(client))
        yield running, backends, clients


def running_workloads(running: NatsServices) -> list[str]:
    return [wid for s in running.node_services.values() for wid in s.agent.workloads()]


def test_the_same_key_at_two_apis_at_once_creates_one_workload(
    secured: tuple[NatsServer, ClusterAuth],
) -> None:
    body: dict[str, Any] = {"name": "once", "type": "micro", "command": ["sleep", "60"]}
    key = "concurrent-5e1d0c9b"

    async def scenario() -> None:
        async with two_apis(*secured) as (running, backends, clients):
            sent = [
                clients[i % 2].post("/v1/workloads", json=body, headers={"Idempotency-Key": key})
                for i in range(8)
            ]
            answers = await asyncio.gather(*sent)
            statuses = sorted(answer.status_code for answer in answers)
            created = {a.json()["id"] for a in answers if a.status_code == 201}
            assert len(created) == 1 and set(statuses) <= {201, 409}, statuses
            for answer in answers:
                if answer.status_code == 409:
                    assert answer.json()["type"].endswith("/idempotency_in_progress")
                    assert answer.headers["Retry-After"]
            (workload_id,) = created
            records = await backends[0].workloads.list(namespace="default")
            assert [r.id for r in records if r.name == "once"] == [workload_id]
            assert running_workloads(running).count(workload_id) == 1
            for client in clients:  # settled: each API answers the one workload
                again = await client.post(
                    "/v1/workloads", json=body, headers={"Idempotency-Key": key}
                )
                assert again.status_code == 201, again.text
                assert again.json()["id"] == workload_id
                assert again.headers[idempotency.REPLAYED_HEADER] == "true"
            other = await clients[1].post(
                "/v1/workloads",
                json={**body, "command": ["true"]},
                headers={"Idempotency-Key": key},
            )
            assert other.status_code == 422 and other.json()["field"] == "Idempotency-Key"
            await clients[0].post(f"/v1/workloads/{workload_id}/stop", json={"grace_s": 0})

    asyncio.run(scenario())


def test_a_claim_abandoned_at_one_api_is_taken_over_at_the_other(
    secured: tuple[NatsServer, ClusterAuth],
) -> None:
    body: dict[str, Any] = {"name": "taken", "type": "micro", "command": ["sleep", "60"]}
    key = "abandoned-3a7f"

    async def scenario() -> None:
        async with two_apis(*secured) as (running, backends, clients):
            died = new_workload_id()  # API 0's create claimed the key, then died
            claim = KeyClaim(
                key=key_name(key),
                workload_id=died,
                request_hash=request_hash(WorkloadCreate.model_validate(body)),
                claimed_at=time.time(),
            )
            planted = await backends[0].workloads.keys.claim(claim, replaceable=_never)
            assert planted.workload_id == died
            headers = {"Idempotency-Key": key}
            busy = await clients[1].post("/v1/workloads", json=body, headers=headers)
            assert busy.status_code == 409, busy.text
            assert busy.json()["workload_id"] == died and busy.headers["Retry-After"] == "1"
            assert await backends[1].workloads.get(died) is None
            await asyncio.sleep(ABANDONED_AFTER_S + 0.1)
            taken = await clients[1].post("/v1/workloads", json=body, headers=headers)
            assert taken.status_code == 201, taken.text
            workload_id = taken.json()["id"]
            assert workload_id != died and idempotency.REPLAYED_HEADER not in taken.headers
            held = await backends[0].workloads.keys.holder(key_name(key))
            assert held is not None and held.workload_id == workload_id
            assert running_workloads(running).count(workload_id) == 1
            again = await clients[0].post("/v1/workloads", json=body, headers=headers)
            assert again.status_code == 201 and again.json()["id"] == workload_id
            await clients[0].post(f"/v1/workloads/{workload_id}/stop", json={"grace_s": 0})

    asyncio.run(scenario())


async def _never(claim: KeyClaim) -> bool:
    return False
