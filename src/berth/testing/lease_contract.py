"""The conformance suite of the leader-lease port (:class:`berth.registry.port.LeaderLease`).

Subclass :class:`LeaseContract` beside a driver's tests and implement
:meth:`~LeaseContract.open_leases`: a factory of *contenders* for one fresh lease with the
given TTL — each call a contender's own view of it, as a separate process would hold (one
shared object for an in-process driver, a client object each for a network one).  The TTL is
real time (the NATS driver's server judges expiry by its own clock), so the suite waits.

The guarantees checked are the ones the reconciler builds on:

* of two contenders exactly one takes a free lease; the holder renews it (``True`` again),
  the other is refused for as long as it is renewed;
* a holder that gives it up frees it at once: the other takes it on its next ``hold``;
* a holder that stops renewing loses it after the TTL: the other takes it, and the old
  holder's next ``hold`` is ``False`` — it learns that it lost the lease, and stops acting;
* ``release`` by a contender that does not hold it changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import ClassVar

from berth.registry.port import LeaderLease
from berth.testing.contract import run_check

__all__ = ["LeaseContract"]

Contenders = Callable[[], LeaderLease]


class LeaseContract:
    """Base class of a lease driver's conformance tests; override :meth:`open_leases`."""

    ttl_s: ClassVar[float] = 1.0
    timeout_s: ClassVar[float] = 15.0

    def open_leases(self, ttl_s: float) -> AbstractAsyncContextManager[Contenders]:
        """Contenders for one fresh lease of ``ttl_s`` (entered in a running loop)."""
        raise NotImplementedError

    def _run(self, check: Callable[[Contenders], Awaitable[None]]) -> None:
        run_check(lambda: self.open_leases(self.ttl_s), check, self.timeout_s)

    def test_one_contender_takes_a_free_lease_and_keeps_it_by_renewing(self) -> None:
        async def check(contenders: Contenders) -> None:
            first, second = contenders(), contenders()
            assert 0 < first.ttl_s <= self.ttl_s * 1.001
            assert await first.hold("a") is True
            assert await second.hold("b") is False
            for _ in range(4):  # renewed within its TTL for longer than one TTL
                await asyncio.sleep(self.ttl_s / 3)
                assert await first.hold("a") is True
                assert await second.hold("b") is False

        self._run(check)

    def test_of_concurrent_takers_exactly_one_holds_it(self) -> None:
        async def check(contenders: Contenders) -> None:
            views = [contenders() for _ in range(5)]
            held = await asyncio.gather(*(v.hold(f"h{i}") for i, v in enumerate(views)))
            assert sum(held) == 1

        self._run(check)

    def test_a_released_lease_is_taken_at_once(self) -> None:
        async def check(contenders: Contenders) -> None:
            first, second = contenders(), contenders()
            assert await first.hold("a") is True
            await second.release("b")  # not its lease: changes nothing
            assert await second.hold("b") is False
            await first.release("a")
            assert await second.hold("b") is True
            assert await first.hold("a") is False

        self._run(check)

    def test_a_holder_that_stops_renewing_loses_it_and_learns_so(self) -> None:
        async def check(contenders: Contenders) -> None:
            first, second = contenders(), contenders()
            assert await first.hold("a") is True
            taken = False
            for _ in range(40):  # the server may remove an expired value a little late
                await asyncio.sleep(self.ttl_s / 4)
                if await second.hold("b"):
                    taken = True
                    break
            assert taken, "the lease was never taken over after its holder stopped renewing"
            assert await first.hold("a") is False  # the old holder stops acting
            assert await second.hold("b") is True

        self._run(check)
