"""Node agents on NATS: each agent's state in the nodes bucket, its subjects answered.

A :class:`NodeService` runs one :class:`~berth.node.agent.Agent` against the cluster (the
agent and its store are built from its configuration by :func:`berth.processes.agent.node_service`):

* its state store is a publish-only :class:`~berth.store.nats.NatsStore` (an agent never
  reads other nodes, so it keeps no replica) on a bucket whose snapshot time-to-live is three
  of the agent's heartbeats (:func:`~berth.store.nats.bucket_ttl_s`);
* a :class:`~berth.nodeclient.nats_server.NodeServer` answers the node's subjects — started
  *before* the agent first advertises, so a scheduler that sees the node can reach it;
* with a routing registry, the node keeps its own routes true to its reservations, on every
  heartbeat and once as soon as its agent has started (:meth:`NodeService.reconcile_routes`):

  - it **removes** the routes of reservations it no longer holds (a lease that expired, a
    workload that ended) — a fresh agent holds nothing, so all of its routes go, while one
    that adopted its workloads from its journal holds their reservations again, so their
    routes stay;
  - it **rewrites** the routes of reservations it still holds that are missing (issue 20):
    a node silent for longer than its snapshot lives (SIGSTOP, a partition) leaves every
    scheduler's view, and the schedulers purge its routes; when it comes back they are
    written again from what the node last read of them, exactly as they were (workload,
    reservation, spec, function, ``placed_at``), so ``berth routes`` finds its workloads and
    every scheduler counts its replicas for spreading again.

  What a rewrite writes is the node's copy of its routes as its last pass read them, for
  the reservations it held (a node cannot rebuild a route from its budget: a reservation
  does not know the workload or function it was placed for).  With a ``state_dir`` the copy
  is kept in ``<state_dir>/routes.json`` (written whenever it changes, replaced atomically),
  so an agent restarted on its journal rewrites the routes of the workloads it adopted too.
  A rewrite is a compare-and-set that writes only where the registry holds nothing for the
  key (:meth:`~berth.registry.nats_routes.NatsRoutes.restore`): a route stored since the
  read is never overwritten, and a route removed on purpose (a tombstone) never revived;
  the reservation is checked again after the write, so a workload that ended meanwhile
  loses its rewritten route at once.  A purge that lands after the rewrite (a scheduler
  whose view lagged) is repaired on the next beat — the node rewrites on every beat while a
  route is missing — so the node, which is back, has the last word.  A route the node
  never read (placed less than a heartbeat before the node fell silent) cannot be
  rewritten.

With an event stream (``events``, :class:`~berth.events.nats.NatsEvents`) the agent pushes
each workload's end and restart to it (:mod:`berth.events`): the API learns of them without
asking, and the journal entry of an ended workload goes only once the stream stored its end.

Stopping is the clean shutdown: stop answering, stop the agent (its workloads stop and its
key is deleted at once, so it leaves every replica without waiting for expiry), remove its
routes and its copy of them.

Several services may share a process and a connection (``berth up`` puts several agents in
a process above a threshold; with authentication each needs its own connection, as its own
user).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path

from nats.aio.client import Client

from berth.events.nats import NatsEvents
from berth.nats.wire import PREFIX, MalformedMessage
from berth.node.agent import Agent
from berth.nodeclient.nats_server import NodeServer
from berth.registry.nats_routes import NatsRoutes, route_document, route_of
from berth.registry.port import Route
from berth.store.nats import NatsStore

__all__ = ["ROUTES_FILE", "NodeService"]

log = logging.getLogger("berth.nodeclient.nats_node")

ROUTES_FILE = "routes.json"
"""The node's copy of its own routes in its state directory (``{"v": 1, "routes": [...]}``,
each route as the registry stores it)."""


class NodeService:
    """One agent on NATS (see the module docstring).  ``async with NodeService(...)``."""

    def __init__(
        self,
        client: Client,
        agent: Agent,
        store: NatsStore,
        *,
        prefix: str = PREFIX,
        routes: NatsRoutes | None = None,
        state_dir: Path | None = None,
        events: NatsEvents | None = None,
    ) -> None:
        self.client = client
        self.events = events
        self.routes = routes
        self.store = store
        """The agent's publish-only store (the service starts and closes it)."""
        self.agent = agent
        """The agent, built over :attr:`store` (and ``events``, ``state_dir``)."""
        self.server = NodeServer(client, self.agent, prefix=prefix)
        self._reconciler: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._routes_file = None if state_dir is None else state_dir / ROUTES_FILE
        self._own_routes: dict[str, Route] = {}
        """This node's routes as its last pass read them (workload → route), for the
        reservations it held: what a rewrite writes."""
        self._routes_kept = True  # the file says what _own_routes says (or there is none)
        self._routes_pass = asyncio.Lock()

    @property
    def name(self) -> str:
        return self.agent.name

    async def start(self) -> NodeService:
        await self.store.start()
        if self.events is not None:
            await self.events.start()
        await self.server.start()
        await self.agent.start()  # adopts what its journal says still runs
        if self.routes is not None:
            self._own_routes = self._load_routes()  # the agent has taken the state directory
            try:
                await self.reconcile_routes()
            except Exception as error:  # the heartbeat's passes retry
                log.info("node %s could not reconcile its routes: %s", self.name, error)
            self._reconciler = asyncio.create_task(self._reconcile_routes())
        return self

    async def stop(self) -> None:
        if self._reconciler is not None:
            # A flag and a wake-up, not cancel(): on Python 3.11 a cancellation landing in one
            # of nats-py's wait_for calls can be swallowed, and the loop would go on for ever.
            self._stopping.set()
            _, late = await asyncio.wait({self._reconciler}, timeout=10.0)
            for task in late:
                task.cancel()
            self._reconciler = None
        await self.server.stop()
        try:
            await self.agent.stop()
        finally:
            await self.store.close()
        if self.routes is not None:
            with contextlib.suppress(Exception):
                await self.routes.clear_node(self.name)
            self._remember({})  # its workloads stopped: nothing left to rewrite

    async def __aenter__(self) -> NodeService:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _reconcile_routes(self) -> None:
        assert self.routes is not None
        self._stopping.clear()
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.agent.heartbeat_s)
            if self._stopping.is_set():
                return
            try:
                await self.reconcile_routes()
            except Exception as error:  # the server may be briefly away; next beat retries
                log.info("node %s could not reconcile its routes: %s", self.name, error)

    # -- the node's own routes ---------------------------------------------------------------
    async def reconcile_routes(self) -> tuple[int, int]:
        """One pass over this node's routes (see the module docstring): remove those whose
        reservation it does not hold, rewrite the missing ones of reservations it holds;
        ``(removed, rewritten)``.  The heartbeat runs it; passes never overlap."""
        if self.routes is None:
            return (0, 0)
        async with self._routes_pass:
            return await self._reconcile_routes_once(self.routes)

    async def _reconcile_routes_once(self, routes: NatsRoutes) -> tuple[int, int]:
        seen: dict[str, Route] = {}
        removed = rewritten = 0
        for revision, route in await routes.on_node(self.name):
            if self._holds(route):
                seen[route.workload] = route
            else:  # only that revision: a route stored since the read stays
                await routes.remove(route.workload, self.name, revision=revision)
                removed += 1
        for workload, route in self._own_routes.items():
            if workload in seen or not self._holds(route):
                continue  # stored, or its workload ended: nothing to rewrite
            seen[workload] = route  # kept while held, whether written now or on a later beat
            restored = await routes.restore(route)
            if restored is None:
                continue  # the key holds another route or a delete: the registry's word
            if not self._holds(route):  # it ended while being written
                await routes.remove(workload, self.name, revision=restored)
                del seen[workload]
                continue
            rewritten += 1
        if rewritten:
            log.info("node %s rewrote %d missing route(s)", self.name, rewritten)
        self._remember(seen)
        return removed, rewritten

    def _holds(self, route: Route) -> bool:
        return route.reservation_id is not None and self.agent.budget.holds(route.reservation_id)

    def _remember(self, routes: dict[str, Route]) -> None:
        """Keep ``routes`` as the node's copy, and in its state directory when it changed."""
        changed = routes != self._own_routes or not self._routes_kept
        self._own_routes = routes
        if not changed or self._routes_file is None:
            return
        document = {"v": 1, "routes": [route_document(route) for route in routes.values()]}
        temporary = self._routes_file.with_name(f".{ROUTES_FILE}.tmp")
        try:
            temporary.write_text(json.dumps(document, separators=(",", ":")))
            os.replace(temporary, self._routes_file)
            self._routes_kept = True
        except OSError as error:  # the copy in memory serves this process; the next pass retries
            self._routes_kept = False
            log.warning("node %s could not keep its routes in %s: %s", self.name, temporary, error)

    def _load_routes(self) -> dict[str, Route]:
        """The node's routes as its state directory kept them; a file that cannot be read or
        an entry that is not one of this node's routes is logged and left out."""
        path = self._routes_file
        if path is None or not path.exists():
            return {}
        try:
            document = json.loads(path.read_bytes())
            entries = document["routes"] if document.get("v") == 1 else None
            if not isinstance(entries, list):
                raise ValueError("not a routes file of version 1")
        except (OSError, ValueError, AttributeError, KeyError, TypeError) as error:
            log.warning("node %s ignores its routes file %s: %s", self.name, path, error)
            return {}
        routes: dict[str, Route] = {}
        for entry in entries:
            try:
                route = route_of(entry, source=str(path))
            except MalformedMessage as error:
                log.warning("ignored: %s", error)
                continue
            if route.node == self.name:  # never another node's
                routes[route.workload] = route
        return routes
