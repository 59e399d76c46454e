"""The operator commands' edges, without a cluster: finding the API (flags, environment,
``$BERTH_HOME/api.json``), an API that is not there (connection refused, a server that never
answers) and flags that never reach the server — each one ``error:`` line naming the URL or
the flag, a non-zero exit status, no traceback, nothing sent.

The commands against a real ``berth up`` cluster are in ``test_operator_cli_walkthrough.py``.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from berth.api.client import ApiClient, ApiLocation, api_file, locate
from berth.cli.main import app
from berth.errors import BerthError, Invalid, NoCapacity, Unavailable


def berth(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def one_line(args: tuple[str, ...], expected: str, env: dict[str, str] | None = None) -> str:
    code, out, err = berth(*args, env=env)
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], err
    assert "Traceback" not in err and out == ""
    return lines[0]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port  # closed again: a connection to it is refused


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for connection in accepted:
            connection.close()
        server.close()


# -- finding the API -------------------------------------------------------------------------
def test_the_api_file_lives_under_berth_home(tmp_path: Path) -> None:
    assert api_file({"BERTH_HOME": str(tmp_path)}) == tmp_path / "api.json"
    assert api_file({"HOME": str(tmp_path)}).name == "api.json"


def test_flags_win_and_the_file_fills_in(tmp_path: Path) -> None:
    env = {"BERTH_HOME": str(tmp_path)}
    (tmp_path / "api.json").write_text(json.dumps({"url": "http://127.0.0.1:8080/", "token": "t"}))
    assert locate(None, None, environ=env) == ApiLocation(
        "http://127.0.0.1:8080", "t", str(tmp_path / "api.json")
    )
    # the file's token goes with the file's URL only
    assert locate("http://127.0.0.1:8080", None, environ=env).token == "t"
    assert locate("http://10.0.0.5:8080", None, environ=env).token is None
    assert locate("http://10.0.0.5:8080", "mine", environ=env).token == "mine"
    assert locate(None, "mine", environ=env).token == "mine"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("not json", "not a JSON document"),
        ('["http://x"]', '{"url": ..., "token": ...}'),
        ('{"url": "http://127.0.0.1:1", "token": 5}', "token: expected a string"),
        ('{"url": "ftp://x"}', "expected an http:// or https:// URL"),
    ],
)
def test_a_bad_api_file_is_named(tmp_path: Path, content: str, expected: str) -> None:
    (tmp_path / "api.json").write_text(content)
    with pytest.raises(Invalid) as caught:
        locate(None, None, environ={"BERTH_HOME": str(tmp_path)})
    assert caught.value.field == str(tmp_path / "api.json") and expected in str(caught.value)


def test_no_api_anywhere_says_how_to_get_one(tmp_path: Path) -> None:
    line = one_line(("nodes",), "--api", env={"BERTH_HOME": str(tmp_path), "BERTH_API": ""})
    assert "berth up" in line and str(tmp_path / "api.json") in line


@pytest.mark.parametrize(
    "url",
    [
        "127.0.0.1:8080",
        "nats://127.0.0.1:4222",
        "http://",
        "http://h/?a=1",
        "http://[::1",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:9/\n",
        "http://127.0.0.1 :9",
    ],
)
def test_a_bad_api_url_is_named(url: str) -> None:
    one_line(("ps", "--api", url), "--api")


@pytest.mark.parametrize("token", ["", "é", "a b", "a\nb", "x" * 5000])
def test_a_token_that_cannot_be_sent_is_named_not_shown(token: str) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    line = one_line(("ps", "--api", url, "--token", token), "--token")
    assert "characters that are not" in line and (not token or token not in line)


def test_a_bad_token_in_the_api_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "api.json").write_text(json.dumps({"url": "http://127.0.0.1:1", "token": "a b"}))
    with pytest.raises(Invalid) as caught:
        locate(None, None, environ={"BERTH_HOME": str(tmp_path)})
    assert caught.value.field == f"{tmp_path / 'api.json'}: token"


# -- an API that is not there ----------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ("ps",),
        ("nodes",),
        ("stop", "w-1"),
        ("cordon", "node-00"),
        ("drain", "node-00"),
        ("images",),
        ("run", "busybox", "--", "true"),
        ("explain", "busybox"),
    ],
)
def test_connection_refused_is_one_line_naming_the_url(args: tuple[str, ...]) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    line = one_line((args[0], "--api", url, *args[1:]), f"cannot reach the berth API at {url}/")
    assert "refused" in line


def test_a_stale_api_file_is_named_as_stale(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"  # a berth up killed with -9 left its file
    (tmp_path / "api.json").write_text(json.dumps({"url": url, "token": "t"}))
    line = one_line(("ps",), f"cannot reach the berth API at {url}/", {"BERTH_HOME": str(tmp_path)})
    assert f"({tmp_path / 'api.json'} says the API is there" in line
    assert "the file is stale — start berth up again, or pass --api URL)" in line
    # given --api, the file is not to blame
    line = one_line(("ps", "--api", url), "refused", {"BERTH_HOME": str(tmp_path)})
    assert "stale" not in line


def test_a_server_that_never_answers_times_out(silent_server: str) -> None:
    location = ApiLocation(silent_server, None, "--api")
    expected = f"{silent_server}/v1/nodes did not answer within 0.3s"
    with ApiClient(location, timeout_s=0.3) as client, pytest.raises(Unavailable, match=expected):
        client.nodes()


def test_a_change_never_answered_says_its_outcome_is_unknown(silent_server: str) -> None:
    location = ApiLocation(silent_server, None, "--api")
    with ApiClient(location, timeout_s=0.3) as client:
        with pytest.raises(Unavailable, match="POST is unknown: it may have been done"):
            client.create_workload({"name": "job"})
        with pytest.raises(Unavailable) as caught:
            client.nodes()
        assert "unknown" not in str(caught.value)  # a read changes nothing


# -- flags that never reach a server ---------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("run", "busybox", "--env", "NOEQUALS", "--", "true"), "--env"),
        (("stop", "w-1", "--grace", "-1"), "--grace"),
        (("stop", "w-1", "--grace", "nan"), "--grace"),
        (("drain", "node-00", "--grace", "inf"), "--grace"),
        (("stop", "w-1", "--grace", "3601"), "--grace"),  # a stop's grace is at most an hour
        (("drain", "node-00", "--grace", "7200"), "--grace"),
        (("images", "add", "img", "--layer", "nocolon"), "--layer"),
        (("images", "add", "img", "--layer", "sha256:ab:-1GiB"), "--layer"),
        (("images", "add", "img", "--layer", "sha256:ab:8 GiBs"), "--layer"),
        (("stop", ""), "ID"),
        (("run", "busybox", "--restart", "sometimes", "--", "true"), "--restart"),
        (("run", "busybox", "--restart-attempts", "-1", "--", "true"), "--restart-attempts"),
        (("run", "busybox", "--restart-interval", "0", "--", "true"), "--restart-interval"),
        (
            ("run", "busybox", "--restart-delay", "5", "--restart-max-delay", "1", "--", "true"),
            "--restart-max-delay",
        ),
        (("run", "busybox", "--reschedule", "-1", "--", "true"), "--reschedule"),
        (("ps", "a b"), "ID"),
        (("cordon", "a b"), "NODE"),
        (("uncordon", "x" * 300), "NODE"),
        (("drain", "node\u200b"), "NODE"),
    ],
)
def test_bad_flags_are_one_line_and_send_nothing(args: tuple[str, ...], flag: str) -> None:
    # the API is a closed port: had anything been sent, the error would be "cannot reach"
    url = f"http://127.0.0.1:{closed_port()}"
    one_line(
        (*args[:-2], "--api", url, *args[-2:]) if "--" in args else (*args, "--api", url), flag
    )


# -- a server that answers badly -------------------------------------------------------------
# (httpx's MockTransport plays a broken or hostile server; the real API is in the walk-through)
def answering(status: int, content: bytes, kind: str = "application/problem+json") -> ApiClient:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=content, headers={"content-type": kind})

    return ApiClient(ApiLocation("http://api", "t", "test"), transport=httpx.MockTransport(handler))


def problem(status: int, **fields: object) -> bytes:
    return json.dumps({"type": "x", "title": "t", "status": status, **fields}).encode()


def test_a_validation_problem_names_the_request_field_once() -> None:
    body = problem(400, detail="query.state: Input should be 'running'", field="query.state")
    with answering(400, body) as client, pytest.raises(Invalid) as caught:
        client.workloads(state="x")
    assert caught.value.field == "state" and str(caught.value) == "state: must be 'running'"


def test_no_capacity_keeps_the_counts_and_tolerates_junk_in_them() -> None:
    body = problem(409, detail="0/3 nodes can run it", reasons={"mem_exhausted": 3})
    with answering(409, body) as client, pytest.raises(NoCapacity) as caught:
        client.nodes()
    assert caught.value.reasons == {"mem_exhausted": "3"}
    junk = problem(409, detail="x", reasons=[1, 2])
    with answering(409, junk) as client, pytest.raises(NoCapacity) as caught:
        client.nodes()
    assert caught.value.reasons == {}


@pytest.mark.parametrize(
    ("status", "content", "expected"),
    [
        (500, b"boom", "failed with HTTP 500: boom"),
        (502, b"\xff\xfe", "failed with HTTP 502"),
        (404, problem(404, detail="no node 'x'"), "not found: no node 'x'"),
        (503, problem(503, detail="no scheduler answers"), "no scheduler answers"),
        (200, b"<html>", "the answer is not JSON"),
        (200, b'{"items": [{"name": 5}]}', "does not match its schema: items.0"),
        (200, b"[" * 100_000 + b"]" * 100_000, "not JSON"),
        (500, b"[" * 100_000 + b"]" * 100_000, "failed with HTTP 500"),
        (500, problem(500, detail="y" * 100_000), "y" * 100 + "…"),
    ],
)
def test_a_broken_answer_is_one_error_not_a_traceback(
    status: int, content: bytes, expected: str
) -> None:
    with answering(status, content) as client, pytest.raises(BerthError) as caught:
        client.nodes()
    assert expected in str(caught.value) and len(str(caught.value)) < 2200


def test_a_create_waits_as_long_as_the_api_may_take_to_place_and_boot() -> None:
    """The API places (the queue group's timeout) and then boots (the node's run timeout): a
    client that gave up first would leave the outcome unknown for no reason."""
    from berth.defaults import RUN_TIMEOUT_S, SCHEDULE_TIMEOUT_S

    waited: dict[str, float] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        waited[request.method] = request.extensions["timeout"]["read"]
        return httpx.Response(
            503,
            content=problem(503, detail="no scheduler"),
            headers={"content-type": "application/problem+json"},
        )

    location = ApiLocation("http://api", "t", "test")
    with ApiClient(location, transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(Unavailable):
            client.create_workload({"name": "x"})
        with pytest.raises(Unavailable):
            client.workloads()
    assert waited["GET"] == client.timeout_s  # a read keeps the client's own timeout
    assert waited["POST"] > SCHEDULE_TIMEOUT_S + RUN_TIMEOUT_S
