"""The in-memory state store passes the store contract; expiry follows its clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from berth.store.memory import MemoryStore
from berth.store.port import StateEvent, StateStore
from berth.testing.clock import FakeClock
from berth.testing.store_contract import StateStoreContract, sample_state


class TestMemoryStoreContract(StateStoreContract):
    def open_store(self, *, ttl_s: float | None = None) -> AbstractAsyncContextManager[StateStore]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[StateStore]:
            yield MemoryStore(ttl_s=ttl_s)

        return opened()


def test_expiry_follows_a_fake_clock_and_notifies() -> None:
    clock = FakeClock(0.0)
    store = MemoryStore(ttl_s=5, clock=clock)
    events: list[StateEvent] = []
    store.subscribe(events.append)
    store.publish_now(sample_state("a"))
    clock.now = 4.0
    store.publish_now(sample_state("b"))
    clock.now = 5.5
    assert set(store.states_now()) == {"b"}
    assert [(e.kind, e.node) for e in events] == [("put", "a"), ("put", "b"), ("delete", "a")]


def test_republishing_keeps_a_node_alive_whatever_its_first_publication() -> None:
    clock = FakeClock(0.0)
    store = MemoryStore(ttl_s=5, clock=clock)
    store.publish_now(sample_state("early"))
    store.publish_now(sample_state("late"))
    clock.now = 4.0
    store.publish_now(sample_state("early", 1))  # now the most recent, though first in
    clock.now = 6.0
    assert set(store.states_now()) == {"early"}
    clock.now = 9.5
    assert store.states_now() == {}
