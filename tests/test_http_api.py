"""The HTTP API against a real local cluster: ``berth up``'s processes (a nats-server with
authentication, agents with the process runtime, a scheduler serving the API), driven over
HTTP with httpx — workloads booted, exiting, stopped; images; placements and explanations;
cordon and drain; errors as problem+json; the token."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from api_helpers import api_client, problem, until
from berth.api.schemas import DrainReport, NodeList, Workload
from berth.oci import ImageSpec, file, write_layout
from berth.registry.workloads import CLAIM_PENDING_S, Claim, IdentityClaims
from berth.testing.nats import client
from berth.up import LocalCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, heartbeat_s=0.5, runtime="process", http=("127.0.0.1", 0)) as up:
        yield up


@pytest.fixture(scope="module")
def api(cluster: LocalCluster) -> Iterator[httpx.Client]:
    with api_client(cluster) as client:
        yield client


def run(api: httpx.Client, command: list[str], **fields: Any) -> Workload:
    body = {"name": "job", "type": "micro", "command": command, **fields}
    response = api.post("/v1/workloads", json=body)
    assert response.status_code == 201, response.text
    return Workload.model_validate(response.json())


def mem_reserved(api: httpx.Client, node: str) -> int:
    reserved: int = api.get(f"/v1/nodes/{node}").json()["mem_reserved"]
    return reserved


# -- authentication ------------------------------------------------------------------------
def test_token_on_every_route_but_health(cluster: LocalCluster, api: httpx.Client) -> None:
    assert cluster.api_url is not None
    with httpx.Client(base_url=cluster.api_url) as anonymous:
        assert anonymous.get("/healthz").json() == {"status": "ok"}
        for path in ("/v1/nodes", "/v1/workloads", "/openapi.json", "/v1/images"):
            body = problem(anonymous.get(path), 401)
            assert "Bearer" in anonymous.get(path).headers["www-authenticate"]
            assert body["type"].endswith("unauthorized")
        wrong = {"Authorization": "Bearer " + "x" * 43}
        problem(anonymous.get("/v1/nodes", headers=wrong), 401)
        problem(anonymous.post("/v1/workloads", json={}), 401)  # 401 before validation
        anonymous.cookies.set("berth_token", str(cluster.api_token))
        assert anonymous.get("/v1/nodes").status_code == 200  # the dashboard's cookie
    document = api.get("/openapi.json").json()
    assert "/v1/workloads" in document["paths"]


# -- nodes and images ----------------------------------------------------------------------
def test_nodes_list_and_get(api: httpx.Client) -> None:
    nodes = NodeList.model_validate(api.get("/v1/nodes").json()).items
    assert [node.name for node in nodes] == ["node-00", "node-01", "node-02"]
    assert all(not node.cordoned and node.mem_max > 0 for node in nodes)
    assert api.get("/v1/nodes/node-01").json()["name"] == "node-01"
    assert problem(api.get("/v1/nodes/ghost"), 404)["detail"] == "no node 'ghost'"


def test_images_register_get_list_and_oci(api: httpx.Client, tmp_path: Path) -> None:
    created = api.post("/v1/images", json={"name": "app", "platform": "linux/amd64",
                       "layers": [{"id": "sha256:base", "size": "28MiB"},
                                  {"id": "sha256:app", "size": 4096}]})  # fmt: skip
    assert created.status_code == 201, created.text
    assert created.json()["size"] == 28 * 2**20 + 4096
    assert api.get("/v1/images/app").json()["layers"][1] == {"id": "sha256:app", "size": 4096}
    assert "app" in [image["name"] for image in api.get("/v1/images").json()["items"]]
    problem(api.get("/v1/images/nope"), 404)
    bad = problem(api.post("/v1/images", json={"name": "x", "layers": [{"id": "a",
                  "size": "-1GiB"}]}), 400)  # fmt: skip
    assert bad["field"].startswith("layers.0"), bad
    layout = write_layout(tmp_path / "layout", ImageSpec(layers=[[file("hello", "hi")]],
                          cmd=("sh", "-c", "true")))  # fmt: skip
    imported = api.post("/v1/images/oci", json={"path": str(layout), "name": "hello"})
    assert imported.status_code == 201, imported.text
    image = imported.json()
    assert image["layers"][0]["id"].startswith("sha256:") and image["command"][0] == "sh"
    assert image["platform"] == "linux/amd64"
    missing = problem(api.post("/v1/images/oci", json={"path": str(tmp_path / "none")}), 400)
    assert missing["field"].startswith("path"), missing


# -- workloads -----------------------------------------------------------------------------
def test_create_get_list_and_stop(api: httpx.Client) -> None:
    api.post("/v1/images", json={"name": "base", "layers": [{"id": "sha256:b1", "size": 1000}]})
    workload = run(api, ["sleep", "60"], image="base", namespace="team-a", restartable=True)
    assert workload.state == "running" and workload.image == "base"
    assert workload.reservation_id and workload.node.startswith("node-")
    fetched = api.get(f"/v1/workloads/{workload.id}").json()
    assert fetched["state"] == "running" and "env" not in fetched
    listed = api.get("/v1/workloads", params={"namespace": "team-a", "state": "running"})
    assert [item["id"] for item in listed.json()["items"]] == [workload.id]
    assert api.get("/v1/workloads", params={"namespace": "nobody"}).json()["items"] == []
    by_node = api.get("/v1/workloads", params={"node": workload.node}).json()["items"]
    assert workload.id in [item["id"] for item in by_node]
    assert api.get(f"/v1/nodes/{workload.node}").json()["workloads"] >= 1
    stopped = api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 5})
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped", stopped.text
    again = api.post(f"/v1/workloads/{workload.id}/stop")  # idempotent
    assert again.json()["state"] == "stopped" and again.json()["ended_at"]
    problem(api.get("/v1/workloads/w-000000000000"), 404)
    problem(api.post("/v1/workloads/nope/stop"), 404)
    problem(api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": -1}), 400)


def stubborn(api: httpx.Client, ready: Path, **fields: Any) -> Workload:
    """A workload that traps SIGTERM, once its trap is set (it writes ``ready``)."""
    workload = run(api, ["sh", "-c", f'trap "" TERM; echo ready > {ready}; sleep 60'], **fields)
    until(lambda: ready.exists() and ready.read_text().strip())
    return workload


def test_a_stops_grace_reaches_the_nodes_runtime(api: httpx.Client, tmp_path: Path) -> None:
    """``berth up``'s agents kill after 1 s by default; a stop with ``grace_s`` 2.5 gives a
    workload that ignores SIGTERM those 2.5 s, then SIGKILL, and the call waits for it."""
    workload = stubborn(api, tmp_path / "ready", name="stubborn")
    began = time.monotonic()
    stopped = api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 2.5})
    waited = time.monotonic() - began
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["state"] == "stopped"
    assert stopped.json()["detail"] == "stopped (killed by SIGKILL)", stopped.text
    assert 2.4 <= waited < 15.0  # not the node's 1 s default; loose above for a loaded machine


def cluster_state(api: httpx.Client) -> tuple[dict[str, int], int, Any]:
    """What a refused create must not change: memory reserved per node, the workloads, the
    newest recent placement."""
    reserved = {node["name"]: node["mem_reserved"] for node in api.get("/v1/nodes").json()["items"]}
    workloads = len(api.get("/v1/workloads").json()["items"])
    recent = api.get("/v1/placements/recent", params={"limit": 1}).json()["items"]
    return reserved, workloads, recent


def test_an_identity_held_by_a_running_workload_is_409_and_changes_nothing(
    api: httpx.Client,
) -> None:
    first = run(api, ["sleep", "60"], name="ident")
    before = cluster_state(api)
    taken = problem(api.post("/v1/workloads", json={"name": "ident", "type": "micro",
                             "command": ["sleep", "60"]}), 409)  # fmt: skip
    assert taken["type"].endswith("/identity_taken"), taken
    assert (taken["identity"], taken["workload_id"]) == ("default/ident/0", first.id), taken
    assert "default/ident/0" in taken["detail"] and first.id in taken["detail"]
    assert f"running on {first.node}" in taken["detail"], taken
    assert cluster_state(api) == before  # no placement, no reservation, no record
    other = run(api, ["sleep", "60"], name="ident", replica=1)  # another identity
    elsewhere = run(api, ["sleep", "60"], name="ident", namespace="team-b")
    api.post(f"/v1/workloads/{first.id}/stop", json={"grace_s": 5})
    again = run(api, ["sleep", "60"], name="ident")  # its holder stopped: the claim is free
    assert again.id != first.id
    for workload in (other, elsewhere, again):
        api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 5})


def test_concurrent_creates_of_one_identity_boot_one(api: httpx.Client) -> None:
    body = {"name": "racer", "type": "micro", "command": ["sleep", "60"]}
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: api.post("/v1/workloads", json=body), range(6)))
    won = [answer.json() for answer in answers if answer.status_code == 201]
    assert len(won) == 1, [answer.text for answer in answers]
    for answer in answers:
        if answer.status_code != 201:
            assert problem(answer, 409)["workload_id"] == won[0]["id"], answer.text
    running = api.get("/v1/workloads", params={"state": "running"}).json()["items"]
    assert [item["id"] for item in running if item["name"] == "racer"] == [won[0]["id"]]
    api.post(f"/v1/workloads/{won[0]['id']}/stop", json={"grace_s": 5})


def test_an_identity_is_free_once_its_workload_exited(api: httpx.Client) -> None:
    first = run(api, ["true"], name="brief")

    def replaced() -> Workload | None:  # nobody read the first one: the create asks its node
        answer = api.post("/v1/workloads", json={"name": "brief", "type": "micro",
                          "command": ["sleep", "60"]})  # fmt: skip
        if answer.status_code == 409:  # still running (a loaded machine)
            return None
        assert answer.status_code == 201, answer.text
        return Workload.model_validate(answer.json())

    second = until(replaced)
    assert api.get(f"/v1/workloads/{first.id}").json()["state"] == "exited"
    api.post(f"/v1/workloads/{second.id}/stop", json={"grace_s": 5})


def test_a_claim_without_a_workload_holds_while_its_create_may_run(
    cluster: LocalCluster, api: httpx.Client
) -> None:
    assert cluster.auth is not None
    scheduler = cluster.auth.scheduler  # the API's own NATS user

    async def claim(identity: str, workload_id: str, at: float) -> None:
        async with client(cluster.url, credentials=scheduler) as nc:
            claims = await IdentityClaims(nc).start()
            await claims.claim(identity, workload_id, holds=nobody, now=at)

    # a create under way (placing, booting: no record yet) holds its identity
    asyncio.run(claim("default/pending/0", "w-0000000000aa", time.time()))
    taken = problem(api.post("/v1/workloads", json={"name": "pending", "type": "micro",
                             "command": ["true"]}), 409)  # fmt: skip
    assert taken["workload_id"] == "w-0000000000aa" and "being created" in taken["detail"]
    # one that died before recording its workload lapses
    asyncio.run(claim("default/lapsed/0", "w-0000000000bb", time.time() - CLAIM_PENDING_S - 1))
    run(api, ["true"], name="lapsed")


async def nobody(claim: Claim) -> str | None:
    return None  # the test's claims are taken whoever holds them


def test_exit_code_is_recorded(api: httpx.Client) -> None:
    workload = run(api, ["sh", "-c", "sleep 0.2; exit 3"], env={"A": "1"})

    def ended() -> dict[str, Any] | None:
        found: dict[str, Any] = api.get(f"/v1/workloads/{workload.id}").json()
        return found if found["state"] != "running" else None

    found = until(ended)
    assert (found["state"], found["exit_code"]) == ("exited", 3), found
    assert found["detail"] == "exited with code 3"
    exited = api.get("/v1/workloads", params={"state": "exited"}).json()["items"]
    assert workload.id in [item["id"] for item in exited]


def test_boot_failure_releases_the_reservation(api: httpx.Client) -> None:
    before = {node["name"]: node["mem_reserved"] for node in api.get("/v1/nodes").json()["items"]}
    refused = problem(api.post("/v1/workloads", json={"name": "broken", "type": "micro",
                      "command": ["/no/such/program"]}), 409)  # fmt: skip
    assert refused["type"].endswith("boot_failed") and refused["reasons"] == {"boot_failed": 1}
    until(lambda: all(mem_reserved(api, node) == mem for node, mem in before.items()))
    recent = api.get("/v1/placements/recent", params={"limit": 5}).json()["items"]
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
        ({"name": "x", "type": "micro", "command": ["true"], "platforms": ["linux/amd46"]},
         "platforms"),
        ({"name": "x", "type": "micro", "command": ["true"], "layers": [{"id": "a", "size": 1},
          {"id": "a", "size": 1}]}, "layers"),
        ({"name": "x", "type": "micro", "command": ["true"], "colour": "red"}, "colour"),
    ],
)  # fmt: skip
def test_bad_workloads_are_400_naming_the_field(
    api: httpx.Client, body: dict[str, Any], field: str
) -> None:
    before = len(api.get("/v1/workloads").json()["items"])
    found = problem(api.post("/v1/workloads", json=body), 400)
    assert found["field"].startswith(field), found
    assert len(api.get("/v1/workloads").json()["items"]) == before  # nothing booted


def test_malformed_json_is_400(api: httpx.Client) -> None:
    found = problem(api.post("/v1/workloads", content=b"{nope",
                             headers={"content-type": "application/json"}), 400)  # fmt: skip
    assert found["field"] == "body"
    problem(api.get("/v1/placements/recent", params={"limit": 0}), 400)
    problem(api.get("/v1/workloads", params={"state": "sleeping"}), 400)


# -- placements ----------------------------------------------------------------------------
def test_placement_port_explain_and_errors(api: httpx.Client) -> None:
    placement = api.post("/v1/placements", json={"name": "lease", "spec": "micro"})
    assert placement.status_code == 200, placement.text
    assert placement.json()["worker_node"].startswith("node-")
    explained = api.post("/v1/explain", json={"name": "x", "type": "micro"}).json()
    assert len(explained["verdicts"]) == 3 and explained["summary"].startswith("3/3")
    full = problem(api.post("/v1/placements", json={"name": "big", "spec": "tera"}), 409)
    assert sum(full["reasons"].values()) == 3, full
    arm = problem(api.post("/v1/placements", json={"name": "a", "spec": "micro",
                  "platforms": ["linux/s390x"]}), 400)  # fmt: skip
    assert "linux/amd64" in arm["platforms_offered"]
    outcomes = [item["outcome"] for item in api.get("/v1/placements/recent").json()["items"]]
    assert {"placed", "no_capacity", "invalid"} <= set(outcomes)


# -- cordon and drain ----------------------------------------------------------------------
def test_cordon_then_drain(api: httpx.Client, tmp_path: Path) -> None:
    nodes = ["node-00", "node-01", "node-02"]
    target = "node-02"
    for node in nodes:
        cordoned = api.post(f"/v1/nodes/{node}/{'uncordon' if node == target else 'cordon'}")
        assert cordoned.json()["cordoned"] is (node != target)
    try:
        explained = api.post("/v1/explain", json={"name": "x", "type": "micro"}).json()
        verdicts = {v["node"]: v["verdict"] for v in explained["verdicts"]}
        assert verdicts == {"node-00": "cordoned", "node-01": "cordoned", "node-02": "fits"}
        assert "2 node cordoned" in explained["summary"]
        keep = run(api, ["sleep", "60"], name="keep", restartable=True)
        once = run(api, ["sleep", "60"], name="once")
        deaf = stubborn(api, tmp_path / "ready", name="deaf")  # ignores SIGTERM
        assert keep.node == once.node == deaf.node == target
        for node in nodes[:2]:
            assert api.post(f"/v1/nodes/{node}/uncordon").json()["cordoned"] is False
        began = time.monotonic()
        report = DrainReport.model_validate(
            api.post(f"/v1/nodes/{target}/drain", json={"grace_s": 2.5}).json()
        )
        assert time.monotonic() - began >= 2.4  # the drain's grace, not the node's 1 s
        outcomes = {item.workload_id: item for item in report.items}
        assert outcomes[once.id].outcome == "stopped"
        assert outcomes[deaf.id].outcome == "stopped"
        assert outcomes[deaf.id].detail == "stopped (killed by SIGKILL)", outcomes[deaf.id]
        replaced = outcomes[keep.id]
        assert replaced.outcome == "replaced" and replaced.new_node in nodes[:2], replaced
        old = api.get(f"/v1/workloads/{keep.id}").json()
        assert (old["state"], old["replaced_by"]) == ("stopped", replaced.new_workload_id)
        new = api.get(f"/v1/workloads/{replaced.new_workload_id}").json()
        assert new["state"] == "running" and new["name"] == "keep" and new["restartable"]
        # the replacement holds the identity now
        taken = problem(api.post("/v1/workloads", json={"name": "keep", "type": "micro",
                                 "command": ["sleep", "60"]}), 409)  # fmt: skip
        assert taken["workload_id"] == replaced.new_workload_id, taken
        node = api.get(f"/v1/nodes/{target}").json()
        assert node["cordoned"] is True and node["workloads"] == 0
        lease = api.post("/v1/placements", json={"name": "p", "spec": "micro"}).json()
        assert lease["worker_node"] != target
        api.post(f"/v1/workloads/{replaced.new_workload_id}/stop")
    finally:
        for node in nodes:
            api.post(f"/v1/nodes/{node}/uncordon")
    problem(api.post("/v1/nodes/ghost/drain"), 404)
    problem(api.post("/v1/nodes/ghost/cordon"), 404)
