"""One holder at a time over NATS: a lease in a JetStream KV bucket with a TTL.

The NATS driver of :class:`~berth.registry.port.LeaderLease` (the port and its guarantee are in
:mod:`berth.registry.port`; the in-process driver is :class:`~berth.registry.memory.MemoryLease`).
The lease of job ``name`` is the key ``name`` in the bucket ``berth_leases``
(:data:`~berth.nats.names.LEASE_BUCKET`), whose ``max_age`` is the lease's TTL: the server
itself removes a value not rewritten for that long, so a holder that dies (``kill -9``, a
partition) frees the lease without anyone deleting it.

* **take** — KV *create* (create-if-absent): of two contenders exactly one stores its name;
* **renew** — KV *update* with the revision the holder last wrote (a compare-and-set): a
  holder whose value expired and was taken by another fails it (wrong last sequence) and so
  learns that it lost the lease — :meth:`NatsLease.hold` answers ``False`` and it stops acting;
* **give up** — a delete conditional on that revision (only its own value).

A holder's renewals must come well within the TTL (a third of it, as the reconciler does):
the TTL is the longest a dead holder blocks the job, and the shortest a live one may pause.
The bucket's ``max_age`` is set when the bucket is created; an existing bucket is used as it
is (its own TTL then applies — :attr:`NatsLease.ttl_s` reports it).  NATS failing under a
question is ``Unavailable`` naming the bucket: the caller acts as if it did not hold it.
"""

from __future__ import annotations

import contextlib

from nats.aio.client import Client
from nats.js.api import KeyValueConfig
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from berth.model import INTERVAL_RULE
from berth.nats.names import LEASE_BUCKET
from berth.nats.streams import created, stream_replicas
from berth.nats.wire import node_token
from berth.registry.nats import asking, opened

__all__ = ["NatsLease"]


class NatsLease:
    """:class:`~berth.registry.port.LeaderLease` of job ``name`` in a KV bucket (see the module
    docstring); ``await start()`` before use."""

    def __init__(
        self, client: Client, name: str, *, ttl_s: float, bucket: str = LEASE_BUCKET
    ) -> None:
        self.client = client
        self.name = name
        self.bucket = bucket
        self._ttl_s = INTERVAL_RULE(ttl_s, "ttl_s")
        self._key = node_token(name)
        self._kv: KeyValue | None = None
        self._revision: int | None = None
        """The revision this holder last wrote (``None``: it holds nothing it knows of)."""

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    async def start(self) -> NatsLease:
        js = self.client.jetstream()
        with self._asking():
            try:
                config = KeyValueConfig(
                    bucket=self.bucket,
                    history=1,
                    ttl=self._ttl_s,
                    replicas=stream_replicas(self.client),
                )
                self._kv = await created(lambda: js.create_key_value(config), self.bucket)
            except BadRequestError:  # it exists with other settings: its TTL applies
                self._kv = await js.key_value(self.bucket)
            ttl_s = (await self._kv.status()).ttl
            if ttl_s:
                self._ttl_s = float(ttl_s)
        return self

    def _bucket(self) -> KeyValue:
        return opened(self._kv, self.bucket)

    def _asking(self) -> contextlib.AbstractContextManager[None]:
        return asking(self.bucket)

    async def hold(self, holder: str) -> bool:
        value = holder.encode()
        kv = self._bucket()
        with self._asking():
            if self._revision is not None:
                try:
                    self._revision = await kv.update(self._key, value, last=self._revision)
                    return True
                except KeyWrongLastSequenceError:
                    self._revision = None  # expired and taken (or rewritten): not ours
            try:
                self._revision = await kv.create(self._key, value)
                return True
            except KeyWrongLastSequenceError:
                pass
            try:
                entry = await kv.get(self._key)
            except KeyNotFoundError:
                return False  # it expired between the two questions: the next call takes it
            if entry.value == value and entry.revision is not None:
                # ours from before this object (a restarted holder of the same name)
                try:
                    self._revision = await kv.update(self._key, value, last=entry.revision)
                    return True
                except KeyWrongLastSequenceError:
                    return False
            return False

    async def release(self, holder: str) -> None:
        if self._revision is None:
            return
        revision, self._revision = self._revision, None
        with self._asking(), contextlib.suppress(KeyWrongLastSequenceError, KeyNotFoundError):
            await self._bucket().delete(self._key, last=revision)
