"""Errors of the API as ``application/problem+json`` (RFC 9457), mapped from berth's errors.

One table says which error becomes which answer, so every route speaks the same way:

* a body, query or path parameter the schema refuses, and berth's ``Invalid`` → ``400`` with
  ``field`` (the dotted path of the offending value) and ``value`` (quoted short and safe);
* ``NoMatchingPlatform`` → ``400`` with ``platforms_offered``;
* ``NoCapacity`` → ``409`` with ``reasons``: how many nodes failed for each reason
  (``{"mem_exhausted": 3, "cordoned": 1}``);
* a node's ``Refused`` (a boot that failed, a cordoned node) → ``409`` with its reason;
* ``IdentityTaken`` (a workload's ``namespace/name/replica`` held by a running one) → ``409``
  with ``identity`` and the holder's ``workload_id``;
* a create's ``Idempotency-Key`` (:mod:`berth.api.idempotency`, its own problems):
  first used for another body → ``422`` on field ``Idempotency-Key``; its first attempt in
  progress → ``409`` with ``Retry-After``; a malformed key is a header the schema refuses
  (``400``, ``field`` the header's name);
* ``Unavailable`` → ``503`` (retrying may help);
* an unknown id → ``404``; a missing or wrong token → ``401``; a write the dashboard's
  cookie authenticates from another origin, or without its CSRF value → ``403``
  (:mod:`berth.api.auth`); a body over the limit → ``413`` (:class:`berth.api.app.BodyLimit`).

Anything else is a bug: logged with its traceback and answered ``500`` without internals.
Bad input never reaches that branch — everything entering is validated first — and the
schemathesis test holds the service to it.

:class:`Problem` is the exception a route raises for its own answers (``404`` …);
:func:`problem_responses` documents the answers a route may give, for the OpenAPI document:
``401`` on every route, and the statuses the route names — exactly those it can answer, so
the document lists nothing a client never sees and everything it may (``403`` and ``413``,
which come from the authentication and the body limit rather than the route, are added by
:func:`~berth.api.app.openapi_document` to the operations they apply to).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from berth.errors import BerthError, Invalid, NoCapacity, NoMatchingPlatform, Unavailable
from berth.ownership import Refused
from berth.registry.port import IdentityTaken
from berth.validation import shown

__all__ = ["PROBLEM_JSON", "Problem", "ProblemBody", "install", "problem_responses"]

log = logging.getLogger("berth.api")

PROBLEM_JSON = "application/problem+json"
_TITLES = {
    400: "bad request",
    401: "unauthorized",
    403: "forbidden",
    404: "not found",
    405: "method not allowed",
    409: "conflict",
    413: "request too large",
    422: "unprocessable content",
    500: "internal error",
    503: "unavailable",
}


class ProblemBody(BaseModel):
    """An error (RFC 9457 problem details, with berth's extensions)."""

    type: str
    title: str
    status: int
    detail: str
    field: str | None = None
    value: str | None = None
    platforms_offered: str | None = None
    reasons: dict[str, int] | None = None
    identity: str | None = None
    workload_id: str | None = None


class Problem(Exception):
    """An answer other than success, raised by a route: ``status``, a ``kind`` (the last part
    of the ``type`` URI), a ``title`` and a ``detail``; ``extra`` fields and ``headers``."""

    def __init__(
        self,
        status: int,
        kind: str,
        title: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.title = title
        self.detail = detail
        self.headers = headers
        self.extra = {key: value for key, value in extra.items() if value is not None}

    def response(self) -> JSONResponse:
        body = {
            "type": f"https://berth.dev/problems/{self.kind}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            **self.extra,
        }
        return JSONResponse(body, self.status, headers=self.headers, media_type=PROBLEM_JSON)


def problem_of(error: BaseException) -> Problem:
    """The answer for one of berth's errors (see the module docstring)."""
    if isinstance(error, Problem):
        return error
    if isinstance(error, NoMatchingPlatform):
        return Problem(
            400,
            "no_matching_platform",
            "no matching platform",
            str(error),
            field="platforms",
            platforms_offered=error.offered or "",
        )
    if isinstance(error, Invalid):
        return Problem(400, "invalid", "invalid input", error.message, field=error.field)
    if isinstance(error, NoCapacity):
        reasons = dict(Counter(_reason_code(reason) for reason in error.reasons.values()))
        return Problem(409, "no_capacity", "no capacity", str(error), reasons=reasons)
    if isinstance(error, Refused):
        where = f"node {error.node}" if error.node else "the node"
        return Problem(
            409,
            error.reason,
            f"refused by {where}",
            f"{where} refused: {error.reason}: {error.detail}",
            reasons={error.reason: 1},
        )
    if isinstance(error, IdentityTaken):
        return Problem(
            409,
            "identity_taken",
            "identity taken",
            str(error),
            identity=error.identity,
            workload_id=error.workload_id,
        )
    if isinstance(error, Unavailable):
        return Problem(503, "unavailable", "unavailable", str(error))
    return Problem(500, "internal", "internal error", "the service failed; see its log")


def _reason_code(reason: str) -> str:
    """``mem_exhausted`` out of ``refused at confirmation (mem_exhausted)`` and the like."""
    if "(" in reason and reason.endswith(")"):
        return reason[reason.rindex("(") + 1 : -1]
    return reason


def _validation_problem(error: RequestValidationError) -> Problem:
    errors = error.errors()
    first = errors[0] if errors else {}
    location = [str(part) for part in first.get("loc", ()) if part not in ("body", "header")]
    cause = first.get("ctx", {}).get("error")
    body_wide = isinstance(cause, Invalid) and bool(cause.field)  # a check that named the place
    if body_wide:
        location.append(str(cause.field))
    field = ".".join(location) or "body"
    message = cause.message if body_wide else str(first.get("msg", "invalid"))
    kind = str(first.get("type", ""))
    if kind == "json_invalid":
        message, field = "the body is not valid JSON", "body"
    quoted = "input" in first and kind != "missing" and not body_wide
    value = shown(first["input"]) if quoted else None  # a body-wide check quotes its own
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return Problem(
        400, "invalid", "invalid input", f"{field}: {message}{more}", field=field, value=value
    )


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` as problem+json (see the module docstring)."""

    async def on_problem(request: Request, error: Exception) -> JSONResponse:
        return problem_of(error).response()

    async def on_validation(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return _validation_problem(error).response()

    async def on_http(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        status = error.status_code
        title = _TITLES.get(status, "error")
        detail = str(error.detail) if error.detail else title
        kind = title.replace(" ", "_")
        headers = dict(error.headers) if error.headers else None
        return Problem(status, kind, title, detail, headers=headers).response()

    async def on_unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return problem_of(error).response()

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(BerthError, on_problem)
    app.add_exception_handler(Refused, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


_DESCRIPTIONS = {
    400: "Invalid input (the field and value are named), or no node runs the platforms",
    401: "Missing or wrong API token (or dashboard session)",
    403: "A write authenticated by the dashboard's cookie that came from another origin, or "
    "without its X-Berth-CSRF value",
    404: "Unknown id or name",
    409: "No capacity (per-reason counts), refused by the node, or the workload's identity "
    "(namespace/name/replica) held by a running workload",
    422: "The Idempotency-Key was first used for another request body",
    503: "A node, the schedulers or the API's registry could not be reached; retrying may help",
}


def problem_responses(
    *statuses: int, described: dict[int, str] | None = None
) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entries of the problems a route may answer: ``401`` and
    ``statuses`` (see the module docstring)."""
    schema = {"$ref": "#/components/schemas/ProblemBody"}
    return {
        status: {
            "description": (described or {}).get(status) or _DESCRIPTIONS[status],
            "content": {PROBLEM_JSON: {"schema": schema}},
        }
        for status in sorted({401, *statuses})
    }
