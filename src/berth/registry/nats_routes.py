"""The routing registry on NATS: which node holds each workload, in a second KV bucket.

The NATS driver of :class:`~berth.registry.port.RouteRegistry` (the port and its in-process
driver, :class:`~berth.registry.memory.MemoryRoutes`, are beside it): Hyper's cluster-wide
routing registry on NATS, one key per placed workload in bucket ``berth_routes``, valued with
the node, the reservation and the spec (:class:`~berth.registry.port.Route`, encoded with
the wire's ``"v"``, :data:`~berth.nats.wire.SCHEMA_VERSION`).  Its life follows the
reservation it indexes:

* **written** by the scheduler that confirmed the placement
  (:class:`~berth.scheduler.nats.SchedulerService`);
* **removed** when the workload ends — released through a scheduler, or noticed by the node
  that held it (:class:`~berth.nodeclient.nats_node.NodeService` drops the routes of reservations
  its budget no longer holds, on every heartbeat, and all of its own routes when it starts:
  a fresh agent holds nothing);
* **purged** for a node that leaves the cluster (expired or shut down): every scheduler
  purges the node's routes when the node leaves its replica;
* **rewritten** by the node itself when it comes back from a silence and still holds their
  reservations (:meth:`NatsRoutes.restore`: exactly as they were, and only where the bucket
  holds nothing for the key, so neither a newer route nor a deliberate delete is undone).

**Every scheduler follows the registry** (:meth:`NatsRoutes.follow`, an ordered consumer
of the bucket like the state store's watch): a route carries its function's identity
(``namespace``, ``name``), so each scheduler counts the replicas the others placed as soon as
their routes land (:class:`~berth.scheduler.nats.RouteReplicas`), which is what a spread
judges.  The function fields were added to version 1 of the record as optional fields: a
reader that predates them ignores them, and a route without them (written by an older
scheduler) is still a route, only not counted for spreading.  A field that is present must be
valid (a name, both or neither); otherwise the whole value is malformed, logged and skipped.

Keys are ``<node>.<workload>`` (both escaped as subject tokens,
:func:`~berth.nats.wire.node_token`), so one node's routes are one subject filter — a single
purge, and a NATS permission can confine an agent to its own.  :meth:`NatsRoutes.whereis`
finds a workload by the filter ``*.<workload>``; :meth:`NatsRoutes.list` reads them all
(or one node's).  Both read the server, not a replica: they are operator queries, not the
placement hot path.  A value that is not a berth route is logged and skipped
(:class:`~berth.nats.wire.MalformedMessage`), never returned.

The registry is an index, not the truth: the node's reservation is.  A route can outlive
its workload by up to a heartbeat (until the node notices), or be missing if the scheduler
died between confirming and recording.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import secrets
import time
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig
from nats.js.errors import APIError, BadRequestError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from berth.defaults import FOLLOW_IDLE_HEARTBEAT_S, FOLLOW_SYNC_TIMEOUT_S
from berth.errors import Invalid, Unavailable
from berth.model import NAME_RULE, Placement, Spec
from berth.nats.names import ROUTES_BUCKET
from berth.nats.streams import created, stream_replicas
from berth.nats.wire import (
    KV_OPERATION,
    MARKER_REASON,
    SCHEMA_VERSION,
    MalformedMessage,
    decode_document,
    encode,
    node_token,
)
from berth.registry.nats import WRONG_LAST_SEQUENCE, BucketWatch
from berth.registry.port import Route, RouteEvent, RouteListener

__all__ = [
    "NatsRouteWatch",
    "NatsRoutes",
    "decode_route",
    "encode_route",
    "route_document",
    "route_of",
]

log = logging.getLogger("berth.registry.routes")

READ_BATCH = 256
"""How many routes one fetch of a read asks for."""
READ_CONSUMER_IDLE_S = 30.0
"""How long the server keeps a read's consumer whose reader died without deleting it."""


def route_document(route: Route) -> dict[str, Any]:
    """``route`` as the JSON document the bucket stores (and a node's own copy of its routes,
    :mod:`berth.nodeclient.nats_node`, keeps)."""
    document: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "workload": route.workload,
        "node": route.node,
        "reservation_id": route.reservation_id,
        "spec": None if route.spec is None else route.spec.model_dump(mode="json"),
        "placed_at": route.placed_at,
    }
    if route.function is not None:
        document["namespace"], document["name"] = route.function
    return document


def encode_route(route: Route) -> bytes:
    """``route`` as the bucket stores it: the wire's envelope of its fields."""
    return encode(route_document(route))


def decode_route(data: bytes, *, source: str) -> Route:
    """A stored route; :class:`MalformedMessage` when it is not one."""
    return route_of(decode_document(data, source=source), source=source)


def route_of(document: object, *, source: str) -> Route:
    """The route a decoded JSON document holds; :class:`MalformedMessage` when it is not one."""
    if not isinstance(document, dict) or document.get("v") != SCHEMA_VERSION:
        raise MalformedMessage(
            f"not a berth route (version {SCHEMA_VERSION})", source=source, field="v"
        )
    workload, node = document.get("workload"), document.get("node")
    reservation_id, placed_at = document.get("reservation_id"), document.get("placed_at", 0.0)
    if not isinstance(workload, str) or not workload:
        raise MalformedMessage(f"bad workload {workload!r}", source=source, field="workload")
    if not isinstance(node, str) or not node:
        raise MalformedMessage(f"bad node {node!r}", source=source, field="node")
    if reservation_id is not None and not isinstance(reservation_id, str):
        raise MalformedMessage("bad reservation_id", source=source, field="reservation_id")
    if isinstance(placed_at, bool) or not isinstance(placed_at, int | float):
        raise MalformedMessage("bad placed_at", source=source, field="placed_at")
    spec = None
    if document.get("spec") is not None:
        try:
            spec = Spec.from_dict(document["spec"])
        except Invalid as error:
            raise MalformedMessage(error.message, source=source, field="spec") from None
    namespace, name = document.get("namespace"), document.get("name")
    if (namespace is None) != (name is None):
        missing = "name" if name is None else "namespace"
        raise MalformedMessage(
            "a route names its function by namespace and name, both or neither",
            source=source,
            field=missing,
        )
    if namespace is not None:
        for field, value in (("namespace", namespace), ("name", name)):
            try:
                NAME_RULE(value, field)
            except Invalid as error:
                raise MalformedMessage(error.message, source=source, field=field) from None
    return Route(workload, node, reservation_id, spec, float(placed_at), namespace, name)


class NatsRoutes:
    """The routing registry on a JetStream KV bucket (see the module docstring)."""

    def __init__(self, client: Client, *, bucket: str = ROUTES_BUCKET) -> None:
        self.client = client
        self.bucket = bucket
        self._js: JetStreamContext = client.jetstream()
        self._kv: KeyValue | None = None
        self._prefix = f"$KV.{bucket}."

    async def start(self) -> NatsRoutes:
        try:
            config = KeyValueConfig(bucket=self.bucket, replicas=stream_replicas(self.client))
            self._kv = await created(lambda: self._js.create_key_value(config), self.bucket)
        except BadRequestError:  # it exists with other settings: use it as it is
            self._kv = await self._js.key_value(self.bucket)
        return self

    def _bucket(self) -> KeyValue:
        if self._kv is None:
            raise Unavailable("the routing registry is not started")
        return self._kv

    @staticmethod
    def key(workload: str, node: str) -> str:
        return f"{node_token(node)}.{node_token(workload)}"

    async def record(
        self,
        workload: str,
        placement: Placement,
        spec: Spec | None = None,
        *,
        function: tuple[str, str] | None = None,
    ) -> int:
        """``workload`` now runs on ``placement.worker_node`` under its reservation, a replica
        of ``function`` (``(namespace, name)``) when given; the route's revision (the bucket's
        sequence number: a later put has a higher one)."""
        route = Route.placed(workload, placement, spec, time.time(), function)
        return await self._bucket().put(self.key(workload, route.node), encode_route(route))

    async def restore(self, route: Route) -> int | None:
        """Store ``route`` exactly as it is (its reservation, spec, function and
        ``placed_at``) where the bucket holds nothing under its key — the key was never
        written, or was purged with its node's routes; its revision, or ``None`` when the key
        holds a route or a delete (a route stored meanwhile is never overwritten, a route
        removed on purpose never revived).  One compare-and-set: the write expects the key's
        last revision to be 0.  What a node does for its own routes after a lapse."""
        try:
            return await self._bucket().update(
                self.key(route.workload, route.node), encode_route(route), last=0
            )
        except KeyWrongLastSequenceError:
            return None

    async def remove(self, workload: str, node: str, *, revision: int | None = None) -> None:
        """The workload ended (idempotent).  With ``revision`` (from :meth:`on_node`), only
        while the route is still that revision: one stored again since stays."""
        try:
            await self._bucket().delete(self.key(workload, node), last=revision)
        except APIError as error:
            if revision is None or error.err_code not in WRONG_LAST_SEQUENCE:
                raise

    async def whereis(self, workload: str) -> Route | None:
        """The route of ``workload``, or ``None`` if it is not placed."""
        read = await self._read(f"*.{node_token(workload)}")
        routes = [route for _, route in read if route.workload == workload]
        return max(routes, key=lambda route: route.placed_at) if routes else None

    async def list(self, node: str | None = None) -> builtins.list[Route]:
        """Every route (of ``node`` when given), by workload."""
        pattern = ">" if node is None else f"{node_token(node)}.>"
        routes = [route for _, route in await self._read(pattern)]
        return sorted(routes, key=lambda route: (route.workload, route.node))

    async def on_node(self, node: str) -> builtins.list[tuple[int, Route]]:
        """Every route of ``node`` with its revision, read from the server (not a watch's
        copy): a route stored before this call began is in it."""
        return await self._read(f"{node_token(node)}.>")

    async def entries(self) -> builtins.list[tuple[int, Route]]:
        """Every route with its revision, read from the server (one consumer, as
        :meth:`list`)."""
        return await self._read(">")

    async def repair(self, route: Route) -> int | None:
        """Store ``route`` where its key holds no route — never written, purged, or deleted
        (a KV *create*: over a delete marker it expects that marker's revision); ``None``
        when a route is stored, now or by a writer that came first.  Unlike :meth:`restore`
        (a node's own copy, which must not revive a route removed on purpose) this writes
        over a delete: the reconciler's caller has just seen the record ``running`` and its
        node running it."""
        try:
            return await self._bucket().create(
                self.key(route.workload, route.node), encode_route(route)
            )
        except KeyWrongLastSequenceError:
            return None

    async def clear_node(self, node: str) -> int:
        """Remove every route of ``node`` key by key (what a node's own user may do)."""
        routes = await self.list(node)
        for route in routes:
            await self.remove(route.workload, node)
        return len(routes)

    async def purge_node(self, node: str) -> int:
        """Remove every route of ``node`` (it left the cluster) in one stream purge; how many
        there were.  Schedulers do this; a node's own user clears its routes key by key."""
        routes = await self.list(node)
        if routes:
            await self._js.purge_stream(
                f"KV_{self.bucket}", subject=f"{self._prefix}{node_token(node)}.>"
            )
        return len(routes)

    async def follow(
        self,
        listener: RouteListener,
        *,
        idle_heartbeat_s: float = FOLLOW_IDLE_HEARTBEAT_S,
        sync_timeout_s: float = FOLLOW_SYNC_TIMEOUT_S,
    ) -> NatsRouteWatch:
        """Call ``listener`` with every route in the bucket, then with every change as it
        lands; returns once the routes stored now were delivered (or ``sync_timeout_s``
        passed: logged, the watch goes on).  Stop it with :meth:`NatsRouteWatch.stop`.

        An ordered consumer with a short idle heartbeat, as the state store's watch: after a
        server restart nats-py resumes it from the last message it saw.  A stream purge
        (:meth:`purge_node`) is not delivered — the node left, and every follower learns
        that from the state store instead.
        """
        return await NatsRouteWatch(self, listener).start(idle_heartbeat_s, sync_timeout_s)

    async def _read(self, pattern: str) -> builtins.list[tuple[int, Route]]:
        """The last value of every key matching ``pattern``, with its revision.

        Read through a pull consumer of its own (random) name, filtered to the pattern,
        rather than a KV watch: creating a *named* consumer puts its filter in the request's
        subject (``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``), which is what lets a
        node's NATS permissions confine its reads to its own keys (:mod:`berth.nats.auth`,
        security finding 5); a watch's unnamed consumer would need the whole stream."""
        stream, name = f"KV_{self.bucket}", f"berth_read_{secrets.token_hex(8)}"
        config = ConsumerConfig(
            name=name,
            filter_subject=f"{self._prefix}{pattern}",
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=READ_CONSUMER_IDLE_S,  # removed by the server if we die
            mem_storage=True,
            num_replicas=1,
        )
        info = await self._js.add_consumer(stream, config=config)
        routes: builtins.list[tuple[int, Route]] = []
        try:
            remaining = info.num_pending or 0
            subscription = await self._js.pull_subscribe_bind(consumer=name, stream=stream)
            try:
                while remaining > 0:
                    try:
                        batch = await subscription.fetch(min(remaining, READ_BATCH), timeout=5.0)
                    except nats.errors.TimeoutError:  # purged since it was counted: no more
                        break
                    for message in batch:
                        remaining = message.metadata.num_pending
                        route = self._route_of(message)
                        if route is not None:
                            routes.append((message.metadata.sequence.stream, route))
            finally:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()
        finally:
            with contextlib.suppress(Exception):
                await self._js.delete_consumer(stream, name)
        return routes

    def _route_of(self, message: Msg) -> Route | None:
        """The route a stored message holds; ``None`` for a delete or purge marker, or a
        value that is not a route (logged)."""
        headers = message.headers or {}
        if KV_OPERATION in headers or MARKER_REASON in headers or not message.data:
            return None
        try:
            return decode_route(message.data, source=message.subject)
        except MalformedMessage as error:
            log.warning("ignored: %s", error)
            return None


class NatsRouteWatch(BucketWatch):
    """A running :meth:`NatsRoutes.follow`; ``rejected`` counts malformed values skipped.

    It delivers in the bucket's order, so once it has delivered revision ``r``
    (:meth:`reached`) every change stored before ``r`` has reached its listener too.
    """

    def __init__(self, registry: NatsRoutes, listener: RouteListener) -> None:
        what = f"the watch of routes bucket {registry.bucket}"
        super().__init__(
            registry.client, registry.bucket, f"{registry._prefix}>", self._handle, what
        )
        self.registry = registry
        self.listener = listener
        self.rejected = 0
        self.seen = 0
        """The highest revision delivered so far."""
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    async def reached(self, revision: int, timeout_s: float) -> bool:
        """Wait until the watch has delivered ``revision``; False if ``timeout_s`` passed."""
        if self.seen >= revision:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (revision, waiter)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            return False
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
        return True

    def _advance(self, revision: int) -> None:
        if revision <= self.seen:
            return
        self.seen = revision
        if self._waiters:
            for entry in [entry for entry in self._waiters if entry[0] <= revision]:
                self._waiters.remove(entry)
                if not entry[1].done():
                    entry[1].set_result(None)

    async def start(self, idle_heartbeat_s: float, sync_timeout_s: float) -> NatsRouteWatch:
        registry = self.registry
        registry._bucket()  # started?
        await self._follow_keys(idle_heartbeat_s, sync_timeout_s)
        return self

    def _handle(self, msg: Msg) -> None:
        revision = _revision(msg)
        event = self._event(msg, revision)
        if event is not None:
            try:
                self.listener(event)
            except Exception:
                log.exception("a route listener failed on %s of %s", event.kind, event.key)
        self._advance(revision)

    def _event(self, msg: Msg, revision: int) -> RouteEvent | None:
        key = msg.subject[len(self.registry._prefix) :]
        headers = msg.headers or {}
        if KV_OPERATION in headers or MARKER_REASON in headers:
            return RouteEvent("delete", key, None, revision)
        try:
            route = decode_route(msg.data, source=msg.subject)
        except MalformedMessage as error:
            self.rejected += 1
            log.warning("ignored: %s", error)
            return None
        if key != NatsRoutes.key(route.workload, route.node):
            self.rejected += 1
            log.warning(
                "ignored: %s holds a route of %r on %r, which belongs under another key",
                msg.subject,
                route.workload,
                route.node,
            )
            return None
        return RouteEvent("put", key, route, revision)


def _revision(msg: Msg) -> int:
    try:
        return int(msg.metadata.sequence.stream)
    except Exception:  # not a JetStream message: no revision to follow
        return 0
