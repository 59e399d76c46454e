"""The in-process node-client driver over node agents: node name → that node's ``Agent``.

The embedded cluster's driver.  Every call is the agent's own method — the same ones a
network driver's server side will call — so what the embedded default proves about
admission, binding and boots holds for the distributed one.

Two checks happen here, before the agent is called, until the agent makes them itself: a
``lease_ttl_s`` that is not positive is ``Invalid`` (naming ``lease_ttl_s``), and ``bind`` and
``release`` first end the node's leases past their deadline — the budget reaps lazily (the
agent's heartbeat, the next admission), and without that a late bind would revive an expired
reservation and a release report it as still held.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from berth.errors import Invalid, Unavailable
from berth.model import Layer, Spec
from berth.node.agent import Agent
from berth.node.runtime.port import BootSpec
from berth.ownership import Admission, Owner
from berth.platform import Platform

__all__ = ["AgentNodes"]


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

    async def admit(
        self,
        node: str,
        spec: Spec,
        *,
        lease_ttl_s: float,
        platforms: Sequence[Platform] = (),
    ) -> Admission:
        if isinstance(lease_ttl_s, bool) or not lease_ttl_s > 0:
            raise Invalid(f"must be positive, got {lease_ttl_s!r}", field="lease_ttl_s")
        return self.agent(node).admit(spec, lease_ttl_s, platforms)

    async def bind(self, node: str, reservation_id: str, owner: Owner | str) -> None:
        agent = self.agent(node)
        agent.budget.reap()
        agent.bind(reservation_id, owner)

    async def release(self, node: str, reservation_id: str) -> bool:
        agent = self.agent(node)
        agent.budget.reap()
        return agent.release(reservation_id)

    async def try_run(
        self,
        node: str,
        spec: Spec,
        layers: Sequence[Layer],
        boot: BootSpec,
        platforms: Sequence[Platform] = (),
    ) -> str:
        return (await self.agent(node).try_run(spec, layers, boot, platforms)).id

    async def stop(self, node: str, workload_id: str) -> None:
        await self.agent(node).stop_workload(workload_id)
