"""The node-client driver over NATS request/reply: a scheduler confirming on remote nodes.

:class:`NatsNodes` implements :class:`~berth.nodeclient.port.AgentClient` by sending each
call to the node's own subject (``berth.node.<node>.<op>``, :mod:`~berth.nats.wire`)
where that node's :class:`~berth.nodeclient.nats_server.NodeServer` answers from its agent.

Failures are typed, so a scheduler's walk knows what to do with each:

* no agent subscribed to the node's subjects (``NoRespondersError``), a closed or
  reconnecting connection → ``Unavailable`` at once;
* no answer in time → ``Unavailable`` too, but the outcome is *unknown*: a timed-out request
  can still be delivered later.  So every ``admit`` carries an idempotency key and is retried
  with the same key (``admit_attempts``): the node answers a retry with the reservation it
  already took.  If no attempt is answered the walk moves on, and a reservation the node took
  anyway is an unbound lease that expires;
* the node's ``Refused`` and ``Invalid`` arrive as themselves (the node named in every
  refusal); a reply that is not a berth reply is :class:`~berth.nats.wire.BadReply`.

A call that is malformed on its face is ``Invalid`` before anything is sent: an order
(``lease_ttl_s`` not an interval the node accepts, a ``workload_id`` that is not a name …) when
it is made (:class:`~berth.boot.AdmitOrder`, :class:`~berth.boot.RunOrder`, by the node's own
rules), a stop's ``grace_s`` out of bounds when it is asked.

Binding to an owner *object* (in-process code, the contract suite) cannot send the object:
the node holds the reservation until told, and this client releases it when the owner ends —
before its next call to that node, so the release is never overtaken (see
:class:`~berth.nodeclient.nats_server.HeldUntilReleased`).  Bind to workload ids where the
workload runs on the node.

Every request carries the current trace context in its headers, under a
``berth.nodeclient.<op>`` client span when tracing is on (:mod:`berth.observability.tracing`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from dataclasses import KW_ONLY, dataclass
from typing import Any

import nats.errors
from nats.aio.client import Client

from berth.boot import (
    LIMIT_RULE,
    OFFSET_RULE,
    AdmitOrder,
    RunOrder,
    WorkloadLogs,
    WorkloadStatus,
)
from berth.defaults import LOG_CHUNK_BYTES, RUN_TIMEOUT_S
from berth.errors import Invalid, Unavailable
from berth.loops import call_on
from berth.nats.connection import request
from berth.nats.wire import (
    IDEMPOTENCY_HEADER,
    NODE_REPLIES,
    PREFIX,
    BadReply,
    encode_request,
    subject,
)
from berth.node.runtime.port import checked_grace
from berth.observability import tracing
from berth.ownership import Admission, Owner, Refused, refused_by
from berth.validation import shown

__all__ = ["NatsNodes"]

log = logging.getLogger("berth.nodeclient.nats")


class _TimedOut(Unavailable):
    """No answer in time: the outcome is unknown."""


@dataclass(eq=False, repr=False)
class NatsNodes:
    """``AgentClient`` over NATS (see the module docstring)."""

    client: Client
    _: KW_ONLY
    prefix: str = PREFIX
    timeout_s: float = 2.0
    run_timeout_s: float = RUN_TIMEOUT_S
    admit_attempts: int = 2

    def __post_init__(self) -> None:
        if self.admit_attempts < 1:
            raise Invalid(f"must be at least 1, got {self.admit_attempts}", field="admit_attempts")
        self._lock = threading.Lock()
        self._ended: dict[str, list[str]] = {}  # node → reservations whose owner ended
        self._flushing: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the port ----------------------------------------------------------------------------
    async def admit(self, node: str, order: AdmitOrder) -> Admission:
        document = {
            "spec": order.spec.model_dump(mode="json"),
            "lease_ttl_s": order.lease_ttl_s,
            "platforms": [str(platform) for platform in order.platforms],
        }
        headers = {IDEMPOTENCY_HEADER: uuid.uuid4().hex}
        for attempt in range(1, self.admit_attempts + 1):
            try:
                value = await self._call(node, "admit", document, headers=headers)
                break
            except _TimedOut:
                if attempt == self.admit_attempts:
                    raise
                log.info("admit on %s timed out; retrying with the same key", node)
        try:
            return Admission(reservation_id=str(value["reservation_id"]), seq=int(value["seq"]))
        except (TypeError, KeyError, ValueError):
            raise BadReply(f"node {node} answered admit with {value!r}") from None

    async def bind(self, node: str, reservation_id: str, owner: Owner | str) -> None:
        workload_id = owner if isinstance(owner, str) else None
        document = {"reservation_id": reservation_id, "workload_id": workload_id}
        await self._call(node, "bind", document)
        if not isinstance(owner, str):
            owner.add_done_callback(lambda _: self._owner_ended(node, reservation_id))

    async def release(self, node: str, reservation_id: str) -> bool:
        document = {"reservation_id": reservation_id}
        return bool(await self._call(node, "release", document))

    async def try_run(self, node: str, order: RunOrder) -> str:
        document = {
            "spec": order.spec.model_dump(mode="json"),
            "layers": [layer.model_dump(mode="json") for layer in order.layers],
            "boot": order.boot.model_dump(mode="json"),
            "platforms": [str(platform) for platform in order.platforms],
            "reservation_id": order.reservation,
            "workload_id": order.workload_id,
        }
        value = await self._call(node, "run", document, timeout_s=self.run_timeout_s)
        if not isinstance(value, str):
            raise BadReply(f"node {node} answered run with {value!r}")
        return value

    async def stop(self, node: str, workload_id: str, *, grace_s: float | None = None) -> None:
        grace = checked_grace(grace_s)
        document: dict[str, Any] = {"workload_id": workload_id}
        if grace is not None:
            document["grace_s"] = grace
        # the node answers once the workload has ended: give it its grace on top
        timeout = self.run_timeout_s + (grace or 0.0)
        await self._call(node, "stop", document, timeout_s=timeout)

    async def status(self, node: str, workload_id: str) -> WorkloadStatus:
        document = {"workload_id": workload_id}
        value = await self._call(node, "status", document)
        try:
            return WorkloadStatus.from_dict(value)
        except Invalid as error:
            raise BadReply(f"node {node} answered status with {value!r}: {error}") from None

    async def logs(
        self, node: str, workload_id: str, offset: int = 0, limit: int = LOG_CHUNK_BYTES
    ) -> WorkloadLogs:
        document = {
            "workload_id": workload_id,
            "offset": OFFSET_RULE(offset, "offset"),
            "limit": LIMIT_RULE(limit, "limit"),
        }
        value = await self._call(node, "logs", document)
        try:
            return WorkloadLogs.from_dict(value)
        except Invalid as error:
            raise BadReply(f"node {node} answered logs with {shown(value)}: {error}") from None

    async def running(self, node: str) -> tuple[str, ...]:
        value = await self._call(node, "running", {})
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise BadReply(f"node {node} answered running with {shown(value)}: expected ids")
        return tuple(sorted(value))

    async def cordon(self, node: str) -> bool:
        return bool(await self._call(node, "cordon", {}))

    async def uncordon(self, node: str) -> bool:
        return bool(await self._call(node, "uncordon", {}))

    # -- transport ---------------------------------------------------------------------------
    async def _call(
        self,
        node: str,
        operation: str,
        document: dict[str, Any],
        *,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        self._loop = asyncio.get_running_loop()
        await self._settle_ended(node)
        return await self._request(node, operation, document, headers, timeout_s)

    async def _request(
        self,
        node: str,
        operation: str,
        document: dict[str, Any],
        headers: dict[str, str] | None,
        timeout_s: float | None,
    ) -> Any:
        where = subject(node, operation, self.prefix)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        # A CLIENT span per request; the trace context travels in the headers to the node.
        with tracing.span(
            f"berth.nodeclient.{operation}", tracing.SpanKind.CLIENT, {"berth.node": node}
        ):
            return await self._exchange(node, operation, where, document, headers, timeout)

    async def _exchange(
        self,
        node: str,
        operation: str,
        where: str,
        document: dict[str, Any],
        headers: dict[str, str] | None,
        timeout: float,
    ) -> Any:
        headers = tracing.headers(headers)
        try:
            payload = encode_request(document)
            reply = await request(self.client, where, payload, timeout, headers=headers)
        except nats.errors.NoRespondersError:
            raise Unavailable(f"node {node!r} is not reachable: no agent answers {where}") from None
        except nats.errors.TimeoutError:
            raise _TimedOut(
                f"node {node!r} did not answer {operation} within {timeout:g}s (outcome unknown)"
            ) from None
        except nats.errors.Error as error:
            raise Unavailable(f"node {node!r} is not reachable: {error}") from None
        with refused_by(node):  # a refusal without a node's name gets this one's
            return NODE_REPLIES.read(reply.data, source=where)

    # -- releases for owner objects that ended -----------------------------------------------
    def _owner_ended(self, node: str, reservation_id: str) -> None:
        with self._lock:
            self._ended.setdefault(node, []).append(reservation_id)
        call_on(self._loop, self._start_settling, node)  # the owner may end in another thread

    def _start_settling(self, node: str) -> None:
        if node not in self._flushing:
            task = asyncio.get_running_loop().create_task(self._settle_ended(node))
            self._flushing[node] = task
            task.add_done_callback(lambda _: self._flushing.pop(node, None))

    async def _settle_ended(self, node: str) -> None:
        """Send the releases owed to ``node`` (before anything else is sent to it)."""
        pending = self._flushing.get(node)
        if pending is not None and pending is not asyncio.current_task():
            await asyncio.shield(pending)
        while True:
            with self._lock:
                owed = self._ended.pop(node, None)
            if not owed:
                return
            for reservation_id in owed:
                document = {"reservation_id": reservation_id}
                try:
                    await self._request(node, "release", document, None, None)
                except (Unavailable, Refused, Invalid) as error:
                    log.warning(
                        "could not release %s on %s after its owner ended: %s",
                        reservation_id,
                        node,
                        error,
                    )
