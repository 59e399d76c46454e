"""The API's registries, written once over versioned documents.

The workload registry, the identity claims, the idempotency keys and the image registry
(:mod:`berth.registry.port`) need one storage primitive: typed documents by name, each read
with its revision, stored create-if-absent, replaced and deleted only at a revision
(:class:`Documents`).  The rules that make the ports' guarantees — a workload's end recorded
by compare-and-set, so nothing written meanwhile is lost; one claim per identity, taken over
only from a holder that no longer holds it, released only by its holder; one create per
idempotency key, renewed by its holder and taken over with the same compare-and-set — are
written here,
once, over any :class:`Documents`; each driver gives the documents:
:class:`~berth.registry.memory.MemoryDocuments` in this process,
:class:`~berth.registry.nats.JsonBucket` in a JetStream KV bucket.

What it is not: the routing registry (:class:`~berth.registry.port.RouteRegistry`), whose
drivers each follow their own store's change feed.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection
from dataclasses import InitVar, dataclass
from typing import Generic, Protocol, TypeVar

from pydantic import BaseModel

from berth.errors import Unavailable
from berth.registry.port import (
    LIVE_STATES,
    WORKLOAD_ID,
    Claim,
    Holds,
    IdempotencyKeys,
    IdentityClaims,
    IdentityTaken,
    Image,
    KeyClaim,
    Replaceable,
    StoredWorkload,
)

__all__ = [
    "CLAIM_ATTEMPTS",
    "DocumentClaims",
    "DocumentImages",
    "DocumentKeys",
    "DocumentWorkloads",
    "Documents",
]

Model = TypeVar("Model", bound=BaseModel)
Held = TypeVar("Held", Claim, KeyClaim)
CLAIM_ATTEMPTS = 8
"""How often a claim looks again at an identity (or a key) whose claim changed under it
before it gives up (``Unavailable``: try again)."""


class Documents(Protocol[Model]):
    """Typed documents by name, each with a revision that every change raises."""

    async def put(self, name: str, document: Model) -> None:
        """Store ``document`` under ``name`` whatever is there."""
        ...

    async def get(self, name: str) -> Model | None: ...

    async def entry(self, name: str) -> tuple[Model | None, int] | None:
        """The document and its revision (``None`` for a stored value that is not one);
        ``None`` when the name is absent or deleted."""
        ...

    async def create(self, name: str, document: Model) -> bool:
        """Store ``document`` only if ``name`` is absent (or deleted); ``False`` if not."""
        ...

    async def replace(self, name: str, document: Model, revision: int) -> bool:
        """Store ``document`` only if ``name`` is still at ``revision``; ``False`` if not."""
        ...

    async def delete_at(self, name: str, revision: int) -> bool:
        """Delete ``name`` only if it is still at ``revision``; ``False`` if not."""
        ...

    async def all(self) -> builtins.list[Model]:
        """Every document (skipping any stored value that is not one)."""
        ...


@dataclass(eq=False, repr=False)
class DocumentWorkloads:
    """A :class:`~berth.registry.port.WorkloadRegistry` over ``documents``."""

    documents: InitVar[Documents[StoredWorkload]]
    claims: IdentityClaims
    keys: IdempotencyKeys

    def __post_init__(self, documents: Documents[StoredWorkload]) -> None:
        self._documents = documents

    async def record(self, workload: StoredWorkload) -> None:
        await self._documents.put(workload.id, workload)

    async def transition(
        self,
        workload_id: str,
        update: dict[str, object],
        *,
        expect: Collection[str],
    ) -> tuple[StoredWorkload | None, bool]:
        """See :meth:`~berth.registry.port.WorkloadRegistry.transition`: a compare-and-set on
        the record's revision, looked at again until it holds or the state is not expected."""
        if not WORKLOAD_ID.fullmatch(workload_id):
            return None, False
        while True:
            found = await self._documents.entry(workload_id)
            current, revision = (None, 0) if found is None else found
            if current is None:
                return None, False
            if current.state not in expect:
                return current, False
            changed = StoredWorkload.model_validate({**current.model_dump(), **update})
            if await self._documents.replace(workload_id, changed, revision):
                return changed, True

    async def end(
        self, workload_id: str, update: dict[str, object]
    ) -> tuple[StoredWorkload | None, bool]:
        """See :meth:`~berth.registry.port.WorkloadRegistry.end`: a transition from any live
        state."""
        return await self.transition(workload_id, update, expect=LIVE_STATES)

    async def get(self, workload_id: str) -> StoredWorkload | None:
        if not WORKLOAD_ID.fullmatch(workload_id):
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


class _HeldDocuments(Generic[Held]):
    """Documents each held by one workload (the base of :class:`DocumentClaims` and
    :class:`DocumentKeys`)."""

    def __init__(self, documents: Documents[Held]) -> None:
        self._documents: Documents[Held] = documents

    async def release(self, name: str, workload_id: str) -> None:
        """Give ``name`` up if ``workload_id`` holds it (a newer holder keeps it)."""
        found = await self._documents.entry(name)
        if found is None or found[0] is None or found[0].workload_id != workload_id:
            return
        await self._documents.delete_at(name, found[1])


class DocumentClaims(_HeldDocuments[Claim]):
    """An :class:`~berth.registry.port.IdentityClaims` over ``documents``."""

    async def holder(self, identity: str) -> str | None:
        """The workload id holding ``identity``, if any."""
        found = await self._documents.entry(identity)
        return None if found is None or found[0] is None else found[0].workload_id

    async def claim(self, identity: str, workload_id: str, *, holds: Holds, now: float) -> None:
        """Take ``identity`` for ``workload_id``, or raise :class:`IdentityTaken` naming the
        workload holding it.  A holder for which ``holds`` says ``None`` is replaced atomically;
        claiming an identity already held by ``workload_id`` is a no-op."""
        mine = Claim(workload_id=workload_id, claimed_at=now)
        for _ in range(CLAIM_ATTEMPTS):
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


class DocumentKeys(_HeldDocuments[KeyClaim]):
    """An :class:`~berth.registry.port.IdempotencyKeys` over ``documents`` (each claim
    stored under its own ``key``)."""

    async def holder(self, key: str) -> KeyClaim | None:
        found = await self._documents.entry(key)
        return None if found is None else found[0]

    async def claim(self, claim: KeyClaim, *, replaceable: Replaceable) -> KeyClaim:
        """See :meth:`~berth.registry.port.IdempotencyKeys.claim`; a stored value that is not
        a claim is replaced as if it were absent."""
        for _ in range(CLAIM_ATTEMPTS):
            found = await self._documents.entry(claim.key)
            if found is None:
                if await self._documents.create(claim.key, claim):
                    return claim
                continue  # another create stored it first: look at whose it is
            held, revision = found
            if held is not None and held.workload_id == claim.workload_id:
                return held
            if held is not None and not await replaceable(held):
                return held
            if await self._documents.replace(claim.key, claim, revision):
                return claim
        raise Unavailable(f"the idempotency key {claim.key} kept changing; try again")

    async def confirm(self, key: str, workload_id: str, *, now: float) -> bool:
        """See :meth:`~berth.registry.port.IdempotencyKeys.confirm`."""
        for _ in range(CLAIM_ATTEMPTS):
            found = await self._documents.entry(key)
            held, revision = (None, 0) if found is None else found
            if held is None or held.workload_id != workload_id:
                return False
            renewed = held.model_copy(update={"claimed_at": now})
            if await self._documents.replace(key, renewed, revision):
                return True
        raise Unavailable(f"the idempotency key {key} kept changing; try again")

    async def expire(self, before: float) -> int:
        """See :meth:`~berth.registry.port.IdempotencyKeys.expire`: each old claim read again
        with its revision and deleted at it, so one renewed or taken over meanwhile stays."""
        deleted = 0
        for listed in await self._documents.all():
            if listed.claimed_at >= before:
                continue
            found = await self._documents.entry(listed.key)
            if found is None or found[0] is None or found[0].claimed_at >= before:
                continue
            if await self._documents.delete_at(listed.key, found[1]):
                deleted += 1
        return deleted


class DocumentImages:
    """An :class:`~berth.registry.port.ImageRegistry` over ``documents``."""

    def __init__(self, documents: Documents[Image]) -> None:
        self._documents = documents

    async def add(self, image: Image) -> None:
        """Register ``image`` (replacing one of the same name)."""
        await self._documents.put(image.name, image)

    async def get(self, name: str) -> Image | None:
        return await self._documents.get(name)

    async def list(self) -> builtins.list[Image]:
        return sorted(await self._documents.all(), key=lambda image: image.name)
