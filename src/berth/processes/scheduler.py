"""The scheduler process (``berth scheduler``): a scheduler on NATS, the HTTP API beside it.

:func:`scheduler_service` composes one whole scheduler on a connection: its replica of the
node states (a :class:`~berth.store.nats.NatsStore` watch, a snapshot living three node
heartbeats), its node client (:class:`~berth.nodeclient.nats.NatsNodes`), its
:class:`~berth.scheduler.multinode.ClusterScheduler` with its metrics, and the
:class:`~berth.scheduler.nats_server.SchedulerService` that answers the queue group.
:func:`scheduler_api` composes the HTTP API beside a running scheduler: the
:class:`~berth.api.backend.ClusterBackend` over that scheduler's view and node client, the
queue group for placements, the API's registries in their buckets, the reconciler under its
lease, the nodes' event feed, and the uvicorn server.  :func:`serve_scheduler` is the whole
process: it connects, runs both until a signal or its duration, and stops them gracefully
(the API first, then the scheduler, which leaves the queue group and finishes what it
started).  The test clusters (:mod:`berth.testing.cluster`) call the first two.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from nats.aio.client import Client

from berth.api.app import create_app
from berth.api.backend import ClusterBackend
from berth.api.reconciler import Reconciler
from berth.api.server import ApiServer, HttpsFiles, remove_api_file, write_api_file
from berth.defaults import (
    HEARTBEAT_S,
    LEASE_TTL_S,
    NODE_GONE_AFTER_S,
    RECONCILE_EVERY_S,
    RECONCILE_LEASE_TTL_S,
    SHUTDOWN_GRACE_S,
)
from berth.errors import Invalid
from berth.events.nats import NatsEvents
from berth.nats.connection import Credentials, connect, until_stopped
from berth.nats.names import SCHEDULER_PREFIX
from berth.nats.wire import PREFIX
from berth.nodeclient.nats import NatsNodes
from berth.observability.metrics import Metrics
from berth.processes.lifetime import stop_event
from berth.registry.nats import NatsImages, NatsWorkloads
from berth.registry.nats_lease import NatsLease
from berth.registry.nats_routes import NatsRoutes
from berth.registry.port import RouteRegistry
from berth.scheduler.multinode import ClusterScheduler
from berth.scheduler.nats import NatsScheduler
from berth.scheduler.nats_server import SchedulerService
from berth.scheduler.policy import Policy
from berth.store.nats import DEFAULT_BUCKET, NatsStore, bucket_ttl_s

__all__ = ["ApiSettings", "scheduler_api", "scheduler_service", "serve_scheduler"]


@contextlib.asynccontextmanager
async def scheduler_service(
    client: Client,
    *,
    bucket: str = DEFAULT_BUCKET,
    node_prefix: str = PREFIX,
    prefix: str = SCHEDULER_PREFIX,
    heartbeat_s: float = HEARTBEAT_S,
    lease_ttl_s: float = LEASE_TTL_S,
    routes: RouteRegistry | None = None,
    policy: Policy | None = None,
    node_timeout_s: float = 2.0,
    grace_s: float = SHUTDOWN_GRACE_S,
    metrics: Metrics | None = None,
    share_replicas: bool = True,
    settle_races: bool = True,
) -> AsyncIterator[SchedulerService]:
    """A whole scheduler on ``client``: its replica, its node client, its service; stopped
    gracefully on exit.  ``heartbeat_s`` is the nodes' (the bucket keeps 3 of them).
    ``metrics`` (a new :class:`~berth.observability.metrics.Metrics` when not given; one per
    scheduler) counts its decisions and reports its view, a node stale after two heartbeats
    without a snapshot: ``service.scheduler.metrics``.  With ``routes``, the replicas every
    scheduler placed count for spreading unless ``share_replicas`` is false (then only its
    own do — how schedulers worked before); ``settle_races=False`` leaves out the re-check of
    a hard per-node spread (the benchmark compares the three)."""
    # the watch's idle heartbeat: half a node heartbeat (at most 1 s), so after a server
    # restart the replica resumes within about one node heartbeat (two missed idle beats)
    idle_s = min(1.0, heartbeat_s / 2)
    ttl_s = bucket_ttl_s(heartbeat_s)
    async with NatsStore(client, bucket=bucket, ttl_s=ttl_s, idle_heartbeat_s=idle_s) as store:
        nodes = NatsNodes(client, prefix=node_prefix, timeout_s=node_timeout_s)
        metrics = metrics if metrics is not None else Metrics()
        scheduler = ClusterScheduler(
            store, nodes, lease_ttl_s=lease_ttl_s, policy=policy, metrics=metrics
        )
        metrics.watch(scheduler, stale_after_s=2 * heartbeat_s)
        service = SchedulerService(
            client,
            scheduler,
            store=store,
            routes=routes,
            prefix=prefix,
            share_replicas=share_replicas,
            settle_races=settle_races,
        )
        await service.start()
        try:
            yield service
        finally:
            await service.stop(grace_s=grace_s)
            scheduler.close()


@contextlib.asynccontextmanager
async def scheduler_api(
    client: Client,
    service: SchedulerService,
    *,
    host: str,
    port: int,
    token: str,
    node_gone_after_s: float = NODE_GONE_AFTER_S,
    reconcile_every_s: float = RECONCILE_EVERY_S,
    lease_ttl_s: float = RECONCILE_LEASE_TTL_S,
    https: HttpsFiles | None = None,
) -> AsyncIterator[ApiServer]:
    """The API served beside ``service`` (a running scheduler), on its connection: its
    replica and node client, the queue group for placements, the API's registries; and the
    reconciler (:mod:`berth.api.reconciler`) every ``reconcile_every_s``, while this process
    holds its lease (``berth_leases``, ``lease_ttl_s``): one scheduler service of the cluster
    reconciles at a time — kept stops delivered, gone nodes noticed, ghosts stopped, with
    nobody reading — and takes the nodes' workload events (:mod:`berth.events`) from the
    durable consumer every API process shares.  ``node_gone_after_s``: how long a workload's
    node stays unreachable before its workloads are ``lost``.  Each interval ``Invalid``
    naming it unless positive."""
    nodes = service.scheduler.nodes
    if not isinstance(nodes, NatsNodes):
        raise Invalid("the API needs a scheduler that reaches its nodes over NATS", field="--http")
    workloads = await NatsWorkloads(client).start()
    images = await NatsImages(client).start()
    placements = NatsScheduler(client, prefix=service.prefix)

    async def members() -> set[str]:  # the API processes up now: every scheduler's
        return set(await placements.census())

    backend = ClusterBackend(
        service.scheduler,
        nodes,
        placements,
        workloads,
        images,
        node_gone_after_s=node_gone_after_s,
        owner=service.id,
        members=members,
        metrics=service.scheduler.metrics,
    )
    record_watch = await workloads.watch()
    reconciler = Reconciler(
        backend,
        every_s=reconcile_every_s,
        routes=service.routes,
        route_index=service.shared,
        records=record_watch,
    )
    events = await NatsEvents(client).start()
    lease = await NatsLease(client, "reconciler", ttl_s=lease_ttl_s).start()
    api = await ApiServer(create_app(backend, token=token), host, port, https).start()
    holder = f"scheduler-{service.id}"
    sweeper = asyncio.create_task(reconciler.run(lease, holder), name="berth reconciler")
    consumer = asyncio.create_task(events.consume(backend.apply_event), name="berth events")
    try:
        yield api
    finally:
        for task in (consumer, sweeper):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await api.stop()
        await record_watch.stop()
        await backend.close()


@dataclass(frozen=True)
class ApiSettings:
    """The HTTP API beside a scheduler (``--http`` and its flags, each checked by the caller)."""

    address: tuple[str, int]
    token: str
    generated: bool = False
    """Whether the token was made here: it is written to ``api.json`` (and removed at exit)."""
    https: HttpsFiles | None = None
    node_gone_after_s: float = NODE_GONE_AFTER_S
    reconcile_every_s: float = RECONCILE_EVERY_S


async def serve_scheduler(
    url: str,
    *,
    credentials: Credentials | None = None,
    tls: ssl.SSLContext | None = None,
    heartbeat_s: float = HEARTBEAT_S,
    lease_ttl_s: float = LEASE_TTL_S,
    grace_s: float = SHUTDOWN_GRACE_S,
    policy: Policy | None = None,
    api: ApiSettings | None = None,
    duration_s: float | None = None,
    say: Callable[[str], None] = print,
) -> None:
    """The scheduler process on the servers at ``url`` (see the module docstring), with the
    API when ``api`` says where, until a signal or ``duration_s``; ``say`` hears what a log
    would show (where it serves, how it stops)."""
    stop = stop_event(duration_s)
    client = await connect(
        url, name=f"berth-scheduler-{os.getpid()}", credentials=credentials, tls=tls
    )
    try:
        routes = await NatsRoutes(client).start()
        async with scheduler_service(
            client,
            heartbeat_s=heartbeat_s,
            lease_ttl_s=lease_ttl_s,
            routes=routes,
            grace_s=grace_s,
            policy=policy,
        ) as service:
            say(
                f"scheduler {service.id} serving {service.prefix}.* in queue group "
                f"{service.queue} on {url}; {len(service.scheduler.states())} nodes seen"
            )
            async with contextlib.AsyncExitStack() as stack:
                if api is not None:
                    await _serve_api(stack, client, service, api, say)
                await until_stopped(stop, [client])
                say("stopping: finishing in-flight requests")
    finally:
        await client.close()


async def _serve_api(
    stack: contextlib.AsyncExitStack,
    client: Client,
    service: SchedulerService,
    settings: ApiSettings,
    say: Callable[[str], None],
) -> None:
    """The HTTP API beside a running scheduler, stopped with ``stack``; a generated token
    goes to ``api.json`` for the CLI to find (and is removed with it)."""
    host, port = settings.address
    api = await stack.enter_async_context(
        scheduler_api(
            client,
            service,
            host=host,
            port=port,
            token=settings.token,
            node_gone_after_s=settings.node_gone_after_s,
            reconcile_every_s=settings.reconcile_every_s,
            https=settings.https,
        )
    )
    where = ""
    if settings.generated:
        where = f"; token in {write_api_file(api.url, settings.token)}"
        stack.callback(remove_api_file, settings.token)
    say(f"API on {api.url} (dashboard {api.url}/){where}")
