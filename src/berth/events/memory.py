"""The in-process workload events driver: one queue, for the embedded cluster and tests.

:class:`MemoryEvents` is both ends of the port in one object: nodes publish into it, the
API consumes from it.  It keeps the port's promises within one process and one event loop:
an event is kept once :meth:`MemoryEvents.publish` returns; each is handed to one consumer;
one whose handler raised goes back to the head of the queue and is handed out again after
``redeliver_after_s``; a republished event (same :attr:`~berth.events.port.WorkloadEvent.key`)
within the last ``dedupe`` keys is kept once, as NATS's duplicate window does.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque

from berth.events.port import EventHandler, WorkloadEvent

__all__ = ["MemoryEvents"]

log = logging.getLogger("berth.events")


class MemoryEvents:
    """An ``EventSink`` and an ``EventFeed`` in one process (see the module docstring)."""

    def __init__(self, *, redeliver_after_s: float = 0.2, dedupe: int = 4096) -> None:
        self.redeliver_after_s = redeliver_after_s
        self._queue: deque[WorkloadEvent] = deque()
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._dedupe = dedupe
        self._waiting: asyncio.Event | None = None
        self.published = 0
        self.redelivered = 0

    def __len__(self) -> int:
        """Events kept and not yet applied."""
        return len(self._queue)

    async def publish(self, event: WorkloadEvent) -> None:
        if event.key in self._keys:
            return  # the same event again: kept once
        self._keys[event.key] = None
        while len(self._keys) > self._dedupe:
            self._keys.popitem(last=False)
        self._queue.append(event)
        self.published += 1
        self._wake()

    def _wake(self) -> None:
        if self._waiting is not None:
            self._waiting.set()

    async def consume(self, handler: EventHandler) -> None:
        if self._waiting is None:
            self._waiting = asyncio.Event()
        waiting = self._waiting
        while True:
            if not self._queue:
                waiting.clear()
                await waiting.wait()
                continue
            event = self._queue.popleft()
            try:
                await handler(event)
            except asyncio.CancelledError:
                self._queue.appendleft(event)  # not applied: the next consumer's
                raise
            except Exception as error:
                log.info("event %s not applied (%s); handed out again", event.key, error)
                self.redelivered += 1
                self._queue.appendleft(event)
                await asyncio.sleep(self.redeliver_after_s)
