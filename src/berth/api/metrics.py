"""``GET /metrics``: the scheduler's Prometheus metrics, behind the API's token.

What it owns: the route, and nothing else — the metrics themselves (names, help, buckets, the
collector that reads the scheduler's view at scrape time) are
:mod:`berth.observability.metrics`'.  The application names the
:class:`~berth.observability.metrics.Metrics` to serve in ``app.state.metrics``
(:func:`~berth.api.app.create_app` sets it to its scheduler's); without one the
answer is ``503`` (problem+json), never an empty page that would read as "no placements".

The handler is ``async`` on purpose: it runs on the event loop that owns the scheduler's
replica, so the scrape reads the replica between two of its updates, never in the middle of
one (a thread-pool handler could race them).  Prometheus scrapes with the same token as any
client: ``authorization: {type: Bearer, credentials: <token>}`` in its scrape config.  The
route is left out of the OpenAPI document (its body is Prometheus' text format, not JSON),
like the dashboard's.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from berth.api.auth import require_token
from berth.api.problems import Problem
from berth.observability.metrics import CONTENT_TYPE, Metrics

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


@router.get("/metrics", dependencies=[Depends(require_token)])
async def metrics(request: Request) -> Response:
    """The scheduler's metrics in Prometheus' text exposition format."""
    served = getattr(request.app.state, "metrics", None)
    if not isinstance(served, Metrics):
        raise Problem(
            503,
            "unavailable",
            "no metrics",
            "this server measures no scheduler (app.state.metrics is not set)",
        )
    return Response(
        served.exposition(), media_type=CONTENT_TYPE, headers={"Cache-Control": "no-store"}
    )
