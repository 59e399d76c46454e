"""A node-client driver that wraps another and injects the network's faults, for tests.

What a caller of a node must survive is not a node that says no but one that says nothing:
a partition, a paused agent, an answer lost on its way back.  :class:`FaultyNodes` forwards
every call to the wrapped :class:`~berth.nodeclient.port.AgentClient` and, on demand, makes
a node unreachable (:meth:`FaultyNodes.cut`: every call to it is ``Unavailable`` and reaches
nothing) or loses the answers of runs (:meth:`FaultyNodes.lose_run_answers`: the run *is*
delivered and the node boots, then the caller hears ``Unavailable`` — the outcome unknown).
It counts every run delivered (:attr:`FaultyNodes.runs`), so a test can say how many boots a
retry caused.  :class:`FaultyEvents` is the same cut on the way back: a node's workload
events (:mod:`berth.events`) are not stored while it is cut off — its agent keeps them and
publishes them again, as over a partition — when both share one set of cut nodes.

What it is not: a simulation of the node.  The wrapped driver's nodes answer everything
that is delivered; this only decides what is delivered and what is heard.  It is passed in
(the API harness, :func:`berth.api.testing.embedded_api`, wraps its cluster's client in one)
instead of patching a transport.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from berth.boot import RunOrder
from berth.errors import Unavailable
from berth.events.port import EventSink, WorkloadEvent
from berth.nodeclient.forwarding import ForwardingAgents
from berth.nodeclient.port import AgentClient

__all__ = ["FaultyEvents", "FaultyNodes"]

T = TypeVar("T")


class FaultyNodes(ForwardingAgents):
    """``AgentClient`` forwarding to ``nodes``, with nodes cut off and run answers lost."""

    def __init__(self, nodes: AgentClient, *, cut: set[str] | None = None) -> None:
        super().__init__(nodes)
        self._cut: set[str] = set() if cut is None else cut
        """The nodes cut off (shared with a :class:`FaultyEvents` when given)."""
        self._lose_runs = 0
        self.runs: list[tuple[str, str | None]] = []
        """Every run delivered to a node: ``(node, workload_id)``, in order."""

    def cut(self, node: str) -> None:
        """Make ``node`` unreachable: every call to it is ``Unavailable`` until :meth:`heal`."""
        self._cut.add(node)

    def heal(self, node: str) -> None:
        self._cut.discard(node)

    def lose_run_answers(self, count: int = 1) -> None:
        """The next ``count`` runs are delivered, and their answers lost (``Unavailable``)."""
        self._lose_runs += count

    def _reach(self, node: str) -> None:
        if node in self._cut:
            raise Unavailable(f"node {node!r} is not reachable (cut off)")

    async def forward(self, node: str, call: Callable[[], Awaitable[T]]) -> T:
        self._reach(node)
        return await call()

    async def forward_run(
        self, node: str, order: RunOrder, call: Callable[[], Awaitable[str]]
    ) -> str:
        self._reach(node)
        self.runs.append((node, order.workload_id))
        ran = await super().forward_run(node, order, call)
        if self._lose_runs > 0:
            self._lose_runs -= 1
            raise Unavailable(f"node {node!r} did not answer run (the answer was lost)")
        return ran


class FaultyEvents:
    """``EventSink`` forwarding to ``events``, except for the nodes in ``cut`` (cut off
    altogether) or in :attr:`held` (only their events held back, so a test sees what the
    reconciler does without them): their events are ``Unavailable`` (not stored)."""

    def __init__(self, events: EventSink, cut: set[str]) -> None:
        self._events = events
        self.cut = cut
        self.held: set[str] = set()

    async def publish(self, event: WorkloadEvent) -> None:
        if event.node in self.cut or event.node in self.held:
            raise Unavailable(f"node {event.node!r} is cut off: its event was not stored")
        await self._events.publish(event)
