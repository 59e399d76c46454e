"""The node's side of admission over NATS: one agent's responder on its own subjects.

A :class:`NodeServer` answers ``berth.node.<node>.admit|bind|release|run|stop`` (and
``status``, ``logs``, ``running``, ``cordon``, ``uncordon``) by calling the agent's own
methods — ``admit``, ``bind``, ``release``, ``try_run``, ``stop_workload`` — the very ones the
in-process driver calls, so the network adds transport and nothing else.  Its table of
operations is the node protocol: each operation's request fields (``spec``, ``lease_ttl_s``,
``platforms``, ``reservation_id``, ``workload_id``, ``layers``, ``boot``; a ``stop`` may carry
``grace_s``,
seconds from ``SIGTERM`` to ``SIGKILL``, a finite number from 0 to
:data:`~berth.node.runtime.port.MAX_STOP_GRACE_S`, absent or null for the node's default;
a ``logs`` carries ``offset`` and ``limit``, the bytes of output to read; a ``run`` may carry
``workload_id``, a :data:`~berth.model.Name` the node boots it under —
idempotently, so a client whose answer was lost asks again), read by its decoder — into the
agent's :class:`~berth.boot.AdmitOrder` or :class:`~berth.boot.RunOrder` for an ``admit`` or a
``run`` — before its handler calls the agent; the envelope, the replies and the
malformed-request handling are :mod:`berth.nats.wire`'s.  It owns three things the agent
deliberately does not:

* **idempotent admission.**  A request that times out may still be delivered (docs/design.md §5),
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
  called.  A well-formed request whose order the node's own rules refuse (a ``lease_ttl_s``
  out of bounds, a layer listed twice) is answered ``invalid`` naming the field as the agent
  would answer it, without being counted.  A message without a reply subject is dropped:
  nobody could learn its outcome.

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
from typing import Any, NamedTuple

from nats.aio.client import Client
from nats.aio.msg import Msg

from berth.boot import LIMIT_RULE, OFFSET_RULE, AdmitOrder, BootSpec, RunOrder
from berth.errors import Invalid
from berth.model import NAME_RULE, Layer, Spec
from berth.nats.connection import settle
from berth.nats.wire import (
    IDEMPOTENCY_HEADER,
    NODE_REPLIES,
    PREFIX,
    MalformedMessage,
    Operation,
    Responder,
    field_of,
    model_of,
    no_fields,
    node_token,
    perform,
)
from berth.node.agent import Agent
from berth.node.runtime.port import checked_grace
from berth.nodeclient.agents import running_on
from berth.observability import tracing
from berth.ownership import Admission, refused_by
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
        self.answered = 0
        self._responder = Responder(NODE_REPLIES, log, failed=f"node {agent.name} failed to answer")
        self._operations: dict[str, Operation[Any]] = {
            "admit": Operation(_read_admit, self._admit),
            "bind": Operation(_read_bind, self._bind),
            "release": Operation(_reservation_id, self._release),
            "run": Operation(_read_run, self._run),
            "stop": Operation(_read_stop, self._stop),
            "status": Operation(_workload_id, self._status),
            "logs": Operation(_read_logs, self._logs),
            "running": Operation(no_fields, self._running),
            "cordon": Operation(no_fields, self._cordon),
            "uncordon": Operation(no_fields, self._uncordon),
        }
        """The node protocol: operation → its request's decoder and its handler."""
        self._admitted: OrderedDict[str, Admission] = OrderedDict()
        self._subscription: Any = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def rejected(self) -> int:
        """Requests refused as malformed, and messages without a reply subject (each logged)."""
        return self._responder.rejected

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
        if operation in _OWN_TASK:
            task = asyncio.create_task(self._answer(msg, operation))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            await self._answer(msg, operation)

    async def _answer(self, msg: Msg, operation: str) -> None:
        if self._responder.unanswerable(msg):
            return
        reply = await self._responder.reply(
            msg, lambda document: self._perform(operation, document, msg)
        )
        self.answered += 1
        with contextlib.suppress(Exception):  # the asker may be gone; it has its timeout
            await msg.respond(reply)

    async def _perform(self, operation: str, document: dict[str, Any], msg: Msg) -> Any:
        # the scheduler's trace continues here (its context is in the message's headers)
        name = (
            f"berth.node.{operation}"
            if operation.isalpha() and len(operation) <= 16
            else "berth.node.unknown"
        )
        attributes = {"berth.node": self.agent.name}
        with refused_by(self.agent.name), tracing.server_span(name, msg.headers, attributes):
            return await perform(self._operations, operation, document, msg)

    # -- the operations ----------------------------------------------------------------------
    async def _admit(self, request: _Admit) -> dict[str, Any]:
        key = request.key
        admission = self._admitted.get(key) if key else None
        if admission is None:
            admission = self.agent.admit(request.order)
            if key:
                self._admitted[key] = admission
                while len(self._admitted) > self.idempotency_capacity:
                    self._admitted.popitem(last=False)
        else:
            log.info("node %s: admit retried with key %s: %s", self.agent.name, key, admission)
        return {"reservation_id": admission.reservation_id, "seq": admission.seq}

    async def _bind(self, request: tuple[str, str | None]) -> None:
        reservation_id, workload_id = request
        if workload_id is None:
            self.agent.bind(reservation_id, HeldUntilReleased())
        else:
            self.agent.bind(reservation_id, workload_id)

    async def _release(self, reservation_id: str) -> bool:
        return self.agent.release(reservation_id)

    async def _run(self, order: RunOrder) -> str:
        workload = await self.agent.try_run(order)
        return workload.id

    async def _stop(self, request: tuple[str, float | None]) -> None:
        workload_id, grace_s = request
        await self.agent.stop_workload(workload_id, grace_s=grace_s)

    async def _status(self, workload_id: str) -> dict[str, Any]:
        return self.agent.status(workload_id).to_dict()

    async def _logs(self, request: tuple[str, int, int]) -> dict[str, Any]:
        workload_id, offset, limit = request
        logs = await asyncio.to_thread(self.agent.logs, workload_id, offset, limit)
        return logs.model_dump()

    async def _running(self, _: None) -> list[str]:
        return list(running_on(self.agent))

    async def _cordon(self, _: None) -> bool:
        return self.agent.cordon(True)

    async def _uncordon(self, _: None) -> bool:
        return self.agent.cordon(False)


_OWN_TASK = frozenset({"run", "stop"})
"""Operations answered from their own task: a boot or a stop may take long."""


# -- the requests: each operation's fields, read in order (the first wrong one is named) ----
class _Admit(NamedTuple):
    order: AdmitOrder
    key: str | None


def _read_admit(document: dict[str, Any], msg: Msg) -> _Admit:
    source = msg.subject
    spec = model_of(Spec, document, "spec", source=source)
    lease_ttl_s = field_of(document, "lease_ttl_s", (int, float), source=source)
    platforms = _platforms(document, source)
    key = (msg.headers or {}).get(IDEMPOTENCY_HEADER)
    return _Admit(AdmitOrder(spec, float(lease_ttl_s), platforms), key)


def _read_bind(document: dict[str, Any], msg: Msg) -> tuple[str, str | None]:
    return _reservation_id(document, msg), _optional_str(document, "workload_id", msg.subject)


def _reservation_id(document: dict[str, Any], msg: Msg) -> str:
    reservation_id: str = field_of(document, "reservation_id", str, source=msg.subject)
    return reservation_id


def _workload_id(document: dict[str, Any], msg: Msg) -> str:
    workload_id: str = field_of(document, "workload_id", str, source=msg.subject)
    return workload_id


def _read_run(document: dict[str, Any], msg: Msg) -> RunOrder:
    source = msg.subject
    spec = model_of(Spec, document, "spec", source=source)
    layers = _layers(document, source)
    boot = model_of(BootSpec, document, "boot", source=source)
    platforms = _platforms(document, source)
    reservation = _optional_str(document, "reservation_id", source)
    workload_id = _optional_name(document, "workload_id", source)
    return RunOrder(spec, layers, boot, platforms, reservation=reservation, workload_id=workload_id)


def _read_stop(document: dict[str, Any], msg: Msg) -> tuple[str, float | None]:
    workload_id = _workload_id(document, msg)
    try:
        grace_s = checked_grace(document.get("grace_s"))
    except Invalid as error:
        raise MalformedMessage(error.message, source=msg.subject, field="grace_s") from None
    return workload_id, grace_s


def _read_logs(document: dict[str, Any], msg: Msg) -> tuple[str, int, int]:
    workload_id = _workload_id(document, msg)
    read: list[int] = []
    for name, rule in (("offset", OFFSET_RULE), ("limit", LIMIT_RULE)):
        try:
            read.append(rule(document.get(name), name))
        except Invalid as error:
            raise MalformedMessage(error.message, source=msg.subject, field=name) from None
    return workload_id, read[0], read[1]


def _optional_str(document: dict[str, Any], name: str, source: str) -> str | None:
    value = document.get(name)
    if value is not None and not isinstance(value, str):
        raise MalformedMessage(
            f"must be a string or null, got {value!r}", source=source, field=name
        )
    return value


def _optional_name(document: dict[str, Any], name: str, source: str) -> str | None:
    """``document[name]``: absent, null or a :data:`~berth.model.Name`."""
    value = document.get(name)
    if value is None:
        return None
    try:
        checked: str = NAME_RULE(value, name)
    except Invalid as error:
        raise MalformedMessage(error.message, source=source, field=name) from None
    return checked


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
