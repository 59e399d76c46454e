"""The API client with several endpoints: which are tried, when, and what a POST carries."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from berth.api.client import ApiClient, ApiLocation, locate
from berth.errors import Invalid, Unavailable

Handler = Callable[[httpx.Request], httpx.Response]


def test_the_file_and_the_flag_name_every_endpoint(tmp_path: Path) -> None:
    env = {"BERTH_HOME": str(tmp_path)}
    document = {"url": "https://a:1", "urls": ["https://a:1", "https://b:2/"], "token": "t"}
    document["ca"] = "tls/ca.pem"  # relative: to the file's own directory
    (tmp_path / "api.json").write_text(json.dumps(document))
    located = locate(None, None, environ=env)
    assert located.urls == ("https://a:1", "https://b:2")
    assert located.ca == str(tmp_path / "tls" / "ca.pem") and located.token == "t"
    flagged = locate("http://x:1,http://y:2", None, environ=env)
    assert flagged.urls == ("http://x:1", "http://y:2") and flagged.token is None
    # the file's token and CA go with any of the file's endpoints
    assert locate("https://a:1,https://c:3", None, environ=env).token == "t"
    assert locate("https://b:2", None, environ=env).token == "t"
    # `export BERTH_API=… BERTH_TOKEN=…` as berth up prints: the file's CA is still trusted
    exported = locate("https://a:1", "mine", environ=env)
    assert exported.token == "mine" and exported.ca == str(tmp_path / "tls" / "ca.pem")
    assert locate("https://elsewhere:1", "mine", environ=env).ca is None


@pytest.mark.parametrize(
    ("api", "message"),
    [
        ("http://x:1,http://x:1", "given twice"),
        ("http://x:1,", "expected an http:// or https:// URL"),
        ("http://x:1,ftp://y", "expected an http:// or https:// URL"),
    ],
)
def test_bad_endpoint_lists_name_the_flag(api: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(Invalid, match=message) as error:
        locate(api, None, environ={"BERTH_HOME": str(tmp_path)})
    assert error.value.field == "--api"


def test_a_bad_urls_entry_in_the_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "api.json").write_text(json.dumps({"url": "http://a:1", "urls": "http://a:1"}))
    with pytest.raises(Invalid, match="urls: expected a list"):
        locate(None, None, environ={"BERTH_HOME": str(tmp_path)})


def _client(handler: Handler, hosts: tuple[str, ...] = ("a", "b", "c")) -> ApiClient:
    urls = [f"http://{host}" for host in hosts]
    location = ApiLocation(urls[0], "t", "test", tuple(urls[1:]))
    return ApiClient(location, transport=httpx.MockTransport(handler))


def _ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"status": "ok", "from": request.url.host})


def test_an_unreachable_endpoint_is_skipped_and_the_next_one_kept() -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        if request.url.host == "a":
            raise httpx.ConnectError("connection refused", request=request)
        return _ok(request)

    with _client(handler) as client:
        assert client.health()["from"] == "b"
        assert client.url == "http://b"
        assert client.health()["from"] == "b"  # the one that answered is asked first
    assert asked == ["a", "b", "b"]


def test_a_post_keeps_its_idempotency_key_across_endpoints_even_after_a_timeout() -> None:
    keys: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append((request.url.host, request.headers.get("Idempotency-Key")))
        if request.url.host == "a":
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.host == "b":
            raise httpx.ReadTimeout("timed out", request=request)
        return _ok(request)

    with _client(handler) as client:  # b may have done it: c answers the same key's outcome
        assert client.request("POST", "/v1/nodes/n/cordon")["from"] == "c"
    assert [host for host, _ in keys] == ["a", "b", "c"]
    assert keys[0][1] is not None and len({key for _, key in keys}) == 1
    keys.clear()
    # a placement's repeat would take a second lease: not asked again after a timeout
    with _client(handler) as client, pytest.raises(Unavailable, match="outcome of the POST"):
        client.request("POST", "/v1/placements")
    assert [host for host, _ in keys] == ["a", "b"]
    fresh: list[str | None] = []

    def answering(request: httpx.Request) -> httpx.Response:
        fresh.append(request.headers.get("Idempotency-Key"))
        return _ok(request)

    with _client(answering) as client:
        client.request("POST", "/x")
        client.request("POST", "/x")
        client.request("GET", "/x")
    assert fresh[0] != fresh[1] and None not in fresh[:2]  # a fresh key per request
    assert fresh[2] is None  # a read needs none


def test_a_read_goes_on_after_a_timeout_or_a_503() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a":
            raise httpx.ReadTimeout("timed out", request=request)
        if request.url.host == "b":
            return httpx.Response(503, json={"detail": "registry down"})
        return _ok(request)

    with _client(handler) as client:
        assert client.health()["from"] == "c"


def test_when_none_answers_each_is_named() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with _client(handler, ("a", "b")) as client, pytest.raises(Unavailable) as error:
        client.health()
    message = str(error.value)
    assert "none of the 2" in message and "http://a/healthz" in message
    assert "http://b/healthz" in message


def test_a_real_refused_port_fails_over_to_a_real_server() -> None:
    """Over real sockets: a closed port, then a listening one (no mock transport)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"status": "ok"}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    server = HTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        location = ApiLocation(
            f"http://127.0.0.1:{closed}", None, "test", (f"http://127.0.0.1:{server.server_port}",)
        )
        with ApiClient(location, timeout_s=5) as client:
            assert client.health() == {"status": "ok"}
    finally:
        server.shutdown()
        server.server_close()


def test_a_post_whose_first_attempt_is_still_under_way_is_asked_again() -> None:
    answers = [
        httpx.Response(
            409,
            headers={"Retry-After": "0"},
            json={"type": "https://berth.dev/problems/idempotency_in_progress", "detail": "wait"},
        ),
        httpx.Response(201, json={"status": "ok", "from": "a"}),
    ]
    keys: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers.get("Idempotency-Key"))
        return answers.pop(0)

    with _client(handler, ("a",)) as client:
        assert client.request("POST", "/v1/workloads", body={})["from"] == "a"
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0] is not None

    # and within the request's time only: then it is said as it is
    def busy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            409,
            headers={"Retry-After": "1"},
            json={"type": "https://berth.dev/problems/idempotency_in_progress", "detail": "wait"},
        )

    location = ApiLocation("http://a", "t", "test")
    with (
        ApiClient(location, timeout_s=0.5, transport=httpx.MockTransport(busy)) as client,
        pytest.raises(Unavailable, match="wait"),
    ):
        client.request("POST", "/v1/workloads", body={})
