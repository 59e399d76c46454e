"""The dashboard's routes in process: the token hand-off (``/?token=`` → an HttpOnly session
cookie that is not the token → redirect), 401 without it, the shell (with its session's CSRF
value) and its two assets with a strict Content-Security-Policy, and the page script's rules
— API strings become text nodes, never markup; every call sends the CSRF value.

The page rendered by a real browser over a real cluster is ``test_dashboard_browser.py``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from importlib.resources import files

import httpx
import pytest

from berth.api.app import create_app
from berth.api.auth import COOKIE

pytestmark = pytest.mark.anyio

TOKEN = "dashboard-test-token-0123456789"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """GETs against the app in this process (httpx's ASGI transport), keeping cookies."""
    # The dashboard reads no backend: its data comes from the JSON routes, in the browser.
    transport = httpx.ASGITransport(app=create_app(None, token=TOKEN))
    async with httpx.AsyncClient(
        transport=transport, base_url="http://127.0.0.1", follow_redirects=True
    ) as http:
        yield http


async def test_the_token_in_the_url_becomes_a_cookie_and_leaves_the_url(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get(f"/?token={TOKEN}", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and TOKEN not in cookie  # a session, not the token
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert response.headers["referrer-policy"] == "no-referrer"
    page = await client.get("/")  # the client kept the cookie
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<table id="nodes">' in page.text and "/static/dashboard.js" in page.text
    csrf = re.search(r'<meta name="berth-csrf" content="([\w-]{20,})">', page.text)
    assert csrf is not None and csrf.group(1) not in cookie, page.text
    again = await client.get(f"/?token={TOKEN}")  # each hand-off is a session of its own
    assert again.status_code == 200 and csrf.group(1) not in again.text


async def test_no_token_or_a_wrong_one_is_a_401_page_without_a_cookie(
    client: httpx.AsyncClient,
) -> None:
    for url in ("/", "/?token=wrong", "/?token=", "/static/dashboard.js"):
        response = await client.get(url, follow_redirects=False)
        assert response.status_code == 401, url
        assert "not authorized" in response.text and "set-cookie" not in response.headers
    for name, value in (("berth_token", TOKEN), (COOKIE, TOKEN), (COOKIE, "a.b")):
        client.cookies.set(name, value)  # the token itself is no session
        assert (await client.get("/")).status_code == 401, (name, value)
        client.cookies.clear()


async def test_a_bearer_token_opens_the_page_too(client: httpx.AsyncClient) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert (await client.get("/", headers=headers)).status_code == 200
    assert (await client.get("/static/dashboard.css", headers=headers)).status_code == 200


async def test_assets_are_served_with_their_types_and_a_strict_policy(
    client: httpx.AsyncClient,
) -> None:
    await client.get(f"/?token={TOKEN}")  # the session cookie
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        response = await client.get(f"/static/{name}")
        assert response.status_code == 200 and response.headers["content-type"].startswith(kind)
        assert response.headers["x-content-type-options"] == "nosniff"
    assert (await client.get("/static/../app.py")).status_code == 404
    assert (await client.get("/static/index.html")).status_code == 404
    policy = (await client.get("/")).headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy


def test_the_page_script_inserts_text_never_markup() -> None:
    script = (files("berth.api") / "static" / "dashboard.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink
    assert "textContent" in script and "createTextNode" in script
    # polls the three JSON routes once a second, with the cookie
    assert re.search(r"PERIOD_MS = 1000\b", script)
    for route in ("/v1/nodes", "/v1/workloads", "/v1/placements/recent"):
        assert f'"{route}' in script
    assert 'credentials: "same-origin"' in script
    # sends the session's CSRF value the page embeds, and keeps its Origin on a write
    assert 'meta[name="berth-csrf"]' in script and '"X-Berth-CSRF": CSRF' in script
    assert 'referrerPolicy: "same-origin"' in script


def test_the_shell_has_no_inline_code() -> None:
    shell = (files("berth.api") / "static" / "index.html").read_text()
    assert "<script>" not in shell and "<style" not in shell
    assert not re.search(r"\son\w+=", shell)  # no inline event handlers
