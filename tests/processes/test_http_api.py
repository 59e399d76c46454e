"""The HTTP API, each test run twice: in this process (the application over the embedded
cluster through httpx's ASGI transport, in-memory registries) and against a real local
cluster (``berth up``'s processes: a nats-server with authentication, agents with the process
runtime, a scheduler serving the API) — workloads booted, exiting, stopped; images;
placements and explanations; cordon and drain; errors as problem+json; the token."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from berth.api.schemas import DrainReport, NodeList, Workload
from berth.api.testing import ApiUnderTest
from berth.oci import ImageSpec, file, write_layout
from berth.registry.port import CLAIM_PENDING_S, Claim
from berth.units import MiB
from tests.api_helpers import BOTH, api_under_test, eventually, problem

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", params=BOTH)
async def service(request: pytest.FixtureRequest) -> AsyncIterator[ApiUnderTest]:
    async with api_under_test(request.param, 3) as under_test:
        yield under_test


@pytest.fixture(scope="module")
async def api(service: ApiUnderTest) -> AsyncIterator[httpx.AsyncClient]:
    async with service.client() as client:
        yield client


async def run(api: httpx.AsyncClient, command: list[str], **fields: Any) -> Workload:
    body = {"name": "job", "type": "micro", "command": command, **fields}
    response = await api.post("/v1/workloads", json=body)
    assert response.status_code == 201, response.text
    return Workload.model_validate(response.json())


async def mem_reserved(api: httpx.AsyncClient, node: str) -> int:
    reserved: int = (await api.get(f"/v1/nodes/{node}")).json()["mem_reserved"]
    return reserved


# -- authentication ------------------------------------------------------------------------
async def test_token_on_every_route_but_health(
    service: ApiUnderTest, api: httpx.AsyncClient
) -> None:
    async with service.client(token=False) as anonymous:
        assert (await anonymous.get("/healthz")).json() == {"status": "ok"}
        for path in ("/v1/nodes", "/v1/workloads", "/openapi.json", "/v1/images"):
            body = problem(await anonymous.get(path), 401)
            assert "Bearer" in (await anonymous.get(path)).headers["www-authenticate"]
            assert body["type"].endswith("unauthorized")
        wrong = {"Authorization": "Bearer " + "x" * 43}
        problem(await anonymous.get("/v1/nodes", headers=wrong), 401)
        problem(await anonymous.post("/v1/workloads", json={}), 401)  # 401 before validation
        anonymous.cookies.set("berth_token", service.token)  # the token is no cookie
        problem(await anonymous.get("/v1/nodes"), 401)
        anonymous.cookies.clear()
        await anonymous.get(f"/?token={service.token}")  # the dashboard's session cookie
        assert (await anonymous.get("/v1/nodes")).status_code == 200
    document = (await api.get("/openapi.json")).json()
    assert "/v1/workloads" in document["paths"]


# -- nodes and images ----------------------------------------------------------------------
async def test_nodes_list_and_get(api: httpx.AsyncClient) -> None:
    nodes = NodeList.model_validate((await api.get("/v1/nodes")).json()).items
    assert [node.name for node in nodes] == ["node-00", "node-01", "node-02"]
    assert all(not node.cordoned and node.mem_max > 0 for node in nodes)
    assert (await api.get("/v1/nodes/node-01")).json()["name"] == "node-01"
    assert problem(await api.get("/v1/nodes/ghost"), 404)["detail"] == "no node 'ghost'"


async def test_images_register_get_list_and_oci(api: httpx.AsyncClient, tmp_path: Path) -> None:
    created = await api.post(
        "/v1/images",
        json={
            "name": "app",
            "platform": "linux/amd64",
            "layers": [{"id": "sha256:base", "size": "28MiB"}, {"id": "sha256:app", "size": 4096}],
        },
    )
    assert created.status_code == 201, created.text
    assert created.json()["size"] == 28 * MiB + 4096
    app = (await api.get("/v1/images/app")).json()
    assert app["layers"][1] == {"id": "sha256:app", "size": 4096}
    assert "app" in [image["name"] for image in (await api.get("/v1/images")).json()["items"]]
    problem(await api.get("/v1/images/nope"), 404)
    bad = problem(
        await api.post("/v1/images", json={"name": "x", "layers": [{"id": "a", "size": "-1GiB"}]}),
        400,
    )
    assert bad["field"].startswith("layers.0"), bad
    layout = write_layout(
        tmp_path / "layout", ImageSpec(layers=[[file("hello", "hi")]], cmd=("sh", "-c", "true"))
    )
    imported = await api.post("/v1/images/oci", json={"path": str(layout), "name": "hello"})
    assert imported.status_code == 201, imported.text
    image = imported.json()
    assert image["layers"][0]["id"].startswith("sha256:") and image["command"][0] == "sh"
    assert image["platform"] == "linux/amd64"
    missing = problem(await api.post("/v1/images/oci", json={"path": str(tmp_path / "none")}), 400)
    assert missing["field"].startswith("path"), missing


# -- workloads -----------------------------------------------------------------------------
async def test_create_get_list_and_stop(api: httpx.AsyncClient) -> None:
    await api.post(
        "/v1/images", json={"name": "base", "layers": [{"id": "sha256:b1", "size": 1000}]}
    )
    workload = await run(api, ["sleep", "60"], image="base", namespace="team-a", restartable=True)
    assert workload.state == "running" and workload.image == "base"
    assert workload.reservation_id and workload.node.startswith("node-")
    fetched = (await api.get(f"/v1/workloads/{workload.id}")).json()
    assert fetched["state"] == "running" and "env" not in fetched
    listed = await api.get("/v1/workloads", params={"namespace": "team-a", "state": "running"})
    assert [item["id"] for item in listed.json()["items"]] == [workload.id]
    assert (await api.get("/v1/workloads", params={"namespace": "nobody"})).json()["items"] == []
    by_node = (await api.get("/v1/workloads", params={"node": workload.node})).json()["items"]
    assert workload.id in [item["id"] for item in by_node]
    assert (await api.get(f"/v1/nodes/{workload.node}")).json()["workloads"] >= 1
    stopped = await api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 5})
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped", stopped.text
    again = await api.post(f"/v1/workloads/{workload.id}/stop")  # idempotent
    assert again.json()["state"] == "stopped" and again.json()["ended_at"]
    problem(await api.get("/v1/workloads/w-000000000000"), 404)
    problem(await api.post("/v1/workloads/nope/stop"), 404)
    problem(await api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": -1}), 400)


async def stubborn(api: httpx.AsyncClient, ready: Path, **fields: Any) -> Workload:
    """A workload that traps SIGTERM, once its trap is set (it writes ``ready``)."""
    workload = await run(
        api, ["sh", "-c", f'trap "" TERM; echo ready > {ready}; sleep 60'], **fields
    )

    async def trapped() -> bool:
        return ready.exists() and bool(ready.read_text().strip())

    await eventually(trapped)
    return workload


async def test_a_stops_grace_reaches_the_nodes_runtime(
    api: httpx.AsyncClient, shared_dir: Path
) -> None:
    """``berth up``'s agents (and the embedded ones) kill after 1 s by default; a stop with
    ``grace_s`` 2.5 gives a workload that ignores SIGTERM those 2.5 s, then SIGKILL, and the
    call waits for it."""
    workload = await stubborn(api, shared_dir / "ready", name="stubborn")
    began = time.monotonic()
    stopped = await api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 2.5})
    waited = time.monotonic() - began
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["state"] == "stopped"
    assert stopped.json()["detail"] == "stopped (killed by SIGKILL)", stopped.text
    assert 2.4 <= waited < 15.0  # not the node's 1 s default; loose above for a loaded machine


async def cluster_state(api: httpx.AsyncClient) -> tuple[dict[str, int], int, Any]:
    """What a refused create must not change: memory reserved per node, the workloads, the
    newest recent placement."""
    nodes = (await api.get("/v1/nodes")).json()["items"]
    reserved = {node["name"]: node["mem_reserved"] for node in nodes}
    workloads = len((await api.get("/v1/workloads")).json()["items"])
    recent = (await api.get("/v1/placements/recent", params={"limit": 1})).json()["items"]
    return reserved, workloads, recent


async def test_an_identity_held_by_a_running_workload_is_409_and_changes_nothing(
    api: httpx.AsyncClient,
) -> None:
    first = await run(api, ["sleep", "60"], name="ident")
    before = await cluster_state(api)
    taken = problem(
        await api.post(
            "/v1/workloads", json={"name": "ident", "type": "micro", "command": ["sleep", "60"]}
        ),
        409,
    )
    assert taken["type"].endswith("/identity_taken"), taken
    assert (taken["identity"], taken["workload_id"]) == ("default/ident/0", first.id), taken
    assert "default/ident/0" in taken["detail"] and first.id in taken["detail"]
    assert f"running on {first.node}" in taken["detail"], taken
    assert await cluster_state(api) == before  # no placement, no reservation, no record
    other = await run(api, ["sleep", "60"], name="ident", replica=1)  # another identity
    elsewhere = await run(api, ["sleep", "60"], name="ident", namespace="team-b")
    await api.post(f"/v1/workloads/{first.id}/stop", json={"grace_s": 5})
    again = await run(api, ["sleep", "60"], name="ident")  # its holder stopped: the claim is free
    assert again.id != first.id
    for workload in (other, elsewhere, again):
        await api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 5})


async def test_concurrent_creates_of_one_identity_boot_one(api: httpx.AsyncClient) -> None:
    body = {"name": "racer", "type": "micro", "command": ["sleep", "60"]}
    answers = await asyncio.gather(*(api.post("/v1/workloads", json=body) for _ in range(6)))
    won = [answer.json() for answer in answers if answer.status_code == 201]
    assert len(won) == 1, [answer.text for answer in answers]
    for answer in answers:
        if answer.status_code != 201:
            assert problem(answer, 409)["workload_id"] == won[0]["id"], answer.text
    running = (await api.get("/v1/workloads", params={"state": "running"})).json()["items"]
    assert [item["id"] for item in running if item["name"] == "racer"] == [won[0]["id"]]
    await api.post(f"/v1/workloads/{won[0]['id']}/stop", json={"grace_s": 5})


async def test_an_identity_is_free_once_its_workload_exited(api: httpx.AsyncClient) -> None:
    first = await run(api, ["true"], name="brief")

    async def replaced() -> Workload | None:  # nobody read the first one: the create asks its node
        answer = await api.post(
            "/v1/workloads", json={"name": "brief", "type": "micro", "command": ["sleep", "60"]}
        )
        if answer.status_code == 409:  # still running (a loaded machine)
            return None
        assert answer.status_code == 201, answer.text
        return Workload.model_validate(answer.json())

    second = await eventually(replaced)
    assert (await api.get(f"/v1/workloads/{first.id}")).json()["state"] == "exited"
    await api.post(f"/v1/workloads/{second.id}/stop", json={"grace_s": 5})


async def test_a_claim_without_a_workload_holds_while_its_create_may_run(
    service: ApiUnderTest, api: httpx.AsyncClient
) -> None:
    claims = service.claims  # the API's own (over NATS: on the API's own NATS user)
    # a create under way (placing, booting: no record yet) holds its identity
    await claims.claim("default/pending/0", "w-0000000000aa", holds=nobody, now=time.time())
    taken = problem(
        await api.post(
            "/v1/workloads", json={"name": "pending", "type": "micro", "command": ["true"]}
        ),
        409,
    )
    assert taken["workload_id"] == "w-0000000000aa" and "being created" in taken["detail"]
    # one that died before recording its workload lapses
    lapsed = time.time() - CLAIM_PENDING_S - 1
    await claims.claim("default/lapsed/0", "w-0000000000bb", holds=nobody, now=lapsed)
    await run(api, ["true"], name="lapsed")


async def nobody(claim: Claim) -> str | None:
    return None  # the test's claims are taken whoever holds them


async def test_exit_code_is_recorded(api: httpx.AsyncClient) -> None:
    workload = await run(api, ["sh", "-c", "sleep 0.2; exit 3"], env={"A": "1"})

    async def ended() -> dict[str, Any] | None:
        found: dict[str, Any] = (await api.get(f"/v1/workloads/{workload.id}")).json()
        return found if found["state"] != "running" else None

    found = await eventually(ended)
    assert (found["state"], found["exit_code"]) == ("exited", 3), found
    assert found["detail"] == "exited with code 3"
    exited = (await api.get("/v1/workloads", params={"state": "exited"})).json()["items"]
    assert workload.id in [item["id"] for item in exited]


async def test_boot_failure_releases_the_reservation(api: httpx.AsyncClient) -> None:
    nodes = (await api.get("/v1/nodes")).json()["items"]
    before = {node["name"]: node["mem_reserved"] for node in nodes}
    refused = problem(
        await api.post(
            "/v1/workloads",
            json={"name": "broken", "type": "micro", "command": ["/no/such/program"]},
        ),
        409,
    )
    assert refused["type"].endswith("boot_failed") and refused["reasons"] == {"boot_failed": 1}

    async def released() -> bool:
        return all([await mem_reserved(api, node) == mem for node, mem in before.items()])

    await eventually(released)
    recent = (await api.get("/v1/placements/recent", params={"limit": 5})).json()["items"]
    assert recent[0]["outcome"] == "refused" and recent[0]["name"] == "broken"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "", "type": "micro", "command": ["true"]}, "name"),
        ({"name": "a b", "type": "micro", "command": ["true"]}, "name"),
        ({"name": "x", "type": "huge", "command": ["true"]}, "type"),
        ({"name": "x", "command": ["true"]}, "type"),
        ({"name": "x", "type": "micro", "command": []}, "command"),
        ({"name": "x", "type": "micro"}, "command"),
        ({"name": "x", "type": "micro", "command": ["true"], "replica": 2**40}, "replica"),
        ({"name": "x", "type": "micro", "command": ["true"], "image": "nope"}, "image"),
        (
            {"name": "x", "type": "micro", "command": ["true"], "platforms": ["linux/amd46"]},
            "platforms",
        ),
        (
            {
                "name": "x",
                "type": "micro",
                "command": ["true"],
                "layers": [{"id": "a", "size": 1}, {"id": "a", "size": 1}],
            },
            "layers",
        ),
        ({"name": "x", "type": "micro", "command": ["true"], "colour": "red"}, "colour"),
        (
            {"name": "x", "type": "micro", "command": ["true"], "restart": {"mode": "often"}},
            "restart.mode",
        ),
        (
            {
                "name": "x",
                "type": "micro",
                "command": ["true"],
                "restart": {"mode": "always", "delay_s": 9.0, "max_delay_s": 1.0},
            },
            "restart.max_delay_s",
        ),
        (
            {"name": "x", "type": "micro", "command": ["true"], "reschedule": {"attempts": -2}},
            "reschedule.attempts",
        ),
    ],
)
async def test_bad_workloads_are_400_naming_the_field(
    api: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    before = len((await api.get("/v1/workloads")).json()["items"])
    found = problem(await api.post("/v1/workloads", json=body), 400)
    assert found["field"].startswith(field), found
    assert len((await api.get("/v1/workloads")).json()["items"]) == before  # nothing booted


async def test_malformed_json_is_400(api: httpx.AsyncClient) -> None:
    found = problem(
        await api.post(
            "/v1/workloads", content=b"{nope", headers={"content-type": "application/json"}
        ),
        400,
    )
    assert found["field"] == "body"
    problem(await api.get("/v1/placements/recent", params={"limit": 0}), 400)
    problem(await api.get("/v1/workloads", params={"state": "sleeping"}), 400)


# -- placements ----------------------------------------------------------------------------
async def test_placement_port_explain_and_errors(api: httpx.AsyncClient) -> None:
    placement = await api.post("/v1/placements", json={"name": "lease", "spec": "micro"})
    assert placement.status_code == 200, placement.text
    assert placement.json()["worker_node"].startswith("node-")
    explained = (await api.post("/v1/explain", json={"name": "x", "type": "micro"})).json()
    assert len(explained["verdicts"]) == 3 and explained["summary"].startswith("3/3")
    full = problem(await api.post("/v1/placements", json={"name": "big", "spec": "tera"}), 409)
    assert sum(full["reasons"].values()) == 3, full
    arm = problem(
        await api.post(
            "/v1/placements", json={"name": "a", "spec": "micro", "platforms": ["linux/s390x"]}
        ),
        400,
    )
    assert "linux/amd64" in arm["platforms_offered"]
    recent = (await api.get("/v1/placements/recent")).json()["items"]
    assert {"placed", "no_capacity", "invalid"} <= {item["outcome"] for item in recent}


# -- cordon and drain ----------------------------------------------------------------------
async def test_cordon_then_drain(api: httpx.AsyncClient, shared_dir: Path) -> None:
    nodes = ["node-00", "node-01", "node-02"]
    target = "node-02"
    for node in nodes:
        verb = "uncordon" if node == target else "cordon"
        cordoned = await api.post(f"/v1/nodes/{node}/{verb}")
        assert cordoned.json()["cordoned"] is (node != target)
    try:
        explained = (await api.post("/v1/explain", json={"name": "x", "type": "micro"})).json()
        verdicts = {v["node"]: v["verdict"] for v in explained["verdicts"]}
        assert verdicts == {"node-00": "cordoned", "node-01": "cordoned", "node-02": "fits"}
        assert "2 node cordoned" in explained["summary"]
        keep = await run(api, ["sleep", "60"], name="keep", restartable=True)
        once = await run(api, ["sleep", "60"], name="once")
        deaf = await stubborn(api, shared_dir / "ready", name="deaf")  # ignores SIGTERM
        assert keep.node == once.node == deaf.node == target
        for node in nodes[:2]:
            assert (await api.post(f"/v1/nodes/{node}/uncordon")).json()["cordoned"] is False
        began = time.monotonic()
        report = DrainReport.model_validate(
            (await api.post(f"/v1/nodes/{target}/drain", json={"grace_s": 2.5})).json()
        )
        assert time.monotonic() - began >= 2.4  # the drain's grace, not the node's 1 s
        outcomes = {item.workload_id: item for item in report.items}
        assert outcomes[once.id].outcome == "stopped"
        assert outcomes[deaf.id].outcome == "stopped"
        assert outcomes[deaf.id].detail == "stopped (killed by SIGKILL)", outcomes[deaf.id]
        replaced = outcomes[keep.id]
        assert replaced.outcome == "replaced" and replaced.new_node in nodes[:2], replaced
        old = (await api.get(f"/v1/workloads/{keep.id}")).json()
        assert (old["state"], old["replaced_by"]) == ("stopped", replaced.new_workload_id)
        new = (await api.get(f"/v1/workloads/{replaced.new_workload_id}")).json()
        assert new["state"] == "running" and new["name"] == "keep" and new["restartable"]
        # the replacement holds the identity now
        taken = problem(
            await api.post(
                "/v1/workloads", json={"name": "keep", "type": "micro", "command": ["sleep", "60"]}
            ),
            409,
        )
        assert taken["workload_id"] == replaced.new_workload_id, taken
        node = (await api.get(f"/v1/nodes/{target}")).json()
        assert node["cordoned"] is True and node["workloads"] == 0
        lease = (await api.post("/v1/placements", json={"name": "p", "spec": "micro"})).json()
        assert lease["worker_node"] != target
        await api.post(f"/v1/workloads/{replaced.new_workload_id}/stop")
    finally:
        for node in nodes:
            await api.post(f"/v1/nodes/{node}/uncordon")
    problem(await api.post("/v1/nodes/ghost/drain"), 404)
    problem(await api.post("/v1/nodes/ghost/cordon"), 404)
