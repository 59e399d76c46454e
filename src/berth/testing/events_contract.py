"""The conformance suite of the workload events port (:mod:`berth.events.port`), for any driver.

Subclass :class:`EventsContract` beside a driver's tests and implement
:meth:`~EventsContract.open_events`: a factory of *ends* of one fresh feed — each call an
``(sink, feed)`` pair as a separate process would hold (one shared object for an in-process
driver, a connection each for a network one); every feed of one factory is the same feed
(on NATS: the same durable consumer).

The guarantees checked are the ones the API and the agents build on:

* every event published is handed to a handler, one workload's events in the order
  published;
* an event whose handler raised is handed out again, and applied once it succeeds;
* events published while nobody consumes are kept for the consumer that comes;
* two consumers of one feed share it: every event handled, none by both;
* an event published twice (the same :attr:`~berth.events.port.WorkloadEvent.key`, a
  republish after a lost acknowledgement) is handed out once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import ClassVar

from berth.events.port import EventFeed, EventSink, WorkloadEvent
from berth.testing.contract import run_check

__all__ = ["Ends", "EventsContract"]

Ends = Callable[[], tuple[EventSink, EventFeed]]


def event(
    workload: str, kind: str = "ended", *, node: str = "n1", restarts: int = 0
) -> WorkloadEvent:
    return WorkloadEvent.from_dict(
        {
            "node": node,
            "workload_id": workload,
            "kind": kind,
            "exit_code": 0 if kind == "ended" else None,
            "reason": "exited with code 0",
            "restarts": restarts,
            "at": 1.0,
        }
    )


@contextlib.asynccontextmanager
async def consuming(
    feed: EventFeed, seen: list[WorkloadEvent], fail: set[str] | None = None
) -> AsyncIterator[None]:
    """``feed`` consumed into ``seen`` while the block runs; an event whose key is in
    ``fail`` raises once (and is removed from it)."""

    async def handle(item: WorkloadEvent) -> None:
        if fail is not None and item.key in fail:
            fail.discard(item.key)
            raise RuntimeError(f"not now: {item.key}")
        seen.append(item)

    task = asyncio.create_task(feed.consume(handle))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(check: Callable[[], bool], timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("not within the timeout")
        await asyncio.sleep(0.02)


class EventsContract:
    """Base class of an events driver's conformance tests; override :meth:`open_events`."""

    timeout_s: ClassVar[float] = 15.0

    def open_events(self) -> AbstractAsyncContextManager[Ends]:
        """The ends of one fresh feed (entered in a running loop)."""
        raise NotImplementedError

    def _run(self, check: Callable[[Ends], Awaitable[None]]) -> None:
        run_check(self.open_events, check, self.timeout_s)

    def test_every_event_is_handed_out_and_one_workloads_in_order(self) -> None:
        async def check(ends: Ends) -> None:
            sink, feed = ends()
            sent = [event("w1", "restarted", restarts=1), event("w2"), event("w1", restarts=1)]
            seen: list[WorkloadEvent] = []
            async with consuming(feed, seen):
                for item in sent:
                    await sink.publish(item)
                await until(lambda: len(seen) >= len(sent), self.timeout_s)
                await asyncio.sleep(0.2)  # nothing more comes
            assert sorted(e.key for e in seen) == sorted(e.key for e in sent)
            assert [e.kind for e in seen if e.workload_id == "w1"] == ["restarted", "ended"]

        self._run(check)

    def test_an_event_whose_handler_raised_is_handed_out_again(self) -> None:
        async def check(ends: Ends) -> None:
            sink, feed = ends()
            item = event("w1")
            seen: list[WorkloadEvent] = []
            fail = {item.key}
            async with consuming(feed, seen, fail):
                await sink.publish(item)
                await until(lambda: len(seen) == 1, self.timeout_s)
                await asyncio.sleep(0.2)
            assert not fail and [e.key for e in seen] == [item.key]

        self._run(check)

    def test_events_published_while_nobody_consumes_are_kept(self) -> None:
        async def check(ends: Ends) -> None:
            sink, _ = ends()
            for index in range(5):
                await sink.publish(event(f"w{index}"))
            _, feed = ends()  # the consumer comes later, as an API that restarted
            seen: list[WorkloadEvent] = []
            async with consuming(feed, seen):
                await until(lambda: len(seen) == 5, self.timeout_s)
            assert sorted(e.workload_id for e in seen) == [f"w{i}" for i in range(5)]

        self._run(check)

    def test_two_consumers_share_one_feed(self) -> None:
        async def check(ends: Ends) -> None:
            sink, first = ends()
            _, second = ends()
            seen_first: list[WorkloadEvent] = []
            seen_second: list[WorkloadEvent] = []
            async with consuming(first, seen_first), consuming(second, seen_second):
                for index in range(40):
                    await sink.publish(event(f"w{index}"))
                await until(lambda: len(seen_first) + len(seen_second) >= 40, self.timeout_s)
                await asyncio.sleep(0.3)
            keys = [e.key for e in seen_first + seen_second]
            assert len(keys) == 40 and len(set(keys)) == 40

        self._run(check)

    def test_an_event_published_twice_is_handed_out_once(self) -> None:
        async def check(ends: Ends) -> None:
            sink, feed = ends()
            item = event("w1")
            await sink.publish(item)
            await sink.publish(item)  # a republish: its acknowledgement was lost
            await sink.publish(event("w1", "restarted", restarts=1))  # another event
            seen: list[WorkloadEvent] = []
            async with consuming(feed, seen):
                await until(lambda: len(seen) >= 2, self.timeout_s)
                await asyncio.sleep(0.3)
            assert sorted(e.key for e in seen) == sorted(
                [item.key, event("w1", "restarted", restarts=1).key]
            )

        self._run(check)
