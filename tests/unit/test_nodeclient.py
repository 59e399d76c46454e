"""Every node-client driver passes the port's contract; then driver specifics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from berth.boot import AdmitOrder, RunOrder
from berth.errors import Invalid, Unavailable
from berth.model import Spec
from berth.node.agent import Agent
from berth.node.runtime import BootSpec, FakeRuntime
from berth.nodeclient.agents import AgentNodes
from berth.nodeclient.faults import FaultyNodes
from berth.nodeclient.local import LocalNodes
from berth.nodeclient.port import NodeClient
from berth.nodeclient.recording import RecordingNodes
from berth.ownership import Refused
from berth.platform import Platform
from berth.store.memory import MemoryStore
from berth.testing.nodeclient_contract import NodeClientContract, NodeShape
from berth.units import MiB

WORKLOAD_SPEC = Spec(vcpus=0.01, mem=MiB, disk=MiB)


def local_nodes(shapes: Sequence[NodeShape]) -> LocalNodes:
    return LocalNodes({shape.name: shape.budget() for shape in shapes})


class TestLocalNodesContract(NodeClientContract):
    def open_nodes(self, shapes: Sequence[NodeShape]) -> AbstractAsyncContextManager[NodeClient]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[NodeClient]:
            yield local_nodes(shapes)

        return opened()


class TestRecordingNodesContract(NodeClientContract):
    def open_nodes(self, shapes: Sequence[NodeShape]) -> AbstractAsyncContextManager[NodeClient]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[NodeClient]:
            yield RecordingNodes(local_nodes(shapes))

        return opened()


class TestAgentNodesContract(NodeClientContract):
    """Agents that are not started (no advertiser): the port must not rely on their loops."""

    runs_workloads = True

    def open_nodes(self, shapes: Sequence[NodeShape]) -> AbstractAsyncContextManager[NodeClient]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[NodeClient]:
            store = MemoryStore()
            agents = [
                Agent(shape.name, shape.platform, shape.budget(), store, FakeRuntime())
                for shape in shapes
            ]
            yield AgentNodes({agent.name: agent for agent in agents})

        return opened()

    async def start_workload(self, nodes: NodeClient, node: str) -> str:
        assert isinstance(nodes, AgentNodes)
        return await nodes.try_run(
            node, RunOrder(WORKLOAD_SPEC, [], BootSpec(name="w", command=("vm",)))
        )

    async def stop_workload(self, nodes: NodeClient, node: str, workload_id: str) -> None:
        assert isinstance(nodes, AgentNodes)
        await nodes.stop(node, workload_id)


class TestStartedAgentNodesContract(TestAgentNodesContract):
    """The same agents advertising (reaping leases on their heartbeat) while the suite runs."""

    def open_nodes(self, shapes: Sequence[NodeShape]) -> AbstractAsyncContextManager[NodeClient]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[NodeClient]:
            store = MemoryStore()
            agents = [
                Agent(shape.name, shape.platform, shape.budget(), store, FakeRuntime())
                for shape in shapes
            ]
            for agent in agents:
                await agent.start()
            try:
                yield AgentNodes({agent.name: agent for agent in agents})
            finally:
                for agent in agents:
                    await agent.stop()

        return opened()


class TestFaultyNodesContract(NodeClientContract):
    """The fault-injecting wrapper, with no fault injected, is the driver it wraps."""

    runs_workloads = True

    def open_nodes(self, shapes: Sequence[NodeShape]) -> AbstractAsyncContextManager[NodeClient]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[NodeClient]:
            store = MemoryStore()
            agents = [
                Agent(shape.name, shape.platform, shape.budget(), store, FakeRuntime())
                for shape in shapes
            ]
            yield FaultyNodes(AgentNodes({agent.name: agent for agent in agents}))

        return opened()

    async def start_workload(self, nodes: NodeClient, node: str) -> str:
        assert isinstance(nodes, FaultyNodes)
        return await nodes.try_run(
            node, RunOrder(WORKLOAD_SPEC, [], BootSpec(name="w", command=("vm",)))
        )

    async def stop_workload(self, nodes: NodeClient, node: str, workload_id: str) -> None:
        assert isinstance(nodes, FaultyNodes)
        await nodes.stop(node, workload_id)


def test_a_cut_node_is_unavailable_and_reached_again_once_healed() -> None:
    async def scenario() -> None:
        agent = Agent(
            "n1",
            Platform.parse("linux/amd64"),
            NodeShape("n1").budget(),
            MemoryStore(),
            FakeRuntime(),
        )
        nodes = FaultyNodes(AgentNodes({"n1": agent}))
        workload_id = await nodes.try_run(
            "n1", RunOrder(WORKLOAD_SPEC, [], BootSpec(name="w", command=("vm",)))
        )
        nodes.cut("n1")
        for call in (
            nodes.status("n1", workload_id),
            nodes.stop("n1", workload_id),
            nodes.cordon("n1"),
        ):
            with pytest.raises(Unavailable, match="cut off"):
                await call
        assert agent.status(workload_id).state == "running"  # a cut reaches nothing
        nodes.heal("n1")
        assert (await nodes.status("n1", workload_id)).state == "running"
        nodes.lose_run_answers(1)
        with pytest.raises(Unavailable, match="answer was lost"):
            await nodes.try_run(
                "n1",
                RunOrder(
                    WORKLOAD_SPEC,
                    [],
                    BootSpec(name="x", command=("vm",)),
                    workload_id="w-00000000000x",
                ),
            )
        assert agent.status("w-00000000000x").state == "running"  # delivered, only unheard
        assert nodes.runs == [("n1", None), ("n1", "w-00000000000x")]

    asyncio.run(scenario())


# --- driver specifics ------------------------------------------------------------------------


def test_recording_nodes_note_every_refusal_and_clear() -> None:
    shapes = [NodeShape("small", mem=MiB), NodeShape("arm", Platform.parse("linux/arm64"))]
    nodes = RecordingNodes(local_nodes(shapes))
    spec = Spec(vcpus=0.01, mem=2 * MiB, disk=1)

    async def scenario() -> None:
        with pytest.raises(Refused):
            await nodes.admit("small", AdmitOrder(spec, 5))
        with pytest.raises(Refused):
            await nodes.admit("arm", AdmitOrder(spec, 5, (shapes[0].platform,)))
        with pytest.raises(Refused):
            await nodes.bind("arm", "r404", "w")
        with pytest.raises(Unavailable):  # not a node's refusal: not noted
            await nodes.admit("ghost", AdmitOrder(spec, 5))
        assert nodes.refusals == [
            ("small", "mem_exhausted"),
            ("arm", "platform_mismatch"),
            ("arm", "lease_expired"),
        ]
        nodes.clear()
        assert nodes.refusals == []

    asyncio.run(scenario())


def test_discarded_node_answers_unavailable() -> None:
    local = local_nodes([NodeShape("a")])
    agents = AgentNodes()
    agent = Agent("a", "linux/amd64", NodeShape("a").budget(), MemoryStore(), FakeRuntime())
    agents.add(agent)

    async def scenario(nodes: LocalNodes | AgentNodes) -> None:
        admission = await nodes.admit("a", AdmitOrder(WORKLOAD_SPEC, 5))
        nodes.discard("a")
        nodes.discard("a")  # idempotent
        for call in (
            nodes.admit("a", AdmitOrder(WORKLOAD_SPEC, 5)),
            nodes.release("a", admission.reservation_id),
        ):
            with pytest.raises(Unavailable, match="'a'"):
                await call

    asyncio.run(scenario(local))
    asyncio.run(scenario(agents))


def test_try_run_carries_platforms_and_the_node_refuses_a_mismatch() -> None:
    async def main() -> None:
        runtime = FakeRuntime()
        shape = NodeShape("arm", platform=Platform.parse("linux/arm64"))
        agent = Agent(shape.name, shape.platform, shape.budget(), MemoryStore(), runtime)
        nodes = AgentNodes({agent.name: agent})
        boot = BootSpec(name="w", command=("vm",))
        with pytest.raises(Refused) as refused:
            await nodes.try_run(
                "arm", RunOrder(WORKLOAD_SPEC, [], boot, (Platform.parse("linux/amd64"),))
            )
        assert refused.value.reason == "platform_mismatch"
        assert runtime.list() == () and agent.budget.reservations() == []  # nothing started
        workload = await nodes.try_run("arm", RunOrder(WORKLOAD_SPEC, [], boot, (shape.platform,)))
        assert [w.id for w in runtime.list()] == [workload]

    asyncio.run(main())


def test_an_order_is_checked_once_when_made_with_the_nodes_own_messages() -> None:
    """A malformed admit or run is refused when its order is made — ``Invalid`` naming the
    field, in the words the node core uses for the same call — so no driver ever sees it."""
    boot = BootSpec(name="w", command=("vm",))
    budget = NodeShape("n1").budget()  # nothing may be reserved on it
    agent = Agent("n1", "linux/amd64", budget, MemoryStore(), FakeRuntime())
    admits: dict[str, dict[str, object]] = {
        "spec": {"spec": None, "lease_ttl_s": 5},
        "platforms": {"spec": WORKLOAD_SPEC, "lease_ttl_s": 5, "platforms": "linux/amd64"},
        "lease_ttl_s": {"spec": WORKLOAD_SPEC, "lease_ttl_s": 0},
    }
    for field, arguments in admits.items():
        with pytest.raises(Invalid) as made:
            AdmitOrder(**arguments)  # type: ignore[arg-type]
        with pytest.raises(Invalid) as asked:
            agent.core.admit(**arguments)  # type: ignore[arg-type]
        assert made.value.field == field and str(made.value) == str(asked.value)
    runs: dict[str, dict[str, object]] = {
        "layers": {"layers": "sha256:ab"},
        "boot": {"boot": ("vm",)},
        "reservation": {"reservation": 5},
        "workload_id": {"workload_id": "a b"},
    }
    for field, arguments in runs.items():
        given: dict[str, object] = {"spec": WORKLOAD_SPEC, "layers": [], "boot": boot}
        with pytest.raises(Invalid) as made:
            RunOrder(**{**given, **arguments})  # type: ignore[arg-type]
        with pytest.raises(Invalid) as asked:
            asyncio.run(agent.core.boot(**{**given, **arguments}))  # type: ignore[arg-type]
        assert made.value.field == field and str(made.value) == str(asked.value)
    assert budget.reservations() == [] and agent.workloads() == {}
    layers, platforms = [("sha256:ab", 1)], ["linux/arm64"]  # parsed as a request's are
    order = RunOrder(WORKLOAD_SPEC, layers, boot, platforms, workload_id="w-1")  # type: ignore[arg-type]
    assert order.layers[0].id == "sha256:ab" and str(order.platforms[0]) == "linux/arm64/v8"
    with pytest.raises(AttributeError):
        order.workload_id = "w-2"  # type: ignore[misc]
    assert AdmitOrder(WORKLOAD_SPEC, 5).lease_ttl_s == 5.0
