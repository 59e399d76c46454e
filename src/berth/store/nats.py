"""The state store on a NATS JetStream key-value bucket: one key per node, a replica per reader.

Every node *publishes* its ``NodeState`` as the value of its own key in one bucket (default
``berth_nodes``); every reader keeps a *replica* — node name → latest snapshot — from a
watch of the whole bucket, and serves :meth:`NatsStore.states` and
:meth:`NatsStore.subscribe` from it without a round trip.

**Liveness is the server's clock, and every reader ages its own replica.**  The bucket's
``max_age`` is the snapshot time-to-live (three heartbeats: :func:`bucket_ttl_s`), so the
server drops a silent node's last value, and a reader that starts later never sees it.  A
reader also drops a node from its replica once it has received nothing from it for that
``max_age`` (the bucket's, read when the store starts): a sweep every
:data:`SWEEP_EVERY_S` removes it and tells the subscribers (a ``delete``), so a node that
stops publishing leaves every replica within three heartbeats and a sweep.  The server's
*limit markers* once did this (a marker per expired key, delivered to every watcher), but a
stream with markers keeps ``Nats-Rollup`` allowed whatever its configuration says, and a
rollup on a node's own key purges every other node's snapshot (issue 36):
:func:`~berth.nats.streams.forbid_rollups` now turns markers off with rollups.  The values a
watch catches up on when it starts are aged from their server timestamps (at most
``max_age`` old: older ones are gone), so a node that died just before a scheduler started
leaves it on time too — to the precision of the two machines' clocks, and a reader whose
clock runs ahead drops such a node early, until its next heartbeat.  A sweep that wakes
late (the event loop was held) expires nothing that round: the snapshots received meanwhile
wait in the connection's buffer.  And silence everywhere is the bucket's, not the nodes':
when a sweep would drop nodes and no snapshot at all has come in for a heartbeat (a third of
``max_age``: the nodes do not all fall silent on the same tick), it asks two questions
(each within :data:`PROBE_TIMEOUT_S`): does the bucket's stream have a leader, and has the
watch's consumer delivered every snapshot stored
(:meth:`~berth.nats.follow.KvFollow.current`)?  While the server leading the stream is down
and its successor not yet elected (4–9 s), no node can publish; while the watch's consumer
is gone with that server (nats-py makes another after two missed heartbeats: up to two
seconds *after* the election), no snapshot reaches the replica; while this reader is cut off
from the servers, neither — so nothing is dropped.  Once both answer yes (or a snapshot comes
in) every node held gets a fresh ``max_age`` to publish in.  Both yes while every node is
silent means they are: they are dropped.  (Either question alone is not enough: the stream
answers as soon as it is elected, before the consumer is made again, and a consumer on a
surviving server answers "nothing pending" while the stream has no leader to store anything
— either way the replica dropped every node, creates were refused for want of nodes, and
CI caught it.)
:meth:`NatsStore.remove` (an agent's clean shutdown) deletes the key at once.

**The watch is an ordered consumer with a short idle heartbeat** (``idle_heartbeat_s``,
1 s; :class:`~berth.nats.follow.KvFollow`): a replica resumes about two seconds after a
server restart — the stock KV watcher waits for its own 5 s heartbeats and resumed only after
~14 s.

**Messages are versioned and schema-checked.**  A value is ``{"v": 1, "state": {...}}``,
berth's envelope (:mod:`berth.nats.wire`) around the state (:func:`encode_state`);
:func:`decode_state` validates it into a ``NodeState`` and checks that the state names the
node whose key it is stored under.  Peer data that fails — not JSON, another version, an
invalid field, a state filed under another node's key — raises :class:`MalformedMessage`,
which the watch logs (``berth.store.nats``) and counts (:attr:`NatsStore.rejected`); the
replica is left exactly as it was.

**Generations survive a node's restart.**  Readers drop snapshots older than one they hold
(the port's guarantee), and a restarted agent counts generations from 1 again; so a store
continues the key's generation: on its first publication for a node it reads the stored
snapshot and numbers its own after it (``generation + offset``).  A publication older than
the store's previous one for that node is dropped before it reaches the server, so the bucket
never regresses.

Node names become keys (and subject tokens, :func:`~berth.nats.wire.node_token`) by escaping
every character outside ``[A-Za-z0-9_-]`` as ``=XX`` (hex of its UTF-8 bytes): ``node.1`` →
``node=2E1``.

Not here: admission (the node-client drivers) and the routing registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from berth.defaults import FOLLOW_IDLE_HEARTBEAT_S
from berth.errors import Invalid, Unavailable
from berth.nats.follow import KvFollow
from berth.nats.names import NODES_BUCKET as DEFAULT_BUCKET
from berth.nats.streams import created, stream_replicas
from berth.nats.wire import (
    KV_OPERATION,
    MARKER_REASON,
    MalformedMessage,
    decode_document,
    encode_body,
    model_of,
    node_token,
)
from berth.state import NodeState
from berth.store.port import StateEvent, StateListener

__all__ = [
    "DEFAULT_BUCKET",
    "NatsStore",
    "bucket_ttl_s",
    "decode_state",
    "encode_state",
]

log = logging.getLogger("berth.store.nats")

SWEEP_EVERY_S = 0.25
"""How often a reader's replica drops the nodes it has heard nothing from for the bucket's
``max_age`` (see the module docstring)."""
QUIET_SHARE = 3
"""A watch that has heard no node for ``max_age / QUIET_SHARE`` — a heartbeat, as ``max_age``
is three (:func:`bucket_ttl_s`) — asks its consumer before it drops a node: while the nodes
live, one of them has published within a heartbeat (see the module docstring)."""
PROBE_TIMEOUT_S = 1.0
"""How long a sweep waits for its watch's consumer to say whether it has delivered every
snapshot, when no node has published for a heartbeat (see the module docstring)."""


def bucket_ttl_s(heartbeat_s: float) -> float:
    """The snapshot time-to-live for nodes that publish every ``heartbeat_s``: three beats."""
    return 3 * heartbeat_s


def encode_state(state: NodeState) -> bytes:
    """The wire form of ``state`` (``{"v": 1, "state": {...}}``)."""
    return encode_body("state", state.to_json().encode())


def decode_state(data: bytes, *, key: str | None = None, source: str = "state store") -> NodeState:
    """Validate a published snapshot; :class:`MalformedMessage` says what is wrong with it.

    ``key`` (the KV key it was stored under) must be the snapshot's own node's token.
    """
    state = model_of(NodeState, decode_document(data, source=source), "state", source=source)
    if key is not None and node_token(state.node) != key:
        raise MalformedMessage(
            f"the state of node {state.node!r} is stored under key {key!r}",
            source=source,
            field="state.node",
        )
    return state


@dataclass(eq=False, repr=False)
class NatsStore:
    """``StateStore`` on a JetStream KV bucket (see the module docstring).

    ``ttl_s`` is the bucket's ``max_age`` (``None``: snapshots never expire); it applies
    when this store creates the bucket — a bucket that already exists keeps its own settings
    (a different ``max_age`` is logged).  ``watch=False`` makes a publish-only store (a node
    agent's: no replica, ``states()`` is empty, subscribers hear nothing).  Use
    ``async with NatsStore(client, ...)`` or ``start()``/``close()``; the connection stays the
    caller's.
    """

    client: Client
    _: KW_ONLY
    bucket: str = DEFAULT_BUCKET
    ttl_s: float | None = None
    idle_heartbeat_s: float = FOLLOW_IDLE_HEARTBEAT_S
    sync_timeout_s: float = 10.0
    watch: bool = True
    publish_timeout_s: float | None = None
    """Seconds a publish waits for its ack (default: about one heartbeat, set at init)."""
    rejected: int = field(default=0, init=False)
    """Messages the watch refused as malformed (each one logged)."""

    def __post_init__(self) -> None:
        ttl_s = self.ttl_s
        if ttl_s is not None and not ttl_s > 0:
            raise Invalid(f"must be positive, got {ttl_s!r}", field="ttl_s")
        # An unacknowledged put may still be applied (docs/design.md §5); waiting longer than a
        # heartbeat for the ack only delays the next attempt, so wait about one heartbeat.
        self.publish_timeout_s = self.publish_timeout_s or (
            2.0 if ttl_s is None else min(2.0, max(0.25, ttl_s / 3))
        )
        self._js: JetStreamContext = self.client.jetstream()
        self._prefix = f"$KV.{self.bucket}."
        self._stream = f"KV_{self.bucket}"
        self._replica: dict[str, NodeState] = {}
        self._key_nodes: dict[str, str] = {}  # key → node whose snapshot the replica holds
        self._listeners: list[StateListener] = []
        self._offsets: dict[str, int] = {}  # node → generation offset of this publisher
        self._last_published: dict[str, int] = {}
        self._follow: KvFollow | None = None
        self._kv: KeyValue | None = None
        self._max_age_s: float | None = None
        """The bucket's ``max_age`` (``None``: snapshots never expire), read at start."""
        self._expires: OrderedDict[str, float] = OrderedDict()
        """node → when the replica drops it (``monotonic``), soonest first."""
        self._sweeper: asyncio.Task[None] | None = None
        self._last_put = -math.inf
        """When the last snapshot came in (``monotonic``): a watch silent for ``max_age``
        may be a bucket that cannot take them (see the module docstring)."""
        self._outage = False
        """Whether the stream did not answer a sweep's probe since the last snapshot."""
        self.clock: Callable[[], float] = time.monotonic
        self.wall_clock: Callable[[], float] = time.time

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> NatsStore:
        """Create (or bind) the bucket and fill the replica from a watch of it."""
        self._kv = await self._ensure_bucket()
        if not self.watch:
            return self
        follow = self._follow = KvFollow(
            self.client,
            stream=self._stream,
            subject=f"{self._prefix}>",
            handle=self._apply,
            what=f"the replica of {self.bucket}",
            idle_heartbeat_s=self.idle_heartbeat_s,
        )
        if not await follow.start(self.sync_timeout_s):
            await self.close()
            raise Unavailable(
                f"the state store's watch of bucket {self.bucket} did not catch up "
                f"within {self.sync_timeout_s:g}s"
            )
        if self._max_age_s is not None:
            self._sweeper = asyncio.create_task(self._sweep(), name=f"berth sweep {self.bucket}")
        return self

    async def _ensure_bucket(self) -> KeyValue:
        config = KeyValueConfig(bucket=self.bucket, history=1)
        config.replicas = stream_replicas(self.client)
        if self.ttl_s is not None:
            config.ttl = self.ttl_s
        try:
            created_kv = await created(lambda: self._js.create_key_value(config), self.bucket)
            self._max_age_s = self.ttl_s
            return created_kv
        except BadRequestError as error:  # exists with another configuration
            log.debug("bucket %s exists: %s", self.bucket, error)
        try:
            kv = await self._js.key_value(self.bucket)
            status = await kv.status()
        except BucketNotFoundError:
            raise Unavailable(f"cannot create or bind bucket {self.bucket}") from None
        if self.ttl_s is not None and status.ttl != self.ttl_s:
            log.warning(
                "bucket %s keeps snapshots for %ss, not the %ss asked for; its settings win",
                self.bucket,
                status.ttl,
                self.ttl_s,
            )
        self._max_age_s = status.ttl or None  # 0: never
        return kv

    async def close(self) -> None:
        """Stop watching (the replica stays as it was; nothing is removed)."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
        follow, self._follow = self._follow, None
        if follow is not None:
            await follow.stop()

    async def __aenter__(self) -> NatsStore:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the port ----------------------------------------------------------------------------
    async def publish(self, state: NodeState) -> None:
        node = state.node
        offset = self._offsets.get(node)
        if offset is None:
            offset = self._offsets[node] = await self._stored_generation(node)
        if offset:
            state = state.model_copy(update={"generation": state.generation + offset})
        if state.generation < self._last_published.get(node, -1):
            return
        self._last_published[node] = state.generation
        try:
            await self._js.publish(
                self._prefix + node_token(node),
                encode_state(state),
                timeout=self.publish_timeout_s,
            )
        except Exception as error:
            raise Unavailable(f"cannot publish the state of {node}: {error}") from error

    def _bucket(self) -> KeyValue:
        if self._kv is None:
            raise Unavailable(f"the state store on bucket {self.bucket} is not started")
        return self._kv

    async def _stored_generation(self, node: str) -> int:
        try:
            entry = await self._bucket().get(node_token(node))
        except KeyNotFoundError:
            return 0
        except Exception as error:
            raise Unavailable(f"cannot read the state of {node}: {error}") from error
        try:
            return decode_state(entry.value or b"", key=node_token(node)).generation
        except MalformedMessage:
            return 0

    async def remove(self, node: str) -> None:
        kv = self._bucket()
        try:
            await kv.delete(node_token(node))
        except Exception as error:
            raise Unavailable(f"cannot remove the state of {node}: {error}") from error

    async def states(self) -> dict[str, NodeState]:
        return dict(self._replica)

    def subscribe(self, listener: StateListener) -> Callable[[], None]:
        self._listeners.append(listener)
        for state in list(self._replica.values()):
            listener(StateEvent("put", state.node, state))

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    # -- the watch ---------------------------------------------------------------------------
    def _apply(self, msg: Msg) -> None:
        key = msg.subject[len(self._prefix) :]
        headers = msg.headers or {}
        if KV_OPERATION in headers or MARKER_REASON in headers:
            # a delete, a purge, or the expiry marker of a bucket made before markers went
            node = self._key_nodes.pop(key, None)
            if node is not None:
                self._drop(node)
            return
        try:
            state = decode_state(msg.data, key=key, source=msg.subject)
        except MalformedMessage as error:
            self.rejected += 1
            log.warning("ignored: %s", error)
            return
        current = self._replica.get(state.node)
        if current is not None and current.generation > state.generation:
            return
        self._replica[state.node] = state
        self._key_nodes[key] = state.node
        self._aged(state.node, msg)
        self._notify(StateEvent("put", state.node, state))

    def _aged(self, node: str, msg: Msg) -> None:
        """Set when the replica drops ``node``, whose snapshot ``msg`` just came in: the
        bucket's ``max_age`` from now — from the server's timestamp for a value the watch
        catches up on at start (see the module docstring)."""
        max_age = self._max_age_s
        if max_age is None:
            return
        age = 0.0
        if self._follow is None or not self._follow.caught_up:
            with contextlib.suppress(Exception):
                stamped = msg.metadata.timestamp.timestamp()
                age = min(max_age, max(0.0, self.wall_clock() - stamped))
        now = self._last_put = self.clock()
        if self._outage:
            self._regrace(now)
        self._expires[node] = now + max_age - age
        self._expires.move_to_end(node)

    def _regrace(self, now: float) -> None:
        """The watch is current again after an outage: every node held gets a fresh
        ``max_age`` to publish in (none could be heard while it was not)."""
        self._outage = False
        assert self._max_age_s is not None
        for node in self._expires:
            self._expires[node] = now + self._max_age_s
        held = len(self._expires)
        log.info("%s's watch is current again: %d node(s) given a fresh ttl", self.bucket, held)

    async def _bucket_heard(self) -> bool:
        """Whether the nodes could publish and this replica would have heard them: the
        bucket's stream has a leader to take snapshots and the watch's consumer has delivered
        every one stored (each asked within :data:`PROBE_TIMEOUT_S`; see the module
        docstring)."""
        try:
            info = await asyncio.wait_for(self._js.stream_info(self._stream), PROBE_TIMEOUT_S)
        except Exception as error:  # no leader, no connection: nothing can be said
            log.debug("stream %s did not answer: %r", self._stream, error)
            return False
        if info.cluster is not None and not info.cluster.leader:
            return False
        follow = self._follow
        return follow is not None and await follow.current(PROBE_TIMEOUT_S)

    def _drop(self, node: str) -> None:
        """Take ``node`` out of the replica, telling the subscribers."""
        self._expires.pop(node, None)
        if self._replica.pop(node, None) is not None:
            self._notify(StateEvent("delete", node))

    async def _sweep(self) -> None:
        """Drop the nodes heard from no later than the bucket's ``max_age`` ago, every
        :data:`SWEEP_EVERY_S`, until cancelled; a round that wakes late drops none."""
        due = self.clock() + SWEEP_EVERY_S
        while True:
            await asyncio.sleep(max(0.0, due - self.clock()))
            now = self.clock()
            late = now - due > SWEEP_EVERY_S
            due = now + SWEEP_EVERY_S
            if late:
                continue  # the snapshots received while the loop was held come in first
            if not self._expires or next(iter(self._expires.values())) > now:
                continue
            if now - self._last_put >= (self._max_age_s or 0.0) / QUIET_SHARE:
                # no node heard from for a heartbeat: a bucket, or a watch, that is down?
                heard_at = self._last_put
                answers = await self._bucket_heard()
                now = self.clock()
                if self._last_put != heard_at:
                    continue  # a snapshot came in meanwhile: the next round sees anew
                if not answers:
                    if not self._outage:
                        log.warning(
                            "no snapshot in %s for %gs, and its stream or its watch cannot "
                            "answer for them: no node is dropped until both do",
                            self.bucket,
                            now - self._last_put,
                        )
                    self._outage = True
                    continue
                if self._outage:
                    self._regrace(now)
                    continue
            while self._expires:
                node, expires = next(iter(self._expires.items()))
                if expires > now:
                    break
                self._key_nodes.pop(node_token(node), None)
                self._drop(node)
                log.info("dropped node %s: no snapshot for %gs", node, self._max_age_s)

    def _notify(self, event: StateEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("a state store listener failed on %s of %s", event.kind, event.node)
