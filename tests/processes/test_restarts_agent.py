"""Restarts across an agent's death, with real processes on a real nats-server: a workload
with ``restart = always`` killed by something else than a stop (``kill -9``) is restarted
by its agent under its id; the agent is ``kill -9``ed and started again on its state
directory; it adopts the restarted workload with its policy and restart count, and restarts
it again when it is killed again — one reservation throughout, every process killed at the
end, pass or fail."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from berth.boot import RunOrder
from berth.model import RestartPolicy
from berth.node.runtime import BootSpec
from berth.node.runtime.supervisor import alive
from tests.processes.test_agent_restart import (
    LAYERS,
    NODE,
    QUARTER,
    Agents,
    agents,
    connected,
    first_state_after,
    kill_9,
    reserved,
)

__all__ = ["agents"]  # the fixture, used by name

pytestmark = pytest.mark.slow  # agent processes on a real nats-server, a few seconds

ALWAYS = BootSpec(
    name="s", command=("sleep", "600"), restart=RestartPolicy(mode="always", delay_s=0.1)
)


def test_a_restarted_agent_adopts_a_restarted_workload_and_restarts_it_again(
    agents: Agents,
) -> None:
    async def scenario() -> None:
        async with connected(agents.url) as (nodes, store):
            agent = agents.start()
            await first_state_after(store, 0)
            workload_id = await nodes.try_run(NODE, RunOrder(QUARTER, LAYERS, ALWAYS))
            pids = [agents.workload_processes()[workload_id]]
            os.kill(pids[0][0], signal.SIGKILL)  # not a stop: its agent restarts it

            async def restarted(count: int) -> None:
                deadline = time.monotonic() + 10.0
                while (await nodes.status(NODE, workload_id)).restarts < count:
                    assert time.monotonic() < deadline, "not restarted"
                    await asyncio.sleep(0.05)
                while agents.workload_processes().get(workload_id) in (None, *pids):
                    assert time.monotonic() < deadline, "no new process"
                    await asyncio.sleep(0.05)
                pids.append(agents.workload_processes()[workload_id])

            await restarted(1)
            status = await nodes.status(NODE, workload_id)
            assert status.state == "running" and status.reason == "killed by SIGKILL"
            kill_9(agent)
            assert alive(*pids[1])  # it outlives its agent
            started_at = time.time()
            agents.start()
            state = await first_state_after(store, started_at)
            assert reserved(state) == QUARTER.mem  # re-reserved, once
            assert (await nodes.status(NODE, workload_id)).restarts == 1  # kept in the journal
            os.kill(pids[1][0], signal.SIGKILL)
            await restarted(2)
            assert len(set(pids)) == 3 and alive(*pids[2])
            assert reserved(await first_state_after(store, time.time())) == QUARTER.mem
            await nodes.stop(NODE, workload_id)
            final = await nodes.status(NODE, workload_id)
            assert final.state == "ended" and final.stopped and final.restarts == 2
            assert not any(alive(*found) for found in pids)

    asyncio.run(asyncio.wait_for(scenario(), 60))
