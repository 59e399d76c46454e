"""Workload ends pushed as events (issue 20, part 6): the port's contract for both drivers,
the node core's outbox and journal (an end's entry stays, marked ended, until its event is
stored — and a restarted core publishes it again), the agent's reporter (an unreachable sink
retried), and the API applying events: records move without anyone reading them, a listing
asks no node, stale and unrecorded events change nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from berth.api.schemas import Workload
from berth.api.testing import embedded_api
from berth.boot import RunOrder
from berth.errors import Invalid, Unavailable
from berth.events.memory import MemoryEvents
from berth.events.nats import NatsEvents
from berth.events.port import WorkloadEvent
from berth.model import Layer, Spec
from berth.nats.names import Names
from berth.node.agent import Agent
from berth.node.budget import BudgetLimits, NodeBudget
from berth.node.core import NodeCore
from berth.node.journal import Journal
from berth.node.layers import LayerRegistry
from berth.node.runtime import BootSpec, FakeRuntime, ProcessRuntime, Runtime
from berth.store.memory import MemoryStore
from berth.testing.events_contract import Ends, EventsContract
from berth.testing.nats import NatsServer, client, unique_name
from berth.units import GiB, MiB

SPEC = Spec(vcpus=0.1, mem=64 * MiB, disk=MiB)
LAYERS = (Layer(id="sha256:base", size=100),)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


# -- the port's contract ----------------------------------------------------------------------
class TestMemoryEventsContract(EventsContract):
    def open_events(self) -> AbstractAsyncContextManager[Ends]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[Ends]:
            events = MemoryEvents(redeliver_after_s=0.05)
            yield lambda: (events, events)

        return opened()


class TestNatsEventsContract(EventsContract):
    @pytest.fixture(autouse=True)
    def _server(self, nats_server: NatsServer) -> None:
        self.url = nats_server.url

    def open_events(self) -> AbstractAsyncContextManager[Ends]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[Ends]:
            names = Names.namespaced(unique_name("ev"))
            async with contextlib.AsyncExitStack() as stack:
                ends: list[NatsEvents] = []
                for _ in range(4):
                    nc = await stack.enter_async_context(client(self.url))
                    ends.append(await NatsEvents(nc, names=names, redeliver_after_s=0.1).start())
                views = iter(ends)

                def next_end() -> tuple[NatsEvents, NatsEvents]:
                    end = next(views)
                    return end, end

                yield next_end

        return opened()


def test_an_event_that_is_malformed_is_invalid_naming_the_field() -> None:
    with pytest.raises(Invalid) as caught:
        WorkloadEvent.from_dict({"node": "n1", "workload_id": "w", "kind": "exploded"})
    assert caught.value.field == "kind"
    with pytest.raises(Invalid) as caught:
        WorkloadEvent.from_dict({"node": "n1", "workload_id": "w", "kind": "ended", "restarts": -1})
    assert caught.value.field == "restarts"


def test_a_message_on_the_stream_that_is_no_event_is_dropped_and_counted(
    nats_server: NatsServer,
) -> None:
    async def test() -> None:
        names = Names.namespaced(unique_name("ev"))
        async with client(nats_server.url) as nc:
            events = await NatsEvents(nc, names=names, redeliver_after_s=0.05).start()
            await nc.jetstream().publish(events.subject("n1"), b"{not json")
            good = WorkloadEvent(node="n1", workload_id="w1", kind="ended", exit_code=0)
            await events.publish(good)
            seen: list[WorkloadEvent] = []

            async def handle(event: WorkloadEvent) -> None:
                seen.append(event)

            task = asyncio.create_task(events.consume(handle))
            while not seen:
                await asyncio.sleep(0.02)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert seen == [good] and events.rejected == 1

    run(test)


def test_an_event_is_enveloped_and_one_the_previous_release_sent_bare_is_read(
    nats_server: NatsServer,
) -> None:
    async def test() -> None:
        names = Names.namespaced(unique_name("ev"))
        async with client(nats_server.url) as nc:
            events = await NatsEvents(nc, names=names, redeliver_after_s=0.05).start()
            old = WorkloadEvent(node="n1", workload_id="w0", kind="started")
            new = WorkloadEvent(node="n1", workload_id="w1", kind="ended", exit_code=0)
            js = nc.jetstream()
            await js.publish(events.subject("n1"), old.model_dump_json().encode())
            await events.publish(new)
            stored = await js.get_msg(names.events_stream, seq=2)
            assert json.loads(stored.data or b"") == {"v": 1, "event": new.model_dump(mode="json")}
            seen: list[WorkloadEvent] = []

            async def handle(event: WorkloadEvent) -> None:
                seen.append(event)

            task = asyncio.create_task(events.consume(handle))
            while len(seen) < 2:
                await asyncio.sleep(0.02)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert sorted(seen, key=lambda e: e.workload_id) == [old, new]
            assert events.rejected == 0

    run(test)


# -- the node core: an outbox, and the journal until the end is stored -----------------------
LIMITS = BudgetLimits(
    mem_max=GiB, disk_max=10 * GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
)


def core(runtime: Runtime, state_dir: Path) -> NodeCore:
    node = NodeCore(
        "n1",
        "linux/amd64",
        NodeBudget(LIMITS),
        runtime,
        layers=LayerRegistry(GiB),
        journal=Journal(state_dir),
        wall_clock=lambda: 1000.0,
    )
    node.push_events()
    return node


def entry_of(state_dir: Path, workload_id: str) -> dict[str, Any]:
    return dict(json.loads((state_dir / "workloads" / f"{workload_id}.json").read_text()))


def test_an_end_stays_in_the_journal_marked_until_its_event_is_stored(tmp_path: Path) -> None:
    async def test() -> None:
        runtime = FakeRuntime()
        node = core(runtime, tmp_path)
        booted = await node.boot(SPEC, LAYERS, BootSpec(name="w", command=("x",)))
        workload_id = booted.workload.id
        (started,) = node.unreported()  # its boot is done: it runs
        assert (started.kind, started.workload_id, started.restarts) == ("started", workload_id, 0)
        node.reported(started)
        assert node.unreported() == [] and entry_of(tmp_path, workload_id)["ended"] is None
        runtime.finish(workload_id, 3)
        (event,) = node.unreported()
        assert (event.node, event.workload_id, event.kind) == ("n1", workload_id, "ended")
        assert event.exit_code == 3 and event.at == 1000.0
        assert entry_of(tmp_path, workload_id)["ended"]["exit_code"] == 3
        assert node.budget.reservations() == []  # the end released what it held, as before
        node.reported(event)
        assert node.unreported() == []
        assert os.listdir(tmp_path / "workloads") == []

    run(test)


def test_a_restarted_core_publishes_an_end_that_was_not_stored(tmp_path: Path) -> None:
    async def test() -> None:
        first = core(ProcessRuntime(state_dir=tmp_path), tmp_path)
        booted = await first.boot(SPEC, LAYERS, BootSpec(name="q", command=("sh", "-c", "exit 5")))
        await booted.workload.wait()

        def ends() -> list[WorkloadEvent]:
            return [event for event in first.unreported() if event.kind == "ended"]

        for _ in range(100):
            if ends():
                break
            await asyncio.sleep(0.01)
        (lost,) = ends()  # the agent dies before its sink stored it
        second = core(ProcessRuntime(state_dir=tmp_path), tmp_path)
        recovery = await second.recover()
        assert recovery.ended == [booted.workload.id] and recovery.adopted == []
        (again,) = second.unreported()
        assert again.key == lost.key and again.exit_code == 5
        assert second.status(booted.workload.id).exit_code == 5
        second.reported(again)
        assert os.listdir(tmp_path / "workloads") == []

    run(test)


def test_a_restarted_core_publishes_the_start_of_each_workload_it_adopts(tmp_path: Path) -> None:
    async def test() -> None:
        first = core(ProcessRuntime(state_dir=tmp_path), tmp_path)
        booted = await first.boot(SPEC, LAYERS, BootSpec(name="s", command=("sleep", "30")))
        workload_id = booted.workload.id
        second = core(ProcessRuntime(state_dir=tmp_path), tmp_path)  # the first died unheard
        try:
            recovery = await second.recover()
            assert recovery.adopted == [workload_id]
            (started,) = second.unreported()  # its boot's event may never have been stored
            assert (started.kind, started.workload_id) == ("started", workload_id)
            second.reported(started)
            assert entry_of(tmp_path, workload_id)["ended"] is None  # it runs: its entry stays
        finally:
            await second.stop_all()

    run(test)


def test_a_core_without_pushed_events_forgets_an_end_at_once(tmp_path: Path) -> None:
    async def test() -> None:
        runtime = FakeRuntime()
        node = NodeCore(
            "n1",
            "linux/amd64",
            NodeBudget(LIMITS),
            runtime,
            journal=Journal(tmp_path),
        )
        booted = await node.boot(SPEC, LAYERS, BootSpec(name="w", command=("x",)))
        runtime.finish(booted.workload.id, 0)
        assert node.unreported() == [] and os.listdir(tmp_path / "workloads") == []

    run(test)


class Flaky:
    """A sink that refuses the first ``failures`` publications, then keeps them."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.stored: list[WorkloadEvent] = []

    async def publish(self, event: WorkloadEvent) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise Unavailable("the stream is away")
        self.stored.append(event)


def test_an_agent_publishes_again_until_its_sink_stores_the_end(tmp_path: Path) -> None:
    async def test() -> None:
        sink = Flaky(failures=3)
        runtime = FakeRuntime()
        agent = Agent(
            "n1",
            "linux/amd64",
            NodeBudget(LIMITS),
            MemoryStore(),
            runtime,
            state_dir=tmp_path,
            events=sink,
        )
        async with agent:
            workload = await agent.try_run(
                RunOrder(SPEC, LAYERS, BootSpec(name="w", command=("x",)))
            )
            runtime.finish(workload.id, 0)
            for _ in range(400):
                if sink.stored:
                    break
                await asyncio.sleep(0.01)
            for _ in range(400):
                if len(sink.stored) == 2:
                    break
                await asyncio.sleep(0.01)
            assert [(e.workload_id, e.kind) for e in sink.stored] == [
                (workload.id, "started"),
                (workload.id, "ended"),
            ]
            assert agent.reported == 2 and agent.core.unreported() == []
            assert not list((tmp_path / "workloads").glob("*.json"))

    run(test)


def test_a_clean_stop_reports_the_ends_of_the_workloads_it_stopped(tmp_path: Path) -> None:
    async def test() -> None:
        sink = Flaky(failures=0)
        agent = Agent(
            "n1",
            "linux/amd64",
            NodeBudget(LIMITS),
            MemoryStore(),
            FakeRuntime(),
            events=sink,
        )
        async with agent:
            ids = [
                (await agent.try_run(RunOrder(SPEC, LAYERS, BootSpec(name="w", command=("x",))))).id
                for _ in range(3)
            ]
        ends = [e for e in sink.stored if e.kind == "ended"]
        assert sorted(e.workload_id for e in ends) == sorted(ids)
        assert all(e.stopped for e in ends)

    run(test)


# -- the API: ends applied as they come, a listing that asks no node --------------------------
async def create(api: httpx.AsyncClient, name: str, command: list[str]) -> Workload:
    body = {"name": name, "type": "micro", "command": command}
    response = await api.post("/v1/workloads", json=body)
    assert response.status_code == 201, response.text
    return Workload.model_validate(response.json())


async def listed(api: httpx.AsyncClient) -> dict[str, Workload]:
    response = await api.get("/v1/workloads")
    assert response.status_code == 200, response.text
    return {w["id"]: Workload.model_validate(w) for w in response.json()["items"]}


def test_an_end_reaches_the_record_by_its_event_and_a_listing_asks_no_node() -> None:
    async def test() -> None:
        async with embedded_api(3) as under_test, under_test.client() as api:
            assert under_test.faults is not None and under_test.backend is not None
            quitter = await create(api, "quitter", ["sh", "-c", "sleep 0.2; exit 3"])
            sleeper = await create(api, "sleeper", ["sleep", "60"])
            # a listing reads the records: a node cut off is not asked (nothing turns unknown)
            under_test.faults.cut(sleeper.node)
            assert (await listed(api))[sleeper.id].state == "running"
            under_test.faults.heal(sleeper.node)
            for _ in range(300):  # nobody reads the quitter: its node's event ends it
                record = await under_test.backend.workloads.get(quitter.id)
                assert record is not None
                if record.state != "running":
                    break
                await asyncio.sleep(0.02)
            assert record is not None
            assert record.state == "exited" and record.exit_code == 3, record
            assert (await listed(api))[quitter.id].state == "exited"

    run(test)


def test_an_event_no_live_record_names_changes_nothing() -> None:
    async def test() -> None:
        async with embedded_api(2) as under_test, under_test.client() as api:
            backend = under_test.backend
            assert backend is not None
            workload = await create(api, "kept", ["sleep", "60"])
            ghost = WorkloadEvent(node=workload.node, workload_id="w-nobody", kind="ended")
            assert await backend.apply_event(ghost) == "unrecorded"
            other_node = WorkloadEvent(node="elsewhere", workload_id=workload.id, kind="ended")
            assert await backend.apply_event(other_node) == "unrecorded"
            stopped = await api.post(f"/v1/workloads/{workload.id}/stop")
            assert stopped.status_code == 200
            late = WorkloadEvent(
                node=workload.node, workload_id=workload.id, kind="ended", exit_code=9
            )
            assert await backend.apply_event(late) == "stale"
            record = await backend.workloads.get(workload.id)
            assert record is not None and record.state == "stopped" and record.exit_code != 9

    run(test)
