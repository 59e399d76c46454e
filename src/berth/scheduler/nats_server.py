"""The placement port served over NATS, by any number of schedulers in one queue group.

A :class:`SchedulerService` answers ``berth.scheduler.schedule`` (and ``.release``,
``.ping``) in the queue group ``berth-schedulers``: NATS hands each request to one member, so
schedulers share the load and any one of them can die — its in-flight requests time out at
the caller, the others go on.  Each service wraps its own
:class:`~berth.scheduler.multinode.ClusterScheduler` with its own replica (a
:class:`~berth.store.nats.NatsStore` watch) and its own assume cache, and confirms on nodes
through :class:`~berth.nodeclient.nats.NatsNodes`; nothing is shared between schedulers but
the nodes' authority.  Every member also answers a *census* (``berth.scheduler.census``,
outside the queue group), so a caller can count the schedulers that are up.

Each operation is a row of the service's table (its request's decoder, its handler); the
envelope, the replies — :data:`~berth.nats.wire.PLACEMENT_REPLIES`: ``NoCapacity`` with every
node's reason, ``NoMatchingPlatform``, ``Invalid``, ``Unavailable`` — and the handling of
malformed requests are :mod:`berth.nats.wire`'s.  The caller's side is
:class:`~berth.scheduler.nats.NatsScheduler`.

**Shutdown is graceful** (:meth:`SchedulerService.stop`): the service leaves the queue group
first, so new requests go to the other members; requests in flight get ``grace_s`` to finish
and any still running after that are answered ``unavailable`` ("shutting down") rather than
left to time out.

On a confirmed placement the service records a route (:mod:`berth.registry.nats_routes`) when it
has a registry, and on ``release`` removes it; when a node leaves its replica (expired or
shut down) it purges that node's routes.  A node that only fell silent and comes back
writes its missing routes again itself (:mod:`berth.nodeclient.nats_node`), on every beat
while they are missing, so a purge that lands after its return costs a beat, not the routes;
the purge runs even then, because every follower forgot the node's replicas when it left
and only routes written again bring them back.  Registry failures are logged, never a
failed placement: the node's reservation is the truth, the route an index of it.

**A route write that fails is asked again in the background** (``ROUTE_RETRY_*``): while
one server of a three-server cluster is lost, the routes stream may have no leader for a
few seconds and every write fails at once.  The placement is answered without its route,
and the service writes the route again, 0.25 s doubling to 5 s, for up to
:data:`ROUTE_RETRY_FOR_S`, until it is stored — the node cannot write it for the scheduler
(it never read it).  A ``release`` through this service cancels the route's retry; a route
written late for a workload that ended meanwhile is removed by its node on its next beat,
as is any route whose reservation the node does not hold.  At most
:data:`MAX_ROUTE_RETRIES` routes wait at once (more are logged and dropped); a stopped
service drops its retries (the routes they carried are missing, as when a scheduler dies
between confirming and recording).

**Replicas are shared through the routes** (``share_replicas``, on by default with a
registry): a route names its function, and every service follows the registry
(:meth:`~berth.registry.port.RouteRegistry.follow`) into its scheduler's replica index
(:class:`RouteReplicas`), so a spread counts the replicas every scheduler placed, not only
its own.  A scheduler's own replica is keyed by its node and reservation from the moment the
node is asked; its route, when it comes back through the watch, names the same node and
reservation, so it is the same entry (now bound: it lives until its route goes), never a
second one.  A route deleted (released, or dropped by its node when the workload ended or its
lease expired) ends the replica; a node that leaves drops all of its replicas (its routes are
purged in one stream purge, which a watch does not see).

That leaves a window: between a scheduler asking a node and its route reaching the others (a
confirmation plus a KV round trip), two schedulers deciding for one function can pick the
same node.  For a *hard per-node* spread the service closes it after the fact: once its route
is stored it reads the node's routes from the server, and if a sibling's route has a lower
revision (stored first) it gives the node up — releases the lease, removes its route — and
places again, now counting the sibling.  Of two racing routes the later one always sees the
earlier (it was stored before the later read), so exactly one yields.  The read is the
service's own watch: it delivers in the bucket's order, so once it has brought back our own
route every earlier one has arrived too; only when the watch lags (2 s) is the server read.
It costs a wait for one watch round trip per placement under a hard per-node spread.  A
label (zone) spread is not re-checked: its rule depends on every node's count, and a race
can leave one zone a replica ahead.
``benchmarks/spread_nats.py`` measures both.

Traces cross the queue group: :class:`~berth.scheduler.nats.NatsScheduler` sends the
caller's trace context in the request's headers and the service continues it
(``berth.scheduler.<op>`` spans), passing it on to the nodes
(:mod:`berth.observability.tracing`).  A whole scheduler — its replica, its node client, this
service — is composed by :func:`berth.processes.scheduler.scheduler_service`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from berth.defaults import SHUTDOWN_GRACE_S
from berth.errors import Unavailable
from berth.model import Placement, Request
from berth.nats.connection import settle
from berth.nats.names import SCHEDULER_PREFIX
from berth.nats.streams import forbid_rollups
from berth.nats.wire import (
    PLACEMENT_REPLIES,
    Operation,
    Responder,
    field_of,
    model_of,
    no_fields,
    ok_reply,
    perform,
)
from berth.observability import tracing
from berth.ownership import Refused
from berth.registry.port import Route, RouteEvent, RouteRegistry, RouteWatch
from berth.scheduler.multinode import ClusterScheduler
from berth.scheduler.spread import Replicas
from berth.store.port import StateEvent, StateStore

__all__ = [
    "QUEUE",
    "RouteReplicas",
    "SchedulerService",
]

log = logging.getLogger("berth.scheduler.nats")  # the name it always had: log settings stay

QUEUE = "berth-schedulers"
MAX_RACE_RETRIES = 4
"""Times a placement under a hard per-node spread gives up a node it raced for."""
WATCH_WAIT_S = 2.0
"""How long a placement under a hard per-node spread waits for its own watch to bring back
its route before it reads the node's routes from the server."""
ROUTE_RETRY_FIRST_S = 0.25
"""The first wait before a failed route write is asked again (then doubled)."""
ROUTE_RETRY_MAX_S = 5.0
"""The longest wait between two attempts at one route write."""
ROUTE_RETRY_FOR_S = 300.0
"""How long a failed route write is asked again before it is given up (logged)."""
MAX_ROUTE_RETRIES = 10_000
"""Route writes that may wait for a retry at once."""


class RouteReplicas:
    """Feeds a replica index from the routing registry's changes (a route listener).

    A route with its function and reservation counts as a bound replica on its node
    (:meth:`Replicas.add`, idempotent per node and reservation: a scheduler's own placement
    is the entry it already holds).  Deletes carry only their key (``<node>.<workload>``),
    so the feed remembers the route each key counted (and its revision, for
    :meth:`earlier`), and ends that replica when the key is deleted or stored again with
    another reservation.  A route without a function (an older writer) or without a
    reservation is not counted.
    """

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas
        self._keys: dict[str, tuple[int, Route]] = {}  # route key → (revision, route) counted
        self._by_node: dict[str, set[str]] = {}

    def __len__(self) -> int:
        """Routes counted now."""
        return len(self._keys)

    def entries(self) -> list[tuple[int, Route]]:
        """Every route counted now with its revision: a watched copy of the registry's routes
        that name a function and a reservation (the reconciler's, instead of reading the
        bucket every pass — 5.4 s for 100,000 routes)."""
        return list(self._keys.values())

    def __call__(self, event: RouteEvent) -> None:
        route = event.route
        counted = None
        if route is not None and route.reservation_id is not None and route.function is not None:
            counted = route
        before = self._forget(event.key)
        if before is not None and (
            counted is None
            or (before.node, before.reservation_id) != (counted.node, counted.reservation_id)
        ):
            assert before.reservation_id is not None
            self.replicas.ended(before.node, before.reservation_id)
        if counted is not None:
            assert counted.function is not None and counted.reservation_id is not None
            self._keys[event.key] = (event.revision, counted)
            self._by_node.setdefault(counted.node, set()).add(event.key)
            self.replicas.add(counted.function, counted.node, counted.reservation_id, bound=True)

    def _forget(self, key: str) -> Route | None:
        known = self._keys.pop(key, None)
        if known is None:
            return None
        keys = self._by_node.get(known[1].node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_node[known[1].node]
        return known[1]

    def earlier(
        self, node: str, function: tuple[str, str], revision: int, reservation_id: str
    ) -> list[Route]:
        """The routes counted on ``node`` of ``function``, stored before ``revision``, other
        than ``reservation_id``'s."""
        found = []
        for key in self._by_node.get(node, ()):
            stored, route = self._keys[key]
            if (
                stored < revision
                and route.function == function
                and route.reservation_id != reservation_id
            ):
                found.append(route)
        return found

    def drop_node(self, node: str) -> None:
        """Forget the keys of a node that left (its replicas are dropped with it)."""
        for key in list(self._by_node.get(node, ())):
            route = self._forget(key)
            if route is not None and route.reservation_id is not None:
                self.replicas.ended(node, route.reservation_id)


class SchedulerService:
    """Serves one ``ClusterScheduler`` on NATS in the schedulers' queue group."""

    def __init__(
        self,
        client: Client,
        scheduler: ClusterScheduler,
        *,
        store: StateStore | None = None,
        routes: RouteRegistry | None = None,
        prefix: str = SCHEDULER_PREFIX,
        queue: str = QUEUE,
        max_in_flight: int = 512,
        share_replicas: bool = True,
        settle_races: bool = True,
    ) -> None:
        self.client = client
        self.scheduler = scheduler
        self.store = store
        self.routes = routes
        self.prefix = prefix
        self.queue = queue
        self.placed = 0
        self.yielded = 0
        """Nodes given up to a sibling another scheduler placed first (hard per-node spread)."""
        self._slots = asyncio.Semaphore(max_in_flight)
        self._subscriptions: list[Any] = []
        self._in_flight: dict[asyncio.Task[None], Msg] = {}
        self._unwatch: Any = None
        self._purges: set[asyncio.Task[None]] = set()
        self._route_retries: dict[tuple[str, str], asyncio.Task[None]] = {}
        """Route writes asked again in the background, by (workload, node)."""
        self._census: Any = None
        self.id = uuid.uuid4().hex[:12]
        """This member's name in a census (:meth:`NatsScheduler.census`)."""
        self.shared: RouteReplicas | None = None
        """The feed of every scheduler's routes into this one's replica index (``None``
        without a registry, or with ``share_replicas=False``)."""
        if routes is not None and share_replicas:
            self.shared = RouteReplicas(scheduler.replicas)
        self._route_watch: RouteWatch | None = None
        self.settle_races = settle_races
        """Re-check a hard per-node spread's node after recording (module docstring)."""
        self._responder = Responder(PLACEMENT_REPLIES, log, failed="the scheduler failed on")
        self._operations: dict[str, Operation[Any]] = {
            "schedule": Operation(_read_request, self._schedule),
            "release": Operation(_read_release, self._release),
            "ping": Operation(no_fields, self._ping),
        }
        """The placement protocol: operation → its request's decoder and its handler."""

    @property
    def rejected(self) -> int:
        """Requests refused as malformed, and messages without a reply subject (each logged)."""
        return self._responder.rejected

    async def start(self) -> SchedulerService:
        # the buckets nodes write refuse rollups: one node's user cannot purge them all
        for bucket in (getattr(self.store, "bucket", None), getattr(self.routes, "bucket", None)):
            if isinstance(bucket, str):
                await forbid_rollups(self.client, bucket)
        if self.routes is not None and self.shared is not None:
            # before joining the queue group: count the replicas placed so far first
            try:
                self._route_watch = await self.routes.follow(self.shared)
            except Exception as error:
                log.warning("cannot follow the routes; spreading counts own replicas: %s", error)
        # One subscription per operation, not ``prefix.*``: a census would match both that and
        # its own subscription, and nats-server refuses the reply to a message a connection
        # received twice (a response-permission violation under berth up's authentication).
        self._subscriptions = [
            await self.client.subscribe(
                f"{self.prefix}.{operation}", queue=self.queue, cb=self._on_request
            )
            for operation in self._operations
        ]
        self._census = await self.client.subscribe(f"{self.prefix}.census", cb=self._on_census)
        await settle(self.client)
        if self.routes is not None and self.store is not None:
            # purge the routes of every node that leaves this scheduler's replica
            self._unwatch = self.store.subscribe(self._on_state_event)
        return self

    def _on_state_event(self, event: StateEvent) -> None:
        if event.kind != "delete" or self.routes is None:
            return
        if self.shared is not None:
            self.shared.drop_node(event.node)
        task = asyncio.get_running_loop().create_task(self._purge(event.node))
        self._purges.add(task)
        task.add_done_callback(self._purges.discard)

    async def _purge(self, node: str) -> None:
        assert self.routes is not None
        try:
            removed = await self.routes.purge_node(node)
        except Exception as error:
            log.warning("could not purge the routes of %s: %s", node, error)
            return
        if removed:
            log.info("node %s left: purged its routes", node)

    async def stop(self, *, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Leave the queue group, let requests in flight finish (``grace_s``), fail the rest."""
        subscriptions, self._subscriptions = [*self._subscriptions, self._census], []
        self._census = None
        for subscription in subscriptions:
            if subscription is not None:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        if self._route_watch is not None:
            await self._route_watch.stop()
            self._route_watch = None
        if self._in_flight:
            _, late = await asyncio.wait(list(self._in_flight), timeout=grace_s)
            for task in late:
                msg = self._in_flight.get(task)
                task.cancel()
                if msg is not None and msg.reply:
                    shutting = Unavailable("the scheduler is shutting down; retry")
                    with contextlib.suppress(Exception):
                        await msg.respond(PLACEMENT_REPLIES.error(shutting))
            if late:
                await asyncio.wait(late, timeout=1.0)
        if self._purges:
            await asyncio.wait(list(self._purges), timeout=grace_s)
        retries, self._route_retries = list(self._route_retries.values()), {}
        for retry in retries:
            retry.cancel()
        if retries:
            log.warning("stopping with %d route write(s) not stored", len(retries))
            await asyncio.wait(retries, timeout=1.0)
        with contextlib.suppress(Exception):
            await self.client.flush()

    async def __aenter__(self) -> SchedulerService:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- requests ----------------------------------------------------------------------------
    async def _on_census(self, msg: Msg) -> None:
        if msg.reply:
            with contextlib.suppress(Exception):
                nodes = sorted(self.scheduler.states())
                await msg.respond(ok_reply({"id": self.id, "nodes": nodes}))

    async def _on_request(self, msg: Msg) -> None:
        await self._slots.acquire()
        task = asyncio.get_running_loop().create_task(self._answer(msg))
        self._in_flight[task] = msg
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        self._slots.release()

    async def _answer(self, msg: Msg) -> None:
        if self._responder.unanswerable(msg):
            return
        operation = msg.subject.rsplit(".", 1)[-1]
        # the caller's trace continues here: its context is in the message's headers
        with tracing.server_span(f"berth.scheduler.{operation}", msg.headers):
            reply = await self._responder.reply(
                msg,
                lambda document: perform(self._operations, operation, document, msg),
                malformed=self._rejected_placement if operation == "schedule" else None,
            )
        with contextlib.suppress(Exception):
            await msg.respond(reply)

    def _rejected_placement(self) -> None:
        if self.scheduler.metrics is not None:
            self.scheduler.metrics.rejected()

    # -- the operations ----------------------------------------------------------------------
    async def _schedule(self, request: Request) -> Any:
        tracing.annotate({"berth.workload": request.key})
        placement = await self._place(request)
        self.placed += 1
        return placement.model_dump(mode="json")

    async def _ping(self, _: None) -> dict[str, int]:
        return {"nodes": len(self.scheduler.states())}

    async def _place(self, request: Request) -> Placement:
        """Place ``request`` and record its route; under a hard per-node spread, settle a race
        with the other schedulers (see the module docstring): if the node already holds a
        sibling whose route was stored first, give the node up and place again."""
        for attempt in itertools.count():
            placement = await self.scheduler.schedule(request)
            revision = await self._record(request, placement)
            spread = request.spread
            if (
                revision is None
                or self.shared is None
                or not self.settle_races
                or spread is None
                or not spread.hard
                or spread.label is not None
            ):
                return placement
            earlier = await self._earlier_siblings(request, placement, revision)
            if not earlier:
                return placement
            if attempt >= MAX_RACE_RETRIES:
                log.warning(
                    "%s stays on %s beside %d sibling(s) after %d retries",
                    request.key,
                    placement.worker_node,
                    len(earlier),
                    attempt,
                )
                return placement
            self.yielded += 1
            log.info(
                "%s: %s holds %s, placed first by another scheduler; placing again",
                request.key,
                placement.worker_node,
                ", ".join(route.workload for route in earlier),
            )
            for route in earlier:  # counted until the watch brings it (or a lease's ttl)
                assert route.function is not None and route.reservation_id is not None
                self.scheduler.replicas.add(
                    route.function, route.node, route.reservation_id, bound=False
                )
            await self._give_up(request, placement, revision)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns

    async def _record(self, request: Request, placement: Placement) -> int | None:
        """Record ``placement``'s route; its revision, or ``None`` (no registry, nothing
        reserved, or the registry failed: logged, and the write is asked again in the
        background, :meth:`_retry_route`)."""
        if self.routes is None or placement.reservation_id is None:
            return None
        try:
            return await self._write_route(request, placement)
        except Exception as error:
            log.warning("could not record the route of %s: %s; asking again", request.key, error)
            self._retry_route(request, placement)
            return None

    async def _write_route(self, request: Request, placement: Placement) -> int:
        assert self.routes is not None
        return await self.routes.record(
            request.key,
            placement,
            request.spec,
            function=(request.namespace, request.name),
        )

    def _retry_route(self, request: Request, placement: Placement) -> None:
        """Ask the route write of ``placement`` again until it is stored (module docstring)."""
        key = (request.key, placement.worker_node)
        if key in self._route_retries:
            return
        if len(self._route_retries) >= MAX_ROUTE_RETRIES:
            log.error(
                "route of %s not recorded: %d writes already wait",
                request.key,
                len(self._route_retries),
            )
            return
        task = asyncio.get_running_loop().create_task(self._rewrite_route(request, placement))
        self._route_retries[key] = task
        task.add_done_callback(lambda done: self._retried(key, done))

    def _retried(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._route_retries.get(key) is task:
            del self._route_retries[key]

    async def _rewrite_route(self, request: Request, placement: Placement) -> None:
        wait_s, deadline = (
            ROUTE_RETRY_FIRST_S,
            asyncio.get_running_loop().time() + ROUTE_RETRY_FOR_S,
        )
        for attempt in itertools.count(2):
            await asyncio.sleep(wait_s)
            try:
                await self._write_route(request, placement)
            except Exception as error:
                if asyncio.get_running_loop().time() + wait_s > deadline:
                    log.error(
                        "gave up recording the route of %s after %d attempts: %s",
                        request.key,
                        attempt,
                        error,
                    )
                    return
                wait_s = min(wait_s * 2, ROUTE_RETRY_MAX_S)
                continue
            log.info("recorded the route of %s at attempt %d", request.key, attempt)
            return

    async def _earlier_siblings(
        self, request: Request, placement: Placement, revision: int
    ) -> list[Route]:
        """Replicas of ``request``'s function on its node whose routes came before ours: from
        this service's own watch once it has delivered our route (it delivers in order, so
        every earlier route is in), else (it lags by seconds) read from the server."""
        assert self.routes is not None and placement.reservation_id is not None
        function = (request.namespace, request.name)
        watch, shared = self._route_watch, self.shared
        if watch is not None and shared is not None and await watch.reached(revision, WATCH_WAIT_S):
            return shared.earlier(
                placement.worker_node, function, revision, placement.reservation_id
            )
        try:
            routes = await self.routes.on_node(placement.worker_node)
        except Exception as error:
            log.warning("could not read the routes of %s: %s", placement.worker_node, error)
            return []
        return [
            route
            for stored, route in routes
            if stored < revision
            and route.function == function
            and route.reservation_id is not None
            and route.reservation_id != placement.reservation_id
        ]

    async def _give_up(self, request: Request, placement: Placement, revision: int) -> None:
        """Release a placement that lost a race, and its route — only at ``revision``, the
        one this service stored (best effort: an unbound lease expires on the node anyway,
        and the node drops its route then)."""
        assert self.routes is not None
        try:
            await self.scheduler.release(placement)
        except (Refused, Unavailable) as error:
            log.warning("could not release %s on %s: %s", request.key, placement.worker_node, error)
        try:
            await self.routes.remove(request.key, placement.worker_node, revision=revision)
        except Exception as error:
            log.warning("could not remove the route of %s: %s", request.key, error)

    async def _release(self, request: tuple[Placement, str | None]) -> bool:
        placement, workload = request
        if workload is not None:  # a route written after its release would outlive it
            retry = self._route_retries.pop((workload, placement.worker_node), None)
            if retry is not None:
                retry.cancel()
        released = await self.scheduler.release(placement)
        if self.routes is not None and workload is not None:
            try:
                await self.routes.remove(workload, placement.worker_node)
            except Exception as error:
                log.warning("could not remove the route of %s: %s", workload, error)
        return released


# -- the requests --------------------------------------------------------------------------
def _read_request(document: dict[str, Any], msg: Msg) -> Request:
    return model_of(Request, document, "request", source=msg.subject)


def _read_release(document: dict[str, Any], msg: Msg) -> tuple[Placement, str | None]:
    placement = model_of(Placement, document, "placement", source=msg.subject)
    workload = None  # optional; when present a string, checked before anything changes
    if document.get("workload") is not None:
        workload = field_of(document, "workload", str, source=msg.subject)
    return placement, workload
