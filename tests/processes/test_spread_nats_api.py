"""Replica spreading through the HTTP API on a real ``berth up`` cluster (a nats-server with
authentication, agents with the process runtime, two schedulers in the queue group, one
serving the API): a hard per-node spread places a function's replicas on distinct nodes,
whichever scheduler decides, then answers 409 naming ``spread``; a stopped replica frees its
node; explanations name the spread; bad spread fields are 400 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from berth.api.schemas import Workload
from berth.processes.up import LocalCluster
from tests.api_helpers import api_client, problem, until

pytestmark = pytest.mark.slow  # starts a whole berth up

HARD = {"hard": True}


@pytest.fixture(scope="module")
def api() -> Iterator[httpx.Client]:
    with (
        LocalCluster(
            3, schedulers=2, heartbeat_s=0.5, runtime="process", http=("127.0.0.1", 0)
        ) as up,
        api_client(up) as client,
    ):
        yield client


def create(api: httpx.Client, replica: int, **fields: Any) -> httpx.Response:
    body = {
        "namespace": "spread",
        "name": "web",
        "replica": replica,
        "type": "micro",
        "command": ["sleep", "60"],
        "spread": HARD,
        **fields,
    }
    return api.post("/v1/workloads", json=body)


def test_a_hard_spread_places_replicas_on_distinct_nodes_then_refuses(api: httpx.Client) -> None:
    workloads = []
    for replica in range(3):
        response = create(api, replica)
        assert response.status_code == 201, response.text
        workloads.append(Workload.model_validate(response.json()))
    nodes = {workload.node for workload in workloads}
    assert len(nodes) == 3, [w.node for w in workloads]

    refused = problem(create(api, 3), 409)
    assert "spread" in refused["detail"], refused

    explained = api.post(
        "/v1/explain", json={"namespace": "spread", "name": "web", "type": "micro", "spread": HARD}
    )
    assert explained.status_code == 200, explained.text
    verdicts = explained.json()["verdicts"]
    assert {v["verdict"] for v in verdicts} == {"spread"}, verdicts
    assert all("one per node" in v["detail"] for v in verdicts)

    # the placement port (lease only) refuses the same way
    placement = api.post(
        "/v1/placements",
        json={"namespace": "spread", "name": "web", "replica": 7, "spec": "micro", "spread": HARD},
    )
    assert "spread" in problem(placement, 409)["detail"]

    # a soft spread still places (beside a sibling), and another function is not affected
    soft = create(api, 4, spread={"hard": False})
    assert soft.status_code == 201, soft.text
    other = create(api, 0, name="api")
    assert other.status_code == 201, other.text

    # a stopped replica frees its node for the next one, once its route is gone
    stopped = workloads[0]
    assert api.post(f"/v1/workloads/{stopped.id}/stop", json={}).status_code == 200
    for workload in (workloads[1], workloads[2], Workload.model_validate(soft.json())):
        api.post(f"/v1/workloads/{workload.id}/stop", json={})

    def placed_again() -> Workload | None:
        response = create(api, 5)
        return Workload.model_validate(response.json()) if response.status_code == 201 else None

    again = until(placed_again)
    assert again.node in nodes
    api.post(f"/v1/workloads/{again.id}/stop", json={})
    api.post(f"/v1/workloads/{other.json()['id']}/stop", json={})


@pytest.mark.parametrize(
    ("spread", "field", "words"),
    [
        ({}, "spread.hard", "required"),
        ({"hard": "yes"}, "spread.hard", "boolean"),
        ({"hard": True, "max_skew": 2}, "spread.max_skew", "label spread only"),
        ({"hard": True, "label": "zone", "max_skew": 0}, "spread.max_skew", "1"),
        ({"hard": False, "label": "a b"}, "spread.label", "whitespace"),
        ({"hard": True, "zone": "a"}, "spread.zone", "not permitted"),
        ("hard", "spread", "object"),
    ],
)
def test_bad_spread_fields_are_400_naming_the_field(
    api: httpx.Client, spread: Any, field: str, words: str
) -> None:
    for path, body in (
        ("/v1/workloads", {"name": "web", "type": "micro", "command": ["true"]}),
        ("/v1/explain", {"name": "web", "type": "micro"}),
        ("/v1/placements", {"name": "web", "spec": "micro"}),
    ):
        bad = problem(api.post(path, json={**body, "spread": spread}), 400)
        assert bad["field"] == field and words in bad["detail"], (path, bad)
    listed = api.get("/v1/workloads", params={"namespace": "default"}).json()["items"]
    assert not [w for w in listed if w["name"] == "web"]  # nothing was placed or booted
