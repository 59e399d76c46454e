"""The placement port as the API uses it: place a request, give a placement back.

The API places through :class:`Placements` — the placement port
(:class:`~berth.scheduler.port.Scheduler`) plus ``release``, which a create that ends
without a workload needs — and has two drivers for it:

* :class:`~berth.scheduler.nats.NatsScheduler`, the schedulers' queue group (any scheduler
  of the group places; a release there also removes the workload's route) — what
  ``berth scheduler --http`` serves;
* :class:`LocalPlacements`, a :class:`~berth.scheduler.multinode.ClusterScheduler` in this
  process (the embedded cluster's): nothing records a route in process, so a release is the
  scheduler's own.

What it is not: a scheduler.  Which node is chosen, and how, is the scheduler's.
"""

from __future__ import annotations

from typing import Protocol

from berth.model import Placement, Request
from berth.scheduler.multinode import ClusterScheduler

__all__ = ["LocalPlacements", "Placements"]


class Placements(Protocol):
    """Place a request under a lease; release a placement no workload will bind."""

    async def schedule(self, request: Request) -> Placement:
        """Place ``request``: ``Invalid``, ``NoMatchingPlatform``, ``NoCapacity`` or
        ``Unavailable`` when it cannot be."""
        ...

    async def release(self, placement: Placement, *, workload: str | None = None) -> bool:
        """Release ``placement``'s reservation (and the route of ``workload``, where routes
        are kept); whether there was one to release."""
        ...


class LocalPlacements:
    """:class:`Placements` over a scheduler in this process."""

    def __init__(self, scheduler: ClusterScheduler) -> None:
        self.scheduler = scheduler

    async def schedule(self, request: Request) -> Placement:
        return await self.scheduler.schedule(request)

    async def release(self, placement: Placement, *, workload: str | None = None) -> bool:
        return await self.scheduler.release(placement)
