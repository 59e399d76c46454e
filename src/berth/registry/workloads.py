"""The workload registry: every workload the API placed and booted, in a JetStream KV bucket.

The HTTP API (:mod:`berth.api`) records each workload it boots as a
:class:`Workload` — where it runs (node, the node's own workload id, the reservation), what it
runs (command, image), how it was placed (colocated bytes, rank) and its state — under the
key ``w.<id>`` of bucket ``berth_api`` (:data:`API_BUCKET`, shared with the image registry,
:mod:`berth.registry.images`).  A bucket, not the API's memory, so a restarted scheduler (or
another one serving the API) knows the workloads that run.

The state machine is small: ``running`` → ``exited`` (it ended by itself; ``exit_code``),
``stopped`` (the API stopped it, or a drain did) or ``failed`` (killed by a signal, or its
node no longer knows it — the agent restarted).  The node is the authority on whether a
workload still runs; the registry learns it by asking (:meth:`WorkloadRegistry.update`, called
by the API when it reads workloads), never by guessing.

**One running workload per identity.**  A workload's identity is ``namespace/name/replica``
(what the routing registry and ``berth whereis`` key on), so two running workloads may not
share one.  :class:`IdentityClaims` keeps a claim per identity under ``c.<identity>`` in the
same bucket, taken with KV create-if-absent *before* anything is placed — of two concurrent
creates exactly one stores it, the other is refused (:class:`IdentityTaken`) having changed
nothing.  A claim whose holder is no longer running (ended, stopped, failed, replaced — or a
create that died before recording its workload, after :data:`CLAIM_PENDING_S`) is taken over
with a compare-and-set on its revision; the API releases a claim when its workload ends
(a conditional delete: only the holder's own claim).

What it is not: the routing registry (:mod:`berth.registry.routes`, the schedulers' index of
reservations) nor a scheduler.  :class:`JsonBucket` is the small typed KV layer both API
registries use.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Generic, Literal, TypeVar

import nats.errors
from nats.aio.client import Client
from nats.js.api import KeyValueConfig
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ValidationError

from berth.errors import BerthError, Unavailable
from berth.nats.names import API_BUCKET
from berth.nats.wire import node_token

__all__ = [
    "CLAIM_PENDING_S",
    "Claim",
    "IdentityClaims",
    "IdentityTaken",
    "JsonBucket",
    "StoredWorkload",
    "Workload",
    "WorkloadRegistry",
    "WorkloadState",
    "new_workload_id",
]

log = logging.getLogger("berth.registry.workloads")

WorkloadState = Literal["running", "exited", "stopped", "failed"]
Model = TypeVar("Model", bound=BaseModel)
_WORKLOAD_ID = re.compile(r"w-[0-9a-f]{12}")
CLAIM_PENDING_S = 300.0
"""How long a claim whose workload has no record yet (its create is placing and booting) is
respected; after that its create is taken to have died and the claim may be taken over."""
WATCH_TIMEOUT_S = 5.0
"""How long :meth:`JsonBucket.all` waits for the next entry of its watch."""
_CLAIM_ATTEMPTS = 8
_WRONG_LAST_SEQUENCE = 10071  # JetStream's error code for a failed compare-and-set


def new_workload_id() -> str:
    """A fresh workload id, ``w-`` and 12 hex digits (also the node's boot name)."""
    return f"w-{uuid.uuid4().hex[:12]}"


class Workload(BaseModel):
    """A workload the API placed and booted (its record, and the API's answer).

    ``node_workload_id`` is the node's own id for it; ``detail`` says how it ended or why its
    state is what it is; ``replaced_by`` names the workload a drain started in its place.
    """

    id: str
    namespace: str
    name: str
    replica: int
    image: str | None = None
    node: str
    node_workload_id: str
    reservation_id: str | None = None
    colocated_bytes: int
    rank: int
    state: WorkloadState
    exit_code: int | None = None
    detail: str | None = None
    command: list[str]
    restartable: bool
    created_at: float
    ended_at: float | None = None
    replaced_by: str | None = None


class StoredWorkload(Workload):
    """A workload's record: what the API answers, plus what only the registry keeps — its
    environment (it may hold secrets: never answered) and the placement request it was
    created from (to place it again after a drain)."""

    env: dict[str, str] = {}
    request: dict[str, object] = {}


class JsonBucket(Generic[Model]):
    """Pydantic documents under ``<prefix>.<key>`` in a JetStream KV bucket."""

    def __init__(
        self, client: Client, kind: type[Model], *, prefix: str, bucket: str = API_BUCKET
    ) -> None:
        self.client = client
        self.kind = kind
        self.prefix = prefix
        self.bucket = bucket
        self._kv: KeyValue | None = None

    async def start(self) -> None:
        js = self.client.jetstream()
        with self._asking():
            try:
                self._kv = await js.create_key_value(KeyValueConfig(bucket=self.bucket, history=1))
            except BadRequestError:  # it exists with other settings: use it as it is
                self._kv = await js.key_value(self.bucket)

    def _bucket(self) -> KeyValue:
        if self._kv is None:
            raise Unavailable(f"the {self.bucket} bucket is not open")
        return self._kv

    @contextlib.contextmanager
    def _asking(self) -> Iterator[None]:
        """NATS failing under a question (a timeout, a closed connection) is ``Unavailable``
        naming the bucket — the API answers ``503``, never ``500``."""
        try:
            yield
        except nats.errors.Error as error:
            raise Unavailable(f"the {self.bucket} bucket did not answer: {error!r}") from None

    def key(self, name: str) -> str:
        return f"{self.prefix}.{node_token(name)}"

    async def put(self, name: str, document: Model) -> None:
        with self._asking():
            await self._bucket().put(self.key(name), document.model_dump_json().encode())

    async def get(self, name: str) -> Model | None:
        found = await self.entry(name)
        return None if found is None else found[0]

    async def entry(self, name: str) -> tuple[Model | None, int] | None:
        """The document and its revision (``None`` for a document that does not decode);
        ``None`` when the key is absent or deleted."""
        with self._asking():
            try:
                entry = await self._bucket().get(self.key(name))
            except KeyNotFoundError:  # includes a deleted key
                return None
        return self._decode(entry.key, entry.value), entry.revision or 0

    async def create(self, name: str, document: Model) -> bool:
        """Store ``document`` only if the key is absent (or deleted); ``False`` if it is not."""
        with self._asking():
            try:
                await self._bucket().create(self.key(name), document.model_dump_json().encode())
            except KeyWrongLastSequenceError:
                return False
        return True

    async def replace(self, name: str, document: Model, revision: int) -> bool:
        """Store ``document`` only if the key is still at ``revision``; ``False`` if not."""
        with self._asking():
            try:
                await self._bucket().update(
                    self.key(name), document.model_dump_json().encode(), last=revision
                )
            except KeyWrongLastSequenceError:
                return False
        return True

    async def delete_at(self, name: str, revision: int) -> bool:
        """Delete the key only if it is still at ``revision``; ``False`` if not."""
        with self._asking():
            try:
                await self._bucket().delete(self.key(name), last=revision)
            except BadRequestError as error:
                if error.err_code != _WRONG_LAST_SEQUENCE:
                    raise
                return False
        return True

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
            return self.kind.model_validate_json(value)
        except ValidationError as error:
            log.warning("ignored %s in %s: not a %s (%s)", key, self.bucket,
                        self.kind.__name__, error.errors()[0].get("msg"))  # fmt: skip
            return None


class WorkloadRegistry:
    """The API's workloads (see the module docstring)."""

    def __init__(self, client: Client, *, bucket: str = API_BUCKET) -> None:
        self._documents = JsonBucket(client, StoredWorkload, prefix="w", bucket=bucket)
        self.claims = IdentityClaims(client, bucket=bucket)

    async def start(self) -> WorkloadRegistry:
        await self._documents.start()
        await self.claims.start()
        return self

    async def record(self, workload: StoredWorkload) -> None:
        await self._documents.put(workload.id, workload)

    async def end(
        self, workload_id: str, update: dict[str, object]
    ) -> tuple[StoredWorkload | None, bool]:
        """Record that a *running* workload ended, with ``update`` applied to its record as it
        is now (compare-and-set on the revision, so a change written meanwhile — a drain's
        ``replaced_by``, another reader recording the same end — is never overwritten):
        ``(record, True)`` when this call recorded the end, ``(record, False)`` when the record
        no longer says running (someone else recorded an end first), ``(None, False)`` when it
        is gone."""
        while True:
            found = await self._documents.entry(workload_id)
            current, revision = (None, 0) if found is None else found
            if current is None:
                return None, False
            if current.state != "running":
                return current, False
            ended = current.model_copy(update=update)
            if await self._documents.replace(workload_id, ended, revision):
                return ended, True

    async def get(self, workload_id: str) -> StoredWorkload | None:
        if not _WORKLOAD_ID.fullmatch(workload_id):
            return None  # not an id this registry hands out (and never a key to look up)
        return await self._documents.get(workload_id)

    async def list(
        self,
        *,
        namespace: str | None = None,
        node: str | None = None,
        state: str | None = None,
    ) -> builtins.list[StoredWorkload]:
        """The workloads matching every filter given, oldest first."""
        found = [
            workload
            for workload in await self._documents.all()
            if (namespace is None or workload.namespace == namespace)
            and (node is None or workload.node == node)
            and (state is None or workload.state == state)
        ]
        return sorted(found, key=lambda workload: (workload.created_at, workload.id))


class IdentityTaken(BerthError):
    """A workload's identity (``namespace/name/replica``) is held by another workload that
    runs (or is being created): ``identity`` and the holder's ``workload_id``."""

    def __init__(self, identity: str, workload_id: str, how: str) -> None:
        self.identity = identity
        self.workload_id = workload_id
        super().__init__(
            f"{identity} is taken: workload {workload_id} holds it ({how}); stop it first, "
            f"or give another replica"
        )


class Claim(BaseModel):
    """Who holds an identity, since when (the value of ``c.<identity>``)."""

    workload_id: str
    claimed_at: float


Holds = Callable[[Claim], Awaitable[str | None]]
"""How a claim's holder still holds it (``"running on node-01"``, ``"being created"``), or
``None`` when it no longer does (it ended, or its create died)."""


class IdentityClaims:
    """One running workload per identity (see the module docstring)."""

    def __init__(self, client: Client, *, bucket: str = API_BUCKET) -> None:
        self._documents = JsonBucket(client, Claim, prefix="c", bucket=bucket)

    async def start(self) -> IdentityClaims:
        await self._documents.start()
        return self

    async def holder(self, identity: str) -> str | None:
        """The workload id holding ``identity``, if any."""
        found = await self._documents.entry(identity)
        return None if found is None or found[0] is None else found[0].workload_id

    async def claim(self, identity: str, workload_id: str, *, holds: Holds, now: float) -> None:
        """Take ``identity`` for ``workload_id``, or raise :class:`IdentityTaken` naming the
        workload holding it.  A holder for which ``holds`` says ``None`` is replaced atomically;
        claiming an identity already held by ``workload_id`` is a no-op."""
        mine = Claim(workload_id=workload_id, claimed_at=now)
        for _ in range(_CLAIM_ATTEMPTS):
            found = await self._documents.entry(identity)
            if found is None:
                if await self._documents.create(identity, mine):
                    return
                continue  # another create stored it first: look at whose it is
            held, revision = found
            if held is not None and held.workload_id == workload_id:
                return
            how = None if held is None else await holds(held)
            if held is not None and how is not None:
                raise IdentityTaken(identity, held.workload_id, how)
            if await self._documents.replace(identity, mine, revision):
                return
        raise Unavailable(f"the claim on {identity} kept changing; try again")

    async def release(self, identity: str, workload_id: str) -> None:
        """Give ``identity`` up if ``workload_id`` holds it (a newer holder keeps it)."""
        found = await self._documents.entry(identity)
        if found is None or found[0] is None or found[0].workload_id != workload_id:
            return
        await self._documents.delete_at(identity, found[1])
