"""The ``Idempotency-Key`` of ``POST /v1/workloads``: what a key means, how a repeat is answered.

A client that lost a create's answer (a timeout, a dropped connection, a failover to another
API process: :mod:`berth.api.client`) sends the create again with the same key, and must get
the first attempt's workload, not a second one.  Several API processes serve one cluster and
share nothing but the registries, so the key is claimed cluster-wide: :meth:`CreateKeys.take`
stores a :class:`~berth.registry.port.KeyClaim` under :func:`key_name` (a SHA-256 of the key,
never the key) naming the workload id the create will use and :func:`request_hash` of its
body — create-if-absent (:class:`~berth.registry.port.IdempotencyKeys`), after every check of
the input and *before* the identity claim, the placement and the intent record.  Of two
processes given one key at once exactly one stores it; a repeat finds the claim and is
answered by it:

* **same body, workload recorded** → that workload's current record (a read, as ``GET``
  answers it), ``201`` as the create answered, with ``Idempotent-Replayed: true``; nothing is
  placed or booted;
* **another body** → ``422`` naming the header (``idempotency_key_reused``): a key names one
  request;
* **same body, no record yet** → ``409`` ``idempotency_in_progress`` with ``Retry-After``: the
  first attempt is between its claim and its record — unless the claim is older than
  ``abandoned_after_s`` (:data:`~berth.defaults.IDEMPOTENCY_ABANDONED_AFTER_S`, 30 s, longer
  than a create takes from its claim to its record), or names as its ``owner`` an API
  process that is gone (not in the schedulers' census — it was ``kill -9``'d with the create
  in flight, and its client failed over): that attempt died before recording anything, and
  the repeat takes the key over by compare-and-set and creates — taking over the identity
  claim the dead attempt left as well (:attr:`Taken.abandoned`; nothing ran under it: a
  create boots only after its record), so it is answered ``201`` at once instead of ``409``
  in progress for 30 s and then ``409`` identity taken (issue 36).

**No takeover races a record.**  Just before it records its workload the first attempt renews
its claim (:meth:`CreateKeys.confirm`, a compare-and-set on the claim's revision, as a
takeover is): of the two exactly one holds.  An attempt that finds its key taken over gives
back what it took (the placement, the identity) and answers ``409`` in progress — the repeat
that took the key creates.

**Failures.**  A create that fails gives its key back (:meth:`CreateKeys.give_back`) unless
its workload may run: a live record (``pending`` — the boot's outcome unknown, a timeout is
never a failure — or ``running``) keeps the key, so a retry answers that record instead of
booting again; a registry that cannot tell keeps it too, and a retry converges (the record
appears, or the claim is abandoned and taken over).  Bad input — the body or the key — is
refused before the claim, so it changes nothing.

**Retention.**  A claim counts for ``retention_s`` (:data:`~berth.defaults.
IDEMPOTENCY_RETENTION_S`, 24 h) from its claim (or renewal): an older one is taken over as if
absent — the key then names a new create — and :meth:`CreateKeys.expire` (the reconciler's)
deletes old claims.

**Keys**: 1 to 255 printable ASCII characters (``U+0020``–``U+007E``), checked by the route's
header parameter (:data:`KeyHeader`): anything else is ``400`` on field ``Idempotency-Key``.

What it is not: the other POSTs' idempotency.  Stop, cordon, uncordon, drain and the image
registrations are idempotent by what they do (``docs/api.md`` says why) and take no key; a
placement (``POST /v1/placements``) takes a lease that ends by itself unbound.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import KW_ONLY, dataclass
from typing import Annotated, NamedTuple

from fastapi import Header
from pydantic import BaseModel

from berth.api.problems import Problem
from berth.defaults import IDEMPOTENCY_ABANDONED_AFTER_S, IDEMPOTENCY_RETENTION_S
from berth.model import INTERVAL_RULE
from berth.registry.port import LIVE_STATES, IdempotencyKeys, KeyClaim, WorkloadRegistry

__all__ = [
    "HEADER",
    "MAX_KEY",
    "REPLAYED_HEADER",
    "RETRY_AFTER_S",
    "CreateKeys",
    "KeyHeader",
    "Taken",
    "key_name",
    "request_hash",
]

log = logging.getLogger("berth.api")

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
"""Set (``true``) on the answer to a repeat: the first attempt's workload."""
MAX_KEY = 255
RETRY_AFTER_S = 1
"""The ``Retry-After`` of a ``409`` in progress: a create records its intent within seconds."""

KeyHeader = Annotated[
    str | None,
    Header(
        alias=HEADER,
        min_length=1,
        max_length=MAX_KEY,
        pattern=r"^[\x20-\x7e]*$",
        description="A key naming this create (1-255 printable ASCII characters; a UUID): a "
        "repeat with the same key and body is answered with the first attempt's workload "
        f"({REPLAYED_HEADER}: true) instead of creating another; with another body it is 422; "
        "while the first attempt is still under way, 409 with Retry-After. Keys are kept "
        f"{IDEMPOTENCY_RETENTION_S / 3600:g} h.",
    ),
]
"""The route's header parameter: the one place a key's form is checked."""


def key_name(key: str) -> str:
    """Where a key's claim is stored: the SHA-256 of the key (hex) — a key is the client's
    text, so it is never stored, and any key is a valid store name of one length."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def request_hash(body: BaseModel) -> str:
    """The SHA-256 of the validated body, as canonical JSON (every field, defaults filled,
    keys sorted): two bodies that ask the same thing hash alike, however they were written."""
    document = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(document.encode()).hexdigest()


def _reused(held: KeyClaim) -> Problem:
    return Problem(
        422,
        "idempotency_key_reused",
        "idempotency key reused",
        f"{HEADER}: the key was first used for another request (workload {held.workload_id}); "
        "a new request needs a new key",
        field=HEADER,
    )


def _in_progress(workload_id: str | None, why: str) -> Problem:
    return Problem(
        409,
        "idempotency_in_progress",
        "in progress",
        f"a create with this {HEADER} is in progress ({why}); retry after {RETRY_AFTER_S} s",
        headers={"Retry-After": str(RETRY_AFTER_S)},
        workload_id=workload_id,
    )


class Taken(NamedTuple):
    """What :meth:`CreateKeys.take` found: ``first``, the first attempt's recorded workload
    (answer it; nothing is created), or ``None`` — the caller holds the key and creates;
    then ``abandoned`` names the workload of an attempt that died before recording it, whose
    key the caller took over (its identity claim may be taken over too), if any."""

    first: str | None
    abandoned: str | None = None


Members = Callable[[], Awaitable[Collection[str]]]
"""The API processes alive now (their owner ids: the schedulers' census)."""


@dataclass(eq=False, repr=False)
class CreateKeys:
    """The creates' keys over the registry's :class:`~berth.registry.port.IdempotencyKeys`
    (see the module docstring); ``clock`` is the API's (the claims' times)."""

    keys: IdempotencyKeys
    workloads: WorkloadRegistry
    clock: Callable[[], float]
    _: KW_ONLY
    abandoned_after_s: float = IDEMPOTENCY_ABANDONED_AFTER_S
    retention_s: float = IDEMPOTENCY_RETENTION_S
    owner: str | None = None
    """This API process, named in the claims it takes (``None``: unnamed)."""
    members: Members | None = None
    """Who is alive (``None``: nobody can tell, a claim is abandoned only by its age)."""

    def __post_init__(self) -> None:
        self.abandoned_after_s = INTERVAL_RULE(
            self.abandoned_after_s, "idempotency_abandoned_after"
        )
        self.retention_s = INTERVAL_RULE(self.retention_s, "idempotency_retention")

    async def take(self, key: str, workload_id: str, body: BaseModel) -> Taken:
        """Claim ``key`` for a create of ``body`` as ``workload_id`` (see :class:`Taken`).
        ``422`` for a key first used with another body; ``409`` while the first attempt has
        recorded nothing, has not been silent for ``abandoned_after_s`` and its process is
        still up."""
        mine = KeyClaim(
            key=key_name(key),
            workload_id=workload_id,
            request_hash=request_hash(body),
            claimed_at=self.clock(),
            owner=self.owner,
        )
        abandoned: list[str] = []

        async def replaceable(held: KeyClaim) -> bool:
            age_s = self.clock() - held.claimed_at
            if age_s >= self.retention_s:
                return True  # expired: the key names a new create
            if held.request_hash != mine.request_hash:
                return False
            if age_s < self.abandoned_after_s and not await self._gone(held.owner):
                return False
            if await self.workloads.get(held.workload_id) is not None:
                return False
            abandoned.append(held.workload_id)  # its create died before recording it
            return True

        held = await self.keys.claim(mine, replaceable=replaceable)
        if held.workload_id == workload_id:
            return Taken(None, abandoned[-1] if abandoned else None)
        if held.request_hash != mine.request_hash:
            raise _reused(held)
        if await self.workloads.get(held.workload_id) is None:
            age_s = max(0.0, self.clock() - held.claimed_at)
            why = f"workload {held.workload_id}, claimed {age_s:.1f}s ago, not recorded yet"
            raise _in_progress(held.workload_id, why)
        return Taken(held.workload_id)

    async def _gone(self, owner: str | None) -> bool:
        """Whether the API process ``owner`` is surely gone: named, not this one, and not
        among the members alive (a census that fails says nothing)."""
        if owner is None or owner == self.owner or self.members is None:
            return False
        try:
            return owner not in await self.members()
        except Exception as error:
            log.info("could not tell whether %s is up: %s", owner, error)
            return False

    async def confirm(self, key: str, workload_id: str) -> None:
        """Renew ``workload_id``'s claim just before its create records it; ``409`` in
        progress when a repeat took the key over meanwhile (that repeat creates)."""
        if await self.keys.confirm(key_name(key), workload_id, now=self.clock()):
            return
        held = await self.keys.holder(key_name(key))
        holder = None if held is None else held.workload_id
        raise _in_progress(holder, f"a repeat took the key over from {workload_id} as {holder}")

    async def give_back(self, key: str, workload_id: str) -> None:
        """After a failed create: free ``key`` unless ``workload_id`` may run (a live record)
        — best effort, as a claim left behind converges (see the module docstring)."""
        try:
            record = await self.workloads.get(workload_id)
            if record is not None and record.state in LIVE_STATES:
                return
            await self.keys.release(key_name(key), workload_id)
        except Exception as error:
            log.warning("could not give back the idempotency key of %s: %s", workload_id, error)

    async def expire(self) -> int:
        """Delete the claims older than ``retention_s``; how many."""
        return await self.keys.expire(self.clock() - self.retention_s)
