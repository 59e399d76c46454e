"""Restart and reschedule through the HTTP API, over the embedded cluster's real agents and
real process workloads: a workload with ``restart = on-failure`` that exits 1 is restarted
by its node with backoff (its pid changes, its id does not), its record counts the restarts;
once they are exhausted it is ``failed`` and, as its reschedule policy allows, placed again
— and a workload whose node is lost is rescheduled elsewhere, its history saying so."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from berth.api.schemas import Workload
from berth.api.testing import embedded_api
from tests.api_helpers import eventually

pytestmark = pytest.mark.anyio

FLAKY = ["sh", "-c", 'echo "$$ $(date +%s.%N)" >> "$PIDS"; sleep 0.2; exit 1']
"""A workload that notes its pid and the time, then fails."""


async def create(api: httpx.AsyncClient, name: str, **fields: Any) -> Workload:
    body = {"name": name, "type": "micro", **fields}
    response = await api.post("/v1/workloads", json=body)
    assert response.status_code == 201, response.text
    return Workload.model_validate(response.json())


async def read(api: httpx.AsyncClient, workload_id: str) -> Workload:
    response = await api.get(f"/v1/workloads/{workload_id}")
    assert response.status_code == 200, response.text
    return Workload.model_validate(response.json())


def runs(pids: Path) -> list[tuple[int, float]]:
    if not pids.exists():
        return []
    lines = pids.read_text().split("\n")
    return [(int(pid), float(at)) for pid, at in (line.split() for line in lines if line)]


async def test_on_failure_restarts_with_backoff_then_is_rescheduled_when_exhausted(
    shared_dir: Path,
) -> None:
    pids = shared_dir / "pids"
    restart = {"mode": "on-failure", "attempts": 2, "delay_s": 0.3, "max_delay_s": 5.0}
    async with embedded_api(3) as under_test, under_test.client() as api:
        assert under_test.cluster is not None
        workload = await create(
            api,
            "flaky",
            command=FLAKY,
            env={"PIDS": str(pids)},
            restart=restart,
            reschedule={"attempts": 1},
        )
        assert workload.restart is not None and workload.restart.mode == "on-failure"

        async def failed() -> Workload | None:
            # its end arrives as the node's event; the reschedule follows the end
            found = await read(api, workload.id)
            return found if found.state == "failed" and found.replaced_by else None

        ended = await eventually(failed, timeout_s=15.0)
        assert ended.detail is not None and "restarts exhausted" in ended.detail, ended
        assert ended.restarts == 2 and ended.exit_code == 1
        first_three = runs(pids)[:3]
        assert len({pid for pid, _ in first_three}) == 3  # three runs, three processes
        gaps = [b - a for (_, a), (_, b) in itertools.pairwise(first_three)]
        # each gap is the run (0.2 s) plus the backoff: 0.3 s, then 0.6 s
        assert gaps[0] >= 0.45 and gaps[1] >= 0.75 and gaps[1] > gaps[0], gaps
        assert ended.replaced_by is not None
        events = [event.event for event in ended.history]
        assert events[0] == "created" and "failed" in events and events[-1] == "rescheduled"
        restarted = [event.reason or "" for event in ended.history if event.event == "restarted"]
        assert restarted and restarted[-1].endswith("after its run exited with code 1")
        replacement = await read(api, ended.replaced_by)
        assert replacement.reschedules == 1 and replacement.restart == ended.restart
        # the node it failed on is avoided (three nodes: another one takes it)
        assert replacement.node != workload.node
        assert replacement.history[0].reason is not None
        assert workload.id in replacement.history[0].reason

        async def replacement_failed() -> Workload | None:
            found = await read(api, replacement.id)
            return found if found.state == "failed" else None

        last = await eventually(replacement_failed, timeout_s=15.0)
        assert last.replaced_by is None  # its one reschedule was its predecessor's
        agent = under_test.cluster.agents[workload.node]
        held = {reservation.id for reservation in agent.core.budget.reservations()}
        assert workload.reservation_id not in held  # its end released it


async def test_a_restarting_workload_of_a_lost_node_is_rescheduled_elsewhere(
    shared_dir: Path,
) -> None:
    """The issue's case: ``restart = on-failure``, exits 1, restarted with backoff on its
    node (new pids, one id), then its node is lost: rescheduled on another node, where it
    goes on being restarted."""
    pids = shared_dir / "pids"
    restart = {"mode": "on-failure", "attempts": 100, "delay_s": 0.1, "max_delay_s": 0.4}
    async with embedded_api(3, node_gone_after_s=0.3) as under_test, under_test.client() as api:
        cluster, faults = under_test.cluster, under_test.faults
        assert cluster is not None and faults is not None
        nodes = sorted(cluster.agents)
        doomed, others = nodes[0], nodes[1:]
        for node in others:
            assert (await api.post(f"/v1/nodes/{node}/cordon")).status_code == 200
        workload = await create(
            api,
            "svc",
            command=FLAKY,
            env={"PIDS": str(pids)},
            restart=restart,
            reschedule={"attempts": 1},
        )
        assert workload.node == doomed and not workload.reschedule.unlimited
        for node in others:
            assert (await api.post(f"/v1/nodes/{node}/uncordon")).status_code == 200

        async def restarted_twice() -> Workload | None:
            found = await read(api, workload.id)
            return found if found.restarts >= 2 else None

        seen = await eventually(restarted_twice, timeout_s=10.0)
        assert seen.state == "running" and len({pid for pid, _ in runs(pids)}) >= 3
        faults.cut(doomed)
        await cluster.agents[doomed].stop()

        async def lost() -> Workload | None:
            found = await read(api, workload.id)
            return found if found.state == "lost" and found.replaced_by else None

        gone = await eventually(lost, timeout_s=10.0)
        events = [event.event for event in gone.history]
        assert events[0] == "created" and "restarted" in events
        assert events[-2:] == ["lost", "rescheduled"], events
        moved = await read(api, gone.replaced_by or "")
        assert moved.node in others and moved.reschedules == 1
        assert moved.restart is not None and moved.restart.mode == "on-failure"

        async def restarted_there() -> Workload | None:
            found = await read(api, moved.id)
            return found if found.restarts >= 1 and found.state == "running" else None

        await eventually(restarted_there, timeout_s=10.0)  # its new node restarts it too
        started = time.monotonic()
        response = await api.post(f"/v1/workloads/{moved.id}/stop", json={"grace_s": 0})
        assert response.status_code == 200 and response.json()["state"] == "stopped"
        assert time.monotonic() - started < 5.0
