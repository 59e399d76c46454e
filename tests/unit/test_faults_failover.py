"""``benchmarks/faults.py``'s part of issue 21: its workers fail over between the API
endpoints as the CLI's client does, and count a change sent and never answered as unknown,
never as failed; and the judge sees an acknowledged create or stop that was lost.

The endpoints are ``httpx.MockTransport`` drivers (one handler, told apart by port), so
nothing listens; the judge is given its observations, as in ``test_faults_benchmark.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx
import pytest

from berth.units import MiB
from tests.helpers import load_benchmark

faults: ModuleType = load_benchmark("faults")

URLS = ["http://127.0.0.1:7001", "http://127.0.0.1:7002"]


class Endpoints:
    """Two API endpoints behind one mock transport: ``down`` refuse the connection,
    ``dropping`` take the request and drop it unanswered, ``busy`` answer 503."""

    def __init__(self) -> None:
        self.down: set[int] = set()
        self.dropping: set[int] = set()
        self.busy: set[int] = set()
        self.seen: list[tuple[int, str, str]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        port = request.url.port or 0
        if port in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        self.seen.append((port, request.method, request.url.path))
        if port in self.dropping:
            raise httpx.RemoteProtocolError("server disconnected", request=request)
        if port in self.busy:
            return httpx.Response(503, json={"detail": "busy"})
        return httpx.Response(201 if request.method == "POST" else 200, json={"port": port})

    def client(self) -> Any:
        transport = httpx.MockTransport(self.handle)
        return faults.Endpoints(URLS, "token", timeout_s=1.0, transport=transport)


def test_a_create_refused_by_one_endpoint_is_answered_by_the_next_which_is_kept() -> None:
    endpoints = Endpoints()
    endpoints.down.add(7001)
    with endpoints.client() as api:
        assert api.post("/v1/workloads", json={}).json() == {"port": 7002}
        assert api.current == 1 and api.failovers == 1
        endpoints.down.clear()
        assert api.post("/v1/workloads", json={}).json() == {"port": 7002}  # the one that answered
    assert api.failovers == 1


def test_a_create_sent_and_dropped_is_unknown_and_not_sent_again() -> None:
    endpoints = Endpoints()
    endpoints.dropping.add(7001)
    with endpoints.client() as api, pytest.raises(faults.OutcomeUnknown):
        api.post("/v1/workloads", json={})
    assert endpoints.seen == [(7001, "POST", "/v1/workloads")]  # never asked of 7002


def test_no_endpoint_taking_the_connection_is_unreachable_not_unknown() -> None:
    endpoints = Endpoints()
    endpoints.down.update({7001, 7002})
    with endpoints.client() as api, pytest.raises(faults.Unreachable):
        api.post("/v1/workloads", json={})
    assert endpoints.seen == []


def test_a_read_goes_on_after_a_503_or_a_dropped_connection() -> None:
    endpoints = Endpoints()
    endpoints.busy.add(7001)
    with endpoints.client() as api:
        assert api.get("/v1/nodes").json() == {"port": 7002}
        endpoints.busy.clear()
        endpoints.dropping.add(7002)
        assert api.get("/v1/nodes").json() == {"port": 7001}
        endpoints.dropping.add(7001)
        endpoints.busy.add(7002)
        endpoints.dropping.discard(7002)
        assert api.get("/v1/nodes").status_code == 503  # the only answer there is


def test_the_workers_count_unknown_and_unreachable_apart_from_answers() -> None:
    unknown = faults.OutcomeUnknown("dropped")
    unreachable = faults.Unreachable("refused")
    assert faults.Harness.failed("create", unknown) == "create_unknown"
    assert faults.Harness.failed("stop", unreachable) == "stop_unreachable"


@pytest.fixture
def harness() -> Iterator[Any]:
    settings = faults.Settings(
        seed=1, faults=0, workers=0, window_s=1.0, settle_s=10.0, lease_ttl_s=4.0
    )
    made = faults.Harness(settings)
    try:
        yield made
    finally:
        made.close()


def test_an_acknowledged_create_without_a_record_is_lost_only_after_the_settle(
    harness: Any,
) -> None:
    harness.tally.created("w-000000000001", 1, 0.0, 0.1)
    nodes = {node: {"mem_reserved": 0} for node in harness.mem_max}
    early = harness.disagreements(
        [], [], nodes, lambda _: None, final=False, gone=["w-000000000001"]
    )
    assert early == ["lost_create w-000000000001: acknowledged, no record"]
    assert sum(harness.tally.violations.values()) == 0
    harness.disagreements([], [], nodes, lambda _: None, final=True, gone=["w-000000000001"])
    assert harness.tally.violations == {"lost_create": 1}


def test_a_workload_still_running_after_its_acknowledged_stop_is_a_lost_stop(
    harness: Any,
) -> None:
    harness.tally.stopped["w-000000000002"] = "w-000000000002"
    host = [faults.HostWorkload("w-000000000002", "node-00", "default/a/0", 256 * MiB, 0)]
    record = {"id": "w-000000000002", "node_workload_id": "w-000000000002"}
    records = [{**record, "node": "node-00", "state": "running"}]
    nodes = {node: {"mem_reserved": 0} for node in harness.mem_max}
    nodes["node-00"] = {"mem_reserved": 256 * MiB}
    harness.disagreements(host, records, nodes, lambda _: None, final=True)
    assert harness.tally.violations == {"lost_stop": 1}


def test_a_pause_ends_at_the_first_201_of_a_create_sent_after_the_fault_started(
    harness: Any,
) -> None:
    harness.tally.fault_started[3] = ("nats_server_kill", 100.0)
    harness.tally.created("w-000000000003", 3, 99.5, 101.0)  # sent before the fault: not it
    harness.tally.created("w-000000000004", 3, 100.2, 102.5)
    harness.tally.created("w-000000000005", 3, 100.4, 103.0)  # the pause had ended
    assert harness.tally.pause_s == {3: 2.5}
    assert set(harness.tally.acknowledged) == {f"w-00000000000{i}" for i in (3, 4, 5)}
    every, by_fault, unmeasured = faults.pauses(harness.tally)
    assert every == [2.5] and by_fault == {"nats_server_kill": [2.5]} and not unmeasured
