"""The placement port: ``schedule(request) -> Placement``, and its release.

The caller (a controller that later provisions the workload) depends on this protocol only;
drivers — :class:`~berth.scheduler.singlenode.SingleNode` and
:class:`~berth.scheduler.multinode.ClusterScheduler` — are swapped behind it.  The port's
guarantee, which :mod:`berth.testing.placement_contract` checks for any driver: a valid
request yields a ``Placement`` with a non-empty ``worker_node`` and no error, unless it lists
platforms none of which the driver's nodes run (``NoMatchingPlatform``, an ``Invalid``) or —
for drivers that account resources — no node can hold it (``NoCapacity``).

``schedule`` is a coroutine because real drivers confirm over the network.

A driver that places under a lease (:class:`~berth.scheduler.multinode.ClusterScheduler`,
:class:`~berth.scheduler.nats.NatsScheduler` — the schedulers' queue group) also *releases*:
:class:`ReleasingScheduler` is the port as the API uses it, since a create that ends without
a workload gives its placement back (and, where routes are kept, the workload's route).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from berth.model import Placement, Request

__all__ = ["ReleasingScheduler", "Scheduler"]


@runtime_checkable
class Scheduler(Protocol):
    """Decides which worker node runs a replica."""

    async def schedule(self, request: Request) -> Placement:
        """Place ``request``; raise ``Invalid``, ``NoMatchingPlatform`` or ``NoCapacity``."""
        ...


class ReleasingScheduler(Scheduler, Protocol):
    """Places under a lease; releases a placement no workload will bind."""

    async def release(self, placement: Placement, *, workload: str | None = None) -> bool:
        """Release ``placement``'s reservation (and the route of ``workload``, where routes
        are kept); whether there was one to release."""
        ...
