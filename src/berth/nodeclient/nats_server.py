"""The node's side of admission over NATS: one agent's responder on its own subjects.

A :class:`NodeServer` answers ``berth.node.<node>.admit|bind|release|run|stop`` (and
``status``, ``cordon``, ``uncordon``)
(:mod:`berth.nats.wire`) by calling the agent's own methods — ``admit``,
``bind``, ``release``, ``try_run``, ``stop_workload`` — the very ones the in-process driver
calls, so the network adds transport and nothing else.  It owns three things the agent
deliberately does not:

* **idempotent admission.**  A request that times out may still be delivered (DESIGN.md §5),
  so a client retries an ``admit`` with the same idempotency key, and the server answers a
  key it has seen with the admission it took the first time instead of reserving twice.  The
  key map is bounded (``idempotency_capacity`` keys, oldest forgotten first); a retry arriving
  after its key was forgotten reserves again, and the orphan ends with its lease.
* **remote owners.**  A scheduler that binds a reservation to an owner *object* in its own
  process cannot hand that object over the network; the server binds the reservation to a
  :class:`HeldUntilReleased` owner instead, and the client releases the reservation when its
  owner ends.  Such a reservation lives until that release — if the scheduler's process dies
  first, nothing releases it; bind to a workload id (the normal case) whenever there is one.
* **bad requests.**  A request that is not a berth request — unreadable, another version, a
  field of the wrong type, an invalid spec — is answered ``invalid`` naming the field, logged
  on ``berth.nodeclient.nats`` and counted (:attr:`NodeServer.rejected`); the agent is not
  called.  A message without a reply subject is dropped: nobody could learn its outcome.

``admit``, ``bind`` and ``release`` are answered in arrival order, one at a time (they are
quick and synchronous on the agent); ``run`` and ``stop`` boot or stop a workload, so each is
answered from its own task and a slow boot never holds up admissions.

Each request continues the trace whose context its headers carry (a ``berth.node.<op>``
server span when tracing is on; :mod:`berth.observability.tracing`), so a node's admission
and boot join the placement that asked for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from berth.errors import Invalid
from berth.model import Layer, Spec
from berth.nats.connection import settle
from berth.nats.wire import (
    IDEMPOTENCY_HEADER,
    PREFIX,
    MalformedMessage,
    decode_request,
    error_reply,
    field_of,
    node_token,
    ok_reply,
)
from berth.node.agent import Agent
from berth.node.runtime.port import BootSpec, checked_grace
from berth.observability import tracing
from berth.ownership import Admission, Refused
from berth.platform import Platform

__all__ = ["HeldUntilReleased", "NodeServer"]

log = logging.getLogger("berth.nodeclient.nats")


class HeldUntilReleased:
    """The owner of a reservation bound to an owner object in another process: it never ends
    by itself; the remote client releases the reservation when its own owner ends."""

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None:
        """Never called back: the reservation ends by ``release``."""

    def __repr__(self) -> str:
        return "HeldUntilReleased()"


class NodeServer:
    """Serves one agent's admission on NATS (see the module docstring).

    ``async with NodeServer(client, agent):`` or ``start()``/``stop()``.
    """

    def __init__(
        self,
        client: Client,
        agent: Agent,
        *,
        prefix: str = PREFIX,
        idempotency_capacity: int = 4096,
    ) -> None:
        if idempotency_capacity < 1:
            raise Invalid(
                f"must be at least 1, got {idempotency_capacity}", field="idempotency_capacity"
            )
        self.client = client
        self.agent = agent
        self.prefix = prefix
        self.idempotency_capacity = idempotency_capacity
        self.rejected = 0
        """Requests refused as malformed (each one logged)."""
        self.answered = 0
        self._admitted: OrderedDict[str, Admission] = OrderedDict()
        self._subscription: Any = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def subjects(self) -> str:
        """The subjects this server answers (one wildcard subscription)."""
        return f"{self.prefix}.{node_token(self.agent.name)}.*"

    async def start(self) -> NodeServer:
        self._subscription = await self.client.subscribe(self.subjects, cb=self._on_request)
        await settle(self.client)  # subscribed on the server before anyone is told we are up
        return self

    async def stop(self) -> None:
        """Stop answering; requests already being answered finish first."""
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> NodeServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- dispatch ----------------------------------------------------------------------------
    async def _on_request(self, msg: Msg) -> None:
        operation = msg.subject.rsplit(".", 1)[-1]
        if operation in ("run", "stop"):
            task = asyncio.create_task(self._answer(msg, operation))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            await self._answer(msg, operation)

    async def _answer(self, msg: Msg, operation: str) -> None:
        source = msg.subject
        if not msg.reply:
            self.rejected += 1
            log.warning("ignored a message without a reply subject on %s", source)
            return
        try:
            document = decode_request(msg.data, source=source)
            # the scheduler's trace continues here (its context is in the message's headers)
            name = (
                f"berth.node.{operation}"
                if operation.isalpha() and len(operation) <= 16
                else "berth.node.unknown"
            )
            attributes = {"berth.node": self.agent.name}
            with tracing.server_span(name, msg.headers, attributes):
                value = await self._handle(operation, document, msg)
            reply = ok_reply(value)
        except MalformedMessage as error:
            self.rejected += 1
            log.warning("rejected: %s", error)
            reply = error_reply(error)
        except Refused as error:
            if error.node is None:
                error = Refused(error.reason, error.detail, node=self.agent.name)
            reply = error_reply(error)
        except Invalid as error:
            reply = error_reply(error)
        except Exception as error:
            log.exception("node %s failed to answer %s", self.agent.name, source)
            reply = error_reply(error)
        self.answered += 1
        with contextlib.suppress(Exception):  # the asker may be gone; it has its timeout
            await msg.respond(reply)

    async def _handle(self, operation: str, document: dict[str, Any], msg: Msg) -> Any:
        source = msg.subject
        if operation == "admit":
            return self._admit(document, msg)
        if operation == "bind":
            reservation_id = field_of(document, "reservation_id", str, source=source)
            workload_id = document.get("workload_id")
            if workload_id is None:
                self.agent.bind(reservation_id, HeldUntilReleased())
            elif isinstance(workload_id, str):
                self.agent.bind(reservation_id, workload_id)
            else:
                raise MalformedMessage(
                    f"must be a string or null, got {workload_id!r}",
                    source=source,
                    field="workload_id",
                )
            return None
        if operation == "release":
            return self.agent.release(field_of(document, "reservation_id", str, source=source))
        if operation == "run":
            spec = _spec(document, source)
            layers = _layers(document, source)
            boot = _model(BootSpec, document, "boot", source)
            platforms = _platforms(document, source)
            reservation = document.get("reservation_id")
            if reservation is not None and not isinstance(reservation, str):
                raise MalformedMessage(f"must be a string or null, got {reservation!r}",
                                       source=source, field="reservation_id")  # fmt: skip
            workload = await self.agent.try_run(
                spec, layers, boot, platforms, reservation=reservation
            )
            return workload.id
        if operation == "stop":
            workload_id = field_of(document, "workload_id", str, source=source)
            try:
                grace_s = checked_grace(document.get("grace_s"))
            except Invalid as error:
                raise MalformedMessage(error.message, source=source, field="grace_s") from None
            await self.agent.stop_workload(workload_id, grace_s=grace_s)
            return None
        if operation == "status":
            workload_id = field_of(document, "workload_id", str, source=source)
            return self.agent.status(workload_id).to_dict()
        if operation in ("cordon", "uncordon"):
            return self.agent.cordon(operation == "cordon")
        raise MalformedMessage(f"unknown operation {operation!r}", source=source)

    def _admit(self, document: dict[str, Any], msg: Msg) -> dict[str, Any]:
        source = msg.subject
        spec = _spec(document, source)
        lease_ttl_s = field_of(document, "lease_ttl_s", (int, float), source=source)
        platforms = _platforms(document, source)
        key = (msg.headers or {}).get(IDEMPOTENCY_HEADER)
        admission = self._admitted.get(key) if key else None
        if admission is None:
            admission = self.agent.admit(spec, float(lease_ttl_s), platforms)
            if key:
                self._admitted[key] = admission
                while len(self._admitted) > self.idempotency_capacity:
                    self._admitted.popitem(last=False)
        else:
            log.info("node %s: admit retried with key %s: %s", self.agent.name, key, admission)
        return {"reservation_id": admission.reservation_id, "seq": admission.seq}


def _model(kind: Any, document: dict[str, Any], name: str, source: str) -> Any:
    value = document.get(name)
    if not isinstance(value, dict):
        raise MalformedMessage(f"must be an object, got {value!r}", source=source, field=name)
    try:
        return kind.from_dict(value)
    except Invalid as error:
        field = f"{name}.{error.field}" if error.field else name
        raise MalformedMessage(error.message, source=source, field=field) from None


def _spec(document: dict[str, Any], source: str) -> Spec:
    spec: Spec = _model(Spec, document, "spec", source)
    return spec


def _platforms(document: dict[str, Any], source: str) -> tuple[Platform, ...]:
    values = document.get("platforms", [])
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise MalformedMessage(
            f"must be a list of strings, got {values!r}", source=source, field="platforms"
        )
    try:
        return tuple(Platform.parse(value, field="platforms") for value in values)
    except Invalid as error:
        raise MalformedMessage(error.message, source=source, field="platforms") from None


def _layers(document: dict[str, Any], source: str) -> tuple[Layer, ...]:
    values = document.get("layers", [])
    if not isinstance(values, list):
        raise MalformedMessage(f"must be a list, got {values!r}", source=source, field="layers")
    layers = []
    for index, value in enumerate(values):
        try:
            layers.append(Layer.from_dict(value))
        except Invalid as error:
            raise MalformedMessage(error.message, source=source, field=f"layers.{index}") from None
    return tuple(layers)
