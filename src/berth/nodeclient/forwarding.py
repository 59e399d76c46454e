"""The base of node-client drivers that wrap another: every call forwarded through one hook.

A wrapper driver — one that injects faults (:mod:`berth.nodeclient.faults`), notes refusals
(:mod:`berth.nodeclient.recording`), gives up after a number of them (the simulator's) — does
one thing around *every* call and passes the call on unchanged.  Written out per method,
each wrapper repeated the port's every signature and was one forgotten method away from
a driver that skips its own rule.  :class:`ForwardingNodes` (the
:class:`~berth.nodeclient.port.NodeClient` calls) and :class:`ForwardingAgents` (also the
:class:`~berth.nodeclient.port.AgentClient` calls) write the signatures once and send each
call through :meth:`ForwardingNodes.forward` — ``forward(node, call)`` awaits ``call()``,
the wrapped driver's answer; a wrapper overrides it (or, where the rule is one call's own,
that call's hook: :meth:`ForwardingNodes.forward_admit`, :meth:`ForwardingAgents.forward_run`)
and nothing else; those two are handed the call's order (an
:class:`~berth.boot.AdmitOrder`, a :class:`~berth.boot.RunOrder`) too, to read what they need.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from berth.boot import AdmitOrder, RunOrder, WorkloadLogs, WorkloadStatus
from berth.defaults import LOG_CHUNK_BYTES
from berth.nodeclient.port import AgentClient, NodeClient
from berth.ownership import Admission, Owner

__all__ = ["ForwardingAgents", "ForwardingNodes"]

T = TypeVar("T")


class ForwardingNodes:
    """A ``NodeClient`` that forwards every call to ``nodes`` through :meth:`forward`."""

    def __init__(self, nodes: NodeClient) -> None:
        self._nodes = nodes

    async def forward(self, node: str, call: Callable[[], Awaitable[T]]) -> T:
        """The answer to a call to ``node``: ``call()``'s, the wrapped driver's (override to
        do something around every call)."""
        return await call()

    async def forward_admit(
        self, node: str, order: AdmitOrder, call: Callable[[], Awaitable[Admission]]
    ) -> Admission:
        """The answer to ``order``'s ``admit`` on ``node``: :meth:`forward`'s (override to do
        something around admissions alone)."""
        return await self.forward(node, call)

    async def admit(self, node: str, order: AdmitOrder) -> Admission:
        return await self.forward_admit(node, order, lambda: self._nodes.admit(node, order))

    async def bind(self, node: str, reservation_id: str, owner: Owner | str) -> None:
        await self.forward(node, lambda: self._nodes.bind(node, reservation_id, owner))

    async def release(self, node: str, reservation_id: str) -> bool:
        return await self.forward(node, lambda: self._nodes.release(node, reservation_id))


class ForwardingAgents(ForwardingNodes):
    """An ``AgentClient`` that forwards every call to ``nodes`` through :meth:`forward`."""

    def __init__(self, nodes: AgentClient) -> None:
        super().__init__(nodes)
        self._agents = nodes

    async def forward_run(
        self, node: str, order: RunOrder, call: Callable[[], Awaitable[str]]
    ) -> str:
        """The answer to ``order``'s ``try_run`` on ``node``: :meth:`forward`'s (override to
        do something around runs alone)."""
        return await self.forward(node, call)

    async def try_run(self, node: str, order: RunOrder) -> str:
        return await self.forward_run(node, order, lambda: self._agents.try_run(node, order))

    async def stop(self, node: str, workload_id: str, *, grace_s: float | None = None) -> None:
        await self.forward(node, lambda: self._agents.stop(node, workload_id, grace_s=grace_s))

    async def status(self, node: str, workload_id: str) -> WorkloadStatus:
        return await self.forward(node, lambda: self._agents.status(node, workload_id))

    async def logs(
        self, node: str, workload_id: str, offset: int = 0, limit: int = LOG_CHUNK_BYTES
    ) -> WorkloadLogs:
        return await self.forward(node, lambda: self._agents.logs(node, workload_id, offset, limit))

    async def running(self, node: str) -> tuple[str, ...]:
        return await self.forward(node, lambda: self._agents.running(node))

    async def cordon(self, node: str) -> bool:
        return await self.forward(node, lambda: self._agents.cordon(node))

    async def uncordon(self, node: str) -> bool:
        return await self.forward(node, lambda: self._agents.uncordon(node))
