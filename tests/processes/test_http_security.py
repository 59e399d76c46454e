"""The HTTP API's holes a security review found (issue 21), each closed, against a served API:
in this process (the application over the embedded cluster) and, marked ``slow``, a real
``berth up`` (uvicorn, a nats-server with authentication, agent processes).

* the dashboard's cookie is a session, never the token, and a write it authenticates must
  come from the API's own origin with the page's ``X-Berth-CSRF`` value — a page on another
  port of the same host cannot cordon or drain a node with it; bearer clients are unaffected;
* a string UTF-8 cannot encode (a lone surrogate) anywhere in a body is a ``400`` naming the
  field, with nothing claimed, placed or booted;
* an OCI import of a path the system refuses (a component over 255 bytes, a path over 4 KiB,
  blobs past the path limit) is a ``400`` naming ``path``;
* a chunked body over 1 MiB is ``413``, as a declared one is;
* every operation answers only what the committed document lists — also when the API's
  registry is unreachable (``503``), when the cookie comes from elsewhere (``403``) and when
  a body is too large (``413``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from berth.api.app import MAX_BODY_BYTES, create_app
from berth.api.backend import ClusterBackend
from berth.api.testing import TOKEN, ApiUnderTest
from berth.embedded import EmbeddedCluster, embedded_configs
from berth.oci import ImageSpec, file, write_layout
from berth.registry.nats import NatsImages, NatsWorkloads
from berth.testing.nats import NatsServer, client, unique_name
from tests.api_helpers import BOTH, api_under_test, problem

pytestmark = pytest.mark.anyio

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
JSON = {"content-type": "application/json"}
COOKIE = "berth_session"  # the dashboard's session cookie (berth.api.auth)
CSRF_HEADER = "X-Berth-CSRF"  # the header a cookie-authenticated write carries


@pytest.fixture(scope="module", params=BOTH)
async def service(request: pytest.FixtureRequest) -> AsyncIterator[ApiUnderTest]:
    async with api_under_test(request.param, 2, runtime="fake") as under_test:
        yield under_test


@pytest.fixture(scope="module")
async def api(service: ApiUnderTest) -> AsyncIterator[httpx.AsyncClient]:
    async with service.client() as http:
        yield http


@contextlib.asynccontextmanager
async def browser(service: ApiUnderTest) -> AsyncIterator[tuple[httpx.AsyncClient, str, str]]:
    """What a browser holds after opening the dashboard URL: a client with no token, the
    ``Cookie`` header the hand-off set, and the CSRF value the page embeds."""
    async with service.client(token=False) as anonymous:
        handed = await anonymous.get(f"/?token={service.token}", follow_redirects=False)
        assert handed.status_code == 303, handed.text
        set_cookie = re.match(r"([^=;]+)=([^;]*);", handed.headers["set-cookie"])
        assert set_cookie is not None, handed.headers["set-cookie"]
        cookie = f"{set_cookie.group(1)}={set_cookie.group(2)}"
        page = await anonymous.get("/", headers={"cookie": cookie})
        assert page.status_code == 200, page.text
        csrf = re.search(r'<meta name="berth-csrf" content="([^"]*)">', page.text)
        yield anonymous, cookie, "" if csrf is None else csrf.group(1)


def origins(service: ApiUnderTest) -> tuple[str, str]:
    """The API's own origin, and a foreign one: the same host on another port."""
    parts = urlsplit(service.base_url)
    own = f"{parts.scheme}://{parts.netloc}"
    port = parts.port or 80
    return own, f"{parts.scheme}://{parts.hostname}:{port + 1 if port < 65535 else port - 1}"


async def cordoned(api: httpx.AsyncClient, node: str) -> bool:
    state: bool = (await api.get(f"/v1/nodes/{node}")).json()["cordoned"]
    return state


# -- 1. the dashboard's cookie and cross-site request forgery ---------------------------------
async def test_the_cookie_is_a_session_never_the_token(service: ApiUnderTest) -> None:
    async with browser(service) as (anonymous, cookie, csrf):
        assert cookie.startswith(f"{COOKIE}=") and service.token not in cookie
        assert csrf and service.token not in csrf and csrf not in cookie
        for name in (COOKIE, "berth_token"):  # the raw token is no cookie of the API's
            raw = {"cookie": f"{name}={service.token}"}
            problem(await anonymous.get("/v1/nodes", headers=raw), 401)
        forged = cookie[:-2] + ("AA" if not cookie.endswith("AA") else "BB")
        problem(await anonymous.get("/v1/nodes", headers={"cookie": forged}), 401)
        reads = await anonymous.get("/v1/nodes", headers={"cookie": cookie})
        assert reads.status_code == 200  # a read needs the cookie only


async def test_a_foreign_origin_cannot_write_with_the_cookie(
    service: ApiUnderTest, api: httpx.AsyncClient
) -> None:
    own, foreign = origins(service)
    async with browser(service) as (anonymous, session, csrf):
        cookie = {"cookie": session}
        attempts: list[dict[str, str]] = [
            {"origin": foreign},  # what a page on another port sends
            {"origin": foreign, CSRF_HEADER: csrf},  # even with the value (it cannot know it)
            {"referer": f"{foreign}/attack.html"},  # no Origin: the Referer's origin counts
            {"origin": "null"},
            {},  # neither: refused
            {"origin": own},  # own origin, no CSRF value
            {"origin": own, CSRF_HEADER: "not-the-value"},
            {"referer": f"{own}/", CSRF_HEADER: csrf[:-1]},
        ]
        for headers in attempts:
            for path in ("/v1/nodes/node-00/cordon", "/v1/nodes/node-00/drain"):
                answer = await anonymous.post(path, headers={**cookie, **headers})
                body = problem(answer, 403)
                assert body["type"].endswith(("cross_origin", "csrf")), (headers, body)
            created = await anonymous.post(
                "/v1/workloads",
                json={"name": "forged", "type": "micro", "command": ["true"]},
                headers={**cookie, **headers},
            )
            problem(created, 403)
        assert not await cordoned(api, "node-00")  # nothing changed
        listed = (await api.get("/v1/workloads", params={"namespace": "default"})).json()
        assert "forged" not in [item["name"] for item in listed["items"]]

        # the dashboard's own page: its origin and its value
        for referer_only in (False, True):
            source = {"referer": f"{own}/"} if referer_only else {"origin": own}
            mine = {**cookie, **source, CSRF_HEADER: csrf}
            answer = await anonymous.post("/v1/nodes/node-00/cordon", headers=mine)
            assert answer.status_code == 200 and answer.json()["cordoned"], answer.text
            answer = await anonymous.post("/v1/nodes/node-00/uncordon", headers=mine)
            assert answer.status_code == 200 and not answer.json()["cordoned"], answer.text

        # another session's value is not this one's
        async with browser(service) as (_, _other_session, other_csrf):
            assert other_csrf != csrf
            theirs = {**cookie, "origin": own, CSRF_HEADER: other_csrf}
            problem(await anonymous.post("/v1/nodes/node-00/cordon", headers=theirs), 403)


async def test_bearer_clients_are_untouched_by_the_csrf_rule(
    service: ApiUnderTest, api: httpx.AsyncClient
) -> None:
    _, foreign = origins(service)
    answer = await api.post("/v1/nodes/node-01/cordon", headers={"origin": foreign})
    assert answer.status_code == 200 and answer.json()["cordoned"], answer.text
    answer = await api.post("/v1/nodes/node-01/uncordon")  # no Origin, no CSRF value
    assert answer.status_code == 200 and not answer.json()["cordoned"], answer.text


# -- 2. strings UTF-8 cannot encode -----------------------------------------------------------
LONE = "\\ud800"  # as JSON writes it: json.loads makes it a lone surrogate


def create(**fields: str) -> str:
    """A create's body as JSON text, ``fields`` spliced in as they are (JSON fragments)."""
    body = {"name": '"s"', "type": '"micro"', "command": '["true"]', **fields}
    return "{" + ", ".join(f'"{key}": {value}' for key, value in body.items()) + "}"


SURROGATE_BODIES = [
    ("/v1/workloads", create(command=f'["sleep", "{LONE}"]'), "command.1"),
    ("/v1/workloads", create(command=f'["{LONE}x"]'), "command.0"),
    ("/v1/workloads", create(env=f'{{"KEY": "a{LONE}"}}'), "env.KEY"),
    ("/v1/workloads", create(env=f'{{"{LONE}": "v"}}'), "env"),
    ("/v1/workloads", create(name=f'"s{LONE}"'), "name"),
    ("/v1/workloads", create(namespace=f'"{LONE}"'), "namespace"),
    ("/v1/workloads", create(image=f'"{LONE}"'), "image"),
    ("/v1/explain", f'{{"name": "s", "image": "{LONE}"}}', "image"),
    (
        "/v1/placements",
        f'{{"name": "s", "layers": [{{"id": "{LONE}", "size": 1}}]}}',
        "layers.0.id",
    ),
    ("/v1/images", f'{{"name": "{LONE}", "layers": [{{"id": "sha256:a", "size": 1}}]}}', "name"),
    (
        "/v1/images",
        f'{{"name": "i", "layers": [{{"id": "a", "size": "1{LONE}"}}]}}',
        "layers.0.size",
    ),
    ("/v1/images/oci", f'{{"path": "/tmp/{LONE}"}}', "path"),
]


async def reserved(api: httpx.AsyncClient) -> dict[str, int]:
    return {
        node["name"]: node["mem_reserved"] for node in (await api.get("/v1/nodes")).json()["items"]
    }


async def test_a_lone_surrogate_anywhere_is_refused_naming_its_field(
    api: httpx.AsyncClient,
) -> None:
    before = await reserved(api)
    for path, body, field in SURROGATE_BODIES:
        refused = problem(await api.post(path, content=body, headers=JSON), 400)
        assert refused["field"] == field, (body, refused)
        assert "surrogate" in refused["detail"], refused
        json.dumps(refused, ensure_ascii=False).encode()  # the answer itself is UTF-8 text
    # nothing placed, nothing recorded: the same identity creates at once
    assert await reserved(api) == before
    workloads = (await api.get("/v1/workloads")).json()["items"]
    assert "s" not in [item["name"] for item in workloads]
    created = await api.post(
        "/v1/workloads", json={"name": "s", "type": "micro", "command": ["sleep", "é😀"]}
    )
    assert created.status_code == 201, created.text
    assert created.json()["command"] == ["sleep", "é😀"]  # text beyond ASCII is fine
    stopped = await api.post(f"/v1/workloads/{created.json()['id']}/stop")
    assert stopped.status_code == 200, stopped.text


# -- 3. OCI paths the system refuses ---------------------------------------------------------
def deep_layout(tmp_path: Path, length: int) -> Path:
    """A valid OCI layout whose own path is ``length`` bytes long: its ``index.json`` within
    the system's 4,096-byte path limit, its blobs past it."""
    layout = write_layout(
        tmp_path / "short", ImageSpec(layers=[[file("hello", "hi")]], cmd=("true",))
    )
    parent = tmp_path / "deep"
    while len(str(parent)) + 201 < length:
        parent = parent / ("d" * 200)
    parent = parent / ("e" * (length - len(str(parent)) - 1))
    os.makedirs(parent.parent, exist_ok=True)
    shutil.move(str(layout), str(parent))  # a rename: no path past the limit is written
    assert len(str(parent)) == length
    return parent


async def test_oci_paths_the_system_refuses_are_400_naming_path(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    paths = {
        "a component over 255 bytes": str(tmp_path / ("a" * 300)),
        "a path over 4 KiB": str(tmp_path) + "/a" * 2100,
        "blobs past the path limit": str(deep_layout(tmp_path, 4060)),
    }
    for what, path in paths.items():
        refused = problem(await api.post("/v1/images/oci", json={"path": path}), 400)
        assert refused["field"] == "path", (what, refused)
        assert "File name too long" in refused["detail"], (what, refused)
    assert (await api.get("/v1/images")).status_code == 200


# -- 4. bodies over the limit ----------------------------------------------------------------
BIG = b'{"name": "big", "layers": [{"id": "sha256:big", "size": 1}]'


async def chunks(total: int, head: bytes = BIG) -> AsyncIterator[bytes]:
    """A JSON body of ``total`` bytes (padded with spaces), streamed in 64 KiB chunks: httpx
    sends it chunked, with no Content-Length."""
    yield head
    left = total - len(head) - 1
    while left > 0:
        step = min(left, 65536)
        yield b" " * step
        left -= step
    yield b"}"


async def test_a_chunked_body_over_the_limit_is_413(api: httpx.AsyncClient) -> None:
    for path in ("/v1/images", "/v1/workloads", "/v1/nodes/node-00/drain"):
        answer = await api.post(path, content=chunks(MAX_BODY_BYTES + 1), headers=JSON)
        body = problem(answer, 413)
        assert str(MAX_BODY_BYTES) in body["detail"]
    declared = BIG + b" " * MAX_BODY_BYTES + b"}"
    problem(await api.post("/v1/images", content=declared, headers=JSON), 413)
    assert not await cordoned(api, "node-00")  # the drain refused read nothing, did nothing
    # the limit itself is a body like any other
    exactly = await api.post("/v1/images", content=chunks(MAX_BODY_BYTES), headers=JSON)
    assert exactly.status_code == 201, exactly.text


# -- 5. the document lists what each operation answers ---------------------------------------
def documented() -> dict[tuple[str, str], set[str]]:
    document = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    return {
        (method.upper(), path): set(operation["responses"])
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    }


EXAMPLES: dict[tuple[str, str], tuple[str, Any]] = {
    ("GET", "/healthz"): ("/healthz", None),
    ("POST", "/v1/workloads"): (
        "/v1/workloads",
        {"name": "doc", "type": "micro", "command": ["sleep", "60"]},
    ),
    ("GET", "/v1/workloads"): ("/v1/workloads", None),
    ("GET", "/v1/workloads/{workload_id}"): ("/v1/workloads/w-000000000000", None),
    ("GET", "/v1/workloads/{workload_id}/logs"): ("/v1/workloads/w-000000000000/logs", None),
    ("POST", "/v1/workloads/{workload_id}/stop"): ("/v1/workloads/w-000000000000/stop", {}),
    ("POST", "/v1/placements"): ("/v1/placements", {"name": "doc-lease", "spec": "micro"}),
    ("POST", "/v1/explain"): ("/v1/explain", {"name": "doc", "image": "hello", "type": "micro"}),
    ("GET", "/v1/placements/recent"): ("/v1/placements/recent", None),
    ("GET", "/v1/nodes"): ("/v1/nodes", None),
    ("GET", "/v1/nodes/{name}"): ("/v1/nodes/node-00", None),
    ("POST", "/v1/nodes/{name}/cordon"): ("/v1/nodes/node-00/cordon", None),
    ("POST", "/v1/nodes/{name}/uncordon"): ("/v1/nodes/node-00/uncordon", None),
    ("POST", "/v1/nodes/{name}/drain"): ("/v1/nodes/node-00/drain", {"grace_s": 1}),
    ("GET", "/v1/images"): ("/v1/images", None),
    ("POST", "/v1/images"): (
        "/v1/images",
        {"name": "hello", "layers": [{"id": "sha256:doc", "size": 1}]},
    ),
    ("POST", "/v1/images/oci"): ("/v1/images/oci", {"path": "/nonexistent/layout"}),
    ("GET", "/v1/images/{name}"): ("/v1/images/hello", None),
}
"""A call of every documented operation (the test checks that none is missing)."""


def test_every_documented_operation_has_an_example() -> None:
    assert set(documented()) == set(EXAMPLES)


async def answers(http: httpx.AsyncClient, headers: dict[str, str] | None = None) -> list[str]:
    """Every operation called once; the ones whose answer its entry does not list."""
    listed = documented()
    wrong = []
    for (method, route), (url, body) in EXAMPLES.items():
        answer = await http.request(
            method, url, json=body if body is not None else None, headers=headers
        )
        if str(answer.status_code) not in listed[method, route]:
            wrong.append(f"{method} {route}: {answer.status_code} {answer.text[:200]}")
    return wrong


@contextlib.asynccontextmanager
async def api_over_nats_registries(url: str) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """The application over an embedded cluster and the NATS registries on ``url`` (a real
    nats-server), its client and the registries' connection (to lose)."""
    bucket = unique_name("api")
    async with client(url) as nc, EmbeddedCluster(embedded_configs(2, runtime="fake")) as cluster:
        backend = ClusterBackend(
            cluster.scheduler,
            cluster.client,
            cluster.scheduler,
            await NatsWorkloads(nc, bucket=bucket).start(),
            await NatsImages(nc, bucket=bucket).start(),
        )
        transport = httpx.ASGITransport(app=create_app(backend, token=TOKEN))
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://berth.test", headers=headers, timeout=20
        ) as http:
            yield http, nc


async def test_every_answer_is_documented_also_with_the_registry_gone(
    nats_server: NatsServer,
) -> None:
    async with api_over_nats_registries(nats_server.url) as (http, nc):
        assert await answers(http) == []  # the registry answers
        await nc.close()  # the registry's connection is lost: every question to it fails
        gone = await http.get("/v1/nodes/node-00")
        assert problem(gone, 503)["detail"]
        assert await answers(http) == []


async def test_every_refusal_of_a_cookie_write_and_of_a_big_body_is_documented(
    service: ApiUnderTest, api: httpx.AsyncClient
) -> None:
    listed = documented()
    _, foreign = origins(service)
    async with browser(service) as (anonymous, session, _csrf):
        cookie = {"cookie": session, "origin": foreign}
        for (method, route), (url, body) in EXAMPLES.items():
            if method != "POST":
                continue
            answer = await anonymous.post(url, json=body, headers=cookie)
            assert answer.status_code == 403 and "403" in listed[method, route], route
    document = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    for (method, route), (url, _body) in EXAMPLES.items():
        takes_body = "requestBody" in document["paths"][route][method.lower()]
        if not takes_body:
            assert "413" not in listed[method, route], route
            continue
        answer = await api.request(method, url, content=chunks(MAX_BODY_BYTES + 10), headers=JSON)
        assert answer.status_code == 413 and "413" in listed[method, route], route
