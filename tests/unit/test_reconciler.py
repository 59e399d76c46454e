"""The reconciler in this process: the embedded cluster's agents (real process workloads), the
API's in-memory registries, the agents reached through
:class:`~berth.nodeclient.faults.FaultyNodes` — and every check reads the registry or the
agent itself, never through the API (whose reads would refresh the records themselves).

Each rule of :mod:`berth.api.reconciler` is shown: a pending record whose node runs it is
adopted; one never run is retried under its id after its deadline, or failed with the
node's reason; a running record whose node no longer runs it is ended with its exit status;
an unreachable node's workload goes ``unknown`` and back, its kept stop delivered; a ghost is
stopped only once seen for a period and never while a record names it; and of two
reconcilers sharing a lease exactly one acts, the other taking over when it stops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from berth.api.backend import ClusterBackend
from berth.api.create import RUN_ATTEMPTS
from berth.api.reconciler import Reconciler
from berth.api.schemas import Workload
from berth.api.testing import ApiUnderTest, embedded_api
from berth.boot import BootSpec, RunOrder
from berth.embedded import EmbeddedCluster
from berth.errors import Invalid
from berth.model import Request, Spec
from berth.node.agent import Agent
from berth.node.budget import NodeBudget
from berth.node.runtime.fake import FakeRuntime
from berth.nodeclient.agents import AgentNodes
from berth.nodeclient.faults import FaultyNodes
from berth.observability.metrics import Metrics
from berth.ownership import Refused
from berth.registry.memory import MemoryLease, MemoryRoutes, MemoryWorkloads
from berth.registry.port import Route, StoredWorkload
from berth.scheduler.nats_server import RouteReplicas
from berth.scheduler.spread import Replicas
from berth.state import running_digest
from berth.store.memory import MemoryStore
from berth.testing.clock import FakeClock
from berth.units import MiB
from tests.api_helpers import eventually

pytestmark = pytest.mark.anyio

PERIOD_S = 5.0


@asynccontextmanager
async def reconciled(
    clock: FakeClock | None = None, **options: Any
) -> AsyncIterator[
    tuple[ApiUnderTest, httpx.AsyncClient, FaultyNodes, Reconciler, FakeClock, Metrics]
]:
    """An embedded API, its faults, and a reconciler over its backend (``monotonic`` a fake
    clock the test moves; the backend's wall clock ``clock`` when given).  The nodes' events
    are held back: what is tested is what the reconciler converges to without them (a lost
    event, an API down while it was kept)."""
    monotonic = FakeClock()
    if clock is not None:
        options["clock"] = clock
    async with embedded_api(3, **options) as under_test, under_test.client() as api:
        assert under_test.faults is not None and under_test.backend is not None
        assert under_test.events is not None and under_test.cluster is not None
        under_test.events.held.update(under_test.cluster.agents)
        metrics = Metrics()
        reconciler = Reconciler(
            under_test.backend, every_s=PERIOD_S, monotonic=monotonic, metrics=metrics
        )
        yield under_test, api, under_test.faults, reconciler, monotonic, metrics


async def create(api: httpx.AsyncClient, name: str = "job", **fields: Any) -> httpx.Response:
    body = {"name": name, "type": "micro", "command": ["sleep", "60"], **fields}
    return await api.post("/v1/workloads", json=body)


async def created(api: httpx.AsyncClient, name: str = "job", **fields: Any) -> Workload:
    response = await create(api, name, **fields)
    assert response.status_code == 201, response.text
    return Workload.model_validate(response.json())


async def stored(backend: ClusterBackend, workload_id: str) -> StoredWorkload:
    record = await backend.workloads.get(workload_id)
    assert record is not None
    return record


def cluster_of(under_test: ApiUnderTest) -> EmbeddedCluster:
    assert under_test.cluster is not None
    return under_test.cluster


def backend_of(under_test: ApiUnderTest) -> ClusterBackend:
    assert under_test.backend is not None
    return under_test.backend


def on_node(under_test: ApiUnderTest, node: str, workload_id: str) -> str:
    return cluster_of(under_test).agents[node].status(workload_id).state


def counted(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def boot_behind_the_api(under_test: ApiUnderTest, node: str, workload_id: str) -> None:
    """What a scheduler that died between the run and the record leaves: a workload running
    on ``node`` under ``workload_id`` that no record names."""
    cluster = cluster_of(under_test)
    boot = BootSpec(name=workload_id, command=("sleep", "60"))
    spec = Spec(vcpus=0.1, mem=16 * MiB, disk=MiB)
    await cluster.client.try_run(node, RunOrder(spec, [], boot, workload_id=workload_id))
    assert on_node(under_test, node, workload_id) == "running"


async def test_a_pending_record_whose_node_runs_it_is_adopted() -> None:
    async with reconciled() as (under_test, api, faults, reconciler, _, metrics):
        faults.lose_run_answers(RUN_ATTEMPTS)  # the node boots it; the API never hears so
        response = await create(api)
        assert response.status_code == 503, response.text
        (record,) = await backend_of(under_test).workloads.list()
        assert record.state == "pending"
        assert on_node(under_test, record.node, record.id) == "running"
        report = await reconciler.reconcile()
        assert report.adopted == 1 and report.ghosts_stopped == 0
        assert (await stored(backend_of(under_test), record.id)).state == "running"
        assert counted(metrics, "berth_reconciler_adoptions_total") == 1
        transition = {"transition": "pending_running", "outcome": "applied"}
        assert counted(metrics, "berth_reconciler_transitions_total", **transition) == 1
        assert (await reconciler.reconcile()).transitions == {}  # converged: nothing more


async def test_a_running_workloads_missing_route_is_written_and_an_ended_ones_removed() -> None:
    """Routes are an index that converges (issue 36): a create whose scheduler died before
    its route write leaves a running workload without one."""
    async with reconciled() as (under_test, api, _faults, reconciler, _, metrics):
        routes = MemoryRoutes()
        reconciler.routes = routes
        workload = await created(api, "svc")
        record = await stored(backend_of(under_test), workload.id)
        report = await reconciler.reconcile()
        assert (report.routes_restored, report.routes_removed) == (1, 0)
        route = await routes.whereis("default/svc/0")
        assert route is not None and (route.node, route.reservation_id) == (
            record.node,
            record.reservation_id,
        )
        assert route.function == ("default", "svc") and route.spec is not None
        assert route.spec.mem == record.request["spec"]["mem"]  # type: ignore[index]
        assert (await reconciler.reconcile()).routes_restored == 0  # converged
        stop = await api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 0})
        assert stop.status_code == 200, stop.text
        assert await routes.whereis("default/svc/0") is not None  # nobody released it here
        report = await reconciler.reconcile()
        assert (report.routes_restored, report.routes_removed) == (0, 1)
        assert await routes.whereis("default/svc/0") is None
        assert counted(metrics, "berth_reconciler_routes_total", action="restored") == 1
        assert counted(metrics, "berth_reconciler_routes_total", action="removed") == 1


async def test_a_pass_compares_with_a_watched_copy_of_the_routes() -> None:
    """With a route index (the scheduler's watch-fed copy) a pass reads no routes from the
    registry; what the copy lacks is written (never over a stored route) and what it holds
    of an ended workload removed, as before."""
    async with reconciled() as (_under_test, api, _faults, reconciler, _, _metrics):
        routes, index = CountedRoutes(), RouteReplicas(Replicas(30.0))
        await routes.follow(index)
        reconciler.routes, reconciler.route_index = routes, index
        workload = await created(api, "svc")
        assert (await reconciler.reconcile()).routes_restored == 1
        assert len(index) == 1 and await routes.whereis("default/svc/0") is not None
        assert (await reconciler.reconcile()).routes_restored == 0
        stop = await api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 0})
        assert stop.status_code == 200, stop.text
        assert (await reconciler.reconcile()).routes_removed == 1
        assert len(index) == 0 and routes.read == 0  # the registry was never read whole


class CountedRoutes(MemoryRoutes):
    """The in-memory routes, counting reads of every route."""

    read = 0

    async def entries(self) -> list[tuple[int, Route]]:
        self.read += 1
        return await super().entries()


async def test_a_route_is_left_alone_when_the_node_does_not_run_the_workload() -> None:
    async with reconciled() as (_under_test, api, faults, reconciler, _, _metrics):
        routes = MemoryRoutes()
        reconciler.routes = routes
        workload = await created(api, "svc")
        faults.cut(workload.node)  # no report from its node: nothing is known, nothing written
        report = await reconciler.reconcile()
        assert report.routes_restored == 0 and await routes.list() == []


async def test_a_pending_record_never_run_is_retried_after_its_deadline() -> None:
    clock = FakeClock()
    async with reconciled(clock) as (under_test, api, faults, reconciler, _, _metrics):
        backend = backend_of(under_test)
        node = sorted(cluster_of(under_test).agents)[0]
        for other in cluster_of(under_test).agents:
            if other != node:
                await cluster_of(under_test).client.cordon(other)
        await eventually(lambda: _cordoned_seen(backend, node))
        faults.cut(node)  # the run never reaches the node
        response = await create(api)
        assert response.status_code == 503, response.text
        (record,) = await backend.workloads.list()
        assert record.state == "pending" and on_node(under_test, node, record.id) == "unknown"
        faults.heal(node)
        delivered = len(faults.runs)  # none: every attempt of the create was cut off
        await reconciler.reconcile()  # its create may still be asking: left alone
        assert (await stored(backend, record.id)).state == "pending"
        assert len(faults.runs) == delivered
        clock.advance(reconciler.pending_after_s)
        report = await reconciler.reconcile()
        assert report.retried == 1
        assert faults.runs[delivered:] == [(node, record.id)]  # once, under the same id
        assert (await reconciler.reconcile()).retried == 0  # it runs now: nothing to retry
        retried = await stored(backend, record.id)
        assert (retried.state, retried.reservation_id) == ("running", None)  # admitted anew
        assert on_node(under_test, node, record.id) == "running"


async def test_a_pending_record_whose_identity_was_given_back_is_failed_not_retried() -> None:
    """A create whose intent write failed gives its identity back, but the write may have
    landed (its answer lost): the ``pending`` record found later is not run, which could make
    two workloads of one identity — the one that took the identity since runs alone."""
    clock = FakeClock()
    async with reconciled(clock) as (under_test, api, faults, reconciler, _, _metrics):
        backend, _cluster, node = await _one_node_open(under_test)
        record = await _pending_on(node, faults, api, backend)
        identity = Request.from_dict(record.request).key
        await backend.workloads.claims.release(identity, record.id)  # what the create did
        faults.heal(node)
        taken = await created(api)  # the same identity, created again: it runs
        delivered = len(faults.runs)
        clock.advance(reconciler.pending_after_s)
        report = await reconciler.reconcile()
        assert report.retried == 0 and len(faults.runs) == delivered
        failed = await stored(backend, record.id)
        assert failed.state == "failed" and f"held by {taken.id}" in (failed.detail or "")
        assert await backend.workloads.claims.holder(identity) == taken.id
        assert (await stored(backend, taken.id)).state == "running"


async def _one_node_open(under_test: ApiUnderTest) -> tuple[ClusterBackend, EmbeddedCluster, str]:
    """The backend, the cluster and its first node, every other node cordoned (and seen so)."""
    backend = backend_of(under_test)
    cluster = cluster_of(under_test)
    node = sorted(cluster.agents)[0]
    for other in cluster.agents:
        if other != node:
            await cluster.client.cordon(other)
    await eventually(lambda: _cordoned_seen(backend, node))
    return backend, cluster, node


async def _pending_on(
    node: str, faults: FaultyNodes, api: httpx.AsyncClient, backend: ClusterBackend
) -> StoredWorkload:
    """A create cut from ``node`` (the only one open): ``503``, its record left ``pending``."""
    faults.cut(node)
    assert (await create(api)).status_code == 503
    (record,) = await backend.workloads.list()
    return record


async def _cordoned_seen(backend: ClusterBackend, node: str) -> bool:
    states = backend.view.states()
    return all(state.cordoned for name, state in states.items() if name != node)


async def test_a_retried_run_the_node_refuses_ends_failed_with_its_reason() -> None:
    clock = FakeClock()
    async with reconciled(clock) as (under_test, api, faults, reconciler, _, _metrics):
        backend, cluster, node = await _one_node_open(under_test)
        record = await _pending_on(node, faults, api, backend)
        faults.heal(node)
        await cluster.client.cordon(node)  # the retry is refused at the node's admission
        clock.advance(reconciler.pending_after_s)
        report = await reconciler.reconcile()
        assert report.retried == 1
        failed = await stored(backend, record.id)
        assert failed.state == "failed", failed
        assert "never ran" in (failed.detail or "") and "cordoned" in (failed.detail or "")
        identity = Request.from_dict(failed.request).key
        assert await backend.workloads.claims.holder(identity) is None  # the identity is free


async def test_a_running_record_whose_node_no_longer_runs_it_ends_with_its_exit_code() -> None:
    async with reconciled() as (under_test, api, _, reconciler, _, metrics):
        assert under_test.events is not None and under_test.cluster is not None
        # its node's events held back: the end must be found by the reconciler's pass
        under_test.events.held.update(under_test.cluster.agents)
        workload = await created(api, command=["sh", "-c", "sleep 0.3; exit 3"])
        await eventually(lambda: _async(on_node(under_test, workload.node, workload.id) == "ended"))
        assert (await stored(backend_of(under_test), workload.id)).state == "running"
        report = await reconciler.reconcile()
        ended = await stored(backend_of(under_test), workload.id)
        assert (ended.state, ended.exit_code) == ("exited", 3)
        assert report.transitions == {"running_exited": 1}
        transition = {"transition": "running_exited", "outcome": "applied"}
        assert counted(metrics, "berth_reconciler_transitions_total", **transition) == 1


async def _async(value: bool) -> bool:
    return value


async def test_an_unreachable_node_goes_unknown_and_back_and_its_kept_stop_is_delivered() -> None:
    async with reconciled() as (under_test, api, faults, reconciler, _, _metrics):
        backend = backend_of(under_test)
        workload = await created(api)
        faults.cut(workload.node)
        report = await reconciler.reconcile()
        assert report.nodes_unanswered == 1
        assert (await stored(backend, workload.id)).state == "unknown"
        response = await api.post(f"/v1/workloads/{workload.id}/stop", json={"grace_s": 0})
        assert response.status_code == 202
        assert on_node(under_test, workload.node, workload.id) == "running"
        faults.heal(workload.node)
        await reconciler.reconcile()
        assert (await stored(backend, workload.id)).state == "stopped"
        assert on_node(under_test, workload.node, workload.id) == "ended"


async def test_a_node_is_asked_again_only_when_its_snapshot_says_its_report_changed() -> None:
    """Issue 36: a node's report is held while the node has published since it was taken with
    the same digest; a new digest, or no snapshot since (a paused node publishes nothing),
    and it is asked.  Heartbeats are an hour apart here: only what the test publishes."""
    async with reconciled(heartbeat_s=3600.0) as (under_test, api, faults, reconciler, _, _m):
        cluster, backend = cluster_of(under_test), backend_of(under_test)
        workload = await created(api)

        async def advertise() -> None:
            for agent in cluster.agents.values():
                await agent.advertise()

        first = await reconciler.reconcile()
        assert (first.nodes_asked, first.nodes_held, first.converged) == (3, 0, 1)
        again = await reconciler.reconcile()  # nothing published since: asked again
        assert (again.nodes_asked, again.nodes_held) == (3, 0)
        await advertise()
        held = await reconciler.reconcile()
        assert (held.nodes_asked, held.nodes_held, held.converged) == (0, 3, 1)
        assert held.transitions == {} and held.ghosts_seen == 0
        other = next(node for node in sorted(cluster.agents) if node != workload.node)
        await boot_behind_the_api(under_test, other, "w-0000000000ab")
        await advertise()
        changed = await reconciler.reconcile()  # the other node's digest changed: asked
        assert (changed.nodes_asked, changed.nodes_held) == (1, 2)
        assert changed.ghosts_seen == 1
        await advertise()
        faults.cut(workload.node)
        cut = await reconciler.reconcile()  # published since, same digest: held, not asked
        assert cut.nodes_asked == 0 and (await stored(backend, workload.id)).state == "running"
        paused = await reconciler.reconcile()  # nothing since: asked, and it does not answer
        assert (paused.nodes_asked, paused.nodes_unanswered) == (3, 1)
        assert (await stored(backend, workload.id)).state == "unknown"


class _NotCaughtUp:
    def records(self) -> list[StoredWorkload] | None:
        return None


async def test_a_pass_takes_the_records_from_a_watched_copy_when_it_has_caught_up() -> None:
    async with reconciled() as (under_test, api, _, reconciler, _c, _m):
        backend = backend_of(under_test)
        assert isinstance(backend.workloads, MemoryWorkloads)
        ended, kept = await created(api, "ended"), await created(api, "kept")
        await cluster_of(under_test).client.stop(ended.node, ended.id, grace_s=0)
        reconciler.records = _NotCaughtUp()  # not caught up: the registry is listed
        listed = await reconciler.reconcile()
        assert listed.records == 2 and (await stored(backend, ended.id)).state == "stopped"
        reconciler.records = backend.workloads  # this registry is its own watched copy
        assert {r.id for r in backend.workloads.records()} == {ended.id, kept.id}
        await cluster_of(under_test).client.stop(kept.node, kept.id, grace_s=0)
        await cluster_of(under_test).agents[kept.node].advertise()  # its new report's digest
        watched = await reconciler.reconcile()
        assert watched.records == 2 and watched.transitions == {"running_stopped": 1}
        assert (await stored(backend, kept.id)).state == "stopped"


async def test_a_snapshot_digests_what_its_node_reports() -> None:
    async with reconciled(heartbeat_s=3600.0) as (under_test, api, _, _r, _c, _m):
        cluster = cluster_of(under_test)
        workload = await created(api)
        agent = cluster.agents[workload.node]
        state = agent.snapshot()
        assert state.running_digest == running_digest(await cluster.client.running(agent.name))
        assert state.running_digest == running_digest([workload.id])
        assert running_digest(["b", "a"]) == running_digest(["a", "b"]) != running_digest(["a"])


async def test_a_ghost_is_stopped_after_one_period_and_counted() -> None:
    async with reconciled() as (under_test, api, _, reconciler, monotonic, metrics):
        node = sorted(cluster_of(under_test).agents)[0]
        kept = await created(api)  # a recorded workload is never touched
        await boot_behind_the_api(under_test, node, "w-0000000000aa")
        first = await reconciler.reconcile()
        assert first.ghosts_seen == 1 and first.ghosts_stopped == 0  # not a period old yet
        assert on_node(under_test, node, "w-0000000000aa") == "running"
        monotonic.advance(PERIOD_S)
        second = await reconciler.reconcile()
        assert second.ghosts_stopped == 1
        assert on_node(under_test, node, "w-0000000000aa") == "ended"
        assert counted(metrics, "berth_reconciler_ghosts_stopped_total", why="unrecorded") == 1
        assert on_node(under_test, kept.node, kept.id) == "running"
        assert (await stored(backend_of(under_test), kept.id)).state == "running"


async def test_a_run_recorded_between_two_passes_is_no_ghost_but_adopted() -> None:
    """A create whose intent is recorded after the pass read the records (its run already
    answered): seen unrecorded once, then named by its pending record — adopted."""
    async with reconciled() as (under_test, api, faults, reconciler, monotonic, _metrics):
        faults.lose_run_answers(RUN_ATTEMPTS)
        assert (await create(api)).status_code == 503
        backend = backend_of(under_test)
        (record,) = await backend.workloads.list()
        await backend.workloads.transition(record.id, {"node": "elsewhere"}, expect=("pending",))
        first = await reconciler.reconcile()  # the record names another node: unrecorded here
        assert first.ghosts_seen == 1 and first.ghosts_stopped == 0
        await backend.workloads.transition(record.id, {"node": record.node}, expect=("pending",))
        monotonic.advance(PERIOD_S)
        second = await reconciler.reconcile()
        assert second.ghosts_stopped == 0 and second.adopted == 1
        assert on_node(under_test, record.node, record.id) == "running"


async def test_a_workload_whose_record_ended_is_stopped_as_a_ghost() -> None:
    async with reconciled() as (under_test, api, _, reconciler, monotonic, metrics):
        backend = backend_of(under_test)
        workload = await created(api)
        await backend.workloads.end(workload.id, {"state": "lost", "detail": "declared gone"})
        await reconciler.reconcile()
        monotonic.advance(PERIOD_S)
        assert (await reconciler.reconcile()).ghosts_stopped == 1
        assert on_node(under_test, workload.node, workload.id) == "ended"
        assert counted(metrics, "berth_reconciler_ghosts_stopped_total", why="ended") == 1


async def test_a_reconciler_that_does_not_hold_the_lease_stops_no_ghost() -> None:
    async with reconciled() as (under_test, _, _faults, reconciler, monotonic, _metrics):
        node = sorted(cluster_of(under_test).agents)[0]
        await boot_behind_the_api(under_test, node, "w-0000000000bb")
        await reconciler.reconcile(acting=lambda: False)
        monotonic.advance(PERIOD_S)
        assert (await reconciler.reconcile(acting=lambda: False)).ghosts_stopped == 0
        assert on_node(under_test, node, "w-0000000000bb") == "running"


async def test_of_two_reconcilers_sharing_a_lease_one_acts_and_the_other_takes_over() -> None:
    async with embedded_api(2) as under_test:
        backend = backend_of(under_test)
        lease = MemoryLease(0.3)
        first, second = (Reconciler(backend, every_s=0.05) for _ in range(2))
        one = asyncio.create_task(first.run(lease, "one"))
        await eventually(lambda: _async(first.passes >= 2))
        two = asyncio.create_task(second.run(lease, "two"))
        try:
            await asyncio.sleep(0.4)
            assert first.passes >= 4 and second.passes == 0
            one.cancel()  # a stopping service gives the lease up
            with contextlib.suppress(asyncio.CancelledError):
                await one
            await eventually(lambda: _async(second.passes >= 2))
        finally:
            for task in (one, two):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def test_the_first_pass_comes_as_the_lease_is_taken_not_a_period_later() -> None:
    """A holder that died left the records unreconciled for the lease's TTL already: the
    next holder's first pass starts when it takes the lease."""
    async with embedded_api(1) as under_test:
        lease = MemoryLease(1.5)  # asked for every 0.5 s
        assert await lease.hold("dead") is True
        reconciler = Reconciler(backend_of(under_test), every_s=60.0)
        task = asyncio.create_task(reconciler.run(lease, "next"))
        try:
            await asyncio.sleep(0.2)
            assert reconciler.passes == 0  # the lease is another's
            await lease.release("dead")  # as if its TTL had run out
            await eventually(lambda: _async(reconciler.passes >= 1), 5.0)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def test_a_period_that_is_not_positive_is_invalid() -> None:
    async def main() -> None:
        async with embedded_api(1) as under_test:
            with pytest.raises(Invalid) as caught:
                Reconciler(backend_of(under_test), every_s=0)
            assert caught.value.field == "reconcile_every"

    asyncio.run(main())


async def test_a_holder_whose_lease_was_taken_stops_acting() -> None:
    """A holder paused past its TTL (its lease's clock moved on) finds another holding the
    lease at its next renewal: it stops acting — no pass starts — until it holds it again."""
    async with embedded_api(1) as under_test:
        lease_clock = FakeClock()
        lease = MemoryLease(0.3, clock=lease_clock)
        reconciler = Reconciler(backend_of(under_test), every_s=0.05)
        task = asyncio.create_task(reconciler.run(lease, "paused"))
        try:
            await eventually(lambda: _async(reconciler.passes >= 2))
            lease_clock.advance(1.0)  # its lease expired while it was paused
            assert await lease.hold("other") is True
            await eventually(lambda: _async(not reconciler.holding()))
            stopped_at = reconciler.passes
            await asyncio.sleep(0.3)
            assert reconciler.passes <= stopped_at + 1  # a pass under way may finish
            assert lease.holder == "other"
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert lease.holder == "other"  # giving up a lease it no longer holds changes nothing


async def test_a_node_still_reconciling_its_journal_is_left_alone(tmp_path: Path) -> None:
    """A restarted agent answers ``running`` with ``node_starting`` until it has adopted its
    workloads (and ``status`` with ``unknown`` for them): neither the reconciler nor a read
    ends their records, and none is taken for a ghost."""
    async with reconciled() as (under_test, api, _, reconciler, monotonic, _metrics):
        workload = await created(api)
        cluster = cluster_of(under_test)
        old = cluster.agents[workload.node]
        restarted = Agent(
            old.name, old.platform, NodeBudget(old.core.budget.limits), MemoryStore(),
            FakeRuntime(), state_dir=tmp_path,
        )  # fmt: skip
        client = cluster.client
        assert isinstance(client, AgentNodes)
        client.add(restarted)  # not started: still reconciling
        with pytest.raises(Refused) as starting:
            await client.running(workload.node)
        assert starting.value.reason == "node_starting"
        for _ in range(2):
            report = await reconciler.reconcile()
            monotonic.advance(PERIOD_S)
        assert report.nodes_starting == 1 and report.transitions == {}
        assert (await stored(backend_of(under_test), workload.id)).state == "running"
        read = await api.get(f"/v1/workloads/{workload.id}")  # a read does not end it either
        assert read.status_code == 200 and read.json()["state"] == "running", read.text
        client.add(old)


async def test_a_gone_nodes_workloads_are_lost_by_the_reconciler_alone() -> None:
    """The sweep's other duty: a node out of the view for ``node_gone_after`` — its workload
    ``unknown``, then ``lost`` and its identity freed, with nobody reading."""
    clock = FakeClock()
    async with reconciled(clock, node_gone_after_s=30.0) as (under_test, api, faults, rec, _, _m):
        backend = backend_of(under_test)
        workload = await created(api)
        faults.cut(workload.node)
        await cluster_of(under_test).agents[workload.node].stop()
        assert workload.node not in backend.view.states()
        await rec.reconcile()
        assert (await stored(backend, workload.id)).state == "unknown"
        clock.advance(29.0)
        await rec.reconcile()
        assert (await stored(backend, workload.id)).state == "unknown"  # not yet
        clock.advance(2.0)
        report = await rec.reconcile()
        lost = await stored(backend, workload.id)
        assert lost.state == "lost" and "node_gone_after" in (lost.detail or "")
        assert report.transitions == {"unknown_lost": 1}
        identity = Request.from_dict(lost.request).key
        assert await backend.workloads.claims.holder(identity) is None
