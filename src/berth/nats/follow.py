"""Following a KV bucket's keys: how every berth replica of a bucket catches up and stays so.

A scheduler's replica of the node states (:mod:`berth.store.nats`), its copy of the routes
(:mod:`berth.registry.nats_routes`) and the API's copy of the workload records
(:mod:`berth.registry.nats`) are all one thing underneath: an *ordered push consumer* of the
bucket's stream, filtered to some keys, that delivers the latest value of each key first and
then every change as it lands.  :class:`KvFollow` is that consumer, once:

* **a short idle heartbeat** (``idle_heartbeat_s``): nats-py resets an ordered consumer after
  two missed heartbeats, from the stream sequence after the last message it saw, so a follow
  resumes about two heartbeats after a server restart (docs/design.md §5);
* **caught up** (:attr:`KvFollow.caught_up`) once a delivered message says nothing is pending
  — or at once when the consumer has delivered nothing and has nothing pending (no key
  matches).  That check is on the *consumer's* sequence: the server starts a filtered
  consumer's stream sequence past the other keys' messages, so the stream's would never read
  empty;
* **a handler that cannot break it**: whatever ``handle`` raises is logged and the follow
  goes on.

What a message means (a value, a delete, a purge, a limit marker) is the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from berth.defaults import FOLLOW_IDLE_HEARTBEAT_S
from berth.nats.connection import settle

__all__ = ["KvFollow"]

log = logging.getLogger("berth.nats")


@dataclass(eq=False, repr=False)
class KvFollow:
    """An ordered consumer of ``subject`` (a filter under ``$KV.<bucket>.``) on ``stream``,
    latest value per key first, each message given to ``handle`` (see the module docstring).
    ``what`` names it in the log."""

    client: Client
    _: KW_ONLY
    stream: str
    subject: str
    handle: Callable[[Msg], None]
    what: str
    idle_heartbeat_s: float = FOLLOW_IDLE_HEARTBEAT_S
    _subscription: Any = field(default=None, init=False, repr=False)
    _caught_up: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    @property
    def caught_up(self) -> bool:
        """Whether the values stored when the follow started were all delivered."""
        return self._caught_up.is_set()

    @property
    def following(self) -> bool:
        """Whether it is subscribed (started and not stopped)."""
        return self._subscription is not None

    async def start(self, sync_timeout_s: float) -> bool:
        """Subscribe, and wait until it has caught up, at most ``sync_timeout_s``; whether it
        has (logged when not: it goes on either way, until :meth:`stop`)."""
        self._subscription = await self.client.jetstream().subscribe(
            self.subject,
            stream=self.stream,
            cb=self._on_message,
            ordered_consumer=True,
            idle_heartbeat=self.idle_heartbeat_s,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            inactive_threshold=max(30.0, 10 * self.idle_heartbeat_s),
        )
        try:
            await settle(self.client)
            info = await self._subscription.consumer_info()
        except BaseException:
            await self.stop()
            raise
        delivered = info.delivered
        if info.num_pending == 0 and (delivered is None or delivered.consumer_seq == 0):
            self._caught_up.set()  # no key matches: nothing to wait for
        try:
            await asyncio.wait_for(self._caught_up.wait(), sync_timeout_s)
        except TimeoutError:
            log.warning("%s did not catch up within %gs", self.what, sync_timeout_s)
            return False
        return True

    async def current(self, timeout_s: float) -> bool:
        """Whether the follow's consumer answers (within ``timeout_s``) and has delivered every
        message stored: then a follow that hears nothing means nothing was written.  ``False``
        while it cannot say — no connection, the stream without a leader, or the consumer gone
        with the server that held it (nats-py makes another after two missed heartbeats, once
        the stream has a leader again)."""
        subscription = self._subscription
        if subscription is None:
            return False
        try:
            info = await asyncio.wait_for(subscription.consumer_info(), timeout_s)
        except Exception as error:  # no answer, or no such consumer (any more)
            log.debug("%s's consumer did not answer: %r", self.what, error)
            return False
        return not info.num_pending

    async def stop(self) -> None:
        """Unsubscribe (nothing is delivered after)."""
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def _on_message(self, msg: Msg) -> None:
        try:
            self.handle(msg)
        except Exception:  # never out of the callback: the follow goes on
            log.exception("%s failed on %s", self.what, msg.subject)
        finally:
            if not self._caught_up.is_set():
                with contextlib.suppress(Exception):
                    if msg.metadata.num_pending == 0:
                        self._caught_up.set()
