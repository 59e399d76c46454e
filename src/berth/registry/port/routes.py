"""The routing registry port: which node holds each placed workload.

:class:`RouteRegistry` — which node holds each placed workload (:class:`Route`), written by
the scheduler that confirmed it, removed when the workload ends, purged for a node that
leaves; followed by every scheduler (:meth:`RouteRegistry.follow`) to count the replicas the
others placed.  It is an index, not the truth: the node's reservation is.

Its drivers: :class:`~berth.registry.memory.MemoryRoutes`,
:class:`~berth.registry.nats_routes.NatsRoutes`.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from berth.defaults import FOLLOW_IDLE_HEARTBEAT_S, FOLLOW_SYNC_TIMEOUT_S
from berth.model import Placement, Spec

__all__ = ["Route", "RouteEvent", "RouteListener", "RouteRegistry", "RouteWatch"]


@dataclass(frozen=True)
class Route:
    """Where a workload runs: the node, the reservation it holds there, its spec, and the
    function it is a replica of (``namespace``, ``name``; ``None`` in a route written before
    routes carried it)."""

    workload: str
    node: str
    reservation_id: str | None = None
    spec: Spec | None = None
    placed_at: float = 0.0
    namespace: str | None = None
    name: str | None = None

    @property
    def function(self) -> tuple[str, str] | None:
        """``(namespace, name)``, or ``None`` when the route does not say."""
        if self.namespace is None or self.name is None:
            return None
        return (self.namespace, self.name)

    @classmethod
    def placed(
        cls,
        workload: str,
        placement: Placement,
        spec: Spec | None,
        placed_at: float,
        function: tuple[str, str] | None,
    ) -> Route:
        """The route :meth:`RouteRegistry.record` stores for its arguments, placed at
        ``placed_at``."""
        namespace, name = (None, None) if function is None else function
        return cls(
            workload,
            placement.worker_node,
            placement.reservation_id,
            spec,
            placed_at,
            namespace,
            name,
        )


@dataclass(frozen=True)
class RouteEvent:
    """A change :meth:`RouteRegistry.follow` saw: a route stored under ``key`` (``put``), or
    the key deleted (``delete``; ``route`` is ``None`` — a delete carries no value).  ``key``
    is the driver's name for one workload on one node (a delete names only it);
    ``revision`` is the registry's sequence number of the change (0 when unknown)."""

    kind: Literal["put", "delete"]
    key: str
    route: Route | None = None
    revision: int = 0


RouteListener = Callable[[RouteEvent], None]


class RouteWatch(Protocol):
    """A running :meth:`RouteRegistry.follow`, delivering in the registry's order: once it has
    delivered revision ``r`` every change stored before ``r`` has reached its listener too."""

    @property
    def rejected(self) -> int:
        """Stored values skipped as not being routes (0 for a driver that stores typed ones)."""
        ...

    async def reached(self, revision: int, timeout_s: float) -> bool:
        """Wait until the watch has delivered ``revision``; False if ``timeout_s`` passed."""
        ...

    async def stop(self) -> None: ...


class RouteRegistry(Protocol):
    """The routing registry (see the module docstring): one route per workload and node."""

    async def record(
        self,
        workload: str,
        placement: Placement,
        spec: Spec | None = None,
        *,
        function: tuple[str, str] | None = None,
    ) -> int:
        """``workload`` now runs on ``placement.worker_node`` under its reservation, a replica
        of ``function`` (``(namespace, name)``) when given; the route's revision (a later
        record has a higher one)."""
        ...

    async def remove(self, workload: str, node: str, *, revision: int | None = None) -> None:
        """The workload ended (idempotent).  With ``revision`` (from :meth:`on_node`), only
        while the route is still that revision: one stored again since stays."""
        ...

    async def whereis(self, workload: str) -> Route | None:
        """The route of ``workload`` (the latest placed, if on several nodes), or ``None``."""
        ...

    async def list(self, node: str | None = None) -> builtins.list[Route]:
        """Every route (of ``node`` when given), by workload then node."""
        ...

    async def on_node(self, node: str) -> builtins.list[tuple[int, Route]]:
        """Every route of ``node`` with its revision; a route stored before this call began
        is in it."""
        ...

    async def entries(self) -> builtins.list[tuple[int, Route]]:
        """Every route with its revision (what a reconciler's pass compares with the
        records); a route stored before this call began is in it."""
        ...

    async def repair(self, route: Route) -> int | None:
        """Store ``route`` exactly as it is (reservation, spec, function, ``placed_at``) unless
        its key holds a route now — never written, purged, or deleted: what the reconciler
        writes for a workload its record and its node both say runs; its revision, or
        ``None`` when a route is stored (which is never overwritten)."""
        ...

    async def clear_node(self, node: str) -> int:
        """Remove every route of ``node`` one by one (what a node may do of its own); how
        many there were."""
        ...

    async def purge_node(self, node: str) -> int:
        """Remove every route of ``node`` (it left the cluster) at once; how many there were.
        A follower need not see a purge: it learns that the node left from the state store."""
        ...

    async def follow(
        self,
        listener: RouteListener,
        *,
        idle_heartbeat_s: float = FOLLOW_IDLE_HEARTBEAT_S,
        sync_timeout_s: float = FOLLOW_SYNC_TIMEOUT_S,
    ) -> RouteWatch:
        """Call ``listener`` with every route stored now, then with every change as it lands;
        returns once the routes stored now were delivered (or ``sync_timeout_s`` passed).
        ``idle_heartbeat_s`` is how soon a network driver notices a lost feed."""
        ...
