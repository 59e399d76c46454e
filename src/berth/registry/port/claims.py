"""The claim ports: one running workload per identity, one create per idempotency key.

:class:`IdentityClaims` — **one running workload per identity**.  A workload's identity is
``namespace/name/replica`` (what the routing registry and ``berth whereis`` key on).  A
claim is taken create-if-absent *before* anything is placed — of two concurrent creates
exactly one stores it, the other is refused (:class:`IdentityTaken`) having changed
nothing.  A claim whose holder no longer holds it (ended, stopped, failed, lost, replaced —
or a create that died before recording its workload, after :data:`CLAIM_PENDING_S`) is
taken over atomically; a ``pending`` or ``unknown`` holder still holds it; a release frees
a claim only for its own holder.

:class:`IdempotencyKeys` — **one create per idempotency key**: a create that carries a key
(the HTTP API's ``Idempotency-Key``) claims it create-if-absent *before* it records
anything (:class:`KeyClaim`: the workload id it names, a hash of its request), so of two
API processes given the same key at once exactly one creates; the other finds the winner's
claim and answers from it.  A claim the caller judges gone (expired, or abandoned by a
create that died before recording) is taken over by compare-and-set; the holder renews its
claim (:meth:`IdempotencyKeys.confirm`, a compare-and-set too) just before it records its
workload, so a takeover and that record never both happen.  What a key means to the API
is :mod:`berth.api.idempotency`'s; the port stores claims only.

Its drivers: :mod:`berth.registry.memory`, :mod:`berth.registry.nats` (the rules they share:
:mod:`berth.registry.documents`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from pydantic import BaseModel

from berth.errors import BerthError

__all__ = [
    "CLAIM_PENDING_S",
    "Claim",
    "Holds",
    "IdempotencyKeys",
    "IdentityClaims",
    "IdentityTaken",
    "KeyClaim",
    "Replaceable",
]

CLAIM_PENDING_S = 300.0
"""How long a claim whose workload has no record yet (its create is placing and booting) is
respected; after that its create is taken to have died and the claim may be taken over."""


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
    """Who holds an identity, since when."""

    workload_id: str
    claimed_at: float


Holds = Callable[[Claim], Awaitable[str | None]]
"""How a claim's holder still holds it (``"running on node-01"``, ``"being created"``), or
``None`` when it no longer does (it ended, or its create died)."""


class IdentityClaims(Protocol):
    """One running workload per identity (see the module docstring)."""

    async def holder(self, identity: str) -> str | None:
        """The workload id holding ``identity``, if any."""
        ...

    async def claim(self, identity: str, workload_id: str, *, holds: Holds, now: float) -> None:
        """Take ``identity`` for ``workload_id``, or raise :class:`IdentityTaken` naming the
        workload holding it.  A holder for which ``holds`` says ``None`` is replaced atomically
        (a claim changed while ``holds`` was asked is looked at again); claiming an identity
        already held by ``workload_id`` is a no-op."""
        ...

    async def release(self, identity: str, workload_id: str) -> None:
        """Give ``identity`` up if ``workload_id`` holds it (a newer holder keeps it)."""
        ...


# -- idempotency keys ------------------------------------------------------------------------
class KeyClaim(BaseModel):
    """Who took an idempotency key: ``key`` (its name in the store, a hash of the caller's
    key — never the key itself), the workload its create names, a hash of the request that
    create was given, and when it was taken (or last renewed, :meth:`IdempotencyKeys.confirm`)
    on the API's clock."""

    key: str
    workload_id: str
    request_hash: str
    claimed_at: float
    owner: str | None = None
    """The API process whose create took it (its scheduler service's id; ``None`` from a
    process that did not say): once that process is gone, a repeat need not wait for the
    claim to look abandoned (:mod:`berth.api.idempotency`)."""


Replaceable = Callable[[KeyClaim], Awaitable[bool]]
"""Whether a held key claim may be taken over (it expired, or its create died before
recording its workload): the caller's judgement, asked between the store's atomic steps."""


class IdempotencyKeys(Protocol):
    """One create per idempotency key (see the module docstring)."""

    async def holder(self, key: str) -> KeyClaim | None:
        """The claim holding ``key``, if any."""
        ...

    async def claim(self, claim: KeyClaim, *, replaceable: Replaceable) -> KeyClaim:
        """Take ``claim.key`` for ``claim``: stored create-if-absent, so of concurrent claims
        exactly one stores it; a held claim for which ``replaceable`` says ``True`` is
        replaced by compare-and-set (a claim changed while it was asked is looked at again).
        The claim holding the key now: ``claim`` when this call took it (or its workload id
        held it already), else the holder's — the caller compares workload ids."""
        ...

    async def confirm(self, key: str, workload_id: str, *, now: float) -> bool:
        """Renew ``workload_id``'s claim on ``key`` (``claimed_at`` := ``now``) by
        compare-and-set, just before its create records its workload: of this and a takeover
        racing it exactly one holds.  ``False`` when ``workload_id`` no longer holds ``key``
        (taken over: its create must not record anything)."""
        ...

    async def release(self, key: str, workload_id: str) -> None:
        """Give ``key`` up if ``workload_id`` holds it (a newer holder keeps it)."""
        ...

    async def expire(self, before: float) -> int:
        """Delete every claim taken (or last renewed) before ``before`` — unless it changed
        meanwhile; how many were deleted."""
        ...
