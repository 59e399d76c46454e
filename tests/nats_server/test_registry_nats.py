"""The NATS registries (:mod:`berth.registry.nats`, :mod:`berth.registry.nats_routes`) pass
the registry contract against a real nats-server, each run in buckets of its own; the routes
driver's own ``restore`` (what a node that comes back writes) is checked beside it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from berth.model import Placement, Spec
from berth.registry.nats import NatsImages, NatsWorkloads
from berth.registry.nats_routes import NatsRoutes
from berth.registry.port import Route
from berth.testing.nats import NatsServer, client, unique_name
from berth.testing.registry_contract import Registries, RegistryContract
from berth.units import MiB


class TestNatsRegistriesContract(RegistryContract):
    @pytest.fixture(autouse=True)
    def _server(self, nats_server: NatsServer) -> None:
        self.url = nats_server.url

    def open_registries(self) -> AbstractAsyncContextManager[Registries]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[Registries]:
            api, routes = unique_name("api"), unique_name("routes")
            async with client(self.url) as nc:
                yield Registries(
                    await NatsWorkloads(nc, bucket=api).start(),
                    await NatsImages(nc, bucket=api).start(),
                    await NatsRoutes(nc, bucket=routes).start(),
                )

        return opened()


def test_a_restored_route_is_written_exactly_and_only_where_the_key_holds_nothing(
    nats_server: NatsServer,
) -> None:
    """``NatsRoutes.restore`` (a node rewriting its routes after a purge): the route as it
    was, ``placed_at`` included; never over a route stored meanwhile, never over a delete."""
    spec = Spec(vcpus=0.25, mem=128 * MiB, disk=MiB)
    route = Route("t/fn/0", "n1", "r1.abcd", spec, 12.5, "t", "fn")

    async def scenario() -> None:
        async with client(nats_server.url) as nc:
            routes = await NatsRoutes(nc, bucket=unique_name("routes")).start()
            first = await routes.restore(route)
            assert first is not None and await routes.list("n1") == [route]
            # a key that holds a route: the stored one stands
            newer = Placement(worker_node="n1", reservation_id="r2.abcd")
            placed = await routes.record("t/fn/0", newer, spec, function=("t", "fn"))
            assert await routes.restore(route) is None
            [(revision, stored)] = await routes.on_node("n1")
            assert revision == placed and stored.reservation_id == "r2.abcd"
            # a key purged with its node's routes: written again, exactly
            await routes.purge_node("n1")
            again = await routes.restore(route)
            assert again is not None and again > placed
            assert await routes.whereis("t/fn/0") == route
            # a key deleted on purpose (the workload was released): not revived
            await routes.remove("t/fn/0", "n1")
            assert await routes.restore(route) is None and await routes.list("n1") == []

    asyncio.run(scenario())
