"""The API's registries on NATS: workloads, identity claims, idempotency keys and images in
one KV bucket.

The NATS drivers of :class:`~berth.registry.port.WorkloadRegistry`,
:class:`~berth.registry.port.IdentityClaims`, :class:`~berth.registry.port.IdempotencyKeys`
and :class:`~berth.registry.port.ImageRegistry` (the ports, their vocabulary and their
guarantees are in :mod:`berth.registry.port`; the in-process drivers in
:mod:`berth.registry.memory`).  All four keep pydantic documents in the JetStream KV bucket
``berth_api`` (:data:`~berth.nats.names.API_BUCKET`) through :class:`JsonBucket`, each under
its own prefix: a workload under ``w.<id>``, a claim under ``c.<identity>``, a key claim
under ``k.<sha256 of the key>``, an image under ``i.<name>`` (the name escaped as a subject
token, :func:`~berth.nats.wire.node_token`).  A bucket, not the API's memory, so a restarted
scheduler (or another one serving the API) knows the workloads that run.

Key claims live in the API's bucket rather than one with a TTL of its own: the scheduler's
NATS user may keep that bucket already (:mod:`berth.nats.auth`), and its workloads must not
expire.  So a key claim carries its time (``claimed_at``) and expires by the API's rule
(:mod:`berth.api.idempotency`): an expired claim is taken over like an absent one, and the
reconciler deletes old ones (a delete leaves the key's small delete marker in the stream).

The ports' atomic steps are the bucket's: a claim is taken with KV create-if-absent (of two
concurrent creates exactly one stores it), taken over and a workload's end recorded with a
compare-and-set on the key's revision, released with a conditional delete (only the holder's
own claim).  NATS failing under a question (a timeout, a closed connection) is ``Unavailable``
naming the bucket — the API answers ``503``, never ``500``.

**A write waits out its stream's election, not a timeout** (issue 36).  When the server
leading the bucket's stream dies, its replicas elect a new leader 4–9 s later (nats-server's
Raft election timeout, not a setting); a write sent meanwhile gets no answer.  A write asked
JetStream once, with its 5 s timeout, so one sent just after the kill failed at 5 s and the
next went through only after the election: creates paused 5 or 10 s.  Now each write is sent
for :data:`ATTEMPT_S` at a time, again every :data:`ATTEMPT_RETRY_S` while no leader
answers, for :data:`ATTEMPT_PATIENCE_S` in all — every copy under one ``Nats-Msg-Id``, so the
stream stores it once: a copy that reaches a leader after an earlier one was stored is
acknowledged as the duplicate it is (the stream's deduplication window is 2 minutes), never
refused by its own compare-and-set.  Reads (the bucket's leader answers them too) are asked
the same way.  So a create goes through as soon as the new leader is elected.

**A watched copy of the records** (:meth:`NatsWorkloads.watch`, a
:class:`~berth.registry.port.RecordIndex`): an ordered consumer of the ``w.`` keys, like the
routing registry's follow, holding every record by its id.  It is what the reconciler's pass
compares with the nodes' reports without reading the bucket: a listing reads (and decodes)
every record every pass, seconds at 100,000 records.  The copy may lag the bucket by the
feed's delay, which the reconciler allows for (it acts only through the registry's
compare-and-sets); after a server restart nats-py's ordered consumer resumes it from the last
message it saw.  A stream purge is not delivered: nothing in berth purges the ``w.`` keys.

What it is not: the routing registry (:mod:`berth.registry.nats_routes`, the schedulers'
index of reservations, in a bucket of its own).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, Self, TypeVar

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import Header, KeyValueConfig
from nats.js.errors import (
    APIError,
    BadRequestError,
    KeyNotFoundError,
    NoStreamResponseError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue
from pydantic import BaseModel, ValidationError

from berth.defaults import FOLLOW_IDLE_HEARTBEAT_S, FOLLOW_SYNC_TIMEOUT_S
from berth.errors import Unavailable
from berth.nats.follow import KvFollow
from berth.nats.names import API_BUCKET
from berth.nats.streams import created, stream_replicas
from berth.nats.wire import (
    KV_OPERATION,
    MARKER_REASON,
    MalformedMessage,
    body_of,
    encode_model,
    node_token,
)
from berth.registry.documents import (
    DocumentClaims,
    DocumentImages,
    DocumentKeys,
    DocumentWorkloads,
)
from berth.registry.port import Claim, Image, KeyClaim, StoredWorkload

__all__ = [
    "DOCUMENT",
    "WATCH_TIMEOUT_S",
    "WRONG_LAST_SEQUENCE",
    "BucketWatch",
    "JsonBucket",
    "NatsClaims",
    "NatsImages",
    "NatsKeys",
    "NatsRecordWatch",
    "NatsWorkloads",
    "asking",
    "opened",
    "stored",
]

log = logging.getLogger("berth.registry.workloads")

Model = TypeVar("Model", bound=BaseModel)
T = TypeVar("T")
WATCH_TIMEOUT_S = 5.0
"""How long :meth:`JsonBucket.all` waits for the next entry of its watch."""
WRONG_LAST_SEQUENCE = (10071, 10164)
"""JetStream's error codes for a write whose expected last revision is not the current one."""
DOCUMENT = "document"
"""The name a value of the API's bucket holds its document under, in berth's envelope:
``{"v": 1, "document": {…}}`` (:mod:`berth.nats.wire`)."""
ATTEMPT_S = 1.0
"""How long one attempt of a read or a write waits for its answer before it is asked again."""
ATTEMPT_RETRY_S = 0.1
"""The pause before a read or a write is asked again (no leader answered, or none in time)."""
ATTEMPT_PATIENCE_S = 5.0
"""How long a read or a write is attempted in all (JetStream's own request timeout): past it
a write's outcome is unknown — it may still be stored — and it fails ``Unavailable``."""


def opened(kv: KeyValue | None, bucket: str) -> KeyValue:
    """``kv``, the bucket a driver opened, or ``Unavailable`` naming ``bucket`` if it has not."""
    if kv is None:
        raise Unavailable(f"the {bucket} bucket is not open")
    return kv


@contextlib.contextmanager
def asking(bucket: str) -> Iterator[None]:
    """NATS failing under a question (a timeout, a closed connection) is ``Unavailable``
    naming the bucket — the API answers ``503``, never ``500``."""
    try:
        yield
    except nats.errors.Error as error:
        raise Unavailable(f"the {bucket} bucket did not answer: {error!r}") from None


def stored(kind: type[Model], data: bytes, *, source: str) -> Model:
    """The ``kind`` a value of the bucket holds: berth's envelope around it
    (:func:`~berth.nats.wire.body_of`, :data:`DOCUMENT`), or — for this release — the bare
    document the previous release wrote; :class:`MalformedMessage` (naming the field) when it
    is neither."""
    body = body_of(data, DOCUMENT, source=source, bare=True)
    try:
        return kind.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first.get("loc", ())) or None
        raise MalformedMessage(
            f"not a {kind.__name__}: {first.get('msg')}", source=source, field=field
        ) from None
    except RecursionError:
        raise MalformedMessage(f"not a {kind.__name__}: nested too deeply", source=source) from None


class JsonBucket(Generic[Model]):
    """Pydantic documents under ``<prefix>.<key>`` in a JetStream KV bucket (the
    :class:`~berth.registry.documents.Documents` of the NATS drivers)."""

    def __init__(
        self, client: Client, kind: type[Model], *, prefix: str, bucket: str = API_BUCKET
    ) -> None:
        self.client = client
        self.kind = kind
        self.prefix = prefix
        self.bucket = bucket
        self._kv: KeyValue | None = None
        self._reads: KeyValue | None = None

    async def start(self) -> None:
        js = self.client.jetstream()
        with self._asking():
            try:
                config = KeyValueConfig(
                    bucket=self.bucket, history=1, replicas=stream_replicas(self.client)
                )
                self._kv = await created(lambda: js.create_key_value(config), self.bucket)
            except BadRequestError:  # it exists with other settings: use it as it is
                self._kv = await js.key_value(self.bucket)
            # reads wait :data:`ATTEMPT_S` for each answer, and are asked again (_patiently)
            self._reads = await self.client.jetstream(timeout=ATTEMPT_S).key_value(self.bucket)

    def _bucket(self) -> KeyValue:
        return opened(self._kv, self.bucket)

    def _read_bucket(self) -> KeyValue:
        return opened(self._reads, self.bucket)

    def _asking(self) -> contextlib.AbstractContextManager[None]:
        return asking(self.bucket)

    def key(self, name: str) -> str:
        return f"{self.prefix}.{node_token(name)}"

    async def put(self, name: str, document: Model) -> None:
        with self._asking():
            await self._write(name, encode_model(DOCUMENT, document))

    async def get(self, name: str) -> Model | None:
        found = await self.entry(name)
        return None if found is None else found[0]

    async def entry(self, name: str) -> tuple[Model | None, int] | None:
        """The document and its revision (``None`` for a document that does not decode);
        ``None`` when the key is absent or deleted."""
        reads, key = self._read_bucket(), self.key(name)
        with self._asking():
            try:
                entry = await self._patiently(lambda _: reads.get(key), "a read")
            except KeyNotFoundError:  # includes a deleted key
                return None
        return self._decode(entry.key, entry.value), entry.revision or 0

    async def create(self, name: str, document: Model) -> bool:
        """Store ``document`` only if the key is absent (or deleted); ``False`` if it is not."""
        data = encode_model(DOCUMENT, document)
        with self._asking():
            if await self._write(name, data, last=0):
                return True
            try:  # a key deleted (or purged) is created over its marker's revision
                reads, key = self._read_bucket(), self.key(name)
                await self._patiently(lambda _: reads.get(key), "a read")
            except KeyNotFoundError as absent:
                marker = absent.entry  # None: gone altogether since (purged): create again
                revision = 0 if marker is None else marker.revision or 0
                return await self._write(name, data, last=revision)
        return False

    async def replace(self, name: str, document: Model, revision: int) -> bool:
        """Store ``document`` only if the key is still at ``revision``; ``False`` if not."""
        with self._asking():
            return await self._write(name, encode_model(DOCUMENT, document), last=revision)

    async def delete_at(self, name: str, revision: int) -> bool:
        """Delete the key only if it is still at ``revision``; ``False`` if not."""
        with self._asking():
            return await self._write(name, b"", last=revision, operation="DEL")

    async def _write(
        self, name: str, data: bytes, *, last: int | None = None, operation: str | None = None
    ) -> bool:
        """Store ``data`` under ``name``'s key — only if the key is at revision ``last``
        (``0``: absent) when it is given, ``False`` if it is not —, as a KV ``operation``
        (``"DEL"``) when given.  Sent again while the stream has no leader to answer
        (:meth:`_patiently`) under one message id, so a copy that was stored already is
        acknowledged, not stored twice."""
        self._bucket()  # started?
        headers: dict[str, str] = {Header.MSG_ID.value: uuid.uuid4().hex}
        if last is not None:
            headers[Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value] = str(last)
        if operation is not None:
            headers[KV_OPERATION] = operation
        subject = f"$KV.{self.bucket}.{self.key(name)}"
        js = self.client.jetstream()

        async def attempt(timeout_s: float) -> bool:
            try:
                await js.publish(subject, data, headers=headers, timeout=timeout_s)
            except APIError as error:
                if error.err_code in WRONG_LAST_SEQUENCE:
                    return False
                raise
            return True

        return await self._patiently(attempt, "a write")

    async def _patiently(self, attempt: Callable[[float], Awaitable[T]], what: str) -> T:
        """``attempt(timeout_s)``, again every :data:`ATTEMPT_RETRY_S` while the stream has no
        leader to answer it — no answer within :data:`ATTEMPT_S`, no responder, JetStream's
        503 —, for :data:`ATTEMPT_PATIENCE_S` in all; then the last failure is raised (the
        outcome is unknown).  Any other failure at once."""
        deadline = time.monotonic() + ATTEMPT_PATIENCE_S
        while True:
            left = deadline - time.monotonic()
            try:
                return await attempt(max(0.05, min(ATTEMPT_S, left)))
            except (
                nats.errors.TimeoutError,
                nats.errors.NoRespondersError,
                NoStreamResponseError,
                ServiceUnavailableError,
            ) as error:
                if time.monotonic() + ATTEMPT_RETRY_S >= deadline:
                    raise
                log.debug("%s to %s is asked again: %r", what, self.bucket, error)
            await asyncio.sleep(ATTEMPT_RETRY_S)

    async def all(self) -> builtins.list[Model]:
        """Every document under the prefix (skipping, and logging, any that is not one).

        Read with a watch of the latest value per key, until an entry says none are pending.
        The client's "nothing pending" marker is not trusted to end it: nats-py may queue it
        *before* entries the server had already counted as delivered (its consumer-info
        check races the delivery), which read as an empty registry on a loaded machine.  So
        the stream is asked first whether the prefix has any key at all (none: done, no
        watch), and the watch then ends on an entry's pending count alone.
        """
        with self._asking():
            return await self._all()

    async def _all(self) -> builtins.list[Model]:
        info = await self.client.jetstream().stream_info(
            f"KV_{self.bucket}", subjects_filter=f"$KV.{self.bucket}.{self.prefix}.>"
        )
        if not info.state.subjects:
            return []
        watcher = await self._bucket().watch(f"{self.prefix}.>")
        found: builtins.list[Model] = []
        marker = False
        try:
            while True:
                try:
                    entry = await watcher.updates(  # type: ignore[no-untyped-call]
                        timeout=WATCH_TIMEOUT_S
                    )
                except TimeoutError:
                    if marker:  # the keys were purged between the two questions
                        break
                    raise Unavailable(
                        f"the {self.bucket} bucket did not answer within {WATCH_TIMEOUT_S:g}s"
                    ) from None
                if entry is None:
                    marker = True
                    continue
                if entry.operation is None and entry.value:
                    document = self._decode(entry.key, entry.value)
                    if document is not None:
                        found.append(document)
                if not entry.delta:
                    break
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        return found

    def _decode(self, key: str, value: bytes | None) -> Model | None:
        if not value:
            return None
        try:
            return stored(self.kind, value, source=f"{key} in {self.bucket}")
        except MalformedMessage as error:
            log.warning("ignored: %s", error)
            return None


class _InBucket:
    """A registry over one :class:`JsonBucket`, started by starting the bucket."""

    _bucket: JsonBucket[Any]

    async def start(self) -> Self:
        await self._bucket.start()
        return self


class NatsClaims(_InBucket, DocumentClaims):
    """Identity claims under ``c.<identity>`` in the API's bucket."""

    def __init__(self, client: Client, *, bucket: str = API_BUCKET) -> None:
        self._bucket = JsonBucket(client, Claim, prefix="c", bucket=bucket)
        super().__init__(self._bucket)


class NatsKeys(_InBucket, DocumentKeys):
    """Idempotency key claims under ``k.<key>`` in the API's bucket (the key is already a
    hash: :func:`berth.api.idempotency.key_name`)."""

    def __init__(self, client: Client, *, bucket: str = API_BUCKET) -> None:
        self._bucket = JsonBucket(client, KeyClaim, prefix="k", bucket=bucket)
        super().__init__(self._bucket)


class NatsWorkloads(DocumentWorkloads):
    """The workload registry under ``w.<id>`` in the API's bucket, its claims and keys beside
    it."""

    claims: NatsClaims
    keys: NatsKeys

    def __init__(self, client: Client, *, bucket: str = API_BUCKET) -> None:
        self._bucket = JsonBucket(client, StoredWorkload, prefix="w", bucket=bucket)
        super().__init__(
            self._bucket, NatsClaims(client, bucket=bucket), NatsKeys(client, bucket=bucket)
        )

    async def start(self) -> NatsWorkloads:
        await self._bucket.start()
        await self.claims.start()
        await self.keys.start()
        return self

    async def watch(
        self,
        *,
        idle_heartbeat_s: float = FOLLOW_IDLE_HEARTBEAT_S,
        sync_timeout_s: float = FOLLOW_SYNC_TIMEOUT_S,
    ) -> NatsRecordWatch:
        """A copy of every record kept current by the bucket's change feed (see the module
        docstring); returns once the records stored now were delivered, or after
        ``sync_timeout_s`` (logged: the watch goes on, and its :meth:`~NatsRecordWatch.records`
        is ``None`` until it catches up).  Stop it with :meth:`NatsRecordWatch.stop`."""
        return await NatsRecordWatch(self._bucket).start(idle_heartbeat_s, sync_timeout_s)


class BucketWatch:
    """A watch of some keys of a KV bucket through one :class:`~berth.nats.follow.KvFollow`
    (the base of :class:`NatsRecordWatch` and the routing registry's
    :class:`~berth.registry.nats_routes.NatsRouteWatch`): each message on ``subject`` of
    ``bucket``'s stream to ``handle``; ``what`` names it in the log.  Started once (by the
    subclass's ``start``), stopped once."""

    def __init__(
        self, client: Client, bucket: str, subject: str, handle: Callable[[Msg], None], what: str
    ) -> None:
        self._new_follow = functools.partial(
            KvFollow, client, stream=f"KV_{bucket}", subject=subject, handle=handle, what=what
        )
        self._follow: KvFollow | None = None

    async def _follow_keys(self, idle_heartbeat_s: float, sync_timeout_s: float) -> None:
        """Subscribe, and wait until the values stored now were delivered (at most
        ``sync_timeout_s``; past it the watch goes on, logged)."""
        self._follow = self._new_follow(idle_heartbeat_s=idle_heartbeat_s)
        await self._follow.start(sync_timeout_s)  # not caught up: logged, goes on

    async def stop(self) -> None:
        """Unsubscribe: nothing is delivered from now on (idempotent)."""
        follow, self._follow = self._follow, None
        if follow is not None:
            await follow.stop()


class NatsRecordWatch(BucketWatch):
    """A running :meth:`NatsWorkloads.watch`: every workload record by its id, with the
    revision it was stored at (a :class:`~berth.registry.port.RecordIndex`).

    Fed by an ordered push consumer of the bucket's ``w.`` keys, the latest value of each
    first, then every change as it lands.  A delete or purge of a key removes its record; a
    value that is not a record, or is the record of another id than its key's, is logged,
    counted in ``rejected`` and skipped — and the key no longer holds a record, so whatever
    the copy held for it goes too (as the registry's listing would not show it).  An older
    revision never replaces a newer one of the same id.
    """

    def __init__(self, bucket: JsonBucket[StoredWorkload]) -> None:
        self.bucket = bucket
        self.rejected = 0
        """How many values were skipped: not a record, or a record under another id's key."""
        self._records: dict[str, tuple[int, StoredWorkload]] = {}
        self._subject = f"$KV.{bucket.bucket}.{bucket.prefix}."
        what = f"the watch of the records in {bucket.bucket}"
        super().__init__(bucket.client, bucket.bucket, f"{self._subject}>", self._apply, what)

    def records(self) -> builtins.list[StoredWorkload] | None:
        """Every record now — a fresh list of the shared records, never to be changed by the
        caller —, or ``None`` while the watch has not caught up with the bucket yet (or was
        stopped): then list the registry."""
        if self._follow is None or not self._follow.caught_up:
            return None
        return [record for _, record in self._records.values()]

    def __len__(self) -> int:
        return len(self._records)

    async def start(self, idle_heartbeat_s: float, sync_timeout_s: float) -> NatsRecordWatch:
        """Subscribe, and wait until the records stored now were delivered (at most
        ``sync_timeout_s``; past it the watch goes on, logged)."""
        bucket = self.bucket
        bucket._bucket()  # started?
        with bucket._asking():
            await self._follow_keys(idle_heartbeat_s, sync_timeout_s)
        return self

    def _apply(self, msg: Msg) -> None:
        if not msg.subject.startswith(self._subject):
            return  # not a record's key (the filter lets none through)
        key = msg.subject[len(self._subject) :]
        revision = int(msg.metadata.sequence.stream)
        held = self._records.get(key)
        if held is not None and held[0] > revision:
            return  # a newer revision is held already
        headers = msg.headers or {}
        if KV_OPERATION in headers or MARKER_REASON in headers or not msg.data:
            self._records.pop(key, None)
            return
        record = self._record(key, msg.data)
        if record is None:
            self._records.pop(key, None)
        else:
            self._records[key] = (revision, record)

    def _record(self, key: str, data: bytes) -> StoredWorkload | None:
        """The record ``data`` holds under ``key`` (the id's token), or ``None`` (counted,
        logged) when it is not one or is the record of another id."""
        name = f"{self.bucket.prefix}.{key}"
        try:
            record = stored(StoredWorkload, data, source=f"{name} in {self.bucket.bucket}")
        except MalformedMessage as error:
            self.rejected += 1
            log.warning("ignored: %s", error)
            return None
        if not record.id or node_token(record.id) != key:
            self.rejected += 1
            log.warning(
                "ignored %s in %s: it holds the record of %r, which belongs under another key",
                name,
                self.bucket.bucket,
                record.id,
            )
            return None
        return record


class NatsImages(_InBucket, DocumentImages):
    """The image registry under ``i.<name>`` in the API's bucket."""

    def __init__(self, client: Client, *, bucket: str = API_BUCKET) -> None:
        self._bucket = JsonBucket(client, Image, prefix="i", bucket=bucket)
        super().__init__(self._bucket)
