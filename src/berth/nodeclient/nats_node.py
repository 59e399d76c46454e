"""Node agents on NATS: each agent's state in the nodes bucket, its subjects answered.

A :class:`NodeService` runs one :class:`~berth.node.agent.Agent` against the cluster:

* its state store is a publish-only :class:`~berth.store.nats.NatsStore` (an agent never
  reads other nodes, so it keeps no replica) on a bucket whose snapshot time-to-live is three
  of the agent's heartbeats (:func:`~berth.store.nats.bucket_ttl_s`);
* a :class:`~berth.nodeclient.nats_server.NodeServer` answers the node's subjects — started
  *before* the agent first advertises, so a scheduler that sees the node can reach it;
* with a routing registry, the node removes the routes of reservations it no longer holds
  on every heartbeat (a lease that expired, a workload that ended), and once as soon as its
  agent has started: a fresh agent holds nothing, so all of its routes go, while one that
  adopted its workloads from its journal holds their reservations again, so their routes
  stay (they were cleared blindly before the agent started, which lost them).

Stopping is the clean shutdown: stop answering, stop the agent (its workloads stop and its
key is deleted at once, so it leaves every replica without waiting for expiry).

Several services may share a process and a connection (``berth up`` puts several agents in
a process above a threshold; with authentication each needs its own connection, as its own
user).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from nats.aio.client import Client

from berth.nats.wire import PREFIX
from berth.node.agent import Agent
from berth.node.budget import LoadReadings
from berth.node.config import AgentConfig
from berth.nodeclient.nats_server import NodeServer
from berth.registry.port import RouteRegistry
from berth.store.nats import DEFAULT_BUCKET, NatsStore, bucket_ttl_s

__all__ = ["NodeService"]

log = logging.getLogger("berth.nodeclient.nats_node")


class NodeService:
    """One agent on NATS (see the module docstring).  ``async with NodeService(...)``."""

    def __init__(
        self,
        client: Client,
        config: AgentConfig,
        *,
        bucket: str = DEFAULT_BUCKET,
        prefix: str = PREFIX,
        routes: RouteRegistry | None = None,
        readings: LoadReadings | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.routes = routes
        self.store = NatsStore(
            client, bucket=bucket, ttl_s=bucket_ttl_s(config.agent.heartbeat_s), watch=False
        )
        # state_dir keeps what must survive a restart of the agent (its cordon)
        self.agent = Agent.from_config(config, self.store, readings=readings, state_dir=state_dir)
        self.server = NodeServer(client, self.agent, prefix=prefix)
        self._reconciler: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    @property
    def name(self) -> str:
        return self.agent.name

    async def start(self) -> NodeService:
        await self.store.start()
        await self.server.start()
        await self.agent.start()  # adopts what its journal says still runs
        if self.routes is not None:
            try:
                await self._prune_routes()
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
                await self._prune_routes()
            except Exception as error:  # the server may be briefly away; next beat retries
                log.info("node %s could not reconcile its routes: %s", self.name, error)

    async def _prune_routes(self) -> None:
        """Remove this node's routes whose reservation it does not hold."""
        assert self.routes is not None
        for revision, route in await self.routes.on_node(self.name):
            held = route.reservation_id is not None and (
                self.agent.budget.get(route.reservation_id) is not None
            )
            if not held:  # only that revision: a route stored since the read stays
                await self.routes.remove(route.workload, self.name, revision=revision)
