"""The API's placement decisions: the request a body asks for, placed or explained, noted.

:class:`Decisions` turns a request body into berth's :class:`~berth.model.Request` — an
image's layers and platform, an instance type or a spec, each checked (``Invalid`` naming
the field), so bad input reserves nothing — and places it through the placement port
(:class:`~berth.scheduler.port.ReleasingScheduler`: the queue group, where any scheduler of
the group may place) or asks the scheduler's view (:class:`~berth.scheduler.view.ClusterView`)
to explain it.

**Recent placements** are a bounded ring (the newest ``recent_capacity``) of the decisions
this process made, each with the explanation's summary, for the dashboard; every outcome of
a placement is noted there (and counted, ``berth_api_placements_total{outcome}``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from berth.api import schemas
from berth.api.ports import ApiPorts
from berth.errors import Invalid, NoCapacity, Unavailable
from berth.model import Placement, Request
from berth.registry.port import Image

__all__ = ["Decisions"]


class Decisions:
    """Requests from bodies, placed or explained; the recent ring (see the module docstring)."""

    def __init__(self, ports: ApiPorts, *, recent_capacity: int) -> None:
        self.ports = ports
        self._recent: deque[schemas.PlacementRecord] = deque(maxlen=recent_capacity)

    # -- requests ----------------------------------------------------------------------------
    async def workload_request(
        self, body: schemas.WorkloadCreate | schemas.ExplainBody
    ) -> tuple[Request, Image | None]:
        """The placement request of a create (or explain) body: its image's layers and
        platform, its instance type or spec — each checked, ``Invalid`` naming the field."""
        image = None
        if body.image is not None and body.layers is not None:
            raise Invalid("give an image or layers, not both", field="image")
        if body.image is not None:
            image = await self.ports.images.get(body.image) if body.image else None
            if image is None:
                known = ", ".join(i.name for i in await self.ports.images.list()) or "none"
                raise Invalid(
                    f"no registered image {body.image!r} (registered: {known}); register one "
                    "with POST /v1/images (berth images add) or /v1/images/oci (berth images "
                    "import-oci)",
                    field="image",
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
        elif image is not None and image.platform and platforms:
            _platforms_of(image.name, image.platform, platforms)
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

    # -- placing -----------------------------------------------------------------------------
    async def place(self, body: schemas.RequestBody) -> Placement:
        """The placement port: a lease on the chosen node (no boot)."""
        request = _request(body)
        placement = await self.place_request(request)
        explanation = (
            f"placed on {placement.worker_node} (lease {placement.reservation_id}, "
            f"rank {placement.rank}); {self.summary(request)}"
        )
        self.note(request, "placed", explanation, placement=placement)
        return placement

    async def place_request(self, request: Request, workload_id: str | None = None) -> Placement:
        """Through the queue group; every outcome but success noted among the recent
        placements (a success is noted by the caller, once it knows what became of it)."""
        try:
            placement = await self.ports.placements.schedule(request)
        except NoCapacity as error:
            self.note(request, "no_capacity", str(error), workload_id=workload_id)
            raise
        except Invalid as error:  # NoMatchingPlatform included
            self.note(request, "invalid", str(error), workload_id=workload_id)
            raise
        except Unavailable as error:
            self.note(request, "unavailable", str(error), workload_id=workload_id)
            raise
        return placement

    async def explain(self, body: schemas.ExplainBody) -> schemas.Explanation:
        """Each node's verdict on the body's request, and the summary."""
        request, _ = await self.workload_request(body)
        explanation = self.ports.view.explain(request)
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

    def summary(self, request: Request) -> str:
        """The explanation's summary of ``request``, or why there is none."""
        try:
            return self.ports.view.explain(request).summary()
        except Exception as error:  # an explanation is a courtesy; never fail a placement
            return f"(no explanation: {error})"

    # -- the recent placements ---------------------------------------------------------------
    def note(
        self,
        request: Request,
        outcome: str,
        explanation: str,
        *,
        placement: Placement | None = None,
        workload_id: str | None = None,
    ) -> None:
        """Note a decision's ``outcome`` among the recent placements, and count it."""
        self._recent.append(
            schemas.PlacementRecord(
                at=self.ports.clock(),
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
        if self.ports.metrics is not None:  # berth_api_placements_total{outcome}
            self.ports.metrics.api_placement(outcome)

    def recent(self, limit: int) -> list[schemas.PlacementRecord]:
        """The newest ``limit`` placement decisions, newest first."""
        items = list(self._recent)[-limit:]
        items.reverse()
        return items


def _request(body: schemas.RequestBody) -> Request:
    """The request of a bare placement body (its layers given, no image)."""
    document = body.model_dump(exclude_none=True)
    document["layers"] = [layer.model_dump() for layer in body.layers]
    return Request.from_dict(document)


def _platforms_of(image: str, built_for: str, asked: list[str]) -> None:
    """``asked`` may narrow down an image's platform, never replace it: a request that names
    only platforms the image is not built for would run it where it cannot run — one error
    naming both, not a silent override."""
    from berth.platform import Platform, matches_any

    wanted = [Platform.parse(text, field="platforms") for text in asked]
    if not matches_any(Platform.parse(built_for, field="image"), wanted):
        raise Invalid(
            f"image {image!r} is built for {built_for}, not for {', '.join(asked)}: leave "
            "platforms out to run it on its own platform (berth run --platform)",
            field="platforms",
        )
