"""The committed OpenAPI document (docs/openapi.json) is the one the service generates, and
the application answers problem+json for what it refuses, without a cluster behind it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from berth.api.app import generated_openapi
from berth.api.server import parse_address, resolve_token, write_api_file
from berth.errors import Invalid

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_committed_document_is_the_generated_one() -> None:
    committed = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    assert committed == generated_openapi(), (
        "docs/openapi.json is stale: regenerate it with `berth api openapi > docs/openapi.json`"
    )


def test_document_lists_400_not_422_and_the_token() -> None:
    """Validation is 400, never FastAPI's 422; the one 422 is a create's reused
    ``Idempotency-Key``, a problem like every other error."""
    document = generated_openapi()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            if "422" in responses:
                assert (method, path) == ("post", "/v1/workloads"), (method, path)
                problem = responses["422"]["content"]["application/problem+json"]
                assert problem["schema"] == {"$ref": "#/components/schemas/ProblemBody"}
                assert "Idempotency-Key" in responses["422"]["description"]
            if path != "/healthz":
                assert "401" in responses, (method, path)
                problem = responses["401"]["content"]["application/problem+json"]
                assert problem["schema"] == {"$ref": "#/components/schemas/ProblemBody"}
            # 400 only where there is something to refuse: a query parameter or a body
            queried = any(p["in"] == "query" for p in operation.get("parameters", []))
            takes_input = queried or "requestBody" in operation
            assert ("400" in responses) == takes_input, (method, path)
            assert ("413" in responses) == ("requestBody" in operation), (method, path)
            assert ("403" in responses) == (method != "get"), (method, path)
    assert document["security"] == [{"bearer": []}]
    assert document["paths"]["/healthz"]["get"]["security"] == []


@pytest.mark.parametrize(
    ("value", "public", "expected"),
    [
        ("127.0.0.1:8080", False, ("127.0.0.1", 8080)),
        (":0", False, ("127.0.0.1", 0)),
        ("[::1]:9000", False, ("::1", 9000)),
        ("localhost:1", False, ("localhost", 1)),
        ("0.0.0.0:8080", True, ("0.0.0.0", 8080)),
    ],
)
def test_addresses(value: str, public: bool, expected: tuple[str, int]) -> None:
    assert parse_address(value, public=public) == expected


@pytest.mark.parametrize(
    "value", ["0.0.0.0:8080", "10.1.2.3:80", "example.com:80", "8080", "h:99999", "h:-1", ""]
)
def test_bad_or_public_addresses_are_refused(value: str) -> None:
    with pytest.raises(Invalid) as caught:
        parse_address(value)
    assert caught.value.field == "--http"


def test_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token, generated = resolve_token()
    assert generated and len(token) >= 32
    assert resolve_token("a" * 20) == ("a" * 20, False)
    (tmp_path / "t").write_text("b" * 20 + "\nignored\n")
    assert resolve_token(None, tmp_path / "t") == ("b" * 20, False)
    for bad in ("short", "has space in it ....", "x" * 513):
        with pytest.raises(Invalid) as caught:
            resolve_token(bad)
        assert caught.value.field == "--token"
    with pytest.raises(Invalid):
        resolve_token(None, tmp_path / "missing")
    monkeypatch.setenv("BERTH_HOME", str(tmp_path / "home"))
    path = write_api_file("http://127.0.0.1:1", "c" * 20)
    assert path == tmp_path / "home" / "api.json"
    written = {"url": "http://127.0.0.1:1", "urls": ["http://127.0.0.1:1"], "token": "c" * 20}
    assert json.loads(path.read_text()) == written
    assert path.stat().st_mode & 0o777 == 0o600


def test_large_bodies_are_413_and_nothing_is_read_past_the_limit() -> None:
    from berth.api.app import MAX_BODY_BYTES, create_app

    token = "t" * 20
    app = create_app(None, token=token)  # no backend: the call never reaches a route
    headers = {"Authorization": f"Bearer {token}", "content-type": "application/json"}

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"name": "'
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b"x" * 65536

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            big = b'{"name": "' + b"x" * MAX_BODY_BYTES + b'"}'
            response = await http.post("/v1/workloads", content=big, headers=headers)
            assert response.status_code == 413, response.text
            assert response.headers["content-type"] == "application/problem+json"
            chunked = await http.post("/v1/workloads", content=chunks(), headers=headers)
            assert chunked.status_code == 413, chunked.text
            assert chunked.headers["content-type"] == "application/problem+json"

    asyncio.run(main())
