"""Every running workload has its route (issue 36, part 3), over real processes.

A ``berth up`` (a nats-server with authentication, an agent process, a scheduler serving the
API): a workload created through the API has its route in ``berth_routes``; the route is
deleted behind everyone's back (a KV delete: the node itself never revives a deleted route)
and the reconciler writes it again from the record within one period; once the workload is
stopped its route is gone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
import pytest

from berth.defaults import RECONCILE_EVERY_S
from berth.nats.connection import connect
from berth.processes.up import LocalCluster
from berth.registry.nats_routes import NatsRoutes
from berth.registry.port import Route

pytestmark = pytest.mark.slow  # a whole berth up

T = TypeVar("T")


def with_routes(up: LocalCluster, act: Callable[[NatsRoutes], Awaitable[T]]) -> T:
    """``act`` on ``up``'s routing registry, as a scheduler's user."""
    creds = None if up.auth is None else up.auth.scheduler

    async def run() -> T:
        client = await connect(up.url, name="test-routes", credentials=creds, tls=up.client_tls())
        try:
            routes = await NatsRoutes(client, bucket=up.names.routes_bucket).start()
            return await act(routes)
        finally:
            await client.close()

    return asyncio.run(run())


def route_of(up: LocalCluster, identity: str) -> Route | None:
    return with_routes(up, lambda routes: routes.whereis(identity))


def test_a_deleted_route_of_a_running_workload_is_written_again_within_a_period() -> None:
    with LocalCluster(1, heartbeat_s=0.5, http=("127.0.0.1", 0)) as up:
        headers = {"Authorization": f"Bearer {up.api_token}"}
        assert up.api_url is not None
        with httpx.Client(base_url=up.api_url, headers=headers, timeout=30.0) as api:
            body = {"name": "routed", "type": "micro", "command": ["sleep", "120"]}
            created = api.post("/v1/workloads", json=body)
            assert created.status_code == 201, created.text
            record = created.json()
            route = route_of(up, "default/routed/0")
            assert route is not None and route.node == record["node"]

            with_routes(up, lambda routes: routes.remove("default/routed/0", record["node"]))
            deleted_at = time.monotonic()
            assert route_of(up, "default/routed/0") is None
            while (again := route_of(up, "default/routed/0")) is None:
                assert time.monotonic() - deleted_at < 3 * RECONCILE_EVERY_S, "not written again"
                time.sleep(0.1)
            took_s = time.monotonic() - deleted_at
            print(f"the route was written again {took_s:.2f} s after its delete")
            assert (again.node, again.reservation_id, again.function) == (
                route.node,
                route.reservation_id,
                route.function,
            )
            assert again.spec == route.spec
            assert took_s <= RECONCILE_EVERY_S + 1.0, f"{took_s:.2f} s: longer than a period"
            time.sleep(2.0)  # the node keeps it: it holds the reservation the record names
            assert route_of(up, "default/routed/0") is not None

            stopped = api.post(f"/v1/workloads/{record['id']}/stop", json={"grace_s": 0})
            assert stopped.status_code == 200, stopped.text
            deadline = time.monotonic() + 3 * RECONCILE_EVERY_S
            while route_of(up, "default/routed/0") is not None:
                assert time.monotonic() < deadline, "the ended workload's route stayed"
                time.sleep(0.1)
