"""A workload's create: checked, its identity claimed, placed, recorded, then booted.

:class:`Creates` owns ``POST /v1/workloads`` and every placement of a workload again (a
reschedule's, a drain's: :meth:`Creates.replace`).

**Create** validates everything first (the request with berth's types, the boot spec, the
image: :meth:`berth.api.decisions.Decisions.workload_request`), so bad input reserves
nothing; then places through the queue group — the scheduler confirms on the node under a
lease.  Before placing, it claims the workload's identity (``namespace/name/replica``,
:class:`~berth.registry.port.IdentityClaims`): an identity a live workload holds — or one a
concurrent create is placing — is ``409`` naming the holder, with nothing placed.  A create
that carries an ``Idempotency-Key`` claims the key first, after every check of its input
(:mod:`berth.api.idempotency`): a repeat is answered with the first attempt's workload and
places nothing; the claim is renewed just before the intent record, so a takeover of an
abandoned key never races it; a create that fails gives the key back unless its workload
may run.

**Intent before boot**: the placed workload is recorded ``pending`` before its node is asked
anything, then booted with the lease and *the API's id* (``try_run(node, RunOrder(…,
reservation=…, workload_id=…))``: the node binds the reservation to it and boots an id
once).  A run whose answer never came is asked again under the same id
(:data:`RUN_ATTEMPTS`); the node's answer turns the record ``running`` by compare-and-set;
still unanswered, the record stays ``pending`` with the reason (``503``: the outcome is
unknown, the claim is kept — what the node says later settles it: :mod:`berth.api.records`).
A refusal (the node released the reservation already) ends the record ``failed`` with the
node's reason, tells the schedulers (``release``) so their assume caches drop it, frees the
claim and is ``409``.  A registry
that fails to record the intent is ``503`` with nothing booted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from berth.api import schemas
from berth.api.decisions import Decisions
from berth.api.idempotency import CreateKeys
from berth.api.ports import ApiPorts
from berth.api.records import Records
from berth.boot import BootSpec, RunOrder
from berth.defaults import RUN_TIMEOUT_S
from berth.errors import Invalid, Unavailable
from berth.model import Placement, Request, ReschedulePolicy
from berth.ownership import Refused
from berth.registry.port import (
    CLAIM_PENDING_S,
    Claim,
    Image,
    StoredWorkload,
    new_workload_id,
    with_event,
)

__all__ = ["RUN_ATTEMPTS", "RUN_RETRY_S", "Creates"]

log = logging.getLogger("berth.api")

RUN_ATTEMPTS = 4
"""How often a create asks its node to run a workload whose answer never came (the same id
each time: the node boots it once), within :data:`~berth.defaults.RUN_TIMEOUT_S`."""
RUN_RETRY_S = 0.5
"""The pause before the first retry of an unanswered run; it doubles for each further one
(0.5 + 1 + 2 s: about as long as NATS takes to reconnect after a server restart, twice)."""


class Creates:
    """Creates and replacements of workloads (see the module docstring)."""

    def __init__(
        self, ports: ApiPorts, records: Records, decisions: Decisions, keys: CreateKeys
    ) -> None:
        self.ports = ports
        self.records = records
        self.decisions = decisions
        self.keys = keys

    async def create(
        self, body: schemas.WorkloadCreate, *, idempotency_key: str | None = None
    ) -> StoredWorkload:
        """Place and boot ``body`` (see the module docstring); with ``idempotency_key``, a
        repeat's answer is the first attempt's workload (:meth:`create_or_repeat`)."""
        workload, _ = await self.create_or_repeat(body, idempotency_key)
        return workload

    async def create_or_repeat(
        self, body: schemas.WorkloadCreate, idempotency_key: str | None
    ) -> tuple[StoredWorkload, bool]:
        """:meth:`create`: the workload, and whether it is a repeat's answer —
        ``idempotency_key`` named an earlier create, whose workload it is, nothing placed
        (:mod:`berth.api.idempotency`; the key's form is checked where it enters)."""
        request, image = await self.decisions.workload_request(body)
        if request.spec is None:
            raise Invalid("a workload needs its resources: give a type or a spec", field="type")
        workload_id = new_workload_id()
        try:
            boot = BootSpec(
                name=workload_id,
                command=tuple(body.command),
                env=body.env,
                image=None if image is None else image.name,  # the node's layout ref (microvm)
                restart=body.restart,
            )
        except Invalid as error:
            field = error.field if error.field in ("command", "env", "image") else "command"
            raise Invalid(error.message, field=field) from None
        reschedule = body.reschedule_policy()
        if idempotency_key is None:
            return await self._boot(request, boot, workload_id, image, reschedule), False
        first, abandoned = await self.keys.take(idempotency_key, workload_id, body)
        if first is not None:
            return await self.records.workload(first), True
        try:
            booted = await self._boot(
                request,
                boot,
                workload_id,
                image,
                reschedule,
                key=idempotency_key,
                abandoned=abandoned,
            )
        except Exception:
            await self.keys.give_back(idempotency_key, workload_id)
            raise
        return booted, False

    async def replace(self, workload: StoredWorkload, *, counted: bool = True) -> StoredWorkload:
        """Place and boot ``workload`` again from its recorded request, under a new id,
        avoiding the node it ran on (a soft hint: asked only if no other node takes it);
        ``counted``: as one more reschedule of its line (a drain's is not)."""
        request = Request.from_dict(workload.request).avoiding(workload.node)
        image = None if workload.image is None else await self.ports.images.get(workload.image)
        new_id = new_workload_id()
        boot = BootSpec(
            name=new_id,
            command=tuple(workload.command),
            env=workload.env,
            image=None if image is None else image.name,
            restart=workload.restart,
        )
        why = f"in place of {workload.id} ({workload.state} on {workload.node})"
        return await self._boot(
            request,
            boot,
            new_id,
            image,
            workload.reschedule,
            reschedules=workload.reschedules + int(counted),
            why=why,
        )

    async def _boot(
        self,
        request: Request,
        boot: BootSpec,
        workload_id: str,
        image: Image | None,
        reschedule: ReschedulePolicy,
        *,
        reschedules: int = 0,
        why: str | None = None,
        key: str | None = None,
        abandoned: str | None = None,
    ) -> StoredWorkload:
        """Claim the identity, place, record the intent (``pending``), boot on the chosen
        node under the workload's own id, record it ``running``: a running workload the API
        knows, an ended record with the node's reason, or a pending one whose boot's outcome
        is unknown (``Unavailable``) — never a workload the registry has not seen.  ``key``:
        the create's idempotency key, claimed for ``workload_id``, renewed before the record;
        ``abandoned``: the workload of a dead attempt whose key this create took over — its
        identity claim, if it has no record, is taken over too."""
        placement = await self._claim_and_place(request, workload_id, abandoned)
        pending = StoredWorkload(
            id=workload_id,
            namespace=request.namespace,
            name=request.name,
            replica=request.replica,
            image=None if image is None else image.name,
            node=placement.worker_node,
            node_workload_id=workload_id,  # the node boots it under the API's id
            reservation_id=placement.reservation_id,
            colocated_bytes=placement.colocated_bytes,
            rank=placement.rank,
            state="pending",
            command=list(boot.command),
            env=dict(boot.env),
            restartable=reschedule.enabled,
            restart=boot.restart,
            reschedule=reschedule,
            reschedules=reschedules,
            history=with_event((), self.ports.clock(), "created", why, placement.worker_node),
            created_at=self.ports.clock(),
            request=request.model_dump(mode="json"),
        )
        await self._record_intent(request, placement, pending, key)
        node_workload_id = await self._run(request, boot, placement, workload_id)
        workload = await self._started(pending, node_workload_id)
        explanation = (
            f"booted {workload_id} on {placement.worker_node} ({placement.colocated_bytes} B "
            f"colocated, rank {placement.rank}); {self.decisions.summary(request)}"
        )
        self.decisions.note(
            request, "placed", explanation, placement=placement, workload_id=workload_id
        )
        return workload

    async def _claim_and_place(
        self, request: Request, workload_id: str, abandoned: str | None = None
    ) -> Placement:
        """Take the request's identity for ``workload_id`` (over ``abandoned``'s claim, an
        attempt of the same create that died before recording anything), then place it; a
        placement that fails gives the identity back."""

        async def holds(claim: Claim) -> str | None:
            if claim.workload_id == abandoned and await self.ports.workloads.get(abandoned) is None:
                return None  # its create died with its key, which this create took over
            return await self._holds(claim)

        claims = self.ports.workloads.claims
        await claims.claim(request.key, workload_id, holds=holds, now=self.ports.clock())
        try:
            return await self.decisions.place_request(request, workload_id)
        except Exception:
            await self.records.release(request.key, workload_id)
            raise

    async def _holds(self, claim: Claim) -> str | None:
        """How ``claim``'s workload still holds its identity: it runs (asked of its node), it
        is pending (recorded, its boot under way or of unknown outcome) or unknown (its node
        does not answer: it may run), or it has no record yet and its create is recent."""
        workload = await self.ports.workloads.get(claim.workload_id)
        if workload is None:
            if self.ports.clock() - claim.claimed_at < CLAIM_PENDING_S:
                return "being created"
            return None  # its create died before recording it
        workload = await self.records.refresh(workload)
        if workload.state == "running":
            return f"running on {workload.node}"
        if workload.state == "pending":
            return f"being created on {workload.node}"
        if workload.state == "unknown":
            return f"unknown: its node {workload.node} does not answer"
        return None

    async def _record_intent(
        self, request: Request, placement: Placement, pending: StoredWorkload, key: str | None
    ) -> None:
        """Record the workload ``pending`` before its node is asked to run it — first renewing
        its idempotency ``key``'s claim, if any: a key a repeat took over meanwhile is ``409``
        (in progress) with nothing recorded.  A registry that fails to record it is
        ``Unavailable`` with nothing booted: the lease is given back and the identity freed —
        whatever the failure (security finding 4: nothing a create took is kept by a create
        that did not happen)."""
        if key is not None:
            try:
                await self.keys.confirm(key, pending.id)
            except Exception as error:
                await self._give_back(request, placement, pending.id)
                detail = f"{pending.id} not recorded ({error}); nothing was booted"
                self.decisions.note(
                    request, "unavailable", detail, placement=placement, workload_id=pending.id
                )
                raise
        try:
            await self.ports.workloads.record(pending)
        except Exception as error:
            await self._give_back(request, placement, pending.id)
            detail = f"{pending.id} not recorded ({error}); nothing was booted"
            self.decisions.note(
                request, "unavailable", detail, placement=placement, workload_id=pending.id
            )
            if isinstance(error, Unavailable):
                raise Unavailable(detail) from None
            raise

    async def _run(
        self, request: Request, boot: BootSpec, placement: Placement, workload_id: str
    ) -> str:
        """Boot on the placement's node under its lease and ``workload_id``; the node's
        workload id.  An answer that never came (``Unavailable``: the outcome is unknown) is
        asked again under the same id — the node boots an id once — for up to
        :data:`RUN_ATTEMPTS` attempts within :data:`~berth.defaults.RUN_TIMEOUT_S`; still
        unknown, the record stays ``pending`` with the reason.  A refusal ends the record
        ``failed`` with the node's reason."""
        assert request.spec is not None
        node = placement.worker_node
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                # made in the try: a malformed order is answered as the node's Invalid is
                order = RunOrder(
                    request.spec,
                    request.layers,
                    boot,
                    request.platforms,
                    reservation=placement.reservation_id,
                    workload_id=workload_id,
                )
                return await self.ports.nodes.try_run(node, order)
            except Unavailable as error:
                elapsed = time.monotonic() - started
                if attempt < RUN_ATTEMPTS and elapsed < RUN_TIMEOUT_S:
                    log.info(
                        "run of %s on %s unanswered (%s); asking again", workload_id, node, error
                    )
                    await asyncio.sleep(RUN_RETRY_S * 2 ** (attempt - 1))
                    continue
                detail = await self._unanswered(request, placement, workload_id, attempt, error)
                raise Unavailable(
                    f"{detail}; {workload_id} is recorded pending until its node answers"
                ) from None
            except (Refused, Invalid) as error:
                # the node's answer: nothing runs (a refusal released the reservation there)
                with contextlib.suppress(Unavailable):  # the record then waits for a read
                    await self.records.end_by_id(
                        workload_id,
                        {"state": "failed", "detail": f"refused by {node}: {error}"},
                    )
                await self._give_back(request, placement, workload_id)
                outcome = "refused" if isinstance(error, Refused) else "invalid"
                self.decisions.note(
                    request, outcome, str(error), placement=placement, workload_id=workload_id
                )
                raise

    async def _unanswered(
        self,
        request: Request,
        placement: Placement,
        workload_id: str,
        attempts: int,
        error: Unavailable,
    ) -> str:
        """A run whose answer never came: the record stays ``pending`` (the claim with it),
        saying why; the node's answer to a later ``status`` settles it."""
        detail = (
            f"the boot on {placement.worker_node} was not answered after {attempts} "
            f"attempt(s) ({error}); its outcome is unknown"
        )
        with contextlib.suppress(Exception):
            await self.ports.workloads.transition(
                workload_id, {"detail": detail}, expect=("pending",)
            )
        self.decisions.note(
            request,
            "unavailable",
            f"boot on {placement.worker_node}: {error}",
            placement=placement,
            workload_id=workload_id,
        )
        return detail

    async def _started(self, pending: StoredWorkload, node_workload_id: str) -> StoredWorkload:
        """The node answered that it runs the workload: its record turns ``running`` (a
        compare-and-set from ``pending``; a reader that saw it running first did the same).
        A stop asked meanwhile is delivered now.  A registry that fails here leaves the
        record ``pending`` — the workload runs and a read that reaches its node confirms it."""
        update: dict[str, object] = {
            "state": "running",
            "node_workload_id": node_workload_id,
            "detail": None,
        }
        try:
            started, _ = await self.ports.workloads.transition(
                pending.id, update, expect=("pending",)
            )
        except Unavailable as error:
            raise Unavailable(
                f"{pending.id} booted on {pending.node}; its record still says pending "
                f"({error}): reading it confirms it"
            ) from None
        if started is None:  # the record is gone: report the workload as it runs
            return pending.model_copy(update=update)
        if started.stop_requested and started.state == "running":
            return await self.records.deliver_stop(started)
        return started

    async def _give_back(self, request: Request, placement: Placement, workload_id: str) -> None:
        """Undo a create that ends without a workload: the schedulers drop its reservation
        (and route) and release it on the node, and its identity is free again."""
        with contextlib.suppress(Exception):
            await self.ports.placements.release(placement, workload=request.key)
        await self.records.release(request.key, workload_id)
