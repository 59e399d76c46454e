"""The single-node driver: every replica runs on the one local worker.

For a deployment with one worker (a laptop, an edge box, the embedded default).  It is
deterministic and total — the same worker for every request — with one exception taken from
the placement seed: when the request lists artifact platforms and the node's platform is not
among them, it raises ``NoMatchingPlatform`` naming the artifact's platforms, the node and the
node's platform.  It accounts no resources: ``spec`` and ``layers`` are accepted and ignored,
because on one node there is nothing to choose between.  So is ``spread``: with one node
there is nowhere else to put a replica, and a driver that reserves nothing cannot know which
replicas still run — a hard spread is kept only by drivers that hold reservations (the
placement contract checks it for those).
"""

from __future__ import annotations

from berth.errors import Invalid, NoMatchingPlatform
from berth.model import Placement, Request
from berth.platform import Platform, matches_any

__all__ = ["SingleNode"]


class SingleNode:
    """Places every request on ``local``, whose platform is ``platform`` (``os/arch``)."""

    def __init__(self, local: str, platform: str | Platform) -> None:
        if not isinstance(local, str) or not local.strip():
            raise Invalid("the local worker's name must not be empty", field="local")
        self.local = local
        self.platform = Platform.parse(platform, field="platform")
        self._placement = Placement(worker_node=local)

    async def schedule(self, request: Request) -> Placement:
        """The local worker, or ``NoMatchingPlatform`` when the artifact cannot run here."""
        if not matches_any(self.platform, request.platforms):
            raise NoMatchingPlatform(
                tuple(str(platform) for platform in request.platforms),
                f"{self.local} ({self.platform})",
            )
        return self._placement

    def __repr__(self) -> str:
        return f"SingleNode(local={self.local!r}, platform='{self.platform}')"
