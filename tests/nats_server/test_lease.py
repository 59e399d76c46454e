"""The lease drivers pass the lease contract (:mod:`berth.testing.lease_contract`): in this
process (:class:`~berth.registry.memory.MemoryLease`) and on a real nats-server
(:class:`~berth.registry.nats_lease.NatsLease`, each contender a connection of its own, as
separate scheduler processes are)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from berth.errors import Invalid
from berth.registry.memory import MemoryLease
from berth.registry.nats_lease import NatsLease
from berth.registry.port import LeaderLease
from berth.testing.lease_contract import Contenders, LeaseContract
from berth.testing.nats import NatsServer, client, unique_name


class TestMemoryLeaseContract(LeaseContract):
    ttl_s = 0.3

    def open_leases(self, ttl_s: float) -> AbstractAsyncContextManager[Contenders]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[Contenders]:
            lease = MemoryLease(ttl_s)
            yield lambda: lease

        return opened()


class TestNatsLeaseContract(LeaseContract):
    @pytest.fixture(autouse=True)
    def _server(self, nats_server: NatsServer) -> None:
        self.url = nats_server.url

    def open_leases(self, ttl_s: float) -> AbstractAsyncContextManager[Contenders]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[Contenders]:
            bucket = unique_name("lease")
            async with contextlib.AsyncExitStack() as stack:
                leases: list[LeaderLease] = []
                for _ in range(5):
                    nc = await stack.enter_async_context(client(self.url))
                    leases.append(
                        await NatsLease(nc, "reconciler", ttl_s=ttl_s, bucket=bucket).start()
                    )
                views = iter(leases)
                yield lambda: next(views)

        return opened()


def test_a_lease_ttl_that_is_not_positive_is_invalid() -> None:
    with pytest.raises(Invalid) as caught:
        MemoryLease(0)
    assert caught.value.field == "ttl_s"
