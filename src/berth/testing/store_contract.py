"""The conformance suite of the ``StateStore`` port, shipped for every driver.

Subclass :class:`StateStoreContract` next to a driver's tests and implement
:meth:`~StateStoreContract.open_store`; pytest collects the inherited tests.  Events may
arrive asynchronously (a network driver), so every expectation on what a reader sees is polled
with a deadline (:attr:`StateStoreContract.settle_s`) rather than asserted at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import ClassVar

from berth.platform import Platform
from berth.state import NodeState, Overcommit
from berth.store.port import StateEvent, StateStore
from berth.testing.contract import run_check
from berth.units import GiB

__all__ = ["StateStoreContract", "sample_state"]


def sample_state(node: str, generation: int = 0, **changes: object) -> NodeState:
    """A complete, realistic snapshot for tests (every optional field populated)."""
    fields: dict[str, object] = {
        "node": node,
        "platform": Platform.parse("linux/amd64"),
        "generation": generation,
        "published_at": 1_700_000_000.0 + generation,
        "labels": {"zone": "a"},
        "mem_free": 8 * GiB,
        "disk_free": 100 * GiB,
        "mem_max": 16 * GiB,
        "disk_max": 200 * GiB,
        "cpu_load": 0.25,
        "cpu_capacity": 8.0,
        "cpu_max_load": 0.9,
        "disk_bw_load": 1e6,
        "disk_bw_ceiling": 5e8,
        "net_bw_load": 2e6,
        "net_bw_ceiling": 1e9,
        "layers": frozenset({"sha256:a", "sha256:b"}),
        "cached_layers": frozenset({"sha256:c"}),
        "overcommit": Overcommit(vcpus_reserved=2.0, vcpus_ceiling=16.0),
    }
    fields.update(changes)
    return NodeState(**fields)


class StateStoreContract:
    """Base class of a state store driver's conformance tests."""

    settle_s: ClassVar[float] = 2.0
    ttl_s: ClassVar[float] = 0.3

    def open_store(self, *, ttl_s: float | None = None) -> AbstractAsyncContextManager[StateStore]:
        """A fresh, empty store (with snapshot time-to-live ``ttl_s`` when given)."""
        raise NotImplementedError

    # -- helpers -----------------------------------------------------------------------------
    def _run(
        self, check: Callable[[StateStore], Awaitable[None]], ttl_s: float | None = None
    ) -> None:
        run_check(lambda: self.open_store(ttl_s=ttl_s), check)

    async def _eventually(self, predicate: Callable[[], Awaitable[bool] | bool]) -> None:
        deadline = time.monotonic() + self.settle_s
        while True:
            outcome = predicate()
            if not isinstance(outcome, bool):
                outcome = await outcome
            if outcome:
                return
            assert time.monotonic() < deadline, "the store did not converge in time"
            await asyncio.sleep(0.01)

    # -- the contract ------------------------------------------------------------------------
    def test_published_state_is_read_back_equal(self) -> None:
        async def check(store: StateStore) -> None:
            state = sample_state("n1")
            await store.publish(state)

            async def seen() -> bool:
                return (await store.states()).get("n1") == state

            await self._eventually(seen)

        self._run(check)

    def test_latest_generation_wins(self) -> None:
        async def check(store: StateStore) -> None:
            await store.publish(sample_state("n1", 1, mem_free=1))
            await store.publish(sample_state("n1", 3, mem_free=3))
            await store.publish(sample_state("n1", 2, mem_free=2))

            async def latest() -> bool:
                state = (await store.states()).get("n1")
                return state is not None and state.generation == 3

            await self._eventually(latest)
            await asyncio.sleep(0.05)
            assert (await store.states())["n1"].mem_free == 3

        self._run(check)

    def test_removed_node_disappears_and_remove_is_idempotent(self) -> None:
        async def check(store: StateStore) -> None:
            await store.publish(sample_state("n1"))
            await store.publish(sample_state("n2"))

            async def both() -> bool:
                return set(await store.states()) == {"n1", "n2"}

            await self._eventually(both)
            await store.remove("n1")
            await store.remove("n1")
            await store.remove("never-there")

            async def one() -> bool:
                return set(await store.states()) == {"n2"}

            await self._eventually(one)

        self._run(check)

    def test_subscribers_see_current_view_then_changes(self) -> None:
        async def check(store: StateStore) -> None:
            await store.publish(sample_state("n1"))
            await self._eventually(lambda: _has(store, "n1"))
            events: list[StateEvent] = []
            unsubscribe = store.subscribe(events.append)
            await self._eventually(lambda: any(e.node == "n1" for e in events))
            await store.publish(sample_state("n2", 1))
            await store.remove("n1")
            await self._eventually(lambda: ("delete", "n1") in [(e.kind, e.node) for e in events])
            puts = [e.node for e in events if e.kind == "put"]
            assert "n2" in puts
            unsubscribe()
            count = len(events)
            await store.publish(sample_state("n3"))
            await self._eventually(lambda: _has(store, "n3"))
            await asyncio.sleep(0.05)
            assert len(events) == count

        self._run(check)

    def test_unrefreshed_node_expires(self) -> None:
        async def check(store: StateStore) -> None:
            await store.publish(sample_state("stale"))
            await store.publish(sample_state("fresh"))
            await self._eventually(lambda: _has(store, "stale"))
            deadline = time.monotonic() + self.ttl_s * 4
            generation = 1
            while time.monotonic() < deadline:
                await store.publish(sample_state("fresh", generation))
                generation += 1
                await asyncio.sleep(self.ttl_s / 4)

            async def expired() -> bool:
                return set(await store.states()) == {"fresh"}

            await self._eventually(expired)

        self._run(check, ttl_s=self.ttl_s)


async def _has(store: StateStore, node: str) -> bool:
    return node in await store.states()
