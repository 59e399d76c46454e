"""The in-process registries (:mod:`berth.registry.memory`) pass the registry contract."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from berth.registry.memory import MemoryImages, MemoryRoutes, MemoryWorkloads
from berth.testing.registry_contract import Registries, RegistryContract


class TestMemoryRegistriesContract(RegistryContract):
    def open_registries(self) -> AbstractAsyncContextManager[Registries]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[Registries]:
            yield Registries(MemoryWorkloads(), MemoryImages(), MemoryRoutes())

        return opened()
