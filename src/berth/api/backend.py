"""What the API does, over a running cluster: place and boot, stop, drain, cordon, explain.

:class:`ClusterBackend` is written against ports only: a scheduler's view of the node
states (for nodes and explanations, :class:`~berth.scheduler.view.ClusterView`), its node
client (:class:`~berth.nodeclient.port.AgentClient`), the placement port with its release
(:class:`~berth.scheduler.port.ReleasingScheduler`), the API's registries
(:class:`~berth.registry.port.WorkloadRegistry` with its identity claims,
:class:`~berth.registry.port.ImageRegistry`) and where its decisions are counted
(:class:`~berth.observability.metrics.Metrics`, the scheduler's).  In a scheduler's process
(``berth scheduler --http``, composed by :mod:`berth.processes.scheduler`) they are that
scheduler's parts over NATS, the queue group (any scheduler of the group may place) and the
registries in the API's bucket; in this process (:mod:`berth.api.testing`) they are the
embedded cluster's and the in-memory registries — the same API, tested both ways.

It is the one object the routes (:mod:`berth.api.app`) and the reconciler
(:mod:`berth.api.reconciler`) hold, composed of one part per responsibility, each in its own
module with the rules it keeps:

- :mod:`berth.api.decisions` — the request a body asks for, placed or explained; the recent
  placements (the dashboard's ring).
- :mod:`berth.api.create` — create: validate, claim the identity and the idempotency key,
  record the intent before the boot, run attempts; every placement again (reschedule, drain).
- :mod:`berth.api.records` — the records following their nodes: reads, ends pushed by events,
  unknown, node gone → ``lost`` and placed again, restarts; kept stops delivered.
- :mod:`berth.api.stops` — stop: now, or kept on the record and delivered in the background.
- :mod:`berth.api.nodes` — the nodes listed and read, cordon, drain.

Images are registered and read here (they are the registry's, checked at the edge by
:mod:`berth.registry.images`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from berth.api import schemas
from berth.api.create import Creates
from berth.api.decisions import Decisions
from berth.api.idempotency import CreateKeys, Members
from berth.api.nodes import NodeOperations
from berth.api.ports import ApiPorts
from berth.api.records import SWEEP_EVERY_S, Records, not_found
from berth.api.stops import Stops
from berth.boot import WorkloadLogs
from berth.defaults import (
    IDEMPOTENCY_ABANDONED_AFTER_S,
    IDEMPOTENCY_RETENTION_S,
    NODE_GONE_AFTER_S,
)
from berth.events.port import WorkloadEvent
from berth.model import INTERVAL_RULE, Placement
from berth.nodeclient.port import AgentClient
from berth.observability.metrics import Metrics
from berth.registry.images import image_from_layout, image_of
from berth.registry.port import Image, ImageRegistry, StoredWorkload, WorkloadRegistry
from berth.scheduler.port import ReleasingScheduler
from berth.scheduler.view import ClusterView

__all__ = ["ClusterBackend"]


class ClusterBackend:
    """The API's operations over a cluster (see the module docstring): each is its part's."""

    def __init__(
        self,
        view: ClusterView,
        nodes: AgentClient,
        placements: ReleasingScheduler,
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
        metrics: Metrics | None = None,
    ) -> None:
        self.node_gone_after_s = INTERVAL_RULE(node_gone_after_s, "node_gone_after")
        self.view = view
        self.metrics = metrics
        """Where the API's placements and events are counted (``None``: nowhere)."""
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
        self.ports = ApiPorts(view, nodes, placements, workloads, images, clock, metrics)
        """The ports, as the parts hold them (:class:`berth.api.ports.ApiPorts`)."""
        self._decisions = Decisions(self.ports, recent_capacity=recent_capacity)
        self._records = Records(
            self.ports,
            node_gone_after_s=self.node_gone_after_s,
            # a reschedule places again as a create does (the creates are made next)
            replace=lambda ended: self._creates.replace(ended),
        )
        self._creates = Creates(self.ports, self._records, self._decisions, self.keys)
        self._stops = Stops(self._records)
        self._node_operations = NodeOperations(self._records, self._stops, self._creates)

    async def close(self) -> None:
        """:meth:`berth.api.stops.Stops.close`: cancel the background deliveries of kept
        stops (their records keep the stops)."""
        await self._stops.close()

    # -- placements (berth.api.decisions) ----------------------------------------------------
    async def place(self, body: schemas.RequestBody) -> Placement:
        """The placement port: a lease on the chosen node (no boot)."""
        return await self._decisions.place(body)

    async def explain(self, body: schemas.ExplainBody) -> schemas.Explanation:
        """Each node's verdict on the body's request, and the summary."""
        return await self._decisions.explain(body)

    def recent(self, limit: int) -> list[schemas.PlacementRecord]:
        """The newest ``limit`` placement decisions, newest first."""
        return self._decisions.recent(limit)

    # -- creates (berth.api.create) ----------------------------------------------------------
    async def create(
        self, body: schemas.WorkloadCreate, *, idempotency_key: str | None = None
    ) -> StoredWorkload:
        """:meth:`berth.api.create.Creates.create`: place and boot ``body``."""
        return await self._creates.create(body, idempotency_key=idempotency_key)

    async def create_or_repeat(
        self, body: schemas.WorkloadCreate, idempotency_key: str | None
    ) -> tuple[StoredWorkload, bool]:
        """:meth:`berth.api.create.Creates.create_or_repeat`: the workload, and whether it
        is a repeat's answer."""
        return await self._creates.create_or_repeat(body, idempotency_key)

    # -- records (berth.api.records) ---------------------------------------------------------
    async def workload(self, workload_id: str) -> StoredWorkload:
        """:meth:`berth.api.records.Records.workload`: the record, refreshed if live."""
        return await self._records.workload(workload_id)

    async def logs(self, workload_id: str, offset: int, limit: int) -> WorkloadLogs:
        """Up to ``limit`` bytes of the workload's output from ``offset``, read from the node
        it ran on (``404`` for no such workload; ``503`` when its node does not answer)."""
        workload = await self.ports.workloads.get(workload_id)
        if workload is None:
            raise not_found("workload", workload_id)
        if workload.node is None:  # never placed: nothing ran, nothing was written
            return WorkloadLogs(text="", offset=0, next_offset=0, size=0, kept=False)
        return await self.ports.nodes.logs(workload.node, workload_id, offset, limit)

    async def list_workloads(
        self, namespace: str | None, node: str | None, state: str | None
    ) -> list[StoredWorkload]:
        """The records as they are (no node is asked: ends arrive as events)."""
        return await self._records.list_workloads(namespace, node, state)

    async def apply_event(self, event: WorkloadEvent) -> str:
        """:meth:`berth.api.records.Records.apply_event`: record what a node's event says —
        ``applied``, ``stale`` or ``unrecorded``."""
        return await self._records.apply_event(event)

    async def sweep(self) -> int:
        """:meth:`berth.api.records.Records.sweep`: refresh every live workload; how many."""
        return await self._records.sweep()

    async def sweep_forever(self, every_s: float = SWEEP_EVERY_S) -> None:
        """:meth:`berth.api.records.Records.sweep_forever`: :meth:`sweep` every ``every_s``
        seconds until cancelled."""
        await self._records.sweep_forever(every_s)

    # -- what the reconciler (berth.api.reconciler) moves records with: the reads' own rules --
    async def refresh(self, workload: StoredWorkload) -> StoredWorkload:
        """:meth:`berth.api.records.Records.refresh`: ask the node about a live workload and
        record what is learnt."""
        return await self._records.refresh(workload)

    async def runs(self, workload: StoredWorkload) -> StoredWorkload:
        """The node reports that it runs ``workload``: :meth:`berth.api.records.Records.runs`
        (``pending``/``unknown`` → ``running`` by compare-and-set; a kept stop delivered)."""
        return await self._records.runs(workload)

    async def end(self, workload: StoredWorkload, update: dict[str, object]) -> StoredWorkload:
        """:meth:`berth.api.records.Records.end`: record a live workload's end and free its
        identity."""
        return await self._records.end(workload, update)

    # -- stops (berth.api.stops) -------------------------------------------------------------
    async def stop(self, workload_id: str, grace_s: float | None) -> StoredWorkload:
        """:meth:`berth.api.stops.Stops.stop`: stop a workload (idempotent), or keep the stop
        on its record until its node answers."""
        return await self._stops.stop(workload_id, grace_s)

    # -- nodes (berth.api.nodes) -------------------------------------------------------------
    async def node_list(self) -> list[schemas.NodeInfo]:
        return await self._node_operations.node_list()

    async def node(self, name: str) -> schemas.NodeInfo:
        return await self._node_operations.node(name)

    async def cordon(self, name: str, cordoned: bool) -> schemas.NodeInfo:
        """:meth:`berth.api.nodes.NodeOperations.cordon`: on the node itself, then shown."""
        return await self._node_operations.cordon(name, cordoned)

    async def drain(self, name: str, grace_s: float) -> schemas.DrainReport:
        """Cordon, stop every running workload (``grace_s`` each), place restartable ones again."""
        return await self._node_operations.drain(name, grace_s)

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
