"""The API's request and response bodies (pydantic), the source of the OpenAPI document.

Request bodies are typed as plain JSON here (strings, numbers, objects) and checked a second
time by berth's own types (:mod:`berth.model`: names, sizes with units, platforms, instance
types) when the backend turns them into a :class:`~berth.model.Request` — one rule, one
place: the schema says the shape, berth's types say the bounds, and either refusal is a
``400`` naming the field.  Before either, every string of a body — a value or a key, at any
depth, the command and the environment included — must be text UTF-8 can encode
(:func:`berth.validation.check_text`, run once over the whole body by :class:`_Body`): a
lone surrogate (JSON's ``"\\ud800"``) is refused naming where it is (``command.1``,
``env.KEY``) before anything is claimed, placed or booted.  Response bodies are what the
backend returns, validated on the way out, so the document and the answers cannot drift
apart; the CLI (:mod:`berth.api.client`) parses answers with these same models.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from berth.defaults import API_STOP_GRACE_S
from berth.model import ReschedulePolicy, RestartPolicy
from berth.node.runtime.port import StopGrace
from berth.registry.port import Image, Workload
from berth.validation import check_text

__all__ = [
    "DrainItem",
    "DrainReport",
    "DrainRequest",
    "ExplainBody",
    "Explanation",
    "Health",
    "Image",
    "ImageCreate",
    "ImageList",
    "LayerRef",
    "NodeInfo",
    "NodeList",
    "OciImport",
    "PlacementBody",
    "PlacementRecord",
    "RecentPlacements",
    "RequestBody",
    "SpreadBody",
    "StopRequest",
    "Verdict",
    "Workload",
    "WorkloadCreate",
    "WorkloadList",
]

Outcome = Literal["placed", "no_capacity", "invalid", "unavailable", "refused"]
Size = int | str  # bytes, or a size with a unit ("28MiB"): berth.units reads it
_STRICT = ConfigDict(extra="forbid")


class _Body(BaseModel):
    """A request body: strict (no unknown keys), and text UTF-8 can encode throughout,
    checked on the body as sent, before any field (see the module docstring)."""

    model_config = _STRICT

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        check_text(data)
        return data


class Health(BaseModel):
    status: Literal["ok"]


class LayerRef(BaseModel):
    """An image layer: its content id (a digest) and its size (bytes, or with a unit)."""

    model_config = _STRICT
    id: str
    size: Size


class SpreadBody(BaseModel):
    """How the replicas of one function (same ``namespace`` and ``name``) spread over nodes
    (:class:`berth.model.Spread`, which checks the bounds).  No ``label``: at most one
    replica per node; ``label`` (``"zone"``): across the values of that node label, at most
    ``max_skew`` (1–1024, label spreads only) ahead of the least-loaded value.  ``hard``: a
    node that would break it is not eligible (a refusal names ``spread``); soft: such nodes
    are tried last.  Decided by the schedulers, on the replicas every scheduler placed (the
    routing registry); schedulers deciding for one function at the same moment can still
    share a node."""

    model_config = ConfigDict(extra="forbid", strict=True)
    label: str | None = None
    hard: bool
    max_skew: int = 1


class RequestBody(_Body):
    """A placement request (:class:`berth.model.Request`): ``spec`` is an instance type name
    (``"micro"``) or ``{vcpus, mem, disk, disk_bw?, net_bw?}``; ``platforms`` the artifact's
    (``os/arch[/variant]``, empty: any); ``spread`` as :class:`SpreadBody`."""

    namespace: str = "default"
    name: str
    replica: int = 0
    platforms: list[str] = Field(default_factory=list)
    spec: str | dict[str, Any] | None = None
    layers: list[LayerRef] = Field(default_factory=list)
    preferred_node: str | None = None
    spread: SpreadBody | None = None


class _Target(_Body):
    namespace: str = "default"
    name: str
    replica: int = 0
    image: str | None = None
    layers: list[LayerRef] | None = None
    type: str | None = None
    spec: str | dict[str, Any] | None = None
    platforms: list[str] | None = None
    spread: SpreadBody | None = None


class ExplainBody(_Target):
    """What to explain: a request as for placements, or as for a workload (``image`` instead
    of ``layers``, ``type`` for an instance type)."""

    preferred_node: str | None = None


class WorkloadCreate(_Target):
    """Place and boot a workload.  Give ``image`` (a registered image's name) or ``layers``;
    ``type`` (an instance type) or ``spec``; ``command`` is the program and its arguments
    (default: the image's ``Cmd``, which only runtimes that run images can use);
    ``spread`` how this function's replicas spread over nodes; ``restart`` when its node
    restarts it (default: never), ``reschedule`` when the API places it again elsewhere
    (default: never); ``restartable`` is ``reschedule: {"unlimited": true}`` in one word."""

    command: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    restartable: bool = False
    restart: RestartPolicy | None = None
    reschedule: ReschedulePolicy | None = None

    def reschedule_policy(self) -> ReschedulePolicy:
        """The reschedule policy asked for: ``reschedule``, else ``restartable``'s."""
        if self.reschedule is not None:
            return self.reschedule
        return ReschedulePolicy(unlimited=self.restartable)


class WorkloadList(BaseModel):
    items: list[Workload]


class StopRequest(_Body):
    """How long the workload gets to stop before the call gives up (seconds)."""

    grace_s: StopGrace | None = None


class PlacementBody(BaseModel):
    """A placement (:class:`berth.model.Placement`): a lease on ``worker_node`` that expires
    unless bound to a workload; ``refusals`` are the nodes that refused first, and why."""

    worker_node: str
    reservation_id: str | None = None
    colocated_bytes: int
    rank: int
    refusals: list[tuple[str, str]] = Field(default_factory=list)


class Verdict(BaseModel):
    """One node's verdict: ``fits`` or the reason code of the first check it fails
    (``cordoned``, ``mem_exhausted`` …); ``rank`` its place among the candidates."""

    node: str
    verdict: str
    detail: str
    colocated_bytes: int
    rank: int | None = None


class Explanation(BaseModel):
    verdicts: list[Verdict]
    summary: str


class PlacementRecord(BaseModel):
    """One placement decision the API made (the dashboard's "recent placements")."""

    at: float
    workload_id: str | None = None
    namespace: str
    name: str
    node: str | None = None
    outcome: Outcome
    colocated_bytes: int = 0
    rank: int | None = None
    explanation: str


class RecentPlacements(BaseModel):
    items: list[PlacementRecord]


class NodeInfo(BaseModel):
    """A node's latest snapshot as the API's scheduler sees it, and its workloads' count."""

    name: str
    platform: str
    labels: dict[str, str]
    cordoned: bool
    mem_max: int
    mem_reserved: int
    disk_max: int
    disk_reserved: int
    cpu_load: float
    cpu_capacity: float
    disk_bw_load: float
    disk_bw_ceiling: float
    net_bw_load: float
    net_bw_ceiling: float
    layers: int
    workloads: int
    published_at: float


class NodeList(BaseModel):
    items: list[NodeInfo]


class DrainRequest(_Body):
    grace_s: StopGrace = API_STOP_GRACE_S


class DrainItem(BaseModel):
    workload_id: str
    outcome: Literal["stopped", "replaced", "failed"]
    detail: str
    new_workload_id: str | None = None
    new_node: str | None = None


class DrainReport(BaseModel):
    node: str
    items: list[DrainItem]


class ImageCreate(_Body):
    """Register an image as its layer chain (base first) with sizes."""

    name: str
    platform: str | None = None
    layers: list[LayerRef]


class OciImport(_Body):
    """Read an image from an OCI image layout directory on the server's machine."""

    path: str
    name: str | None = None
    ref: str | None = None
    platform: str | None = None


class ImageList(BaseModel):
    items: list[Image]
