"""The registries in this process: the embedded API's drivers, and the tests'.

In-process drivers of the registry ports (:mod:`berth.registry.port`):
:class:`MemoryWorkloads` (with its :class:`MemoryClaims` and :class:`MemoryKeys`) and
:class:`MemoryImages` are the
rules of :mod:`berth.registry.documents` over :class:`MemoryDocuments`; :class:`MemoryRoutes`
keeps routes in a dictionary and delivers every change to its followers as it is made;
:class:`MemoryLease` is a holder and its deadline on an injected clock.
Every one of them passes :mod:`berth.testing.registry_contract`, as the NATS drivers do.

One event loop owns a registry: its atomic steps are atomic because nothing awaits inside
them (a claim's ``holds`` is awaited *between* steps, so a claim changed meanwhile is caught by
its revision, exactly as in a bucket).  Documents are copied in and out, so a caller that
changes a model it stored or read changes nothing stored.  Nothing survives the process:
the embedded cluster's API forgets its workloads when it stops, as its agents do.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from pydantic import BaseModel

from berth.defaults import FOLLOW_IDLE_HEARTBEAT_S, FOLLOW_SYNC_TIMEOUT_S
from berth.model import INTERVAL_RULE, Placement, Spec
from berth.registry.documents import (
    DocumentClaims,
    DocumentImages,
    DocumentKeys,
    DocumentWorkloads,
)
from berth.registry.port import (
    Claim,
    Image,
    KeyClaim,
    Route,
    RouteEvent,
    RouteListener,
    StoredWorkload,
)

__all__ = [
    "MemoryClaims",
    "MemoryDocuments",
    "MemoryImages",
    "MemoryKeys",
    "MemoryLease",
    "MemoryRouteWatch",
    "MemoryRoutes",
    "MemoryWorkloads",
]

log = logging.getLogger("berth.registry.memory")

Model = TypeVar("Model", bound=BaseModel)


class MemoryDocuments(Generic[Model]):
    """Documents by name in a dictionary, each with the revision of its last change (one
    counter for all of them, as a bucket's sequence)."""

    def __init__(self) -> None:
        self._documents: dict[str, tuple[Model, int]] = {}
        self._revision = 0

    def _store(self, name: str, document: Model) -> None:
        self._revision += 1
        self._documents[name] = (document.model_copy(deep=True), self._revision)

    async def put(self, name: str, document: Model) -> None:
        self._store(name, document)

    async def get(self, name: str) -> Model | None:
        found = self._documents.get(name)
        return None if found is None else found[0].model_copy(deep=True)

    async def entry(self, name: str) -> tuple[Model | None, int] | None:
        found = self._documents.get(name)
        return None if found is None else (found[0].model_copy(deep=True), found[1])

    async def create(self, name: str, document: Model) -> bool:
        if name in self._documents:
            return False
        self._store(name, document)
        return True

    async def replace(self, name: str, document: Model, revision: int) -> bool:
        found = self._documents.get(name)
        if found is None or found[1] != revision:
            return False
        self._store(name, document)
        return True

    async def delete_at(self, name: str, revision: int) -> bool:
        found = self._documents.get(name)
        if found is None or found[1] != revision:
            return False
        del self._documents[name]
        return True

    async def all(self) -> builtins.list[Model]:
        return [document.model_copy(deep=True) for document, _ in self._documents.values()]

    def stored(self) -> builtins.list[Model]:
        """Every document as stored — shared, not copied: a reader must not change them
        (each change here stores a new copy, so one read stays as it was)."""
        return [document for document, _ in self._documents.values()]


class MemoryClaims(DocumentClaims):
    """Identity claims in this process."""

    def __init__(self) -> None:
        super().__init__(MemoryDocuments[Claim]())


class MemoryKeys(DocumentKeys):
    """Idempotency keys in this process."""

    def __init__(self) -> None:
        super().__init__(MemoryDocuments[KeyClaim]())


class MemoryWorkloads(DocumentWorkloads):
    """The workload registry in this process, its claims and keys beside it."""

    def __init__(self) -> None:
        self._stored = MemoryDocuments[StoredWorkload]()
        super().__init__(self._stored, MemoryClaims(), MemoryKeys())

    def records(self) -> builtins.list[StoredWorkload]:
        """Every record, shared rather than copied: this registry is its own watched copy
        (a :class:`~berth.registry.port.RecordIndex`, always caught up)."""
        return self._stored.stored()


class MemoryImages(DocumentImages):
    """The image registry in this process."""

    def __init__(self) -> None:
        super().__init__(MemoryDocuments[Image]())


class MemoryRoutes:
    """The routing registry in this process; ``clock`` stamps ``placed_at``.

    A route's key is ``"<node> <workload>"`` (neither holds whitespace: both are berth
    names).  Followers are called as each change is made, so a watch has delivered a
    revision by the time :meth:`record` returns it; a purge is delivered as one delete per
    route (the port lets a follower miss it; this driver need not).
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._routes: dict[str, tuple[int, Route]] = {}
        self._revision = 0
        self._watches: list[MemoryRouteWatch] = []

    @staticmethod
    def key(workload: str, node: str) -> str:
        return f"{node} {workload}"

    def _deliver(self, event: RouteEvent) -> None:
        for watch in list(self._watches):
            watch.deliver(event)

    async def record(
        self,
        workload: str,
        placement: Placement,
        spec: Spec | None = None,
        *,
        function: tuple[str, str] | None = None,
    ) -> int:
        route = Route.placed(workload, placement, spec, self.clock(), function)
        self._revision += 1
        key = self.key(workload, route.node)
        self._routes[key] = (self._revision, route)
        self._deliver(RouteEvent("put", key, route, self._revision))
        return self._revision

    async def remove(self, workload: str, node: str, *, revision: int | None = None) -> None:
        key = self.key(workload, node)
        found = self._routes.get(key)
        if found is None or (revision is not None and found[0] != revision):
            return
        self._drop(key)

    def _drop(self, key: str) -> None:
        del self._routes[key]
        self._revision += 1
        self._deliver(RouteEvent("delete", key, None, self._revision))

    async def whereis(self, workload: str) -> Route | None:
        routes = [route for _, route in self._routes.values() if route.workload == workload]
        return max(routes, key=lambda route: route.placed_at) if routes else None

    async def list(self, node: str | None = None) -> builtins.list[Route]:
        routes = [route for _, route in self._routes.values() if node in (None, route.node)]
        return sorted(routes, key=lambda route: (route.workload, route.node))

    async def on_node(self, node: str) -> builtins.list[tuple[int, Route]]:
        return [
            (revision, route) for revision, route in self._routes.values() if route.node == node
        ]

    async def entries(self) -> builtins.list[tuple[int, Route]]:
        return sorted(self._routes.values(), key=lambda entry: entry[0])

    async def repair(self, route: Route) -> int | None:
        key = self.key(route.workload, route.node)
        if key in self._routes:
            return None
        self._revision += 1
        self._routes[key] = (self._revision, route)
        self._deliver(RouteEvent("put", key, route, self._revision))
        return self._revision

    async def clear_node(self, node: str) -> int:
        keys = [key for key, (_, route) in self._routes.items() if route.node == node]
        for key in keys:
            self._drop(key)
        return len(keys)

    async def purge_node(self, node: str) -> int:
        return await self.clear_node(node)

    async def follow(
        self,
        listener: RouteListener,
        *,
        idle_heartbeat_s: float = FOLLOW_IDLE_HEARTBEAT_S,
        sync_timeout_s: float = FOLLOW_SYNC_TIMEOUT_S,
    ) -> MemoryRouteWatch:
        """Deliver every route stored now, then every change; the timings are a network
        driver's and mean nothing here."""
        watch = MemoryRouteWatch(self, listener)
        for key, (revision, route) in sorted(self._routes.items(), key=lambda item: item[1][0]):
            watch.deliver(RouteEvent("put", key, route, revision))
        self._watches.append(watch)
        return watch


class MemoryRouteWatch:
    """A running :meth:`MemoryRoutes.follow`."""

    rejected = 0
    """Nothing stored here is malformed: routes are kept as values."""

    def __init__(self, routes: MemoryRoutes, listener: RouteListener) -> None:
        self.routes = routes
        self.listener = listener
        self.seen = 0
        """The highest revision delivered so far."""
        self._delivered = asyncio.Event()

    def deliver(self, event: RouteEvent) -> None:
        try:
            self.listener(event)
        except Exception:
            log.exception("a route listener failed on %s of %s", event.kind, event.key)
        self.seen = max(self.seen, event.revision)
        self._delivered.set()

    async def reached(self, revision: int, timeout_s: float) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.seen < revision:
            self._delivered.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._delivered.wait(), remaining)
        return True

    async def stop(self) -> None:
        with contextlib.suppress(ValueError):
            self.routes._watches.remove(self)


class MemoryLease:
    """:class:`~berth.registry.port.LeaderLease` in this process: the holder and its deadline,
    judged by ``clock`` (a :class:`~berth.testing.clock.FakeClock` in tests).  Shared by the
    contenders of one process (the embedded API's reconcilers, tests)."""

    def __init__(self, ttl_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = INTERVAL_RULE(ttl_s, "ttl_s")
        self.clock = clock
        self._holder: str | None = None
        self._until = 0.0

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    @property
    def holder(self) -> str | None:
        """Who holds it now (``None``: nobody, or an expired holder)."""
        return self._holder if self.clock() < self._until else None

    async def hold(self, holder: str) -> bool:
        now = self.clock()
        if self._holder != holder and now < self._until:
            return False
        self._holder, self._until = holder, now + self._ttl_s
        return True

    async def release(self, holder: str) -> None:
        if self._holder == holder:
            self._holder, self._until = None, 0.0
