"""The live dashboard at ``/``: a read-only page over the JSON API, for people.

What it owns: the page's three routes — ``GET /`` (the HTML shell), ``GET
/static/dashboard.js`` and ``GET /static/dashboard.css`` (package data in ``static/``) — and
the token hand-off: ``GET /?token=T`` checks ``T``, trades it for a new session
(:func:`~berth.api.auth.new_session`: a random id and its MAC, never the token) in the
``berth_session`` cookie (HttpOnly, SameSite=Strict, Path=/) and redirects to ``/``, so the
token leaves the address bar and the history; the page's scripts then call ``/v1/nodes``,
``/v1/workloads`` and ``/v1/placements/recent`` once a second with that cookie (the API's
token dependency accepts it).  The shell embeds the session's CSRF value (``<meta
name="berth-csrf">``), which the script sends back as ``X-Berth-CSRF``: the API refuses a
cookie-authenticated write without it, or from another origin (:mod:`berth.api.auth`).
Without a valid token or session the page is a 401 telling where the right URL is.

What it is not: an API of its own or a second renderer of cluster state — the shell carries no
data; everything shown comes from the same JSON routes the CLI uses, drawn by
``dashboard.js`` with text nodes only (no ``innerHTML``), so a node or command named
``<script>`` is shown, never run.  A strict Content-Security-Policy (scripts and styles from
this origin only, no inline code) backs that up.  No build toolchain: plain files a fresh
machine can serve.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from berth.api.auth import COOKIE, Session, bearer_token, new_session, session_of, token_matches

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
_DENIED = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>berth — not authorized</title></head>
<body><h1>berth dashboard: not authorized</h1>
<p>This page needs the cluster's API token. Open the dashboard URL that <code>berth up</code>
printed (it ends in <code>?token=…</code>), or the URL in <code>$BERTH_HOME/api.json</code>
with <code>/?token=</code> and its token appended.</p></body></html>
"""


@cache
def _static(name: str) -> str:
    return (files("berth.api") / "static" / name).read_text(encoding="utf-8")


_CSRF_SLOT = "__BERTH_CSRF__"
"""Where ``index.html`` takes the session's CSRF value (``<meta name="berth-csrf">``)."""


def _session(request: Request) -> Session | None:
    return session_of(request.app, request.cookies.get(COOKIE))


def _authorized(request: Request) -> bool:
    """The API's rule (:func:`~berth.api.auth.require_token`), answered with a page."""
    return _session(request) is not None or token_matches(request, bearer_token(request))


def _denied() -> HTMLResponse:
    return HTMLResponse(_DENIED, status_code=401, headers=_HEADERS)


@router.get("/")
def page(request: Request, token: str | None = None) -> Response:
    """The dashboard; ``?token=T`` trades the token for a session cookie and redirects here."""
    if token is not None:
        if not token_matches(request, token):
            return _denied()
        response = RedirectResponse("/", status_code=303, headers=_HEADERS)
        issued = new_session(request.app)
        secure = request.url.scheme == "https"  # over HTTPS, never sent in plain text
        response.set_cookie(
            COOKIE, issued.cookie, httponly=True, samesite="strict", path="/", secure=secure
        )
        return response
    if not _authorized(request):
        return _denied()
    session = _session(request)  # None: a bearer token opened it (its page can read, not write)
    shell = _static("index.html").replace(_CSRF_SLOT, "" if session is None else session.csrf)
    return HTMLResponse(shell, headers=_HEADERS)


@router.get("/static/{name}")
def asset(request: Request, name: str) -> Response:
    """``dashboard.js`` or ``dashboard.css``; anything else is a 404."""
    if not _authorized(request):
        return _denied()
    if name not in _ASSETS:
        return Response("not found\n", status_code=404, media_type="text/plain")
    return Response(_static(name), media_type=_ASSETS[name], headers=_HEADERS)
