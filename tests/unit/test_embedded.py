"""End to end: an embedded cluster of real agents booting real processes.

No test here depends on timing: the processes killed from outside run until they are killed
(they cannot have exited on their own first), every wait is for an event with a generous
bound, and the store is read after an explicit advertisement, not after a sleep.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal

import pytest

from berth import Invalid, NoCapacity, Platform, Request
from berth.embedded import EmbeddedCluster, embedded_configs
from berth.node.runtime import BootSpec, WorkloadHandle
from berth.platform import matches_any


def test_twenty_mixed_workloads_some_killed_budgets_return_exactly() -> None:
    async def test() -> None:
        rng = random.Random(7)
        async with EmbeddedCluster(embedded_configs(3)) as cluster:
            start = {name: a.budget.headroom() for name, a in cluster.agents.items()}
            types = ["micro", "milli", "centi", "deci"]
            started: list[tuple[Request, str, WorkloadHandle]] = []
            refused = 0
            for index in range(20):
                platforms = rng.choice([(), ("linux/amd64",), ("linux/arm64",)])
                request = Request(
                    namespace="it",
                    name="job",
                    replica=index,
                    spec=rng.choice(types),
                    platforms=platforms,
                    layers=((f"layer-{index % 4}", 1000 + index % 4),),
                )
                # Every fourth workload runs until it is killed below; the rest end on their own.
                seconds = "600" if index % 4 == 0 else f"{rng.uniform(0.05, 0.3):.2f}"
                boot = BootSpec(name=f"job-{index}", command=("sleep", seconds))
                try:
                    run = await cluster.run(request, boot)
                except NoCapacity:
                    refused += 1
                    continue
                started.append((request, run.node, run.result))
                for name, agent in cluster.agents.items():  # no budget ever exceeded
                    held = agent.budget.reservations()
                    assert sum(r.spec.mem for r in held) <= agent.budget.limits.mem_max, name
                    assert sum(r.spec.disk for r in held) <= agent.budget.limits.disk_max, name
                node_platform = cluster.agents[run.node].platform
                assert matches_any(node_platform, request.platforms)  # never a wrong platform
            assert len(started) >= 10
            victims = [w for _, _, w in started if w.spec.command == ("sleep", "600")]
            assert len(victims) >= 2
            for workload in victims:
                assert workload.pid is not None and not workload.done  # alive: it never exits
                os.killpg(workload.pid, signal.SIGKILL)
            for _, _, workload in started:
                await asyncio.wait_for(workload.wait(), timeout=10)
            for workload in victims:
                assert workload.exit is not None and workload.exit.signal == signal.SIGKILL
            for name, agent in cluster.agents.items():
                assert agent.budget.headroom() == start[name]
                assert agent.budget.reservations() == []
                assert agent.layers.mounted() == frozenset()
                assert agent.workloads() == {}
            for agent in cluster.agents.values():
                await agent.advertise()  # what the cluster knows now, not after a while
            for name, state in cluster.store.states_now().items():
                assert state.mem_free == start[name].mem_free  # and the cluster knows it

    asyncio.run(test())


def test_embedded_configs_are_heterogeneous_and_validated() -> None:
    configs = embedded_configs(6)
    assert len({c.budget.mem_max for c in configs}) == 3
    assert {c.node.platform for c in configs} == {
        Platform.parse("linux/amd64"),
        Platform.parse("linux/arm64"),
    }
    with pytest.raises(Invalid):
        embedded_configs(0)
    with pytest.raises(Invalid):
        EmbeddedCluster(configs + configs[:1])


def test_run_needs_a_spec() -> None:
    async def test() -> None:
        async with EmbeddedCluster(embedded_configs(1, runtime="fake")) as cluster:
            with pytest.raises(Invalid):
                await cluster.run(
                    Request(namespace="a", name="b"), BootSpec(name="x", command=("x",))
                )

    asyncio.run(test())
