"""The API's one authentication rule: a bearer token, or the dashboard's session cookie — and
the cookie's defence against cross-site request forgery.

Every route except ``GET /healthz`` depends on :func:`require_token`.  A request is
authorized when its ``Authorization: Bearer <token>`` header equals the application's token
(the CLI, :mod:`berth.api.client`, scripts), or when its ``berth_session`` cookie is a session
this application issued (``GET /?token=T`` issues one for the dashboard,
:mod:`berth.api.dashboard`).  Otherwise the answer is ``401`` as
``application/problem+json`` with ``WWW-Authenticate: Bearer``.

**The cookie is not the token.**  A session is a random id and its MAC,
``<id>.<HMAC-SHA256(secret, "session:" + id)>``, under a secret of 32 random bytes the
application draws when it is created (:func:`configure`): nothing is stored per session, a
stolen cookie never reveals the token, and the sessions end with the process that issued
them (the dashboard then asks for its URL again).  Every comparison — token, MAC, CSRF value
— is constant-time (:func:`hmac.compare_digest`).

**Cross-site request forgery.**  ``SameSite=Strict`` does not keep the cookie from a page on
another port of the same host (``http://127.0.0.1:9000`` is the same *site* as the API on
``:8080``, a workload's own web server for one), and a browser attaches it to that page's
``POST``.  So a request the cookie authenticates whose method is not safe (anything but
``GET``, ``HEAD``, ``OPTIONS``) must also

* come from the API's own origin: its ``Origin`` header — or, without one, its ``Referer``'s
  origin — equal to the origin the request was sent to (scheme, ``Host``); a missing or
  ``null`` origin is refused; and
* carry ``X-Berth-CSRF``, the session's CSRF value (``HMAC(secret, "csrf:" + id)``), which
  the dashboard's page embeds and its script sends back.  A cookie cannot supply a header,
  and another origin can neither read the page nor send a custom header without a CORS
  preflight the API never grants.

Either failure is ``403`` (problem+json) and changes nothing.  Bearer-token requests are not
touched by any of this: a header a page cannot set is what authenticates them.

The token and the session secret live on the application (``app.state``), set once by
:func:`configure` from :func:`~berth.api.app.create_app`; there is no global.  Generating
and storing a token (``berth up``, ``berth scheduler --http``) is
:mod:`berth.api.server`'s.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request
from starlette.applications import Starlette

from berth.api.problems import Problem
from berth.validation import shown

__all__ = [
    "COOKIE",
    "CSRF_HEADER",
    "Session",
    "bearer_token",
    "configure",
    "new_session",
    "require_token",
    "session_of",
    "token_matches",
]

COOKIE = "berth_session"
"""The dashboard's session cookie (HttpOnly, SameSite=Strict, Path=/)."""
CSRF_HEADER = "X-Berth-CSRF"
"""The header a cookie-authenticated write must carry: its session's CSRF value."""
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Session:
    """A dashboard session: the ``cookie``'s value and the ``csrf`` value its page embeds."""

    cookie: str
    csrf: str


def configure(app: Starlette, token: str) -> None:
    """Give ``app`` its token and a fresh session secret (see the module docstring)."""
    app.state.token = token
    app.state.session_secret = secrets.token_bytes(32)


def _mac(secret: bytes, purpose: str, session_id: str) -> str:
    digest = hmac.new(secret, f"{purpose}:{session_id}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _secret(app: Starlette) -> bytes | None:
    secret = getattr(app.state, "session_secret", None)
    return secret if isinstance(secret, bytes) and secret else None


def new_session(app: Starlette) -> Session:
    """A new session of ``app`` (the ``?token=`` hand-off's)."""
    secret = _secret(app)
    if secret is None:
        raise RuntimeError("the application has no session secret (auth.configure)")
    session_id = secrets.token_urlsafe(24)
    return Session(
        f"{session_id}.{_mac(secret, 'session', session_id)}", _mac(secret, "csrf", session_id)
    )


def session_of(app: Starlette, cookie: str | None) -> Session | None:
    """The session whose cookie is ``cookie``, if ``app`` issued it; else ``None``."""
    secret = _secret(app)
    if secret is None or not cookie:
        return None
    session_id, _, mac = cookie.partition(".")
    if not session_id or not mac:
        return None
    expected = _mac(secret, "session", session_id)
    if not hmac.compare_digest(mac.encode(), expected.encode()):
        return None
    return Session(cookie, _mac(secret, "csrf", session_id))


def token_matches(request: Request, candidate: str | None) -> bool:
    """Whether ``candidate`` is the application's token (constant-time comparison)."""
    expected: str = request.app.state.token
    if not candidate or not expected:
        return False
    return hmac.compare_digest(candidate.encode(), expected.encode())


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if there is one."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def require_token(request: Request) -> None:
    """The dependency of every protected route: the bearer token, or a session cookie (with
    the CSRF checks for a write), else 401."""
    if token_matches(request, bearer_token(request)):
        return
    session = session_of(request.app, request.cookies.get(COOKIE))
    if session is None:
        raise Problem(
            401,
            "unauthorized",
            "missing or wrong API token",
            "send 'Authorization: Bearer <token>' (the token is in $BERTH_HOME/api.json)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if request.method not in SAFE_METHODS:
        _check_forgery(request, session)


def _check_forgery(request: Request, session: Session) -> None:
    """A cookie-authenticated write: from this API's own origin, with the session's CSRF
    value in :data:`CSRF_HEADER`, or ``403``."""
    own = _origin_of(f"{request.url.scheme}://{request.headers.get('host', '')}")
    claimed = request.headers.get("origin")
    source = claimed if claimed is not None else request.headers.get("referer")
    if own is None or source is None or _origin_of(source) != own:
        said = "no Origin or Referer" if source is None else f"it came from {shown(source)}"
        raise Problem(
            403,
            "cross_origin",
            "cross-origin request refused",
            "a write authenticated by the dashboard's cookie must come from the API's own "
            f"pages ({request.url.scheme}://{request.headers.get('host', '')}); {said}",
        )
    sent = request.headers.get(CSRF_HEADER)
    if sent is None or not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise Problem(
            403,
            "csrf",
            "missing or wrong CSRF value",
            f"a write authenticated by the dashboard's cookie must carry {CSRF_HEADER} with "
            "the value its page embeds (or use 'Authorization: Bearer <token>')",
        )


def _origin_of(url: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of ``url`` — the default port filled in — or ``None`` for
    one that names no origin (``null``, no host, a malformed port)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme]
