"""A node-client driver that wraps another and notes every refusal it passes on.

The simulator confirms through one of these per scheduler: admission is still the wrapped
driver's (a node's own budget); this only records which node refused and why, for placed
requests and for those that end in ``NoCapacity`` alike (``Placement.refusals`` covers only
the former).  Read :attr:`RecordingNodes.refusals` and :meth:`RecordingNodes.clear` it
between decisions.
"""

from __future__ import annotations

from collections.abc import Sequence

from berth.model import Spec
from berth.nodeclient.port import NodeClient
from berth.ownership import Admission, Owner, Refused
from berth.platform import Platform

__all__ = ["RecordingNodes"]


class RecordingNodes:
    """``NodeClient`` that forwards to ``nodes`` and appends ``(node, reason)`` per refusal."""

    def __init__(self, nodes: NodeClient) -> None:
        self._nodes = nodes
        self.refusals: list[tuple[str, str]] = []

    def clear(self) -> None:
        """Forget the refusals noted so far."""
        self.refusals = []

    async def admit(
        self,
        node: str,
        spec: Spec,
        *,
        lease_ttl_s: float,
        platforms: Sequence[Platform] = (),
    ) -> Admission:
        try:
            return await self._nodes.admit(node, spec, lease_ttl_s=lease_ttl_s, platforms=platforms)
        except Refused as refused:
            self.refusals.append((node, refused.reason))
            raise

    async def bind(self, node: str, reservation_id: str, owner: Owner | str) -> None:
        try:
            await self._nodes.bind(node, reservation_id, owner)
        except Refused as refused:
            self.refusals.append((node, refused.reason))
            raise

    async def release(self, node: str, reservation_id: str) -> bool:
        return await self._nodes.release(node, reservation_id)
