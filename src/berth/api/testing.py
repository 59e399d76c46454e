"""The HTTP API under test: in this process over the embedded cluster, or over the network.

:class:`ApiUnderTest` is what an API test needs of the service it drives, whichever it is: an
authenticated client (:meth:`ApiUnderTest.client`; ``token=False`` for an anonymous one), the
token, and the API's identity claims (to plant a claim a create must respect).  Two ways to
get one, so the same tests run both ways:

* :func:`embedded_api` — the application (:func:`berth.api.app.create_app`) over a
  :class:`~berth.api.backend.ClusterBackend` of the embedded cluster
  (:class:`~berth.embedded.EmbeddedCluster`: its scheduler, its agents, placing through its
  scheduler) and the in-memory registries
  (:mod:`berth.registry.memory`), reached through httpx's ASGI transport: no server, no
  socket, no NATS — seconds faster, and every part of the API but uvicorn exercised.  The
  backend reaches the agents through a :class:`~berth.nodeclient.faults.FaultyNodes`
  (:attr:`ApiUnderTest.faults`), so a test cuts a node off or loses a run's answer; the
  agents push their workload events into an in-process feed
  (:class:`~berth.events.memory.MemoryEvents`) the backend consumes, through a
  :class:`~berth.nodeclient.faults.FaultyEvents` cut along with the node;
* :func:`remote_api` — a served API at ``url`` (``berth up``'s, say), with the claims it keeps
  given by the caller (its bucket on NATS).

Clients are ``httpx.AsyncClient``: the in-process application runs in the caller's event
loop, so the tests are coroutines (the ``anyio`` pytest plugin runs them).  It lives with the
API, as a test client ships with its web framework, because it stands on the API and the
embedded cluster — both above :mod:`berth.testing` in the layers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from berth.api.app import create_app
from berth.api.backend import ClusterBackend
from berth.defaults import IDEMPOTENCY_ABANDONED_AFTER_S, NODE_GONE_AFTER_S
from berth.embedded import EmbeddedCluster, embedded_configs
from berth.events.memory import MemoryEvents
from berth.nodeclient.faults import FaultyEvents, FaultyNodes
from berth.registry.memory import MemoryImages, MemoryWorkloads
from berth.registry.port import IdentityClaims

__all__ = ["TOKEN", "ApiUnderTest", "embedded_api", "remote_api"]

TOKEN = "berth-test-token-0123456789abcdef"
"""The token :func:`embedded_api` serves with unless told another."""
_IN_PROCESS_URL = "http://berth.test"


@dataclass
class ApiUnderTest:
    """An API some tests drive: where it is, its token, its identity claims."""

    base_url: str
    token: str
    claims: IdentityClaims
    transport: httpx.AsyncBaseTransport | None = None
    """httpx's ASGI transport for an application in this process; ``None``: the network."""
    backend: ClusterBackend | None = None
    """The backend, when the API runs in this process."""
    cluster: EmbeddedCluster | None = None
    """The embedded cluster behind it, when the API runs in this process."""
    faults: FaultyNodes | None = None
    """The backend's way to its nodes, when the API runs in this process: cut one off, lose
    a run's answer."""
    events: FaultyEvents | None = None
    """The agents' way to push their workload events, when the API runs in this process:
    hold a node's events back (``events.held.add(node)``)."""

    def client(self, *, token: bool = True, **options: Any) -> httpx.AsyncClient:
        """A client of the API (``async with``), the bearer token set unless ``token`` is
        false; ``options`` go to ``httpx.AsyncClient``."""
        headers = {"Authorization": f"Bearer {self.token}"} if token else {}
        options.setdefault("timeout", 20.0)
        return httpx.AsyncClient(
            base_url=self.base_url, headers=headers, transport=self.transport, **options
        )


@contextlib.asynccontextmanager
async def embedded_api(
    nodes: int = 3,
    *,
    token: str = TOKEN,
    runtime: Literal["process", "fake"] = "process",
    heartbeat_s: float = 0.5,
    node_gone_after_s: float = NODE_GONE_AFTER_S,
    idempotency_abandoned_after_s: float = IDEMPOTENCY_ABANDONED_AFTER_S,
    clock: Callable[[], float] = time.time,
) -> AsyncIterator[ApiUnderTest]:
    """The API in this process over ``nodes`` embedded agents (sizes and platforms as
    :func:`~berth.embedded.embedded_configs` gives them) and in-memory registries; ``clock``
    is the backend's (its records' times, the claims' ages, ``node_gone_after``);
    ``idempotency_abandoned_after_s`` how soon a create's key claim with no record is taken
    over (:mod:`berth.api.idempotency`)."""
    configs = embedded_configs(nodes, runtime=runtime, heartbeat_s=heartbeat_s)
    events, cut = MemoryEvents(), set[str]()
    sink = FaultyEvents(events, cut)
    async with EmbeddedCluster(configs, events=sink) as cluster:
        workloads = MemoryWorkloads()
        faults = FaultyNodes(cluster.client, cut=cut)
        backend = ClusterBackend(
            cluster.scheduler,
            faults,
            cluster.scheduler,
            workloads,
            MemoryImages(),
            node_gone_after_s=node_gone_after_s,
            idempotency_abandoned_after_s=idempotency_abandoned_after_s,
            clock=clock,
            metrics=cluster.scheduler.metrics,
        )
        app = create_app(backend, token=token)
        consumer = asyncio.create_task(events.consume(backend.apply_event), name="berth events")
        try:
            yield ApiUnderTest(
                base_url=_IN_PROCESS_URL,
                token=token,
                claims=workloads.claims,
                transport=httpx.ASGITransport(app=app),
                backend=backend,
                cluster=cluster,
                faults=faults,
                events=sink,
            )
        finally:
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
            await backend.close()


@contextlib.asynccontextmanager
async def remote_api(url: str, token: str, claims: IdentityClaims) -> AsyncIterator[ApiUnderTest]:
    """The API served at ``url`` with ``token``; ``claims`` are the ones it keeps."""
    yield ApiUnderTest(base_url=url, token=token, claims=claims)
