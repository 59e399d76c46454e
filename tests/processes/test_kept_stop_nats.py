"""A stop kept for a paused agent is delivered when the agent answers again — with the
reconciler's lease held by a scheduler that was just ``kill -9``'d (issue 36, part 1).

The fault benchmark's ``lost_stop``: a workload on an agent paused with ``SIGSTOP`` is
``unknown``, its stop is answered ``202`` and kept on the record; the scheduler holding the
reconciler lease had died a moment before, so no reconciler pass came for the lease's TTL
plus a period (15 + 5 s) — the kept stop waited for it, and the workload ran on.  Now the
API process that kept the stop asks the node again in the background until it answers.

Real processes (a ``berth up`` with two schedulers serving the API, the process runtime):
the stop is sent to the scheduler that does *not* hold the lease, the holder is ``kill -9``'d,
the agent gets ``SIGCONT``; the workload's supervisor must be gone from the host and its
record (read from the listing, which asks no node) ``stopped`` within one reconciler period.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import httpx
import psutil
import pytest

from berth.defaults import RECONCILE_EVERY_S
from berth.nats.connection import connect
from berth.nats.names import LEASE_BUCKET
from berth.nats.wire import node_token
from berth.processes.up import LocalCluster
from tests.api_helpers import until

pytestmark = pytest.mark.slow  # a whole berth up

HEARTBEAT_S = 0.5


def lease_holder(up: LocalCluster) -> str | None:
    """The reconciler lease's holder (``scheduler-<id>``), read from its bucket."""
    creds = None if up.auth is None else up.auth.scheduler

    async def read() -> str | None:
        client = await connect(up.url, name="test-lease", credentials=creds, tls=up.client_tls())
        try:
            entry = await (await client.jetstream().key_value(LEASE_BUCKET)).get(
                node_token("reconciler")
            )
            return None if entry.value is None else entry.value.decode()
        except Exception:
            return None
        finally:
            await client.close()

    return asyncio.run(read())


def holder_index(up: LocalCluster) -> int:
    """Which of ``up``'s schedulers holds the reconciler lease (its log names its id)."""
    found: list[int] = []

    def known() -> bool:
        holder = lease_holder(up)
        if holder is None:
            return False
        service_id = holder.removeprefix("scheduler-")
        for index in range(len(up.scheduler_processes)):
            log = up.directory / "logs" / f"scheduler-{index}.log"
            if f"scheduler {service_id} serving" in log.read_text(errors="replace"):
                found.append(index)
                return True
        return False

    assert until(known, 30.0), "no scheduler took the reconciler lease"
    return found[0]


def supervisor_runs(workload_id: str) -> bool:
    """Whether the workload's supervisor (``python3 -I …/supervisor.py ID``) is alive."""
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if len(cmdline) >= 4 and cmdline[2].endswith("supervisor.py") and cmdline[3] == workload_id:
            return bool(process.info["status"] != psutil.STATUS_ZOMBIE)
    return False


def listed(api: httpx.Client, record_id: str) -> dict[str, Any]:
    """The record as the listing has it (the listing asks no node: only what was recorded)."""
    items = api.get("/v1/workloads").json()["items"]
    found: dict[str, Any] = next(item for item in items if item["id"] == record_id)
    return found


def test_a_kept_stop_is_delivered_when_the_node_answers_with_the_lease_holder_dead() -> None:
    with LocalCluster(
        2, schedulers=2, heartbeat_s=HEARTBEAT_S, http=("127.0.0.1", 0), tls=False
    ) as up:
        holder = holder_index(up)
        serving = 1 - holder  # the stop goes to the scheduler that does not reconcile
        headers = {"Authorization": f"Bearer {up.api_token}"}
        with httpx.Client(base_url=up.api_urls[serving], headers=headers, timeout=30.0) as api:
            names = [config.node.name for config in up.configs]
            paused_node, other = names
            assert api.post(f"/v1/nodes/{other}/cordon").status_code == 200
            body = {"name": "kept", "type": "micro", "command": ["sleep", "120"]}
            created = api.post("/v1/workloads", json=body)
            assert created.status_code == 201, created.text
            record = created.json()
            assert record["node"] == paused_node
            assert supervisor_runs(record["node_workload_id"])

            agent = up.agent_processes[names.index(paused_node)]
            os.kill(agent.pid, signal.SIGSTOP)
            try:
                stop = api.post(f"/v1/workloads/{record['id']}/stop", json={"grace_s": 0.5})
                assert stop.status_code == 202, stop.text
                assert stop.json()["state"] == "unknown" and stop.json()["stop_requested"]
                up.scheduler_processes[holder].kill()  # the reconciler's lease is left held
                up.scheduler_processes[holder].wait()
            finally:
                os.kill(agent.pid, signal.SIGCONT)
            resumed_at = time.monotonic()

            def delivered() -> bool:
                return not supervisor_runs(record["node_workload_id"]) and (
                    listed(api, record["id"])["state"] == "stopped"
                )

            assert until(delivered, 30.0), listed(api, record["id"])
            took_s = time.monotonic() - resumed_at
            print(f"the kept stop delivered {took_s:.2f} s after SIGCONT")
            assert took_s <= RECONCILE_EVERY_S, f"{took_s:.2f} s: the kept stop waited"
