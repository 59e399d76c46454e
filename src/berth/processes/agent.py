"""The node agent process (``berth agent --nats``): agents on NATS, one per configuration.

:func:`agent_configs` reads the configuration files (``--config``, each checked by
:func:`~berth.node.config.load_config`, names unique).  :func:`node_service` builds one
node's parts from its configuration: the :class:`~berth.node.agent.Agent` over a
publish-only node store (:class:`~berth.store.nats.NatsStore`, a snapshot living three of its
heartbeats), its state directory and event stream, inside the
:class:`~berth.nodeclient.nats_node.NodeService` that answers its subjects and keeps its
routes.  :func:`serve_agents` connects — one connection shared, or one per node when each
node is its own NATS user (``--creds-dir``) — starts every node and runs until a signal, the
duration, or a connection closed for good (then it exits, to be restarted by its
supervisor).  ``berth up`` runs this process as its agent children, ``berth deploy``'s units
as a service; the test clusters (:mod:`berth.testing.cluster`) call :func:`node_service`.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from berth.errors import Invalid
from berth.events.nats import NatsEvents
from berth.nats.connection import Credentials, connect, until_stopped
from berth.nats.wire import PREFIX, node_token
from berth.node.agent import Agent
from berth.node.budget import IDLE, LoadReadings
from berth.node.config import AgentConfig, load_config
from berth.nodeclient.nats_node import NodeService
from berth.processes.lifetime import stop_event
from berth.registry.nats_routes import NatsRoutes
from berth.store.nats import DEFAULT_BUCKET, NatsStore, bucket_ttl_s

__all__ = ["agent_configs", "node_service", "serve_agents"]


def agent_configs(paths: Sequence[Path], *, orphan_grace_s: float | None) -> list[AgentConfig]:
    """Every ``--config`` file, loaded and checked; ``orphan_grace_s`` (checked by the
    caller) overrides each one's ``agent.orphan_grace_s``.  ``Invalid`` naming ``--config``
    when two files name the same node."""
    configs = [load_config(path) for path in paths]
    if orphan_grace_s is not None:
        configs = [
            config.model_copy(
                update={"agent": config.agent.model_copy(update={"orphan_grace_s": orphan_grace_s})}
            )
            for config in configs
        ]
    names = [config.node.name for config in configs]
    if len(set(names)) != len(names):
        raise Invalid(f"node names must be unique, got {names}", field="--config")
    return configs


def node_service(
    client: Client,
    config: AgentConfig,
    *,
    bucket: str = DEFAULT_BUCKET,
    prefix: str = PREFIX,
    routes: NatsRoutes | None = None,
    readings: LoadReadings | None = None,
    state_dir: Path | None = None,
    events: NatsEvents | None = None,
) -> NodeService:
    """One node on ``client`` built from ``config`` (see the module docstring); ``readings``
    replace the load monitor's (``IDLE``: a node that reports no load), ``state_dir`` keeps
    what must survive a restart (its journal, its cordon, its copy of its routes)."""
    store = NatsStore(
        client, bucket=bucket, ttl_s=bucket_ttl_s(config.agent.heartbeat_s), watch=False
    )
    agent = Agent.from_config(config, store, readings=readings, state_dir=state_dir, events=events)
    return NodeService(
        client, agent, store, prefix=prefix, routes=routes, state_dir=state_dir, events=events
    )


async def serve_agents(
    configs: Sequence[AgentConfig],
    url: str,
    *,
    credentials: Credentials | None = None,
    creds_dir: Path | None = None,
    idle_load: bool = False,
    duration_s: float | None = None,
    state_dir: Path | None = None,
    tls: ssl.SSLContext | None = None,
    say: Callable[[str], None] = print,
) -> None:
    """Run a node for each of ``configs`` on the servers at ``url`` until a signal or
    ``duration_s`` (see the module docstring); ``credentials`` is the one user every node
    shares, ``creds_dir`` holds one per node (``node-<token>.creds.json``) instead; each
    node keeps its state in ``state_dir/<token>``.  ``say`` hears what a log would show."""
    stop = stop_event(duration_s)
    clients: list[Any] = []
    async with contextlib.AsyncExitStack() as stack:

        async def connection(name: str, user: Credentials | None) -> Any:
            client = await connect(url, name=name, credentials=user, tls=tls)
            stack.push_async_callback(client.close)
            clients.append(client)
            return client

        # each node as its own user needs its own connection; otherwise they share one
        shared = None if creds_dir else await connection("berth-agents", credentials)
        for config in configs:
            name = config.node.name
            if shared is None:
                assert creds_dir is not None
                own = Credentials.load(creds_dir / f"node-{node_token(name)}.creds.json")
            client = shared or await connection(name, own)
            service = node_service(
                client,
                config,
                routes=await NatsRoutes(client).start(),
                readings=IDLE if idle_load else None,
                state_dir=None if state_dir is None else state_dir / node_token(name),
                events=NatsEvents(client),
            )
            await stack.enter_async_context(service)
            accel = getattr(service.agent.runtime, "accel_detail", None)
            say(
                f"agent {service.name} ({service.agent.platform}) on {url}, "
                f"heartbeat {config.agent.heartbeat_s:g}s"
                + ("" if accel is None else f", microVMs under {accel}")
            )
        await until_stopped(stop, clients)  # a connection closed for good: exit, restarted
        say("stopping: leaving the cluster")
