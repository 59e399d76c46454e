"""A NATS-backed cluster in one process: agents and schedulers talking only through NATS.

:func:`nats_cluster` starts, on a running ``nats-server``, N node services (each an agent
answering its own subjects and publishing to the nodes bucket) and K scheduler services
(each with its own replica, node client and assume cache, in one queue group), each on its
own connection, and yields the :class:`NatsServices` it started, whose ``scheduler`` is the caller's
placement port (:class:`~berth.scheduler.nats.NatsScheduler`).  Nothing passes between
them but NATS messages, exactly as between machines; only the process is shared.

Bucket names and subject prefixes can be made unique (``namespace``) so that several
clusters share one server — the tests and the benchmark do.  ``berth up`` runs the same
services in separate processes instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from nats.aio.client import Client

from berth.defaults import HEARTBEAT_S, LEASE_TTL_S
from berth.events.nats import NatsEvents
from berth.nats.auth import ClusterAuth
from berth.nats.connection import Credentials, connect
from berth.nats.names import Names
from berth.node.budget import IDLE
from berth.node.config import AgentConfig
from berth.nodeclient.nats import NatsNodes
from berth.nodeclient.nats_node import NodeService
from berth.processes.agent import node_service
from berth.processes.scheduler import scheduler_service as open_scheduler_service
from berth.registry.nats_routes import NatsRoutes
from berth.scheduler.nats import NatsScheduler
from berth.scheduler.nats_server import SchedulerService

__all__ = ["Names", "NatsServices", "nats_cluster"]


@dataclass
class NatsServices:
    """The services :func:`nats_cluster` started on one server (not to be confused with
    :class:`berth.nats.cluster.NatsCluster`, a cluster of nats-servers); ``scheduler`` is the
    placement port over NATS."""

    url: str
    names: Names
    client: Client
    scheduler: NatsScheduler
    nodes: NatsNodes
    routes: NatsRoutes
    node_services: dict[str, NodeService] = field(default_factory=dict)
    scheduler_services: list[SchedulerService] = field(default_factory=list)


@contextlib.asynccontextmanager
async def nats_cluster(
    url: str,
    configs: Sequence[AgentConfig],
    *,
    schedulers: int = 1,
    names: Names | None = None,
    lease_ttl_s: float = LEASE_TTL_S,
    auth: ClusterAuth | None = None,
    live_monitors: bool = False,
    share_replicas: bool = True,
    settle_races: bool = True,
) -> AsyncIterator[NatsServices]:
    """Agents for ``configs`` and ``schedulers`` schedulers on the server at ``url``.

    Agents in one process share one machine: unless ``live_monitors``, they read idle load
    (as the embedded cluster's do), so soft checks pass and hard budgets decide.  With
    ``auth`` (a server configured by :meth:`ClusterAuth.server_config`) every party connects
    as its own user — then each node has its own connection, as it would on its own machine.
    ``share_replicas``/``settle_races`` go to every scheduler service (replica spreading's
    route feed and hard-spread re-check; off only to measure what they do).
    """
    names = names or Names()
    heartbeat_s = max((config.agent.heartbeat_s for config in configs), default=HEARTBEAT_S)
    async with contextlib.AsyncExitStack() as stack:

        async def connection(name: str, credentials: Credentials | None = None) -> Client:
            client = await connect(url, name=name, credentials=credentials)
            stack.push_async_callback(client.close)
            return client

        caller = await connection("berth-caller", None if auth is None else auth.client)
        routes = await NatsRoutes(caller, bucket=names.routes_bucket).start()
        cluster = NatsServices(
            url=url,
            names=names,
            client=caller,
            scheduler=NatsScheduler(caller, prefix=names.scheduler_prefix),
            nodes=NatsNodes(caller, prefix=names.node_prefix),
            routes=routes,
        )
        shared: tuple[Client, NatsRoutes] | None = None
        for config in configs:
            if auth is not None:
                node_side = await connection(config.node.name, auth.nodes[config.node.name])
                node_routes = await NatsRoutes(node_side, bucket=names.routes_bucket).start()
            else:
                if shared is None:
                    client = await connection("berth-nodes")
                    shared = (
                        client,
                        await NatsRoutes(client, bucket=names.routes_bucket).start(),
                    )
                node_side, node_routes = shared
            node = node_service(
                node_side,
                config,
                bucket=names.nodes_bucket,
                prefix=names.node_prefix,
                routes=node_routes,
                readings=None if live_monitors else IDLE,
                events=NatsEvents(node_side, names=names),
            )
            await stack.enter_async_context(node)
            cluster.node_services[node.name] = node
        for index in range(schedulers):
            client = await connection(
                f"berth-scheduler-{index}", None if auth is None else auth.scheduler
            )
            scheduler_routes = await NatsRoutes(client, bucket=names.routes_bucket).start()
            service = await stack.enter_async_context(
                open_scheduler_service(
                    client,
                    bucket=names.nodes_bucket,
                    node_prefix=names.node_prefix,
                    prefix=names.scheduler_prefix,
                    heartbeat_s=heartbeat_s,
                    lease_ttl_s=lease_ttl_s,
                    routes=scheduler_routes,
                    share_replicas=share_replicas,
                    settle_races=settle_races,
                )
            )
            cluster.scheduler_services.append(service)
        await _until_every_scheduler_sees(cluster, set(cluster.node_services))
        yield cluster


async def _until_every_scheduler_sees(cluster: NatsServices, nodes: set[str]) -> None:
    for _ in range(500):
        if all(set(s.scheduler.states()) >= nodes for s in cluster.scheduler_services):
            return
        await asyncio.sleep(0.01)
