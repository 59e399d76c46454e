"""The placement port over NATS, the caller's side: ``schedule`` on the schedulers' queue group.

:class:`NatsScheduler` is a driver of the placement port (``schedule(request) -> Placement``)
that sends the request to whichever scheduler the queue group ``berth-schedulers`` picks
(:class:`~berth.scheduler.nats_server.SchedulerService`, the server side), and raises what
that scheduler raised — ``NoCapacity`` with every node's reason, ``NoMatchingPlatform``,
``Invalid`` — or ``Unavailable`` (no scheduler, or no answer in time: the outcome is then
unknown, and a reservation taken anyway is a lease that expires).  The request and its reply
are :mod:`berth.nats.wire`'s envelope; the errors its placement replies
(:data:`~berth.nats.wire.PLACEMENT_REPLIES`).

:meth:`NatsScheduler.census` asks every member of the group (``berth.scheduler.census``,
outside the queue group) and counts those that answer.  A caller's trace context travels in
each request's headers (a ``berth.client.<op>`` client span when tracing is on;
:mod:`berth.observability.tracing`), so the service's spans continue it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import KW_ONLY, dataclass
from typing import Any

import nats.errors
from nats.aio.client import Client

from berth.defaults import SCHEDULE_TIMEOUT_S
from berth.errors import BerthError, Invalid, Unavailable
from berth.model import Placement, Request
from berth.nats.connection import request
from berth.nats.names import SCHEDULER_PREFIX
from berth.nats.wire import PLACEMENT_REPLIES, BadReply, encode_request
from berth.observability import tracing

__all__ = ["NatsScheduler"]


@dataclass(eq=False, repr=False)
class NatsScheduler:
    """The placement port over NATS: ``schedule`` on whichever scheduler the queue group picks."""

    client: Client
    _: KW_ONLY
    prefix: str = SCHEDULER_PREFIX
    timeout_s: float = SCHEDULE_TIMEOUT_S

    async def schedule(self, request: Request) -> Placement:
        value = await self._call("schedule", {"request": request.model_dump(mode="json")})
        try:
            return Placement.from_dict(value)
        except Invalid as error:
            raise BadReply(f"a scheduler answered with a malformed placement: {error}") from None

    async def release(self, placement: Placement, *, workload: str | None = None) -> bool:
        """Release ``placement``'s reservation (and its route, when ``workload`` names it)."""
        document: dict[str, Any] = {"placement": placement.model_dump(mode="json")}
        if workload is not None:
            document["workload"] = workload
        return bool(await self._call("release", document))

    async def ping(self) -> int:
        """Whether a scheduler answers: how many nodes the one that answered sees."""
        value = await self._call("ping", {})
        nodes = value.get("nodes") if isinstance(value, dict) else None
        if not isinstance(nodes, int):
            raise BadReply(f"a scheduler answered ping with {value!r}")
        return nodes

    async def census(self, wait_s: float = 0.3) -> dict[str, tuple[str, ...]]:
        """Every scheduler that answers within ``wait_s``: its id → the nodes in its replica."""
        inbox = self.client.new_inbox()
        subscription = await self.client.subscribe(inbox)
        members: dict[str, tuple[str, ...]] = {}
        try:
            await self.client.publish(f"{self.prefix}.census", encode_request({}), reply=inbox)
            deadline = asyncio.get_running_loop().time() + wait_s
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                try:
                    msg = await subscription.next_msg(timeout=left)
                except nats.errors.TimeoutError:
                    break
                with contextlib.suppress(BerthError):
                    value = PLACEMENT_REPLIES.read(msg.data, source=inbox)
                    nodes = value.get("nodes") if isinstance(value, dict) else None
                    if isinstance(nodes, list) and all(isinstance(n, str) for n in nodes):
                        members[str(value.get("id"))] = tuple(nodes)
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        return members

    async def _call(self, operation: str, document: dict[str, Any]) -> Any:
        where = f"{self.prefix}.{operation}"
        payload = encode_request(document)
        # a CLIENT span; the trace context travels to the scheduler in the message's headers
        with tracing.span(f"berth.client.{operation}", tracing.SpanKind.CLIENT):
            try:
                reply = await request(
                    self.client, where, payload, self.timeout_s, headers=tracing.headers()
                )
            except nats.errors.NoRespondersError:
                raise Unavailable(f"no scheduler answers {where}") from None
            except nats.errors.TimeoutError:
                raise Unavailable(
                    f"no scheduler answered {operation} within {self.timeout_s:g}s "
                    "(outcome unknown)"
                ) from None
            except nats.errors.Error as error:
                raise Unavailable(f"cannot reach the schedulers: {error}") from None
            return PLACEMENT_REPLIES.read(reply.data, source=where)
