"""The FastAPI application: berth's routes over a :class:`~.backend.ClusterBackend`.

:func:`create_app` wires the routes (listed in ``docs/api.md``), the token dependency on all
of them but ``GET /healthz`` (:mod:`~berth.api.auth`), the problem+json answers
(:mod:`~berth.api.problems`), the dashboard at ``/``
(:mod:`~berth.api.dashboard`) and ``/metrics`` (:mod:`~berth.api.metrics`).
The OpenAPI document is served at ``/openapi.json`` behind the token too (no Swagger UI: it
would load scripts from a CDN); :func:`generated_openapi` gives it without a running server —
the copy committed as ``docs/openapi.json`` (``berth api openapi``) is held equal to it by a
test.
Validation answers ``400`` (not FastAPI's ``422``; the ``422`` a create's reused
``Idempotency-Key`` answers is the route's own), so the document lists only the answers the
service gives.
"""

from __future__ import annotations

import contextlib
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Response
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from berth import __version__
from berth.api import dashboard, idempotency, metrics, schemas
from berth.api.auth import SAFE_METHODS, configure, require_token
from berth.api.backend import ClusterBackend
from berth.api.problems import Problem, ProblemBody, install, problem_responses
from berth.boot import WorkloadLogs
from berth.defaults import API_STOP_GRACE_S, LOG_CHUNK_BYTES, MAX_LOG_CHUNK_BYTES
from berth.model import Placement
from berth.observability.tracing import TracingMiddleware
from berth.registry.port import LIVE_STATES, Image, Workload, WorkloadState

__all__ = ["API_VERSION", "create_app", "generated_openapi", "openapi_document"]

API_VERSION = __version__  # the package's version is the API's (docs/openapi.json says it)
_DESCRIPTION = (
    "berth's API: place and boot workloads, stop them, drain and cordon nodes, register "
    "images, explain placements. Every route but /healthz needs 'Authorization: Bearer "
    "<token>' (or the dashboard's berth_session cookie; a write it authenticates must come "
    "from the API's own origin and carry X-Berth-CSRF). Errors are application/problem+json."
)

WorkloadId = Annotated[str, Path(description="A workload id (w-<12 hex digits>)")]
NodeName = Annotated[str, Path(description="A node's name")]
ImageName = Annotated[str, Path(description="A registered image's name")]


_CREATE_RESPONSES: dict[int | str, dict[str, Any]] = {
    201: {
        "description": "Created: the workload, as recorded; or a repeat's answer — the first "
        "attempt's workload as it is now, with Idempotent-Replayed: true",
        "headers": {
            idempotency.REPLAYED_HEADER: {
                "description": "true on the answer to a repeat of an Idempotency-Key",
                "schema": {"type": "string", "enum": ["true"]},
            }
        },
    },
    **problem_responses(
        400,
        409,
        422,
        503,
        described={
            409: "No capacity (per-reason counts), refused by the node, the workload's "
            "identity (namespace/name/replica) held by a running workload, or a create with "
            "the same Idempotency-Key still in progress (idempotency_in_progress, "
            "Retry-After)",
        },
    ),
}
_CREATE_RESPONSES[409]["headers"] = {
    "Retry-After": {
        "description": "Seconds to wait before a repeat, when the create with the same "
        "Idempotency-Key is in progress",
        "schema": {"type": "integer"},
    }
}


def _routes(backend: ClusterBackend) -> APIRouter:
    api = APIRouter(prefix="/v1", dependencies=[Depends(require_token)])

    # -- workloads ---------------------------------------------------------------------------
    @api.post(
        "/workloads",
        status_code=201,
        response_model=Workload,
        responses=_CREATE_RESPONSES,
        tags=["workloads"],
        summary="Place and boot a workload (a repeat of its Idempotency-Key: the first's)",
    )
    async def create_workload(
        body: schemas.WorkloadCreate,
        response: Response,
        idempotency_key: idempotency.KeyHeader = None,
    ) -> Workload:
        workload, replayed = await backend.create_or_repeat(body, idempotency_key)
        if replayed:
            response.headers[idempotency.REPLAYED_HEADER] = "true"
        return workload

    @api.get(
        "/workloads",
        response_model=schemas.WorkloadList,
        responses=problem_responses(400, 503),
        tags=["workloads"],
        summary="List workloads (filters: namespace, node, state)",
    )
    async def list_workloads(
        namespace: str | None = None,
        node: str | None = None,
        state: WorkloadState | None = None,
    ) -> schemas.WorkloadList:
        return schemas.WorkloadList(items=await backend.list_workloads(namespace, node, state))

    @api.get(
        "/workloads/{workload_id}",
        response_model=Workload,
        responses=problem_responses(404, 503),
        tags=["workloads"],
        summary="One workload, its state asked of its node",
    )
    async def get_workload(workload_id: WorkloadId) -> Workload:
        return await backend.workload(workload_id)

    @api.get(
        "/workloads/{workload_id}/logs",
        response_model=WorkloadLogs,
        responses=problem_responses(400, 404, 503),
        tags=["workloads"],
        summary="A piece of a workload's output (stdout and stderr), read from its node",
    )
    async def workload_logs(
        workload_id: WorkloadId,
        offset: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_LOG_CHUNK_BYTES)] = LOG_CHUNK_BYTES,
    ) -> WorkloadLogs:
        """Up to ``limit`` bytes from byte ``offset``; ask again from ``next_offset`` to follow
        (``kept`` is false where the node's runtime keeps no output)."""
        return await backend.logs(workload_id, offset, limit)

    @api.post(
        "/workloads/{workload_id}/stop",
        response_model=Workload,
        responses={
            202: {
                "description": "Accepted, not done: the workload's node does not answer "
                "(unknown) or its boot is unanswered (pending); the stop is kept on the "
                "record (stop_requested) and delivered when the node answers",
                "model": Workload,
            },
            **problem_responses(400, 404, 503),
        },
        tags=["workloads"],
        summary="Stop a workload (idempotent; 202 when it is kept for an unreachable node)",
    )
    async def stop_workload(
        workload_id: WorkloadId, response: Response, body: schemas.StopRequest | None = None
    ) -> Workload:
        workload = await backend.stop(workload_id, None if body is None else body.grace_s)
        if workload.state in LIVE_STATES and workload.stop_requested:
            response.status_code = 202
        return workload

    # -- placements --------------------------------------------------------------------------
    @api.post(
        "/placements",
        response_model=schemas.PlacementBody,
        responses=problem_responses(400, 409, 503),
        tags=["placements"],
        summary="The placement port: a lease on the chosen node, no boot",
    )
    async def place(body: schemas.RequestBody) -> schemas.PlacementBody:
        placement: Placement = await backend.place(body)
        return schemas.PlacementBody.model_validate(placement.model_dump(mode="json"))

    @api.post(
        "/explain",
        response_model=schemas.Explanation,
        responses=problem_responses(400, 503),
        tags=["placements"],
        summary="Every node's verdict for a request",
    )
    async def explain(body: schemas.ExplainBody) -> schemas.Explanation:
        return await backend.explain(body)

    @api.get(
        "/placements/recent",
        response_model=schemas.RecentPlacements,
        responses=problem_responses(400),
        tags=["placements"],
        summary="The latest placement decisions of this API, newest first",
    )
    async def recent(
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> schemas.RecentPlacements:
        return schemas.RecentPlacements(items=backend.recent(limit))

    # -- nodes -------------------------------------------------------------------------------
    @api.get(
        "/nodes",
        response_model=schemas.NodeList,
        responses=problem_responses(503),
        tags=["nodes"],
        summary="Every node's latest state",
    )
    async def nodes() -> schemas.NodeList:
        return schemas.NodeList(items=await backend.node_list())

    @api.get(
        "/nodes/{name}",
        response_model=schemas.NodeInfo,
        responses=problem_responses(404, 503),
        tags=["nodes"],
        summary="One node's latest state",
    )
    async def node(name: NodeName) -> schemas.NodeInfo:
        return await backend.node(name)

    @api.post(
        "/nodes/{name}/cordon",
        response_model=schemas.NodeInfo,
        responses=problem_responses(404, 503),
        tags=["nodes"],
        summary="Cordon a node: it takes no new workloads",
    )
    async def cordon(name: NodeName) -> schemas.NodeInfo:
        return await backend.cordon(name, True)

    @api.post(
        "/nodes/{name}/uncordon",
        response_model=schemas.NodeInfo,
        responses=problem_responses(404, 503),
        tags=["nodes"],
        summary="Lift a node's cordon",
    )
    async def uncordon(name: NodeName) -> schemas.NodeInfo:
        return await backend.cordon(name, False)

    @api.post(
        "/nodes/{name}/drain",
        response_model=schemas.DrainReport,
        responses=problem_responses(400, 404, 503),
        tags=["nodes"],
        summary="Cordon, stop every workload, place restartable ones again",
    )
    async def drain(
        name: NodeName, body: schemas.DrainRequest | None = None
    ) -> schemas.DrainReport:
        return await backend.drain(name, API_STOP_GRACE_S if body is None else body.grace_s)

    # -- images ------------------------------------------------------------------------------
    @api.post(
        "/images",
        status_code=201,
        response_model=Image,
        responses=problem_responses(400, 503),
        tags=["images"],
        summary="Register an image as its layers with sizes",
    )
    async def add_image(body: schemas.ImageCreate) -> Image:
        return await backend.add_image(body)

    @api.post(
        "/images/oci",
        status_code=201,
        response_model=Image,
        responses=problem_responses(400, 503),
        tags=["images"],
        summary="Register an image read from an OCI layout directory on the server",
    )
    async def import_oci(body: schemas.OciImport) -> Image:
        return await backend.import_oci(body)

    @api.get(
        "/images",
        response_model=schemas.ImageList,
        responses=problem_responses(503),
        tags=["images"],
        summary="Every registered image",
    )
    async def images() -> schemas.ImageList:
        return schemas.ImageList(items=await backend.image_list())

    @api.get(
        "/images/{name}",
        response_model=Image,
        responses=problem_responses(404, 503),
        tags=["images"],
        summary="One registered image",
    )
    async def image(name: ImageName) -> Image:
        return await backend.image(name)

    return api


MAX_BODY_BYTES = 1 << 20
"""The largest request body accepted (a workload's request is a few KiB); more is ``413``."""


class BodyLimit:
    """ASGI middleware: a request body larger than ``limit`` bytes is answered ``413``
    (problem+json), whatever the route would have said.

    It counts the bytes as they arrive, so a chunked body (no ``Content-Length``) is refused
    as soon as it passes the limit, and the rest is not read; a declared ``Content-Length``
    over the limit is refused at the first read, before any byte.  Only a body a route reads
    is refused (routes without a body never read one), so the answer is the route's own
    ``413``, documented on the operations that take a body.

    The refusal cannot travel as an exception: FastAPI turns any error while it reads a body
    into its own ``400``.  So the wrapped ``receive`` notes that the limit was passed and
    ends the body there; whatever the application answers then is dropped, and the ``413``
    sent in its place."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        declared = int(length) if length.isdigit() else 0
        received = 0
        too_large = False
        started = False

        async def limited() -> Message:
            nonlocal received, too_large
            if too_large:
                raise _TooLarge
            if declared > self.limit:
                too_large = True
                raise _TooLarge
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    too_large = True
                    raise _TooLarge
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            if too_large and not started:
                return  # the application's answer to a body it could not read: replaced
            started = started or message["type"] == "http.response.start"
            await send(message)

        with contextlib.suppress(_TooLarge):  # raised past FastAPI (a route's own read)
            await self.app(scope, limited, sending)
        if too_large and not started:
            await self._too_large(scope, receive, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        problem = Problem(
            413, "too_large", "request too large", f"the body is larger than {self.limit} bytes"
        )
        await problem.response()(scope, receive, send)


class _TooLarge(Exception):
    """The body passed the limit (caught by :class:`BodyLimit`, or by FastAPI, which makes
    it a ``400`` that :class:`BodyLimit` replaces)."""


def create_app(backend: ClusterBackend | None, *, token: str) -> FastAPI:
    """The application over ``backend``, requiring ``token`` (see the module docstring)."""
    app = FastAPI(
        title="berth",
        version=API_VERSION,
        description=_DESCRIPTION,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    configure(app, token)  # the token and the dashboard's session secret (berth.api.auth)
    app.add_middleware(BodyLimit)
    if backend is not None:  # None: generated_openapi (routes declared, never called)
        app.state.metrics = backend.metrics  # served by GET /metrics (http/metrics.py)
    install(app)
    app.add_middleware(TracingMiddleware)  # continues a caller's trace (berth.observability)

    @app.get("/healthz", response_model=schemas.Health, tags=["service"], summary="Liveness")
    async def healthz() -> schemas.Health:
        return schemas.Health(status="ok")

    app.include_router(_routes(cast(ClusterBackend, backend)))
    app.include_router(dashboard.router)
    app.include_router(metrics.router)

    @app.get(
        "/openapi.json",
        include_in_schema=False,
        dependencies=[Depends(require_token)],
    )
    async def openapi() -> dict[str, Any]:
        return openapi_document(app)

    return app


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document of ``app``: FastAPI's, with ``400`` in place of ``422``."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    too_large = {413: f"The request body is larger than {MAX_BODY_BYTES} bytes"}
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            if "HTTPValidationError" in str(responses.get("422")):  # FastAPI's, never answered
                responses.pop("422")
            for parameter in operation.get("parameters", ()):
                _absent_not_null(parameter)
            if path == "/healthz":
                continue
            added: dict[int | str, dict[str, Any]] = {}
            if method.upper() not in SAFE_METHODS:  # the cookie's CSRF checks (api/auth.py)
                added.update(problem_responses(403))
            if "requestBody" in operation:  # a body a route reads is limited (BodyLimit)
                added.update(problem_responses(413, described=too_large))
            responses.update({str(status): entry for status, entry in added.items()})
            operation["responses"] = {code: responses[code] for code in sorted(responses)}
    schemas_ = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas_.pop(name, None)
    problem = ProblemBody.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas_["ProblemBody"] = problem
    document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    document["security"] = [{"bearer": []}]
    document["paths"]["/healthz"]["get"]["security"] = []  # the one open route
    app.openapi_schema = document
    return document


def _absent_not_null(parameter: dict[str, Any]) -> None:
    """An optional header is absent or a string, never JSON's ``null``: its schema says the
    string alone (FastAPI writes ``anyOf: [string, null]`` for ``str | None``)."""
    schema = parameter.get("schema", {})
    options = schema.get("anyOf", [])
    if parameter.get("in") != "header" or {"type": "null"} not in options:
        return
    (kept,) = [option for option in options if option != {"type": "null"}]
    parameter["schema"] = {**kept, "title": schema.get("title", parameter["name"])}


def generated_openapi() -> dict[str, Any]:
    """The document without a cluster (``berth api openapi``, the test of the committed copy):
    the routes are declared, never called, so no backend is needed."""
    return openapi_document(create_app(None, token=""))
