"""Cordon: one check of the table, judged alike by the reference, the engine, admission and
explanations; a node core and an agent refuse new workloads while cordoned; an agent's
cordon survives its restart (the file in its state directory), also over NATS."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berth import Layer, Platform, Spec
from berth.boot import AdmitOrder, RunOrder
from berth.embedded import embedded_configs
from berth.node.agent import Agent
from berth.node.budget import IDLE, BudgetLimits, NodeBudget, StaticLoad
from berth.node.runtime import BootSpec, FakeRuntime
from berth.nodeclient.nats import NatsNodes
from berth.nodeclient.nats_node import NodeService
from berth.ownership import Refused
from berth.processes.agent import node_service
from berth.scheduler.engine import Engine
from berth.scheduler.explain import verdicts
from berth.scheduler.reference import ReferenceRanker
from berth.state import NodeState, first_failed_check
from berth.store.memory import MemoryStore
from berth.testing.nats import NatsServer, client, unique_name
from berth.units import GiB

AMD64, ARM64 = Platform.parse("linux/amd64"), Platform.parse("linux/arm64")
LAYER_IDS = ["a", "b", "c"]


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeState]:
    names = draw(
        st.lists(st.text(alphabet="abn-01", min_size=1, max_size=4), unique=True, max_size=25)
    )
    return [
        NodeState(
            node=name,
            platform=draw(st.sampled_from([AMD64, ARM64])),
            mem_free=draw(st.integers(0, 4)) * 256,
            disk_free=draw(st.integers(0, 4)) * 256,
            cpu_capacity=2.0,
            disk_bw_ceiling=1024.0,
            net_bw_ceiling=1024.0,
            layers=frozenset(draw(st.lists(st.sampled_from(LAYER_IDS), max_size=3))),
            cordoned=draw(st.booleans()),
        )
        for name in names
    ]


specs = st.none() | st.builds(
    Spec, vcpus=st.just(0.5), mem=st.integers(0, 4).map(lambda x: x * 256), disk=st.just(0)
)
layer_lists = st.lists(
    st.builds(Layer, id=st.sampled_from(LAYER_IDS), size=st.integers(0, 99)),
    max_size=3,
    unique_by=lambda layer: layer.id,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), specs, layer_lists, st.lists(st.sampled_from([AMD64, ARM64]), max_size=1))
def test_engine_reference_and_explanations_agree_on_cordoned_nodes(
    states: list[NodeState], spec: Spec | None, layers: list[Layer], platforms: list[Platform]
) -> None:
    engine, reference = Engine(capacity=2), ReferenceRanker()
    for state in states:
        engine.upsert(state)
        reference.upsert(state)
    got, expected = engine.rank(spec, layers, platforms), reference.rank(spec, layers, platforms)
    assert got.pairs() == expected.pairs()
    ranked = set(got)
    assert not any(state.cordoned and state.node in ranked for state in states)
    explained = verdicts(states, spec, layers, platforms, {})
    for verdict in explained.verdicts:
        state = next(s for s in states if s.node == verdict.node)
        if state.cordoned:  # first in the table: a cordoned node is named so, whatever else
            assert verdict.verdict == "cordoned"
            assert verdict.description.startswith("node cordoned: it takes no new workloads")
        assert (verdict.verdict == "fits") == (verdict.node in ranked)
        assert first_failed_check(state, spec, platforms) == (
            None if verdict.verdict == "fits" else verdict.verdict
        )


def test_summary_names_cordoned_nodes() -> None:
    base = dict(
        platform=AMD64,
        mem_free=GiB,
        disk_free=GiB,
        cpu_capacity=2.0,
        disk_bw_ceiling=1.0,
        net_bw_ceiling=1.0,
    )
    states = [
        NodeState(node="a", cordoned=True, **base),
        NodeState(node="b", cordoned=True, **base),
        NodeState(node="c", **base),
    ]
    explanation = verdicts(states, Spec(vcpus=0.1, mem=1, disk=0), [], [], {"c": 0})
    assert explanation.summary().count("node cordoned") == 1
    assert "2 node cordoned" in explanation.summary()


def _budget() -> NodeBudget:
    limits = BudgetLimits(
        mem_max=GiB, disk_max=GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
    )
    return NodeBudget(limits, StaticLoad(), platform=AMD64)


def test_budget_admission_refuses_cordoned_and_keeps_held() -> None:
    budget = _budget()
    held = budget.admit_leased(Spec(vcpus=0.1, mem=GiB // 2, disk=0), 30.0)
    assert budget.set_cordoned(True) is True and budget.set_cordoned(True) is False
    with pytest.raises(Refused) as refused:
        budget.admit_leased(Spec(vcpus=0.1, mem=1, disk=0), 30.0)
    assert refused.value.reason == "cordoned"
    assert budget.get(held.id) is not None  # what it held stays
    assert budget.set_cordoned(False) is True
    budget.release(budget.admit_leased(Spec(vcpus=0.1, mem=1, disk=0), 30.0).id)


def test_agent_cordon_refuses_boots_publishes_and_survives_restart(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        runtime = FakeRuntime()

        def agent() -> Agent:
            return Agent("n1", AMD64, _budget(), store, runtime, state_dir=tmp_path / "n1")

        first = agent()
        async with first:
            running = await first.try_run(
                RunOrder(Spec(vcpus=0.1, mem=1, disk=0), [], BootSpec(name="w", command=("sleep",)))
            )
            assert first.cordon(True) is True
            await first.advertise()
            assert (await store.states())["n1"].cordoned is True
            with pytest.raises(Refused) as refused:
                await first.try_run(
                    RunOrder(
                        Spec(vcpus=0.1, mem=1, disk=0),
                        [Layer(id="a", size=1)],
                        BootSpec(name="x", command=("sleep",)),
                    )
                )
            assert (refused.value.reason, refused.value.node) == ("cordoned", "n1")
            assert first.layers.mounted() == frozenset()  # refused before mounting
            assert first.status(running.id).state == "running"  # running ones go on
        assert (tmp_path / "n1" / "cordoned").exists()
        second = agent()  # a restart: cordoned from the start, before it first publishes
        assert second.cordoned is True and second.snapshot().cordoned is True
        assert second.cordon(False) is True
        assert not (tmp_path / "n1" / "cordoned").exists()
        assert agent().cordoned is False

    asyncio.run(main())


def test_status_remembers_how_a_workload_ended() -> None:
    async def main() -> None:
        runtime = FakeRuntime()
        agent = Agent("n1", AMD64, _budget(), MemoryStore(), runtime)
        async with agent:
            boot = BootSpec(name="w", command=("true",))
            one = await agent.try_run(RunOrder(Spec(vcpus=0.1, mem=1, disk=0), [], boot))
            two = await agent.try_run(RunOrder(Spec(vcpus=0.1, mem=1, disk=0), [], boot))
            runtime.finish(one.id, 3)
            await agent.stop_workload(two.id)
            assert agent.status(one.id).to_dict() == {
                "state": "ended",
                "exit_code": 3,
                "reason": "exited with code 3",
                "stopped": False,
                "restarts": 0,
                "exhausted": False,
            }
            assert agent.status(two.id).stopped is True
            assert agent.status("nope").state == "unknown"

    asyncio.run(main())


def test_cordon_over_nats_survives_the_agent_restarting(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A node service on a real nats-server is cordoned through NatsNodes; a new agent for
    the same node with the same state directory (a restart) starts cordoned, advertises it,
    and refuses admissions until uncordoned."""
    config = embedded_configs(1, runtime="fake", heartbeat_s=0.5)[0]
    node = config.node.name
    bucket, prefix = unique_name("cordon"), unique_name("cordon")
    spec = Spec(vcpus=0.1, mem=1, disk=0)

    async def main() -> None:
        async with client(nats_server.url) as connection:
            nodes = NatsNodes(connection, prefix=prefix)

            def service() -> NodeService:
                return node_service(
                    connection,
                    config,
                    bucket=bucket,
                    prefix=prefix,
                    readings=IDLE,
                    state_dir=tmp_path / node,
                )

            async with service():
                assert await nodes.cordon(node) is True
                with pytest.raises(Refused) as refused:
                    await nodes.admit(node, AdmitOrder(spec, 5))
                assert (refused.value.reason, refused.value.node) == ("cordoned", node)
            async with service() as restarted:  # the same node, a new agent process
                assert restarted.agent.snapshot().cordoned is True
                with pytest.raises(Refused):
                    await nodes.admit(node, AdmitOrder(spec, 5))
                assert await nodes.uncordon(node) is True
                admission = await nodes.admit(node, AdmitOrder(spec, 5))
                assert await nodes.release(node, admission.reservation_id) is True
            async with service() as again:
                assert again.agent.cordoned is False

    asyncio.run(main())
