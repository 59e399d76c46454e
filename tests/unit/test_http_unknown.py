"""``unknown`` is not an end, and intent comes before boot: the HTTP API in this process over
the embedded cluster (real process workloads), its way to the agents through
:class:`~berth.nodeclient.faults.FaultyNodes` — a node cut off, a run's answer lost.

A workload whose node does not answer is ``unknown``: its identity stays claimed, a stop is
kept (``202``) and delivered when the node answers, and it goes back to ``running``.  A node
out of the cluster for ``node_gone_after`` is gone: its workloads are ``lost``, their claims
freed, restartable ones placed again.  A create whose run answer is lost asks again under
the same id and boots once; one never answered stays ``pending``, never ``failed``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from berth.api.create import RUN_ATTEMPTS
from berth.api.schemas import Workload
from berth.api.testing import ApiUnderTest, embedded_api
from berth.errors import Invalid
from berth.nodeclient.faults import FaultyNodes
from berth.registry.port import CLAIM_PENDING_S, StoredWorkload
from berth.testing.clock import FakeClock
from tests.api_helpers import eventually, problem

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def api_with_faults(
    nodes: int = 3, **options: Any
) -> AsyncIterator[tuple[ApiUnderTest, httpx.AsyncClient, FaultyNodes]]:
    async with embedded_api(nodes, **options) as under_test, under_test.client() as api:
        assert under_test.faults is not None
        yield under_test, api, under_test.faults


async def create(api: httpx.AsyncClient, name: str = "job", **fields: Any) -> Workload:
    body = {"name": name, "type": "micro", "command": ["sleep", "60"], **fields}
    response = await api.post("/v1/workloads", json=body)
    assert response.status_code == 201, response.text
    return Workload.model_validate(response.json())


async def read(api: httpx.AsyncClient, workload_id: str) -> Workload:
    response = await api.get(f"/v1/workloads/{workload_id}")
    assert response.status_code == 200, response.text
    return Workload.model_validate(response.json())


def runs_on_its_node(under_test: ApiUnderTest, workload: Workload) -> str:
    """What the workload's agent itself says of it (no API, no faults in the way)."""
    assert under_test.cluster is not None
    agent = under_test.cluster.agents[workload.node]
    return agent.status(workload.node_workload_id).state


async def test_an_unreachable_node_makes_its_workload_unknown_and_its_stop_is_kept() -> None:
    async with api_with_faults() as (under_test, api, faults):
        workload = await create(api)
        faults.cut(workload.node)
        unknown = await read(api, workload.id)
        assert unknown.state == "unknown", unknown
        assert unknown.unknown_since is not None and unknown.ended_at is None
        assert workload.node in (unknown.detail or "")
        assert runs_on_its_node(under_test, workload) == "running"  # it never stopped
        # the identity stays claimed: a second copy is refused, naming the holder
        taken = problem(
            await api.post(
                "/v1/workloads", json={"name": "job", "type": "micro", "command": ["true"]}
            ),
            409,
        )
        assert workload.id in taken["detail"] and "unknown" in taken["detail"]
        listed = (await api.get("/v1/workloads", params={"state": "unknown"})).json()["items"]
        assert [item["id"] for item in listed] == [workload.id]
        # a stop is accepted, kept on the record, not done
        response = await api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 1.0})
        assert response.status_code == 202, response.text
        kept = Workload.model_validate(response.json())
        assert (kept.state, kept.stop_requested, kept.stop_grace_s) == ("unknown", True, 1.0)
        assert runs_on_its_node(under_test, workload) == "running"
        again = await api.post(f"/v1/workloads/{workload.id}/stop")  # still kept, still 202
        assert again.status_code == 202
        # the node answers again: the kept stop is delivered and the record ends stopped
        faults.heal(workload.node)
        stopped = await read(api, workload.id)
        assert stopped.state == "stopped", stopped
        assert runs_on_its_node(under_test, workload) == "ended"
        replacement = await create(api)  # the identity is free now
        assert replacement.id != workload.id


async def test_a_kept_stop_is_delivered_when_the_node_answers_with_nobody_reading() -> None:
    """No read, no reconciler, no sweep, no event: the process that kept the stop asks the
    node again in the background (issue 36's ``lost_stop``: the reconciler's lease holder
    had died)."""
    async with api_with_faults() as (under_test, api, faults):
        assert under_test.events is not None and under_test.cluster is not None
        under_test.events.held.update(under_test.cluster.agents)  # no start event either
        workload = await create(api)
        faults.cut(workload.node)
        response = await api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 0})
        assert response.status_code == 202, response.text
        await asyncio.sleep(1.5)  # asked again meanwhile: still cut off, nothing changes
        assert runs_on_its_node(under_test, workload) == "running"
        faults.heal(workload.node)
        await eventually(lambda: _ended(under_test, workload), 5.0)
        assert under_test.backend is not None
        record = await under_test.backend.workloads.get(workload.id)
        assert record is not None and record.state == "stopped", record


async def _ended(under_test: ApiUnderTest, workload: Workload) -> bool:
    return runs_on_its_node(under_test, workload) == "ended"


async def test_an_unknown_workload_runs_again_when_its_node_answers() -> None:
    async with api_with_faults() as (under_test, api, faults):
        workload = await create(api)
        faults.cut(workload.node)
        assert (await read(api, workload.id)).state == "unknown"
        assert (await read(api, workload.id)).state == "unknown"  # nothing learnt: no change
        faults.heal(workload.node)
        back = await read(api, workload.id)
        assert (back.state, back.unknown_since, back.stop_requested) == ("running", None, False)
        response = await api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 0})
        assert response.status_code == 200 and response.json()["state"] == "stopped"
        assert runs_on_its_node(under_test, workload) == "ended"


async def test_a_node_gone_for_node_gone_after_loses_its_workloads_and_replaces_some() -> None:
    async with api_with_faults(node_gone_after_s=0.3) as (under_test, api, faults):
        assert under_test.cluster is not None
        nodes = sorted(under_test.cluster.agents)
        doomed, others = nodes[0], nodes[1:]
        for node in others:  # both workloads land on the doomed node
            assert (await api.post(f"/v1/nodes/{node}/cordon")).status_code == 200
        service = await create(api, "svc", restartable=True)
        job = await create(api, "job")
        assert service.node == job.node == doomed
        for node in others:
            assert (await api.post(f"/v1/nodes/{node}/uncordon")).status_code == 200
        # the machine dies: its agent is gone from the cluster and answers nothing
        faults.cut(doomed)
        await under_test.cluster.agents[doomed].stop()
        assert doomed not in under_test.cluster.scheduler.states()
        assert (await read(api, job.id)).state == "unknown"
        problem(
            await api.post(
                "/v1/workloads", json={"name": "job", "type": "micro", "command": ["true"]}
            ),
            409,
        )

        async def lost() -> Workload | None:
            found = await read(api, service.id)
            return found if found.state == "lost" else None

        gone = await eventually(lost, timeout_s=10.0)
        assert gone.ended_at is not None and "node_gone_after" in (gone.detail or "")
        assert gone.replaced_by is not None
        moved = await read(api, gone.replaced_by)
        assert moved.state == "running" and moved.node in others
        assert (moved.namespace, moved.name, moved.replica) == ("default", "svc", 0)
        ended_job = await read(api, job.id)
        assert (ended_job.state, ended_job.replaced_by) == ("lost", None)  # not restartable
        again = await create(api, "job")  # its claim was released
        assert again.node in others


async def test_a_create_whose_run_answer_is_lost_once_boots_exactly_once() -> None:
    async with api_with_faults() as (under_test, api, faults):
        assert under_test.cluster is not None
        faults.lose_run_answers(1)
        workload = await create(api)
        assert workload.state == "running" and workload.node_workload_id == workload.id
        # asked twice, under the API's own id both times; booted once
        assert faults.runs == [(workload.node, workload.id), (workload.node, workload.id)]
        agent = under_test.cluster.agents[workload.node]
        assert list(agent.workloads()) == [workload.id]
        assert len(agent.budget.reservations()) == 1


def hold_events(under_test: ApiUnderTest) -> None:
    """Hold back every node's events: the API learns what runs only by asking."""
    assert under_test.events is not None and under_test.cluster is not None
    under_test.events.held.update(under_test.cluster.agents)


async def test_a_create_never_answered_stays_pending_and_holds_its_identity() -> None:
    async with api_with_faults() as (under_test, api, faults):
        assert under_test.backend is not None
        hold_events(under_test)  # its start's event would move it (see the next test)
        faults.lose_run_answers(RUN_ATTEMPTS)
        body = {"name": "job", "type": "micro", "command": ["sleep", "60"]}
        unanswered = problem(await api.post("/v1/workloads", json=body), 503)
        assert "recorded pending" in unanswered["detail"]
        (record,) = await under_test.backend.workloads.list()
        assert record.state == "pending" and record.id in unanswered["detail"]
        assert f"not answered after {RUN_ATTEMPTS} attempt(s)" in (record.detail or "")
        assert len(faults.runs) == RUN_ATTEMPTS and {wid for _, wid in faults.runs} == {record.id}
        # the node did boot it, once; a read that reaches the node confirms it
        confirmed = await read(api, record.id)
        assert confirmed.state == "running" and confirmed.detail is None
        problem(await api.post("/v1/workloads", json=body), 409)


async def test_a_create_never_answered_runs_by_its_start_event_with_nobody_reading() -> None:
    async with api_with_faults() as (under_test, api, faults):
        assert under_test.backend is not None
        faults.lose_run_answers(RUN_ATTEMPTS)
        body = {"name": "job", "type": "micro", "command": ["sleep", "60"]}
        problem(await api.post("/v1/workloads", json=body), 503)
        backend = under_test.backend
        (record,) = await backend.workloads.list()

        async def moved() -> StoredWorkload | None:
            found = await backend.workloads.get(record.id)
            return found if found is not None and found.state != "pending" else None

        found = await eventually(moved, 5.0)  # no read, no reconciler: its start event did
        assert found.state == "running" and found.detail is None, found
        assert len(faults.runs) == RUN_ATTEMPTS  # nobody asked the node again
        problem(await api.post("/v1/workloads", json=body), 409)


async def test_a_pending_workload_of_a_gone_node_is_lost_only_after_the_claims_grace() -> None:
    """A create never answered, then its node gone: the record stays ``pending`` (its create
    might still be asking) until both ``node_gone_after`` and :data:`CLAIM_PENDING_S` have
    passed since the create, then ends ``lost`` and frees its identity."""
    clock = FakeClock(now=5000.0)
    async with api_with_faults(1, node_gone_after_s=10.0, clock=clock) as (
        under_test,
        api,
        faults,
    ):
        assert under_test.backend is not None and under_test.cluster is not None
        hold_events(under_test)
        faults.lose_run_answers(RUN_ATTEMPTS)
        body = {"name": "job", "type": "micro", "command": ["sleep", "60"]}
        problem(await api.post("/v1/workloads", json=body), 503)
        (record,) = await under_test.backend.workloads.list()
        (node,) = under_test.cluster.agents
        faults.cut(node)
        await under_test.cluster.agents[node].stop()
        clock.advance(CLAIM_PENDING_S - 1.0)  # past node_gone_after, not past the claim's grace
        assert (await read(api, record.id)).state == "pending"
        clock.advance(2.0)
        lost = await read(api, record.id)
        assert lost.state == "lost" and "gone" in (lost.detail or ""), lost
        assert await under_test.backend.workloads.claims.holder("default/job/0") is None


async def test_a_refused_boot_ends_its_record_failed_with_the_nodes_reason() -> None:
    async with api_with_faults(nodes=1) as (under_test, api, _):
        assert under_test.backend is not None
        body = {"name": "job", "type": "micro", "command": ["no-such-command-anywhere"]}
        problem(await api.post("/v1/workloads", json=body), 409)
        (record,) = await under_test.backend.workloads.list()
        assert record.state == "failed" and "boot_failed" in (record.detail or "")
        assert record.ended_at is not None
        assert await under_test.backend.workloads.claims.holder("default/job/0") is None


async def test_node_gone_after_must_be_a_positive_number_of_seconds() -> None:
    for value in (0.0, -1.0, float("nan")):
        with pytest.raises(Invalid) as caught:
            async with embedded_api(1, runtime="fake", node_gone_after_s=value):
                pass
        assert caught.value.field == "node_gone_after"


async def test_the_sweep_notices_and_delivers_with_nobody_reading() -> None:
    """What reads do, the served API's sweep does by itself: a cut-off node's workload is
    recorded ``unknown``, and a kept stop is delivered once the node answers again — every
    check here reads the registry itself, never through the API (which would refresh)."""
    async with api_with_faults() as (under_test, api, faults):
        backend = under_test.backend
        assert backend is not None
        workload = await create(api)
        faults.cut(workload.node)
        sweeper = asyncio.create_task(backend.sweep_forever(0.05))
        try:

            async def recorded(state: str) -> bool:
                stored = await backend.workloads.get(workload.id)
                return stored is not None and stored.state == state

            await eventually(lambda: recorded("unknown"))
            response = await api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 0})
            assert response.status_code == 202
            assert runs_on_its_node(under_test, workload) == "running"
            faults.heal(workload.node)
            await eventually(lambda: recorded("stopped"))
            assert runs_on_its_node(under_test, workload) == "ended"
            assert await backend.sweep() == 0  # nothing live is left to look at
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
