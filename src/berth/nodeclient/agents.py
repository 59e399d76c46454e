"""The in-process node-client driver over node agents: node name → that node's ``Agent``.

The embedded cluster's driver.  Every call is the agent's own method — the same ones a
network driver's server side will call — so what the embedded default proves about
admission, binding and boots holds for the distributed one.

"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from berth.boot import AdmitOrder, RunOrder, WorkloadLogs, WorkloadStatus
from berth.defaults import LOG_CHUNK_BYTES
from berth.errors import Unavailable
from berth.node.agent import Agent
from berth.ownership import Admission, Owner, Refused, refused_by

__all__ = ["AgentNodes", "running_on"]


def running_on(agent: Agent) -> tuple[str, ...]:
    """``agent``'s report of the workload ids it runs, sorted — the one answer of ``running``
    for every driver.  Refused ``node_starting`` while an agent with a journal has not
    reconciled it yet: the workloads it is about to adopt would be missing, and a reconciler
    would take them for ended, or for ghosts."""
    if not agent.reporting:
        with refused_by(agent.name):
            raise Refused("node_starting", "the agent is reconciling its journal")
    return tuple(sorted(agent.workloads()))


class AgentNodes:
    """``AgentClient`` over node agents in this process."""

    def __init__(self, agents: Mapping[str, Agent] | None = None) -> None:
        self._agents: dict[str, Agent] = dict(agents or {})

    def add(self, agent: Agent) -> None:
        self._agents[agent.name] = agent

    def discard(self, node: str) -> None:
        self._agents.pop(node, None)

    def agent(self, node: str) -> Agent:
        try:
            return self._agents[node]
        except KeyError:
            raise Unavailable(f"node {node!r} is not reachable") from None

    async def admit(self, node: str, order: AdmitOrder) -> Admission:
        return self.agent(node).admit(order)

    async def bind(self, node: str, reservation_id: str, owner: Owner | str) -> None:
        self.agent(node).bind(reservation_id, owner)

    async def release(self, node: str, reservation_id: str) -> bool:
        return self.agent(node).release(reservation_id)

    async def try_run(self, node: str, order: RunOrder) -> str:
        booted = await self.agent(node).try_run(order)
        return booted.id

    async def stop(self, node: str, workload_id: str, *, grace_s: float | None = None) -> None:
        await self.agent(node).stop_workload(workload_id, grace_s=grace_s)

    async def status(self, node: str, workload_id: str) -> WorkloadStatus:
        return self.agent(node).status(workload_id)

    async def logs(
        self, node: str, workload_id: str, offset: int = 0, limit: int = LOG_CHUNK_BYTES
    ) -> WorkloadLogs:
        agent = self.agent(node)
        return await asyncio.to_thread(agent.logs, workload_id, offset, limit)

    async def running(self, node: str) -> tuple[str, ...]:
        return running_on(self.agent(node))

    async def cordon(self, node: str) -> bool:
        return self.agent(node).cordon(True)

    async def uncordon(self, node: str) -> bool:
        return self.agent(node).cordon(False)
