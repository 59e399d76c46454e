"""The workload events port on NATS JetStream: one stream, one durable consumer for the API.

* **The stream** ``berth_events`` (:attr:`~berth.nats.names.Names.events_stream`) keeps every
  subject ``berth.events.<node>`` (the node's name as a subject token,
  :func:`~berth.nats.wire.node_token`), on file, for :data:`~berth.events.port.EVENT_MAX_AGE_S`
  — limits retention, so a consumer that was away finds what it missed.  Whoever opens it
  first creates it (a node or an API); a stream that exists with other settings is used as
  it is (its settings win, and that is logged).
* **A node publishes** with a JetStream acknowledgement: :meth:`NatsEvents.publish` returns
  only once the server stored the event, and carries the event's
  :attr:`~berth.events.port.WorkloadEvent.key` as ``Nats-Msg-Id`` — a republish after a lost
  acknowledgement (a node that restarted before it saw the ack) is stored once within the
  stream's :data:`DUPLICATE_WINDOW_S`.  No acknowledgement in time, no stream, no connection:
  ``Unavailable`` — the node keeps the event (and its journal entry) and publishes it again.
  An event is berth's envelope around it, ``{"v": 1, "event": {…}}``
  (:func:`~berth.nats.wire.encode_model`); one without the envelope (as the previous release
  wrote them) is read too, for this release.
* **The API consumes** through one durable pull consumer (``durable``, ``berth_api`` by
  default) shared by every API process: JetStream hands each message to one of them, and a
  message not acknowledged within ``ack_wait_s`` (its consumer died) to another.  A batch's
  events are applied one workload at a time in order, different workloads concurrently.  An event
  whose handler raised is negatively acknowledged with a delay (handed out again after
  ``redeliver_after_s``); a message that is not an event is logged, counted
  (:attr:`NatsEvents.rejected`) and terminated — never handed out again, never a crash.
  A fetch that fails (the server restarting) is retried after a pause, on a subscription made
  afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError

from berth.errors import BerthError, Unavailable
from berth.events.port import EVENT_MAX_AGE_S, EventHandler, WorkloadEvent
from berth.nats.names import Names
from berth.nats.streams import created, stream_replicas
from berth.nats.wire import body_of, encode_model, node_token

__all__ = ["API_CONSUMER", "DUPLICATE_WINDOW_S", "NatsEvents"]

log = logging.getLogger("berth.events")

API_CONSUMER = "berth_api"
"""The durable consumer every API process shares."""
DUPLICATE_WINDOW_S = 300.0
"""How long the stream remembers a message id, so a republished event is stored once."""


class NatsEvents:
    """An ``EventSink`` and an ``EventFeed`` on JetStream (see the module docstring)."""

    def __init__(
        self,
        client: Client,
        *,
        names: Names | None = None,
        durable: str = API_CONSUMER,
        max_age_s: float = EVENT_MAX_AGE_S,
        replicas: int | None = None,
        publish_timeout_s: float = 2.0,
        ack_wait_s: float = 30.0,
        redeliver_after_s: float = 1.0,
        batch: int = 64,
    ) -> None:
        self.client = client
        self.names = names or Names()
        self.stream = self.names.events_stream
        self.durable = durable
        self.max_age_s = max_age_s
        self.replicas = stream_replicas(client) if replicas is None else replicas
        """The stream's replicas when this creates it (default: :func:`stream_replicas`)."""
        self.publish_timeout_s = publish_timeout_s
        self.ack_wait_s = ack_wait_s
        self.redeliver_after_s = redeliver_after_s
        self.batch = batch
        self.rejected = 0
        """Messages that were not events (each logged and terminated)."""
        self._js = client.jetstream()

    def subject(self, node: str) -> str:
        """Where ``node`` publishes its events."""
        return f"{self.names.events_prefix}.{node_token(node)}"

    async def start(self) -> NatsEvents:
        """Create the stream, or use the one that exists (``Unavailable`` if neither)."""
        config = StreamConfig(
            name=self.stream,
            subjects=[f"{self.names.events_prefix}.>"],
            retention=RetentionPolicy.LIMITS,
            max_age=self.max_age_s,
            storage=StorageType.FILE,
            num_replicas=self.replicas,
            duplicate_window=DUPLICATE_WINDOW_S,
        )
        try:
            await created(lambda: self._js.add_stream(config), self.stream)
        except BadRequestError as error:  # it exists with other settings: they win
            log.info("stream %s exists with other settings (%s); using it", self.stream, error)
            try:
                await self._js.stream_info(self.stream)
            except (NatsError, NotFoundError) as missing:
                raise Unavailable(
                    f"cannot create or bind stream {self.stream}: {missing}"
                ) from None
        except (NatsError, TimeoutError) as error:
            raise Unavailable(f"cannot create stream {self.stream}: {error}") from None
        return self

    async def publish(self, event: WorkloadEvent) -> None:
        payload = encode_model("event", event)
        try:
            ack = await self._js.publish(
                self.subject(event.node),
                payload,
                timeout=self.publish_timeout_s,
                stream=self.stream,
                headers={"Nats-Msg-Id": event.key},
            )
        except (NatsError, TimeoutError) as error:
            raise Unavailable(
                f"event {event.key} not acknowledged by stream {self.stream}: "
                f"{error or type(error).__name__}"
            ) from None
        if ack.duplicate:
            log.debug("event %s was stored already", event.key)

    async def consume(self, handler: EventHandler) -> None:
        while True:
            try:
                subscription = await self._subscribe()
            except (NatsError, TimeoutError, Unavailable) as error:
                log.info("cannot consume stream %s yet: %s", self.stream, error)
                await asyncio.sleep(self.redeliver_after_s)
                continue
            try:
                await self._drain(subscription, handler)
            except (NatsError, TimeoutError) as error:
                log.info("consuming stream %s: %s; subscribing again", self.stream, error)
                await asyncio.sleep(self.redeliver_after_s)
            finally:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()

    async def _subscribe(self) -> Any:
        await self.start()  # a stream removed meanwhile is made again
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.ack_wait_s,
            max_deliver=-1,
            max_ack_pending=max(1000, self.batch * 4),
        )
        return await self._js.pull_subscribe(
            f"{self.names.events_prefix}.>", durable=self.durable, stream=self.stream, config=config
        )

    async def _drain(self, subscription: Any, handler: EventHandler) -> None:
        while True:
            try:
                messages = await subscription.fetch(self.batch, timeout=1.0)
            except NatsTimeout:
                continue  # nothing to take
            # one workload's events in order; different workloads' at once (a handler that
            # places a replacement must not hold up every other node's ends)
            lines: dict[str, list[tuple[Msg, WorkloadEvent]]] = {}
            for message in messages:
                event = await self._event(message)
                if event is not None:
                    lines.setdefault(f"{event.node}/{event.workload_id}", []).append(
                        (message, event)
                    )
            await asyncio.gather(*(self._handle(line, handler) for line in lines.values()))

    async def _event(self, message: Msg) -> WorkloadEvent | None:
        """The event ``message`` carries; ``None`` (logged, counted, terminated) if none."""
        try:
            body = body_of(message.data, "event", source=message.subject, bare=True)
            return WorkloadEvent.from_dict(body)
        except BerthError as error:
            self.rejected += 1
            log.warning("not a workload event on %s, dropped: %s", message.subject, error)
            with contextlib.suppress(Exception):
                await message.term()
            return None

    async def _handle(self, line: list[tuple[Msg, WorkloadEvent]], handler: EventHandler) -> None:
        for index, (message, event) in enumerate(line):
            try:
                await handler(event)
            except asyncio.CancelledError:
                for unhandled, _ in line[index:]:
                    with contextlib.suppress(Exception):
                        await unhandled.nak()
                raise
            except Exception as error:
                log.info("event %s not applied (%s); handed out again", event.key, error)
                for unhandled, _ in line[index:]:  # the rest after it, in order
                    with contextlib.suppress(Exception):
                        await unhandled.nak(delay=self.redeliver_after_s)
                return
            await message.ack()
