"""``unknown`` is not an end, over real processes: a ``berth up`` (a nats-server, agent
processes with the process runtime, a scheduler serving the HTTP API) whose agent is paused
with ``SIGSTOP`` for more than twice its heartbeat grace, then resumed with ``SIGCONT``.

While it is silent its workloads are ``unknown`` — never ``failed`` — a second create of
their identity is refused, and a stop is accepted (``202``) and kept; once it answers again
they are ``running``, and the kept stop takes effect."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest

from berth.processes.up import LocalCluster
from tests.api_helpers import api_client, until

pytestmark = pytest.mark.slow  # a whole berth up

HEARTBEAT_S = 0.5
GRACE_S = 3 * HEARTBEAT_S
"""How long a node's state lives without a heartbeat."""


def create(api: httpx.Client, name: str) -> dict[str, Any]:
    body = {"name": name, "type": "micro", "command": ["sleep", "120"]}
    response = api.post("/v1/workloads", json=body)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def state_of(api: httpx.Client, workload_id: str) -> dict[str, Any]:
    response = api.get(f"/v1/workloads/{workload_id}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def test_a_paused_agent_makes_its_workloads_unknown_then_running_with_the_stop_kept() -> None:
    with (
        LocalCluster(2, heartbeat_s=HEARTBEAT_S, http=("127.0.0.1", 0)) as up,
        api_client(up) as api,
    ):
        names = [config.node.name for config in up.configs]
        paused_node, other = names
        assert api.post(f"/v1/nodes/{other}/cordon").status_code == 200
        kept = create(api, "kept")
        stopped = create(api, "stopped")
        assert kept["node"] == stopped["node"] == paused_node
        assert api.post(f"/v1/nodes/{other}/uncordon").status_code == 200
        agent = up.agent_processes[names.index(paused_node)]
        os.kill(agent.pid, signal.SIGSTOP)
        paused_at = time.monotonic()
        try:
            unknown = until(lambda: state_of(api, kept["id"])["state"] == "unknown", 20.0)
            assert unknown
            print(f"unknown after {time.monotonic() - paused_at:.2f}s")
            taken = api.post(
                "/v1/workloads", json={"name": "kept", "type": "micro", "command": ["true"]}
            )
            assert taken.status_code == 409 and kept["id"] in taken.json()["detail"], taken.text
            response = api.post(f"/v1/workloads/{stopped['id']}/stop", json={"grace_s": 0.5})
            assert response.status_code == 202, response.text
            assert response.json()["stop_requested"] is True
            # silent for more than twice the grace: out of every view, still not failed
            time.sleep(max(0.0, 2 * GRACE_S + 0.5 - (time.monotonic() - paused_at)))
            listed = api.get("/v1/workloads").json()["items"]
            assert {item["id"]: item["state"] for item in listed} == {
                kept["id"]: "unknown",
                stopped["id"]: "unknown",
            }
            again = api.post(
                "/v1/workloads", json={"name": "kept", "type": "micro", "command": ["true"]}
            )
            assert again.status_code == 409, again.text
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        resumed_at = time.monotonic()
        until(lambda: state_of(api, kept["id"])["state"] == "running", 30.0)
        print(f"running again {time.monotonic() - resumed_at:.2f}s after SIGCONT")
        ended = until(lambda: state_of(api, stopped["id"])["state"] == "stopped", 30.0)
        assert ended
        final = state_of(api, stopped["id"])
        assert final["ended_at"] is not None, final
        print(f"the kept stop delivered {time.monotonic() - resumed_at:.2f}s after SIGCONT")
        assert state_of(api, kept["id"])["state"] == "running"
