"""The API's one authentication rule: a bearer token, or the dashboard's cookie holding it.

Every route except ``GET /healthz`` depends on :func:`require_token`.  A request is
authorized when its ``Authorization: Bearer <token>`` header, or its ``berth_token`` cookie
(which ``GET /?token=T`` sets for the dashboard, :mod:`berth.api.dashboard`), equals
the application's token, compared in constant time (:func:`hmac.compare_digest`).  Otherwise
the answer is ``401`` as ``application/problem+json`` with ``WWW-Authenticate: Bearer``.

The token lives on the application (``app.state.token``), set once by
:func:`~berth.api.app.create_app`; there is no global.  Generating and storing a
token (``berth up``, ``berth scheduler --http``) is :mod:`berth.api.server`'s.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from berth.api.problems import Problem

__all__ = ["COOKIE", "bearer_token", "require_token", "token_matches"]

COOKIE = "berth_token"


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
    """The dependency of every protected route: the bearer token or the cookie, else 401."""
    if token_matches(request, bearer_token(request)):
        return
    if token_matches(request, request.cookies.get(COOKIE)):
        return
    raise Problem(
        401,
        "unauthorized",
        "missing or wrong API token",
        "send 'Authorization: Bearer <token>' (the token is in $BERTH_HOME/api.json)",
        headers={"WWW-Authenticate": "Bearer"},
    )
