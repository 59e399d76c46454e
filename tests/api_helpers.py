"""Helpers shared by the API tests: the API under test both ways, a client carrying a real
``berth up`` cluster's token, polling until a condition holds, and checking a problem+json
answer.

:func:`api_under_test` gives an :class:`~berth.api.testing.ApiUnderTest` by name —
``"in-process"`` (the application over the embedded cluster through httpx's ASGI transport,
:func:`berth.api.testing.embedded_api`) or ``"nats"`` (``berth up``'s processes: a nats-server
with authentication, agents, a scheduler serving the API,
:class:`~berth.processes.up.LocalCluster` with ``http=``) — so one test module runs the same
tests against both (:data:`BOTH`, the parameters of its module-scoped fixture).

Imported by the test modules as ``tests.api_helpers`` (``tests`` is a package; pytest's default
import mode puts the repository's root on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import httpx
import pytest

from berth.api.testing import ApiUnderTest, embedded_api, remote_api
from berth.processes.up import LocalCluster
from berth.registry.nats import NatsClaims
from berth.testing.nats import client

PROBLEM = "application/problem+json"
BOTH = ["in-process", pytest.param("nats", marks=pytest.mark.slow)]
"""The two ways :func:`api_under_test` serves the API, as fixture parameters (the NATS one
starts a whole ``berth up``: ``slow``)."""


@contextmanager
def api_client(cluster: LocalCluster) -> Iterator[httpx.Client]:
    """An HTTP client on ``cluster``'s API, its bearer token set."""
    assert cluster.api_url is not None
    headers = {"Authorization": f"Bearer {cluster.api_token}"}
    with httpx.Client(base_url=cluster.api_url, headers=headers, timeout=20.0) as client:
        yield client


@contextlib.asynccontextmanager
async def api_under_test(
    how: str, nodes: int = 3, *, runtime: Literal["process", "fake"] = "process"
) -> AsyncIterator[ApiUnderTest]:
    """The API over ``nodes`` nodes (heartbeat 0.5 s), served ``how`` (see the module
    docstring)."""
    if how == "in-process":
        async with embedded_api(nodes, runtime=runtime, heartbeat_s=0.5) as api:
            yield api
        return
    assert how == "nats", how
    up = LocalCluster(nodes, heartbeat_s=0.5, runtime=runtime, http=("127.0.0.1", 0))
    await asyncio.to_thread(up.start)  # it runs its own event loop while it starts
    try:
        assert up.api_url is not None and up.api_token is not None and up.auth is not None
        async with client(up.url, credentials=up.auth.scheduler) as nc:  # the API's own user
            claims = await NatsClaims(nc).start()
            async with remote_api(up.api_url, up.api_token, claims) as api:
                yield api
    finally:
        await asyncio.to_thread(up.stop)


def until(check: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    """``check()``'s first truthy value, polled every 50 ms; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = 15.0) -> Any:
    """``await check()``'s first truthy value, polled every 50 ms; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """``response`` as a problem+json body of ``status`` with a type, title and detail."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["type"] and body["title"] and body["detail"]
    return body
