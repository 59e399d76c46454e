"""A node-client driver that wraps another and notes every refusal it passes on.

The simulator confirms through one of these per scheduler: admission is still the wrapped
driver's (a node's own budget); this only records which node refused and why, for placed
requests and for those that end in ``NoCapacity`` alike (``Placement.refusals`` covers only
the former).  Read :attr:`RecordingNodes.refusals` and :meth:`RecordingNodes.clear` it
between decisions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from berth.nodeclient.forwarding import ForwardingNodes
from berth.nodeclient.port import NodeClient
from berth.ownership import Refused

__all__ = ["RecordingNodes"]

T = TypeVar("T")


class RecordingNodes(ForwardingNodes):
    """``NodeClient`` that forwards to ``nodes`` and appends ``(node, reason)`` per refusal."""

    def __init__(self, nodes: NodeClient) -> None:
        super().__init__(nodes)
        self.refusals: list[tuple[str, str]] = []

    def clear(self) -> None:
        """Forget the refusals noted so far."""
        self.refusals = []

    async def forward(self, node: str, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except Refused as refused:
            self.refusals.append((node, refused.reason))
            raise
