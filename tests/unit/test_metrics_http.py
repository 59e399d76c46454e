"""``GET /metrics``: the scheduler's metrics in Prometheus' text format, behind the API token.

The route (:mod:`berth.api.metrics`) on an application with the API's token rule and
problem answers, serving the metrics of a real ``ClusterScheduler`` (memory store, in-process
budgets) after real placements: 401 without the token, the text format with it (bearer or the
dashboard's cookie), 503 where no scheduler is measured.
"""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from berth import Request, Spec
from berth.api import metrics as metrics_route
from berth.api.auth import COOKIE, configure, new_session
from berth.api.problems import install
from berth.node.budget import BudgetLimits, NodeBudget
from berth.nodeclient.local import LocalNodes
from berth.observability.metrics import Metrics
from berth.scheduler.multinode import ClusterScheduler
from berth.state import NodeState
from berth.store.memory import MemoryStore
from berth.units import GiB

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token"


def app_with(metrics: Metrics | None) -> FastAPI:
    app = FastAPI()
    configure(app, TOKEN)
    if metrics is not None:
        app.state.metrics = metrics
    install(app)
    app.include_router(metrics_route.router)
    return app


async def get(
    app: FastAPI, headers: dict[str, str] | None = None, cookies: dict[str, str] | None = None
) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://berth", cookies=cookies
    ) as client:
        return await client.get("/metrics", headers=headers)


def measured_scheduler() -> tuple[ClusterScheduler, Metrics]:
    store, nodes, metrics = MemoryStore(), LocalNodes(), Metrics()
    scheduler = ClusterScheduler(store, nodes, metrics=metrics)
    metrics.watch(scheduler, stale_after_s=3600)
    for name in ("n1", "n2"):
        limits = BudgetLimits(
            mem_max=4 * GiB, disk_max=10 * GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
        )
        nodes.add(name, NodeBudget(limits, platform="linux/amd64"))
        store.publish_now(
            NodeState(
                node=name,
                platform="linux/amd64",
                mem_free=4 * GiB,
                disk_free=10 * GiB,
                mem_max=4 * GiB,
                disk_max=10 * GiB,
                cpu_capacity=4,
                disk_bw_ceiling=GiB,
                net_bw_ceiling=GiB,
                published_at=9e9,
            )
        )
    return scheduler, metrics


async def test_metrics_need_the_token() -> None:
    _, metrics = measured_scheduler()
    app = app_with(metrics)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        response = await get(app, headers=headers)
        assert response.status_code == 401, headers
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.headers["www-authenticate"] == "Bearer"
        assert "berth_" not in response.text


async def test_metrics_are_prometheus_text_after_real_placements() -> None:
    scheduler, metrics = measured_scheduler()
    spec = Spec(vcpus=0.1, mem=GiB, disk=GiB)
    for replica in range(3):
        request = Request(namespace="m", name="f", replica=replica, spec=spec)
        await scheduler.schedule(request)
    metrics_app = app_with(metrics)
    response = await get(metrics_app, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    assert samples["berth_placements_total", (("outcome", "placed"),)] == 3
    assert samples["berth_placement_seconds_count", ()] == 3
    assert samples["berth_nodes", (("state", "ready"),)] == 2
    assert samples["berth_reservations", (("state", "assumed"),)] == 3
    assert samples["berth_reserved_bytes", (("resource", "mem"), ("source", "assumed"))] == 3 * GiB

    # the dashboard's session cookie opens it too
    cookie = await get(metrics_app, cookies={COOKIE: new_session(metrics_app).cookie})
    assert cookie.status_code == 200 and "berth_placements_total" in cookie.text


async def test_a_server_without_a_measured_scheduler_says_so() -> None:
    response = await get(app_with(None), headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "measures no scheduler" in response.json()["detail"]
