"""The node agent: try_run, releases on every kind of workload end, advertising, leases."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from berth import Layer, Spec
from berth.boot import AdmitOrder, RunOrder
from berth.errors import Invalid, Unavailable
from berth.node.agent import Agent
from berth.node.budget import BudgetLimits, NodeBudget
from berth.node.layers import LayerRegistry
from berth.node.runtime import BootSpec, FakeRuntime, ProcessRuntime, Runtime
from berth.nodeclient.agents import AgentNodes
from berth.ownership import Refused
from berth.platform import Platform
from berth.store.memory import MemoryStore
from berth.units import GiB

SPEC = Spec(vcpus=0.5, mem=GiB, disk=GiB)
LAYERS = (Layer(id="base", size=100), Layer(id="app", size=10))
BOOT = BootSpec(name="w", command=("x",))


def make_agent(runtime: Runtime, store: MemoryStore | None = None, **options: object) -> Agent:
    limits = BudgetLimits(
        mem_max=2 * GiB, disk_max=10 * GiB, cpu_capacity=2, disk_bw_cap=GiB, net_bw_cap=GiB
    )
    return Agent(
        "n1",
        "linux/amd64",
        NodeBudget(limits),
        store or MemoryStore(),
        runtime,
        layers=LayerRegistry(1000),
        **options,  # type: ignore[arg-type]
    )


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def test_try_run_reserves_mounts_and_everything_returns_when_it_ends() -> None:
    async def test() -> None:
        runtime = FakeRuntime()
        store = MemoryStore()
        async with make_agent(runtime, store) as agent:
            workload = await agent.try_run(
                RunOrder(SPEC, LAYERS, BootSpec(name="w", command=("x",)))
            )
            assert agent.budget.headroom().mem_free == GiB
            assert agent.layers.mounted() == {"base", "app"}
            await until(lambda: store.states_now()["n1"].mem_free == GiB)
            assert store.states_now()["n1"].layers == {"base", "app"}
            runtime.finish(workload.id, 0)
            assert agent.budget.headroom().mem_free == 2 * GiB
            assert agent.layers.mounted() == frozenset()
            assert agent.layers.cached() == {"base", "app"}
            await until(lambda: store.states_now()["n1"].cached_layers == {"base", "app"})
            assert agent.workloads() == {}
        assert "n1" not in store.states_now()  # leaving removes the node

    run(test)


def test_admission_refusal_stops_the_started_workload_and_leaks_nothing() -> None:
    async def test() -> None:
        runtime = FakeRuntime()
        async with make_agent(runtime) as agent:
            big = Spec(vcpus=0.5, mem=3 * GiB, disk=GiB)
            with pytest.raises(Refused) as caught:
                await agent.try_run(RunOrder(big, LAYERS, BootSpec(name="w", command=("x",))))
            assert caught.value.reason == "mem_exhausted" and caught.value.node == "n1"
            assert all(w.done for w in runtime.list())
            assert agent.budget.reservations() == []
            assert agent.layers.mounted() == frozenset()

    run(test)


def test_boot_failure_is_a_clear_refusal_and_leaks_nothing() -> None:
    async def test() -> None:
        async with make_agent(FakeRuntime(failing_commands={"broken"})) as agent:
            with pytest.raises(Refused) as caught:
                await agent.try_run(RunOrder(SPEC, LAYERS, BootSpec(name="w", command=("broken",))))
            assert caught.value.reason == "boot_failed"
            assert agent.budget.reservations() == [] and agent.layers.mounted() == frozenset()

    run(test)


def test_real_missing_command_is_refused_with_boot_failed() -> None:
    async def test() -> None:
        async with make_agent(ProcessRuntime()) as agent:
            with pytest.raises(Refused) as caught:
                await agent.try_run(
                    RunOrder(SPEC, LAYERS, BootSpec(name="w", command=("no-such-cmd-xyz",)))
                )
            assert caught.value.reason == "boot_failed"
            assert "no-such-cmd-xyz" in str(caught.value)
            assert agent.budget.reservations() == [] and agent.layers.mounted() == frozenset()

    run(test)


def test_real_process_killed_from_outside_releases_its_reservation() -> None:
    async def test() -> None:
        runtime = ProcessRuntime(stop_grace_s=0.5)
        async with make_agent(runtime) as agent:
            boot = BootSpec(name="sleeper", command=("sleep", "30"))
            workload = await agent.try_run(RunOrder(SPEC, LAYERS, boot))
            assert workload.pid is not None
            assert workload.spec.mem_limit == SPEC.mem  # the hard memory budget is enforced
            os.killpg(workload.pid, signal.SIGKILL)
            await until(lambda: agent.budget.reservations() == [])
            assert agent.layers.mounted() == frozenset()
            await agent.stop_workload(workload.id)  # already gone: harmless
            await agent.stop_workload("never-existed")
        await runtime.aclose()

    run(test)


def test_heartbeat_republishes_and_reaps_unbound_leases() -> None:
    async def test() -> None:
        store = MemoryStore()
        async with make_agent(FakeRuntime(), store, heartbeat_s=0.05) as agent:
            first = store.states_now()["n1"].generation
            await until(lambda: store.states_now()["n1"].generation >= first + 3)
            nodes = AgentNodes({"n1": agent})
            await nodes.admit("n1", AdmitOrder(SPEC, 0.1))
            assert agent.budget.headroom().mem_free == GiB
            await until(lambda: agent.budget.headroom().mem_free == 2 * GiB)
            await until(lambda: store.states_now()["n1"].mem_free == 2 * GiB)

    run(test)


def test_agent_client_binds_a_lease_to_a_workload_by_id() -> None:
    async def test() -> None:
        runtime = FakeRuntime()
        async with make_agent(runtime) as agent:
            nodes = AgentNodes({"n1": agent})
            workload_id = await nodes.try_run(
                "n1", RunOrder(SPEC, LAYERS, BootSpec(name="a", command=("x",)))
            )
            reservation = (await nodes.admit("n1", AdmitOrder(SPEC, 30))).reservation_id
            await nodes.bind("n1", reservation, workload_id)
            assert agent.budget.headroom().mem_free == 0
            await nodes.stop("n1", workload_id)
            assert agent.budget.headroom().mem_free == 2 * GiB  # both reservations followed it
            with pytest.raises(Refused, match="lease_expired"):
                await nodes.bind("n1", reservation, workload_id)
            other = (await nodes.admit("n1", AdmitOrder(SPEC, 30))).reservation_id
            with pytest.raises(Refused, match="unknown_workload"):
                await nodes.bind("n1", other, "ghost")
            assert await nodes.release("n1", other)
            assert not await nodes.release("n1", other)
            with pytest.raises(Unavailable):
                await nodes.admit("elsewhere", AdmitOrder(SPEC, 1))

    run(test)


def test_the_agent_runs_the_node_core_and_advertises_its_snapshot() -> None:
    async def test() -> None:
        runtime = FakeRuntime()
        store = MemoryStore()
        async with make_agent(runtime, store) as agent:
            with pytest.raises(Refused) as caught:  # the core's platform check, before booting
                await agent.try_run(RunOrder(SPEC, LAYERS, BOOT, (Platform.parse("linux/arm64"),)))
            assert caught.value.reason == "platform_mismatch" and runtime.list() == ()
            workload = await agent.try_run(RunOrder(SPEC, LAYERS, BOOT))
            assert agent.workloads() == agent.core.workloads() == {workload.id: workload}
            await until(lambda: store.states_now()["n1"].admitted == 1)
            assert store.states_now()["n1"].generation == agent.core.generation

    run(test)


def test_bad_agent_arguments_are_invalid() -> None:
    with pytest.raises(Invalid):
        make_agent(FakeRuntime(), heartbeat_s=0)
    with pytest.raises(Invalid):
        Agent(
            "",
            "linux/amd64",
            NodeBudget(
                BudgetLimits(mem_max=1, disk_max=1, cpu_capacity=1, disk_bw_cap=1, net_bw_cap=1)
            ),
            MemoryStore(),
            FakeRuntime(),
        )
