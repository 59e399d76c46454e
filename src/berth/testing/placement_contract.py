"""The conformance suite of the ``Scheduler`` port, for any driver.

Like SQLAlchemy's dialect test suite, it ships inside the package: someone writing a driver
subclasses :class:`SchedulerContract` in their own test module, says how to build the driver
and which platforms its nodes run, and pytest collects the inherited tests::

    class TestMyDriver(SchedulerContract):
        def make_scheduler(self) -> Scheduler:
            return MyDriver(...)

        def node_platforms(self) -> set[Platform]:
            return {Platform.parse("linux/amd64")}

The guarantee checked (the placement seed's): a valid request — any namespace, name and
replica, with or without platforms — yields a non-empty ``worker_node`` and no error, unless
it lists only platforms that none of the driver's nodes run, which raises
``NoMatchingPlatform`` (an ``Invalid``).  100 concurrent ``schedule`` calls all succeed, and a
driver that promises determinism (``deterministic = True``) answers identical requests with
identical placements.  Drivers that account resources return a small ``Spec`` from
:meth:`SchedulerContract.valid_spec` and must have room for 100 of them.

Replica spreading (``Request.spread``): every driver places a function's first replica under
any spread setting it can meet without labels (a soft spread, or a hard one-per-node).  A
driver that accounts resources (``valid_spec`` not ``None``) keeps a hard one-per-node spread:
replicas of one function it holds at once land on distinct nodes, and once every node has
one, the next is refused with ``NoCapacity`` naming the spread.  (A placement without
resources holds nothing on its node, so there is no replica to spread away from.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import ClassVar

import pytest

from berth.errors import Invalid, NoCapacity, NoMatchingPlatform
from berth.model import Placement, Request, Spec, Spread
from berth.platform import Platform
from berth.scheduler.port import Scheduler
from berth.testing.contract import run_check

__all__ = ["SchedulerContract"]

_PLATFORM_POOL = (
    "linux/amd64",
    "linux/arm64",
    "linux/arm/v7",
    "linux/s390x",
    "linux/riscv64",
    "linux/ppc64le",
    "windows/amd64",
    "plan9/386",
)


class SchedulerContract:
    """Base class of a driver's conformance tests; override the three hooks."""

    deterministic: ClassVar[bool] = True
    concurrency: ClassVar[int] = 100

    # -- hooks -------------------------------------------------------------------------------
    def make_scheduler(self) -> Scheduler:
        """A fresh driver under test (called inside a running event loop)."""
        raise NotImplementedError

    def node_platforms(self) -> set[Platform]:
        """Every platform some node of the driver runs."""
        raise NotImplementedError

    def valid_spec(self) -> Spec | None:
        """Resources to attach to valid requests (``None``: declare none)."""
        return None

    def open_scheduler(self) -> AbstractAsyncContextManager[Scheduler]:
        """Override for drivers that need async setup and teardown (servers, connections)."""

        @asynccontextmanager
        async def opened() -> AsyncIterator[Scheduler]:
            yield self.make_scheduler()

        return opened()

    # -- helpers -----------------------------------------------------------------------------
    def _run(self, check: Callable[[Scheduler], Awaitable[None]]) -> None:
        run_check(self.open_scheduler, check)

    def _foreign_platforms(self) -> list[Platform]:
        offered = self.node_platforms()
        foreign = [Platform.parse(text) for text in _PLATFORM_POOL]
        foreign = [platform for platform in foreign if platform not in offered]
        if not foreign:  # pragma: no cover - a driver offering every pooled platform
            pytest.skip("the driver's nodes run every platform the suite knows")
        return foreign

    def _request(
        self,
        namespace: str,
        name: str,
        replica: int,
        platforms: list[Platform],
        spread: Spread | None = None,
    ) -> Request:
        return Request(
            namespace=namespace,
            name=name,
            replica=replica,
            platforms=tuple(platforms),
            spec=self.valid_spec(),
            spread=spread,
        )

    def _valid_requests(self) -> list[Request]:
        offered = sorted(self.node_platforms(), key=str)
        foreign = self._foreign_platforms()
        shapes: list[list[Platform]] = [[], offered[:1], offered, [foreign[0], offered[0]]]
        return [
            self._request(namespace, name, replica, platforms)
            for namespace in ("default", "team-a")
            for name in ("echo", "resize-image")
            for replica in (0, 3)
            for platforms in shapes
        ]

    @staticmethod
    def _assert_placed(placement: Placement, request: Request) -> None:
        assert isinstance(placement, Placement), f"{request.key}: got {placement!r}"
        assert placement.worker_node, f"{request.key}: empty worker_node"

    # -- the contract ------------------------------------------------------------------------
    def test_valid_requests_are_placed(self) -> None:
        async def check(scheduler: Scheduler) -> None:
            for request in self._valid_requests():
                self._assert_placed(await scheduler.schedule(request), request)

        self._run(check)

    def test_only_foreign_platforms_raise_no_matching_platform(self) -> None:
        foreign = self._foreign_platforms()

        async def check(scheduler: Scheduler) -> None:
            for platforms in ([foreign[0]], foreign[:3]):
                request = self._request("default", "foreign", 0, platforms)
                with pytest.raises(NoMatchingPlatform) as caught:
                    await scheduler.schedule(request)
                assert isinstance(caught.value, Invalid)
                for platform in platforms:
                    assert str(platform) in str(caught.value)

        self._run(check)

    def test_concurrent_schedules_all_succeed(self) -> None:
        async def check(scheduler: Scheduler) -> None:
            requests = [
                self._request("default", "burst", replica, [])
                for replica in range(self.concurrency)
            ]
            placements = await asyncio.gather(*(scheduler.schedule(r) for r in requests))
            for placement, request in zip(placements, requests, strict=True):
                self._assert_placed(placement, request)

        self._run(check)

    def test_identical_inputs_give_identical_placements(self) -> None:
        if not self.deterministic:
            pytest.skip("the driver does not promise determinism")

        async def first_placements() -> list[str]:
            async with self.open_scheduler() as scheduler:
                return [
                    (await scheduler.schedule(request)).worker_node
                    for request in self._valid_requests()
                ]

        assert asyncio.run(first_placements()) == asyncio.run(first_placements())

    def test_a_first_replica_is_placed_under_any_spread_it_can_meet(self) -> None:
        spreads = [Spread(hard=True), Spread(hard=False), Spread(label="zone", hard=False)]

        async def check(scheduler: Scheduler) -> None:
            for index, spread in enumerate(spreads):
                request = self._request("default", f"spread-{index}", 0, [], spread)
                self._assert_placed(await scheduler.schedule(request), request)

        self._run(check)

    def test_a_hard_spread_puts_held_replicas_on_distinct_nodes(self) -> None:
        if self.valid_spec() is None:
            pytest.skip("placements without resources hold nothing to spread away from")

        async def check(scheduler: Scheduler) -> None:
            nodes: list[str] = []
            for replica in range(17):
                request = self._request("default", "anti", replica, [], Spread(hard=True))
                try:
                    placement = await scheduler.schedule(request)
                except NoCapacity as error:
                    assert "spread" in str(error), f"refused without naming the spread: {error}"
                    break
                self._assert_placed(placement, request)
                assert placement.worker_node not in nodes, (
                    f"{request.key}: a second replica on {placement.worker_node}"
                )
                nodes.append(placement.worker_node)
            else:  # pragma: no cover - a driver with more than 16 nodes
                pytest.skip("the driver has more nodes than the suite places replicas")
            assert nodes, "not even a first replica was placed"

        self._run(check)

    def test_placements_round_trip_through_json(self) -> None:
        async def check(scheduler: Scheduler) -> None:
            request = self._request("default", "json", 1, [], Spread(label="zone", hard=False))
            wire = Request.from_json(request.to_json())
            placement = await scheduler.schedule(wire)
            assert Placement.from_json(placement.to_json()) == placement

        self._run(check)
