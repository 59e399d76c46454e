"""What the API does, over a running cluster: place and boot, stop, drain, cordon, explain.

:class:`ClusterBackend` is written against ports only: a scheduler's replica of the node
states (for nodes and explanations), its node client (:class:`~berth.nodeclient.port.AgentClient`),
the placement port (:class:`~berth.api.placements.Placements`) and the API's registries
(:class:`~berth.registry.port.WorkloadRegistry` with its identity claims,
:class:`~berth.registry.port.ImageRegistry`).  In a scheduler's process
(``berth scheduler --http``, :func:`berth.api.server.scheduler_api`) they are that
scheduler's parts over NATS, the queue group (any scheduler of the group may place) and the
registries in the API's bucket; in this process (:mod:`berth.api.testing`) they are the
embedded cluster's and the in-memory registries — the same API, tested both ways.

**Create** (``POST /v1/workloads``) validates everything first (the request with berth's
types, the boot spec, the image), so bad input reserves nothing; then places through the
queue group — the scheduler confirms on the node under a lease.  Before placing, it claims
the workload's identity (``namespace/name/replica``,
:class:`~berth.registry.port.IdentityClaims`): an identity a live workload holds — or one a
concurrent create is placing — is ``409`` naming the holder, with nothing placed.  A create
that carries an ``Idempotency-Key`` claims the key first, after every check of its input
(:mod:`berth.api.idempotency`): a repeat is answered with the first attempt's workload and
places nothing; the claim is renewed just before the intent record, so a takeover of an
abandoned key never races it; a create that fails gives the key back unless its workload
may run.

**Intent before boot**: the placed workload is recorded ``pending`` before its node is asked
anything, then booted with the lease and *the API's id* (``try_run(…, reservation=…,
workload_id=…)``: the node binds the reservation to it and boots an id once).  A run whose
answer never came is asked again under the same id (:data:`RUN_ATTEMPTS`); the node's answer
turns the record ``running`` by compare-and-set; still unanswered, the record stays
``pending`` with the reason (``503``: the outcome is unknown, the claim is kept).  A refusal
(the node released the reservation already) ends the record ``failed`` with the node's
reason, tells the schedulers (``release``) so their assume caches drop it, frees the claim
and is ``409``.  A registry that fails to record the intent is ``503`` with nothing booted.

**Ends are pushed** (issue 20, part 6): a node publishes each workload's start, end and
restart as an event (:mod:`berth.events`), and :meth:`ClusterBackend.apply_event` — which the
served API runs on every event of the shared feed — records it with the same rules a read
applies to the node's ``status`` answer, by compare-and-set; an event of a workload no live
record of its node names (a ghost's, a replaced record's) changes nothing (counted
``unrecorded`` or ``stale``).  A start moves a ``pending`` record whose run's answer was lost
(its caller died, the connection dropped) to ``running`` at once, without a read.  So **a
listing reads the records** and asks no node; what a listing shows is as fresh as the last
event, read or reconciler pass (a node that does not answer is noticed by the reconciler,
within its period).

**State** follows the node: reading one live workload asks its node (``status``) and records
``exited`` (with the exit code), ``stopped`` or ``failed`` when it has ended — ``failed``
for one the node does not know only once the node's report of its workloads is whole (not
while a restarted agent is still adopting them: ``node_starting``).  **Unknown is
not an end**: a node that does not answer makes its workloads ``unknown`` (claim kept); a
stop then is kept on the record (``202``) and delivered when the node answers, which also
turns the record ``running`` again — asked by the API process that kept it, in the
background, as soon as the node answers (:meth:`ClusterBackend.stop`: a kept stop must not
wait for the reconciler, whose lease may be held by a process that just died), and by the
reconciler's passes whatever becomes of that process; only a node out of the schedulers' view for
:attr:`ClusterBackend.node_gone_after_s` is gone — its workloads ``lost``, their claims freed,
restartable ones placed again (``replaced_by``).  **Stop** is idempotent (a workload that
has ended is returned as it is).  **Drain** cordons the node, then stops its running
workloads (concurrently, each with ``grace_s`` between its ``SIGTERM`` and its ``SIGKILL``),
reporting each; ``restartable`` ones are placed and booted again from their recorded request
— the cordoned node refuses them at its own admission, so they land elsewhere — and the old
record gets ``replaced_by``.

**Restart and reschedule**: a create's restart policy goes to the node in the boot spec —
the node restarts (it sees the exit first); a read records the restarts the node reports
(``restarts``, a ``restarted`` event) and an end with the restarts exhausted as ``failed``.
Rescheduling is the API's: a record that ends ``lost``, or ``failed`` with its restarts
exhausted, is placed again as its reschedule policy allows (``replaced_by``, a
``rescheduled`` event); a drain's replacement does not count as one.  Each record keeps its
``history`` of such events.

**Recent placements** are a bounded ring (the newest ``recent_capacity``) of the decisions
this process made, each with the explanation's summary, for the dashboard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from berth.api import schemas
from berth.api.idempotency import CreateKeys, Members
from berth.api.placements import Placements
from berth.api.problems import Problem
from berth.boot import BootSpec, WorkloadStatus
from berth.defaults import (
    API_STOP_GRACE_S,
    IDEMPOTENCY_ABANDONED_AFTER_S,
    IDEMPOTENCY_RETENTION_S,
    NODE_GONE_AFTER_S,
    RUN_TIMEOUT_S,
)
from berth.errors import Invalid, NoCapacity, Unavailable
from berth.events.port import WorkloadEvent
from berth.model import INTERVAL_RULE, Placement, Request, ReschedulePolicy
from berth.node.runtime.port import checked_grace
from berth.nodeclient.port import AgentClient
from berth.ownership import Refused
from berth.registry.images import image_from_layout, image_of
from berth.registry.port import (
    CLAIM_PENDING_S,
    ENDED_STATES,
    LIVE_STATES,
    Claim,
    IdentityTaken,
    Image,
    ImageRegistry,
    StoredWorkload,
    WorkloadRegistry,
    new_workload_id,
    with_event,
)
from berth.scheduler.multinode import ClusterScheduler
from berth.state import NodeState

__all__ = ["ClusterBackend"]

log = logging.getLogger("berth.api")

STOP_MARGIN_S = 5.0
"""What a stop waits beyond its grace: the round trip, the kill, the runtime's cleanup."""
STATUS_TIMEOUT_S = 2.0
SWEEP_EVERY_S = 5.0
"""How often a served API refreshes its live workloads when nobody reads them
(:meth:`ClusterBackend.sweep_forever`)."""
RUN_ATTEMPTS = 4
"""How often a create asks its node to run a workload whose answer never came (the same id
each time: the node boots it once), within :data:`~berth.defaults.RUN_TIMEOUT_S`."""
RUN_RETRY_S = 0.5
"""The pause before the first retry of an unanswered run; it doubles for each further one
(0.5 + 1 + 2 s: about as long as NATS takes to reconnect after a server restart, twice)."""
KEPT_STOP_ASK_FIRST_S = 0.25
"""The first wait before the node of a kept stop is asked again (then doubled)."""
KEPT_STOP_ASK_MAX_S = 1.0
"""The longest wait between two questions to the node of a kept stop: a node that answers
again has its kept stops delivered within about this, plus the stop itself."""
MAX_KEPT_STOPS = 10_000
"""Kept stops one API process delivers in the background at once (more: the reconciler's)."""


def not_found(what: str, name: str) -> Problem:
    return Problem(404, "not_found", "not found", f"no {what} {name!r}")


class ClusterBackend:
    """The API's operations over a cluster (see the module docstring)."""

    def __init__(
        self,
        scheduler: ClusterScheduler,
        nodes: AgentClient,
        placements: Placements,
        workloads: WorkloadRegistry,
        images: ImageRegistry,
        *,
        recent_capacity: int = 1000,
        clock: Callable[[], float] = time.time,
        node_gone_after_s: float = NODE_GONE_AFTER_S,
        idempotency_abandoned_after_s: float = IDEMPOTENCY_ABANDONED_AFTER_S,
        idempotency_retention_s: float = IDEMPOTENCY_RETENTION_S,
        owner: str | None = None,
        members: Members | None = None,
    ) -> None:
        self.node_gone_after_s = INTERVAL_RULE(node_gone_after_s, "node_gone_after")
        self.scheduler = scheduler
        self.nodes = nodes
        self.placements = placements
        self.workloads = workloads
        self.images = images
        self.clock = clock
        self.keys = CreateKeys(
            workloads.keys,
            workloads,
            clock,
            abandoned_after_s=idempotency_abandoned_after_s,
            retention_s=idempotency_retention_s,
            owner=owner,
            members=members,
        )
        """The creates' idempotency keys (:mod:`berth.api.idempotency`; ``owner`` names this
        process in the claims, ``members`` says which are up)."""
        self._recent: deque[schemas.PlacementRecord] = deque(maxlen=recent_capacity)
        self._couriers: dict[str, asyncio.Task[None]] = {}
        """Kept stops this process delivers in the background, by record id (:meth:`stop`)."""

    async def close(self) -> None:
        """Cancel the background deliveries of kept stops (their records keep the stops: the
        reconciler, or the next API process, delivers them)."""
        couriers, self._couriers = list(self._couriers.values()), {}
        for courier in couriers:
            courier.cancel()
        if couriers:
            await asyncio.wait(couriers, timeout=1.0)

    # -- requests ----------------------------------------------------------------------------
    def _request(self, body: schemas.RequestBody) -> Request:
        document = body.model_dump(exclude_none=True)
        document["layers"] = [layer.model_dump() for layer in body.layers]
        return Request.from_dict(document)

    async def _workload_request(
        self, body: schemas.WorkloadCreate | schemas.ExplainBody
    ) -> tuple[Request, Image | None]:
        """The placement request of a create (or explain) body: its image's layers and
        platform, its instance type or spec — each checked, ``Invalid`` naming the field."""
        image = None
        if body.image is not None and body.layers is not None:
            raise Invalid("give an image or layers, not both", field="image")
        if body.image is not None:
            image = await self.images.get(body.image) if body.image else None
            if image is None:
                known = ", ".join(i.name for i in await self.images.list()) or "none"
                raise Invalid(
                    f"no registered image {body.image!r} (registered: {known})", field="image"
                )
        if body.type is not None and body.spec is not None:
            raise Invalid("give a type or a spec, not both", field="type")
        if image is not None:
            layers: list[dict[str, Any]] = [layer.model_dump() for layer in image.layers]
        else:
            layers = [layer.model_dump() for layer in body.layers or []]
        platforms = body.platforms
        if platforms is None:
            platforms = [image.platform] if image is not None and image.platform else []
        document: dict[str, Any] = {
            "namespace": body.namespace,
            "name": body.name,
            "replica": body.replica,
            "platforms": platforms,
            "layers": layers,
        }
        if body.spread is not None:
            document["spread"] = body.spread.model_dump()
        if isinstance(body, schemas.ExplainBody) and body.preferred_node is not None:
            document["preferred_node"] = body.preferred_node
        spec = body.type if body.type is not None else body.spec
        if spec is not None:
            document["spec"] = spec
        try:
            return Request.from_dict(document), image
        except Invalid as error:
            if error.field == "spec" and body.type is not None:
                raise Invalid(error.message, field="type") from None
            raise

    def _note(
        self,
        request: Request,
        outcome: str,
        explanation: str,
        *,
        placement: Placement | None = None,
        workload_id: str | None = None,
    ) -> None:
        self._recent.append(
            schemas.PlacementRecord(
                at=self.clock(),
                workload_id=workload_id,
                namespace=request.namespace,
                name=request.name,
                node=None if placement is None else placement.worker_node,
                outcome=outcome,
                colocated_bytes=0 if placement is None else placement.colocated_bytes,
                rank=None if placement is None else placement.rank,
                explanation=explanation,
            )
        )
        if self.scheduler.metrics is not None:  # berth_api_placements_total{outcome}
            self.scheduler.metrics.api_placement(outcome)

    def _summary(self, request: Request) -> str:
        try:
            return self.scheduler.explain(request).summary()
        except Exception as error:  # an explanation is a courtesy; never fail a placement
            return f"(no explanation: {error})"

    async def _place(self, request: Request, workload_id: str | None = None) -> Placement:
        """Through the queue group; every outcome noted among the recent placements."""
        try:
            placement = await self.placements.schedule(request)
        except NoCapacity as error:
            self._note(request, "no_capacity", str(error), workload_id=workload_id)
            raise
        except Invalid as error:  # NoMatchingPlatform included
            self._note(request, "invalid", str(error), workload_id=workload_id)
            raise
        except Unavailable as error:
            self._note(request, "unavailable", str(error), workload_id=workload_id)
            raise
        return placement

    # -- placements --------------------------------------------------------------------------
    async def place(self, body: schemas.RequestBody) -> Placement:
        """The placement port: a lease on the chosen node (no boot)."""
        request = self._request(body)
        placement = await self._place(request)
        explanation = (
            f"placed on {placement.worker_node} (lease {placement.reservation_id}, "
            f"rank {placement.rank}); {self._summary(request)}"
        )
        self._note(request, "placed", explanation, placement=placement)
        return placement

    async def explain(self, body: schemas.ExplainBody) -> schemas.Explanation:
        request, _ = await self._workload_request(body)
        explanation = self.scheduler.explain(request)
        return schemas.Explanation(
            verdicts=[
                schemas.Verdict(
                    node=verdict.node,
                    verdict=verdict.verdict,
                    detail=verdict.description,
                    colocated_bytes=verdict.colocated_bytes,
                    rank=verdict.rank,
                )
                for verdict in explanation.verdicts
            ],
            summary=explanation.summary(),
        )

    def recent(self, limit: int) -> list[schemas.PlacementRecord]:
        """The newest ``limit`` placement decisions, newest first."""
        items = list(self._recent)[-limit:]
        items.reverse()
        return items

    # -- workloads ---------------------------------------------------------------------------
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
        request, image = await self._workload_request(body)
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
            return await self.workload(first), True
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
            history=with_event((), self.clock(), "created", why, placement.worker_node),
            created_at=self.clock(),
            request=request.model_dump(mode="json"),
        )
        await self._record_intent(request, placement, pending, key)
        node_workload_id = await self._run(request, boot, placement, workload_id)
        workload = await self._started(pending, node_workload_id)
        explanation = (
            f"booted {workload_id} on {placement.worker_node} ({placement.colocated_bytes} B "
            f"colocated, rank {placement.rank}); {self._summary(request)}"
        )
        self._note(request, "placed", explanation, placement=placement, workload_id=workload_id)
        return workload

    async def _claim_and_place(
        self, request: Request, workload_id: str, abandoned: str | None = None
    ) -> Placement:
        """Take the request's identity for ``workload_id`` (over ``abandoned``'s claim, an
        attempt of the same create that died before recording anything), then place it; a
        placement that fails gives the identity back."""

        async def holds(claim: Claim) -> str | None:
            if claim.workload_id == abandoned and await self.workloads.get(abandoned) is None:
                return None  # its create died with its key, which this create took over
            return await self._holds(claim)

        claims = self.workloads.claims
        await claims.claim(request.key, workload_id, holds=holds, now=self.clock())
        try:
            return await self._place(request, workload_id)
        except Exception:
            await self._release(request.key, workload_id)
            raise

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
                self._note(
                    request, "unavailable", detail, placement=placement, workload_id=pending.id
                )
                raise
        try:
            await self.workloads.record(pending)
        except Exception as error:
            await self._give_back(request, placement, pending.id)
            detail = f"{pending.id} not recorded ({error}); nothing was booted"
            self._note(request, "unavailable", detail, placement=placement, workload_id=pending.id)
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
                return await self.nodes.try_run(
                    node,
                    request.spec,
                    request.layers,
                    boot,
                    request.platforms,
                    reservation=placement.reservation_id,
                    workload_id=workload_id,
                )
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
                    await self._end_by_id(
                        workload_id,
                        {"state": "failed", "detail": f"refused by {node}: {error}"},
                    )
                await self._give_back(request, placement, workload_id)
                outcome = "refused" if isinstance(error, Refused) else "invalid"
                self._note(
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
            await self.workloads.transition(workload_id, {"detail": detail}, expect=("pending",))
        self._note(
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
            started, _ = await self.workloads.transition(pending.id, update, expect=("pending",))
        except Unavailable as error:
            raise Unavailable(
                f"{pending.id} booted on {pending.node}; its record still says pending "
                f"({error}): reading it confirms it"
            ) from None
        if started is None:  # the record is gone: report the workload as it runs
            return pending.model_copy(update=update)
        if started.stop_requested and started.state == "running":
            return await self._deliver_stop(started)
        return started

    async def _holds(self, claim: Claim) -> str | None:
        """How ``claim``'s workload still holds its identity: it runs (asked of its node), it
        is pending (recorded, its boot under way or of unknown outcome) or unknown (its node
        does not answer: it may run), or it has no record yet and its create is recent."""
        workload = await self.workloads.get(claim.workload_id)
        if workload is None:
            if self.clock() - claim.claimed_at < CLAIM_PENDING_S:
                return "being created"
            return None  # its create died before recording it
        workload = await self._refresh(workload)
        if workload.state == "running":
            return f"running on {workload.node}"
        if workload.state == "pending":
            return f"being created on {workload.node}"
        if workload.state == "unknown":
            return f"unknown: its node {workload.node} does not answer"
        return None

    async def _give_back(self, request: Request, placement: Placement, workload_id: str) -> None:
        """Undo a create that ends without a workload: the schedulers drop its reservation
        (and route) and release it on the node, and its identity is free again."""
        with contextlib.suppress(Exception):
            await self.placements.release(placement, workload=request.key)
        await self._release(request.key, workload_id)

    async def _release(self, identity: str, workload_id: str) -> None:
        """Give up ``workload_id``'s claim on ``identity`` (best effort: a claim left behind
        is taken over once its holder is seen not to run)."""
        try:
            await self.workloads.claims.release(identity, workload_id)
        except Exception as error:
            log.warning("could not release the claim of %s on %s: %s", workload_id, identity, error)

    async def _end(self, workload: StoredWorkload, update: dict[str, object]) -> StoredWorkload:
        """Record that a live workload ended (``update`` applied to its record as it is now,
        by compare-and-set: nothing written meanwhile is lost), and free its identity — once,
        by whichever reader recorded the end."""
        ended, _ = await self._end_by_id(workload.id, update)
        return workload.model_copy(update=update) if ended is None else ended

    async def _end_by_id(
        self, workload_id: str, update: dict[str, object]
    ) -> tuple[StoredWorkload | None, bool]:
        """:meth:`_end` by id: the record and whether this call recorded the end."""
        update.setdefault("ended_at", self.clock())
        ended, recorded = await self.workloads.end(workload_id, update)
        if ended is not None and recorded:
            await self._release(Request.from_dict(ended.request).key, ended.id)
        return ended, recorded

    async def workload(self, workload_id: str) -> StoredWorkload:
        workload = await self.workloads.get(workload_id)
        if workload is None:
            raise not_found("workload", workload_id)
        return await self._refresh(workload)

    async def list_workloads(
        self, namespace: str | None, node: str | None, state: str | None
    ) -> list[StoredWorkload]:
        """The records as they are (no node is asked: ends arrive as events)."""
        found = await self.workloads.list(namespace=namespace, node=node)
        return [workload for workload in found if state is None or workload.state == state]

    async def apply_event(self, event: WorkloadEvent) -> str:
        """Record what a node's event says (see the module docstring): ``applied``,
        ``stale`` (the record had it already, or has ended) or ``unrecorded`` (no record of
        that node names the workload).  A registry that cannot be reached raises
        ``Unavailable``: the feed hands the event out again."""
        workload = await self.workloads.get(event.workload_id)
        if (
            workload is None
            or workload.node != event.node
            or workload.node_workload_id != event.workload_id
        ):
            outcome = "unrecorded"
        elif workload.state not in LIVE_STATES:
            outcome = "stale"
        elif event.kind == "started":  # its run's answer may never have come: it runs
            moved = await self._runs(workload)
            outcome = "applied" if moved.state != workload.state else "stale"
        elif event.kind == "restarted":
            moved = await self._restarted(workload, event.status())
            await self._runs(moved)  # the node restarted it: it runs (a kept stop delivered)
            outcome = "stale" if moved is workload and workload.state == "running" else "applied"
        else:
            ended = await self._node_ended(workload, event.status())
            outcome = "applied" if ended.state not in LIVE_STATES else "stale"
        if outcome != "applied":
            log.debug("event %s: %s", event.key, outcome)
        if self.scheduler.metrics is not None:  # berth_events_applied_total{outcome}
            self.scheduler.metrics.event_applied(outcome, max(0.0, self.clock() - event.at))
        return outcome

    async def sweep(self) -> int:
        """Refresh every live workload (:meth:`_refresh`), as a read would: unknown ones are
        noticed, kept stops delivered and gone nodes' workloads lost without anyone reading
        them.  How many live records were looked at."""
        live = [w for w in await self.workloads.list() if w.state in LIVE_STATES]
        await asyncio.gather(*(self._refresh(workload) for workload in live))
        return len(live)

    async def sweep_forever(self, every_s: float = SWEEP_EVERY_S) -> None:
        """:meth:`sweep` every ``every_s`` seconds until cancelled; a sweep that fails (the
        registry unreachable) is logged and the next one tries again.  An interim for the
        reconciler (:mod:`berth.api.reconciler`, which the served API runs instead): every
        process that runs it sweeps, and the compare-and-sets keep them apart."""
        every_s = INTERVAL_RULE(every_s, "every_s")
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.sweep()
            except Exception:
                log.exception("a sweep of the live workloads failed")

    # -- what the reconciler (berth.api.reconciler) moves records with: the reads' own rules --
    async def refresh(self, workload: StoredWorkload) -> StoredWorkload:
        """:meth:`_refresh`: ask the node about a live workload and record what is learnt."""
        return await self._refresh(workload)

    async def runs(self, workload: StoredWorkload) -> StoredWorkload:
        """The node reports that it runs ``workload``: :meth:`_runs` (``pending``/``unknown``
        → ``running`` by compare-and-set; a kept stop delivered)."""
        return await self._runs(workload)

    async def end(self, workload: StoredWorkload, update: dict[str, object]) -> StoredWorkload:
        """:meth:`_end`: record a live workload's end and free its identity."""
        return await self._end(workload, update)

    async def _refresh(self, workload: StoredWorkload) -> StoredWorkload:
        """Ask a live workload's node about it and record what is learnt (each change a
        compare-and-set): ``pending`` or ``unknown`` → ``running`` when the node runs it (a
        stop kept meanwhile is delivered then); ``running`` → ``unknown`` when the node does
        not answer; → ``exited``/``stopped``/``failed`` when it says the workload ended or
        never heard of it; ``unknown`` → ``lost`` once its node has been out of the
        schedulers' view for :attr:`node_gone_after_s`."""
        if workload.state not in LIVE_STATES:
            return workload
        if workload.state != "running" and workload.node not in self.scheduler.states():
            return await self._maybe_lost(workload)  # not back yet: nothing to ask
        try:
            status = await asyncio.wait_for(
                self.nodes.status(workload.node, workload.node_workload_id), STATUS_TIMEOUT_S
            )
        except (Unavailable, TimeoutError) as error:
            return await self._unreachable(workload, error)
        if status.state == "running":
            return await self._runs(await self._restarted(workload, status))
        if status.state == "unknown":
            if workload.state == "pending":
                return await self._pending_unknown_to_node(workload)
            if not await self._settled(workload.node):
                return workload  # a restarted agent not done adopting: it may yet know it
            update: dict[str, object] = {
                "state": "failed",
                "detail": f"node {workload.node} no longer knows it (the agent restarted?)",
            }
            return await self._record_end(workload, update, exhausted=False)
        return await self._node_ended(workload, status)

    async def _node_ended(self, workload: StoredWorkload, status: WorkloadStatus) -> StoredWorkload:
        """The node says the workload ended (its ``status`` answer or its event): record
        ``stopped``, ``exited`` or ``failed`` with the exit code and the node's reason."""
        kind = (
            "stopped"
            if status.stopped
            else ("exited" if status.exit_code is not None and not status.exhausted else "failed")
        )
        update: dict[str, object] = {
            "state": kind,
            "exit_code": status.exit_code,
            "detail": status.reason,
            "restarts": max(workload.restarts, status.restarts),
        }
        return await self._record_end(workload, update, exhausted=status.exhausted)

    async def _record_end(
        self, workload: StoredWorkload, update: dict[str, object], *, exhausted: bool
    ) -> StoredWorkload:
        """End the record with ``update`` and an event in its history; one whose restarts
        ran out (``exhausted``) and ended ``failed`` is placed again as its policy allows."""
        history = with_event(
            workload.history,
            self.clock(),
            str(update["state"]),
            str(update["detail"]),
            workload.node,
        )
        update["history"] = _dumped(history)
        ended = await self._end(workload, update)
        if exhausted and ended.state == "failed":
            return await self._reschedule(ended)
        return ended

    async def _restarted(self, workload: StoredWorkload, status: WorkloadStatus) -> StoredWorkload:
        """Record the restarts the node reports beyond those recorded (count and event)."""
        if status.restarts <= workload.restarts:
            return workload
        first, last = workload.restarts + 1, status.restarts
        count = f"restart {last}" if first == last else f"restarts {first}-{last}"
        reason = f"{count}, after its run {status.reason or 'ended'}"
        history = with_event(workload.history, self.clock(), "restarted", reason, workload.node)
        update: dict[str, object] = {"restarts": status.restarts, "history": _dumped(history)}
        moved, _ = await self.workloads.transition(workload.id, update, expect=(workload.state,))
        return workload if moved is None else moved

    async def _settled(self, node: str) -> bool:
        """Whether ``node``'s word that it does not know a workload is final: not while a
        restarted agent is still adopting its workloads (its report refused
        ``node_starting``), nor when the node does not answer that question."""
        try:
            await asyncio.wait_for(self.nodes.running(node), STATUS_TIMEOUT_S)
        except (Refused, Unavailable, TimeoutError):
            return False
        return True

    async def _runs(self, workload: StoredWorkload) -> StoredWorkload:
        """The node says the workload runs: a ``pending`` or ``unknown`` record turns
        ``running``; a stop kept on it is delivered now."""
        if workload.state != "running":
            update: dict[str, object] = {"state": "running", "unknown_since": None, "detail": None}
            moved, _ = await self.workloads.transition(
                workload.id, update, expect=("pending", "unknown")
            )
            if moved is None:
                return workload
            workload = moved
            if workload.state == "running":
                log.info("%s runs on %s again", workload.id, workload.node)
        if workload.state == "running" and workload.stop_requested:
            return await self._deliver_stop(workload)
        return workload

    async def _unreachable(self, workload: StoredWorkload, error: Exception) -> StoredWorkload:
        """The node did not answer: a ``running`` workload becomes ``unknown`` (it may well
        still run: its identity stays claimed); a ``pending`` or ``unknown`` one stays as it
        is, unless its node has been gone long enough for it to be lost."""
        if workload.state != "running":
            return await self._maybe_lost(workload)
        update: dict[str, object] = {
            "state": "unknown",
            "unknown_since": self.clock(),
            "detail": f"node {workload.node} does not answer ({error or type(error).__name__})",
        }
        moved, mine = await self.workloads.transition(workload.id, update, expect=("running",))
        if mine:
            log.warning("%s is unknown: %s", workload.id, update["detail"])
        return workload if moved is None else moved

    async def _maybe_lost(self, workload: StoredWorkload) -> StoredWorkload:
        """An ``unknown`` workload whose node is out of the schedulers' view, and has not
        answered for :attr:`node_gone_after_s` since it was first unreachable, is ``lost``:
        its identity is freed and a restartable one is placed again elsewhere
        (``replaced_by``).  A ``pending`` one likewise, counted from its create and never
        before :data:`CLAIM_PENDING_S` (its create may still be asking the node)."""
        if workload.node in self.scheduler.states():
            return workload  # the node publishes: it lives, only its answers are missing
        if workload.state == "unknown" and workload.unknown_since is not None:
            since, wait_s = workload.unknown_since, self.node_gone_after_s
        else:
            since, wait_s = workload.created_at, max(self.node_gone_after_s, CLAIM_PENDING_S)
        silent_s = self.clock() - since
        if silent_s < wait_s:
            return workload
        detail = (
            f"node {workload.node} gone: out of the cluster, no answer for "
            f"{silent_s:.0f}s (node_gone_after {self.node_gone_after_s:g}s)"
        )
        history = with_event(workload.history, self.clock(), "lost", detail, workload.node)
        update: dict[str, object] = {"state": "lost", "detail": detail, "history": _dumped(history)}
        lost, recorded = await self._end_by_id(workload.id, update)
        if lost is None or not recorded:
            return workload if lost is None else lost
        log.warning("%s lost: %s", workload.id, update["detail"])
        return await self._reschedule(lost)

    async def _reschedule(self, ended: StoredWorkload) -> StoredWorkload:
        """Place an ended (``lost``, or ``failed`` with its restarts exhausted) workload again,
        elsewhere when its node is gone, if its reschedule policy allows one more; its record
        gets ``replaced_by`` and a ``rescheduled`` event, or the reason it was not."""
        if not ended.reschedule.allows(ended.reschedules):
            return ended
        state = (ended.state,)
        try:
            replacement = await self._replace(ended)
        except (Invalid, NoCapacity, Unavailable, Refused, IdentityTaken) as error:
            log.warning("%s %s and not placed again: %s", ended.id, ended.state, error)
            detail = f"{ended.detail}; not placed again: {error}"
            history = with_event(ended.history, self.clock(), "not rescheduled", str(error), None)
            update: dict[str, object] = {"detail": detail, "history": _dumped(history)}
            return (await self.workloads.transition(ended.id, update, expect=state))[0] or ended
        history = with_event(
            ended.history, self.clock(), "rescheduled", f"as {replacement.id}", replacement.node
        )
        update = {"replaced_by": replacement.id, "history": _dumped(history)}
        replaced, _ = await self.workloads.transition(ended.id, update, expect=state)
        return replaced or ended

    async def _pending_unknown_to_node(self, workload: StoredWorkload) -> StoredWorkload:
        """A ``pending`` workload its node has never heard of: its boot is still on its way
        (or being retried) — unless its create is older than :data:`CLAIM_PENDING_S`, when
        no boot can still be coming and the record ends ``failed``."""
        if self.clock() - workload.created_at < CLAIM_PENDING_S:
            return workload
        update: dict[str, object] = {
            "state": "failed",
            "detail": f"never ran: node {workload.node} has no such workload "
            f"{CLAIM_PENDING_S:g}s after its create",
        }
        return await self._end(workload, update)

    async def _deliver_stop(self, workload: StoredWorkload) -> StoredWorkload:
        """Deliver a stop kept on the record of a workload whose node answers again."""
        try:
            stopped = await self._stop_on_node(workload, workload.stop_grace_s)
        except (Unavailable, Refused) as error:
            log.warning("the kept stop of %s is not delivered yet: %s", workload.id, error)
            return workload
        log.info("delivered the kept stop of %s on %s", workload.id, workload.node)
        return stopped

    def _deliver_when_back(self, workload_id: str) -> None:
        """Ask the node of an ``unknown`` workload with a kept stop again in the background
        until the stop is delivered or the record has ended (:meth:`_courier`); one task per
        record, at most :data:`MAX_KEPT_STOPS` (beyond, the reconciler delivers them)."""
        if workload_id in self._couriers:
            return
        if len(self._couriers) >= MAX_KEPT_STOPS:
            log.warning(
                "the kept stop of %s waits for the reconciler: %d deliveries already wait",
                workload_id,
                len(self._couriers),
            )
            return
        task = asyncio.get_running_loop().create_task(self._courier(workload_id))
        self._couriers[workload_id] = task
        task.add_done_callback(lambda done: self._delivered(workload_id, done))

    def _delivered(self, workload_id: str, task: asyncio.Task[None]) -> None:
        if self._couriers.get(workload_id) is task:
            del self._couriers[workload_id]

    async def _courier(self, workload_id: str) -> None:
        """Read the record and refresh it (:meth:`_refresh`: the node asked, once it is back
        in the schedulers' view) every :data:`KEPT_STOP_ASK_FIRST_S` doubling to
        :data:`KEPT_STOP_ASK_MAX_S`, until it has ended or carries no kept stop; a node that
        answers again turns the record ``running`` and gets the stop at once.  Given up (the
        reconciler's then) after :attr:`node_gone_after_s` — by then a node still silent
        has made the record ``lost``."""
        wait_s = KEPT_STOP_ASK_FIRST_S
        give_up_at = self.clock() + self.node_gone_after_s
        while self.clock() < give_up_at:
            await asyncio.sleep(wait_s)
            wait_s = min(wait_s * 2, KEPT_STOP_ASK_MAX_S)
            try:
                record = await self.workloads.get(workload_id)
                if record is None or record.state not in LIVE_STATES or not record.stop_requested:
                    return
                if (await self._refresh(record)).state not in LIVE_STATES:
                    return
            except Exception as error:  # a background task: whatever failed, ask again
                log.info("the kept stop of %s is not delivered yet: %s", workload_id, error)
        log.warning("the kept stop of %s is left to the reconciler", workload_id)

    async def stop(self, workload_id: str, grace_s: float | None) -> StoredWorkload:
        """Stop a workload (idempotent): the node's runtime sends the graceful signal and
        kills it ``grace_s`` later (``None``: the node's configured grace); this waits that
        long plus :data:`STOP_MARGIN_S` (``None``: :data:`API_STOP_GRACE_S` plus it).

        A workload whose node cannot be reached now (``unknown``), or whose boot has not
        been answered (``pending``), keeps the stop on its record (``stop_requested``): it is
        delivered when the node answers again, and the record answered as it is (the HTTP
        API's ``202``: accepted, not done).  A ``pending`` one's create delivers it after its
        boot; an ``unknown`` one's node is asked again from this process in the background
        (:meth:`_deliver_when_back`) — and by the reconciler's passes, whichever answers
        first: the stop is on the record, so it survives this process."""
        grace_s = checked_grace(grace_s)
        workload = await self.workload(workload_id)
        if workload.state in ("pending", "unknown"):
            kept, _ = await self.workloads.transition(
                workload.id,
                {"stop_requested": True, "stop_grace_s": grace_s},
                expect=("pending", "unknown"),
            )
            if kept is not None and kept.state == "running":  # it came back meanwhile
                return await self._stop_on_node(kept, grace_s)
            if kept is not None and kept.state == "unknown":
                self._deliver_when_back(kept.id)
            return workload if kept is None else kept
        if workload.state != "running":
            return workload
        return await self._stop_on_node(workload, grace_s)

    async def _stop_on_node(
        self, workload: StoredWorkload, grace_s: float | None
    ) -> StoredWorkload:
        deadline = API_STOP_GRACE_S if grace_s is None else grace_s
        try:
            await asyncio.wait_for(
                self.nodes.stop(workload.node, workload.node_workload_id, grace_s=grace_s),
                deadline + STOP_MARGIN_S,
            )
        except TimeoutError:
            raise Unavailable(
                f"{workload.id} did not stop within {deadline:g}s on {workload.node}"
            ) from None
        stopped = await self._refresh(workload)  # records the end the node reports
        if stopped.state in LIVE_STATES:  # the node's status lags its stop by nothing, but be sure
            update: dict[str, object] = {"state": "stopped", "detail": "stopped by the API"}
            stopped = await self._end(workload, update)
        return stopped

    # -- nodes -------------------------------------------------------------------------------
    def _state(self, name: str) -> NodeState:
        state = self.scheduler.states().get(name)
        if state is None:
            raise not_found("node", name)
        return state

    @staticmethod
    def _info(state: NodeState, workloads: int, cordoned: bool | None = None) -> schemas.NodeInfo:
        return schemas.NodeInfo(
            name=state.node,
            platform=str(state.platform),
            labels=dict(state.labels),
            cordoned=state.cordoned if cordoned is None else cordoned,
            mem_max=state.mem_total,
            mem_reserved=state.mem_total - state.mem_free,
            disk_max=state.disk_total,
            disk_reserved=state.disk_total - state.disk_free,
            cpu_load=state.cpu_load,
            cpu_capacity=state.cpu_capacity,
            disk_bw_load=state.disk_bw_load,
            disk_bw_ceiling=state.disk_bw_ceiling,
            net_bw_load=state.net_bw_load,
            net_bw_ceiling=state.net_bw_ceiling,
            layers=len(state.layers),
            workloads=workloads,
            published_at=state.published_at,
        )

    async def _live_by_node(self) -> dict[str, int]:
        """Each node's live workloads (running, pending or unknown: all hold their place)."""
        counts: dict[str, int] = {}
        for workload in await self.workloads.list():
            if workload.state in LIVE_STATES:
                counts[workload.node] = counts.get(workload.node, 0) + 1
        return counts

    async def node_list(self) -> list[schemas.NodeInfo]:
        states = self.scheduler.states()
        counts = await self._live_by_node()
        return [self._info(states[name], counts.get(name, 0)) for name in sorted(states)]

    async def node(self, name: str) -> schemas.NodeInfo:
        state = self._state(name)
        return self._info(state, (await self._live_by_node()).get(name, 0))

    async def cordon(self, name: str, cordoned: bool) -> schemas.NodeInfo:
        """Cordon or uncordon ``name`` on the node itself (authoritative), then wait briefly
        for this scheduler's replica to show it."""
        self._state(name)
        if cordoned:
            await self.nodes.cordon(name)
        else:
            await self.nodes.uncordon(name)
        for _ in range(40):
            state = self.scheduler.states().get(name)
            if state is None or state.cordoned == cordoned:
                break
            await asyncio.sleep(0.05)
        state = self._state(name)
        return self._info(state, (await self._live_by_node()).get(name, 0), cordoned)

    async def drain(self, name: str, grace_s: float) -> schemas.DrainReport:
        """Cordon, stop every running workload (``grace_s`` each), place restartable ones again."""
        checked_grace(grace_s)  # before the cordon: a malformed grace changes nothing
        await self.cordon(name, True)
        running = await self.workloads.list(node=name, state="running")
        # all at once: a drain takes about one grace period, not one per workload
        items = await asyncio.gather(*(self._drain_one(w, grace_s) for w in running))
        return schemas.DrainReport(node=name, items=list(items))

    async def _drain_one(self, workload: StoredWorkload, grace_s: float) -> schemas.DrainItem:
        try:
            stopped = await self.stop(workload.id, grace_s)
        except (Unavailable, Refused) as error:
            return schemas.DrainItem(
                workload_id=workload.id, outcome="failed", detail=f"could not stop it: {error}"
            )
        if stopped.state in LIVE_STATES:  # its node did not answer: the stop is kept
            return schemas.DrainItem(
                workload_id=workload.id,
                outcome="failed",
                detail=f"not stopped yet ({stopped.detail}); the stop is delivered when "
                "its node answers",
            )
        if not workload.restartable:
            return schemas.DrainItem(
                workload_id=workload.id, outcome="stopped", detail=stopped.detail or "stopped"
            )
        try:
            replacement = await self._replace(stopped, counted=False)  # a drain is no failure
        except (Invalid, NoCapacity, Unavailable, Refused, IdentityTaken) as error:
            return schemas.DrainItem(
                workload_id=workload.id,
                outcome="failed",
                detail=f"stopped; not placed again: {error}",
            )
        history = with_event(
            stopped.history, self.clock(), "drained", f"as {replacement.id}", replacement.node
        )
        await self.workloads.transition(
            stopped.id,
            {"replaced_by": replacement.id, "history": _dumped(history)},
            expect=ENDED_STATES,
        )
        return schemas.DrainItem(
            workload_id=workload.id,
            outcome="replaced",
            detail=f"stopped; replaced by {replacement.id} on {replacement.node}",
            new_workload_id=replacement.id,
            new_node=replacement.node,
        )

    async def _replace(self, workload: StoredWorkload, *, counted: bool = True) -> StoredWorkload:
        """Place and boot ``workload`` again from its recorded request, under a new id,
        avoiding the node it ran on (a soft hint: asked only if no other node takes it);
        ``counted``: as one more reschedule of its line (a drain's is not)."""
        request = Request.from_dict(workload.request).avoiding(workload.node)
        image = None if workload.image is None else await self.images.get(workload.image)
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

    # -- images ------------------------------------------------------------------------------
    async def add_image(self, body: schemas.ImageCreate) -> Image:
        image = image_of(body.name, [layer.model_dump() for layer in body.layers], body.platform)
        await self.images.add(image)
        return image

    async def import_oci(self, body: schemas.OciImport) -> Image:
        image = await asyncio.to_thread(
            image_from_layout, body.path, name=body.name, ref=body.ref, platform=body.platform
        )
        await self.images.add(image)
        return image

    async def image(self, name: str) -> Image:
        image = await self.images.get(name) if name else None
        if image is None:
            raise not_found("image", name)
        return image

    async def image_list(self) -> list[Image]:
        return await self.images.list()


def _dumped(history: list[Any]) -> list[dict[str, object]]:
    """A record's history as plain data, for a transition's update."""
    return [event.model_dump() for event in history]
