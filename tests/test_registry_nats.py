"""The NATS registries (:mod:`berth.registry.nats`, :mod:`berth.registry.nats_routes`) pass
the registry contract against a real nats-server, each run in buckets of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from berth.registry.nats import NatsImages, NatsWorkloads
from berth.registry.nats_routes import NatsRoutes
from berth.testing.nats import NatsServer, client, unique_name
from berth.testing.registry_contract import Registries, RegistryContract


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
