"""The node client port: how a scheduler reaches a node's authoritative admission.

A scheduler that has ranked the candidates confirms on the chosen node.  Over a network it
cannot hand the node a live owner object, so confirmation is two steps: ``admit`` reserves
under a *lease* that expires unless it is ``bind``-ed to the workload (or ``release``-d) in
time; an unbound lease simply runs out and frees what it held.  ``try_run`` and ``stop`` (the
node agent's part) extend this port when agents exist.  Messages are plain serialisable data
(a ``Spec``, ids, reason codes), so a network driver can carry them unchanged.

:class:`LocalNodes` is the in-process driver: node name → that node's ``NodeBudget``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from berth.errors import Unavailable
from berth.model import Layer, Spec
from berth.node.budget import NodeBudget, Owner, Refused, refused_by
from berth.node.runtime import BootSpec

if TYPE_CHECKING:
    from berth.node.agent import Agent

__all__ = ["AgentClient", "AgentNodes", "LocalNodes", "NodeClient"]


class NodeClient(Protocol):
    """Admission on a named node."""

    async def admit(self, node: str, spec: Spec, *, lease_ttl_s: float) -> str:
        """Reserve ``spec`` on ``node`` under a lease; the reservation id.

        Raises ``Refused`` (with the node's reason code) or ``Unavailable``.
        """
        ...

    async def bind(self, node: str, reservation_id: str, owner: Owner | str) -> None:
        """Tie the reservation's lease to ``owner`` (an owner object in-process, or a workload
        id on that node): the reservation is then released when the owner ends."""
        ...

    async def release(self, node: str, reservation_id: str) -> bool:
        """Release a reservation; idempotent."""
        ...


class LocalNodes:
    """``NodeClient`` over budgets in this process."""

    def __init__(self, budgets: Mapping[str, NodeBudget] | None = None) -> None:
        self._budgets: dict[str, NodeBudget] = dict(budgets or {})

    def add(self, node: str, budget: NodeBudget) -> None:
        self._budgets[node] = budget

    def discard(self, node: str) -> None:
        self._budgets.pop(node, None)

    def budget(self, node: str) -> NodeBudget:
        try:
            return self._budgets[node]
        except KeyError:
            raise Unavailable(f"node {node!r} is not reachable") from None

    async def admit(self, node: str, spec: Spec, *, lease_ttl_s: float) -> str:
        return self.admit_now(node, spec, lease_ttl_s=lease_ttl_s)

    def admit_now(self, node: str, spec: Spec, *, lease_ttl_s: float) -> str:
        """Synchronous ``admit`` for in-process callers (the simulator)."""
        budget = self.budget(node)
        with refused_by(node):
            return budget.admit_leased(spec, lease_ttl_s).id

    async def bind(self, node: str, reservation_id: str, owner: Owner | str) -> None:
        if isinstance(owner, str):
            raise Refused("unknown_workload", "budget-only nodes run no workloads", node=node)
        budget = self.budget(node)
        with refused_by(node):
            budget.bind(reservation_id, owner)

    async def release(self, node: str, reservation_id: str) -> bool:
        return self.budget(node).release(reservation_id)


class AgentClient(NodeClient, Protocol):
    """Admission plus the agent's workload operations."""

    async def try_run(self, node: str, spec: Spec, layers: Sequence[Layer], boot: BootSpec) -> str:
        """Boot ``boot`` on ``node`` owning a reservation of ``spec``; the workload id.

        Raises ``Refused`` (``boot_failed``, ``mem_exhausted`` …) or ``Unavailable``.
        """
        ...

    async def stop(self, node: str, workload_id: str) -> None:
        """Stop a workload; unknown or already stopped ids are harmless."""
        ...


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

    async def admit(self, node: str, spec: Spec, *, lease_ttl_s: float) -> str:
        return self.agent(node).admit(spec, lease_ttl_s)

    async def bind(self, node: str, reservation_id: str, owner: Owner | str) -> None:
        self.agent(node).bind(reservation_id, owner)

    async def release(self, node: str, reservation_id: str) -> bool:
        return self.agent(node).release(reservation_id)

    async def try_run(self, node: str, spec: Spec, layers: Sequence[Layer], boot: BootSpec) -> str:
        return (await self.agent(node).try_run(spec, layers, boot)).id

    async def stop(self, node: str, workload_id: str) -> None:
        await self.agent(node).stop_workload(workload_id)
