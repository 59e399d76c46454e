"""Traces: one placement is one trace, across the NATS hops, with the right parents.

A scheduler service and agents on a real ``nats-server`` (one process, every party on its own
connection: the context crosses only in message headers, since each NATS callback runs in a
task started before the test's span existed), recorded by an in-memory exporter; the same
with tracing off in this process (the context still passes through); the OTLP configuration
rules; and a cross-process check — a ``berth up``-style cluster whose agent and scheduler
processes export OTLP/HTTP to a receiver this test runs on loopback, decoding the protobuf.
"""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry import context, propagate
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from berth.boot import RunOrder
from berth.embedded import embedded_configs
from berth.errors import Invalid, NoCapacity
from berth.model import Request, Spec
from berth.nats.connection import connect
from berth.node.runtime.port import BootSpec
from berth.observability import tracing
from berth.processes.up import LocalCluster
from berth.scheduler.nats import NatsScheduler
from berth.testing.cluster import Names, nats_cluster
from berth.testing.nats import NatsServer, unique_name
from berth.units import MiB

SMALL = Spec(vcpus=0.01, mem=16 * MiB, disk=16 * MiB)


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """berth's spans in this process, recorded in memory; tracing off again afterwards."""
    recorded = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(recorded))
    tracing.use(provider)
    try:
        yield recorded
    finally:
        tracing.use(None)
        provider.shutdown()


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def _one(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    found = _by_name(spans, name)
    assert len(found) == 1, (name, [span.name for span in spans])
    return found[0]


def _parent_of(child: ReadableSpan, parent: ReadableSpan) -> bool:
    assert child.parent is not None, f"{child.name} has no parent"
    context = parent.get_span_context()  # the typed accessor of ``context``
    assert context is not None
    return child.parent.span_id == context.span_id


def test_one_placement_is_one_trace_across_the_nats_hops(
    nats_server: NatsServer, exporter: InMemorySpanExporter
) -> None:
    configs = embedded_configs(2, runtime="fake", heartbeat_s=1.0)
    names = Names.namespaced(unique_name("trace"))

    async def scenario() -> tuple[str, str]:
        async with nats_cluster(nats_server.url, configs, names=names) as running:
            exporter.clear()  # only the placement's spans from here on
            with tracing.span("caller"):  # the caller's own span, the trace's root
                request = Request(namespace="t", name="traced", spec=SMALL)
                placement = await running.scheduler.schedule(request)
                booted = await running.nodes.try_run(
                    placement.worker_node,
                    RunOrder(SMALL, (), BootSpec(name="traced", command=("sleep", "1"))),
                )
            return placement.worker_node, booted

    node, workload = asyncio.run(scenario())
    spans = exporter.get_finished_spans()
    caller = _one(spans, "caller")
    assert caller.context is not None
    trace_id = caller.context.trace_id
    assert {span.context.trace_id for span in spans if span.context} == {trace_id}

    client = _one(spans, "berth.client.schedule")
    served = _one(spans, "berth.scheduler.schedule")
    place = _one(spans, "berth.scheduler.place")
    rank = _one(spans, "berth.scheduler.rank")
    confirm = _one(spans, "berth.scheduler.confirm")
    admit_client = _one(spans, "berth.nodeclient.admit")
    admit_node = _one(spans, "berth.node.admit")
    assert (client.kind, served.kind) == (SpanKind.CLIENT, SpanKind.SERVER)
    assert (admit_client.kind, admit_node.kind) == (SpanKind.CLIENT, SpanKind.SERVER)
    # the chain: caller → client → (NATS) → scheduler → place → rank / confirm → admit
    # → (NATS) → the node's admit
    assert _parent_of(client, caller)
    assert _parent_of(served, client)  # across the first NATS hop: from the headers
    assert _parent_of(place, served)
    assert _parent_of(rank, place) and _parent_of(confirm, place)
    assert _parent_of(admit_client, confirm)
    assert _parent_of(admit_node, admit_client)  # across the second NATS hop
    assert served.attributes is not None and served.attributes["berth.workload"] == "t/traced/0"
    assert place.attributes is not None
    assert place.attributes["berth.outcome"] == "placed"
    assert place.attributes["berth.node"] == node and place.attributes["berth.attempts"] == 1
    assert admit_node.attributes is not None and admit_node.attributes["berth.node"] == node

    # the boot: the caller's run request → the node's run → the node's boot
    run_client = _one(spans, "berth.nodeclient.run")
    run_node = _one(spans, "berth.node.run")
    boot = _one(spans, "berth.node.boot")
    assert _parent_of(run_client, caller)
    assert _parent_of(run_node, run_client) and _parent_of(boot, run_node)
    assert boot.attributes is not None and boot.attributes["berth.workload"] == workload


def test_a_refused_placement_records_its_refusals_and_outcome(
    nats_server: NatsServer, exporter: InMemorySpanExporter
) -> None:
    configs = embedded_configs(2, runtime="fake", heartbeat_s=1.0)
    names = Names.namespaced(unique_name("trace"))

    async def scenario() -> None:
        async with nats_cluster(nats_server.url, configs, names=names) as running:
            # every node's snapshot says it fits; the nodes themselves are gone
            for service in running.node_services.values():
                await service.server.stop()
            exporter.clear()
            with pytest.raises(NoCapacity):
                await running.scheduler.schedule(Request(namespace="t", name="no", spec=SMALL))

    asyncio.run(scenario())
    spans = exporter.get_finished_spans()
    place = _one(spans, "berth.scheduler.place")
    assert place.attributes is not None
    assert place.attributes["berth.outcome"] == "no_capacity"
    assert place.attributes["berth.attempts"] == 2
    refusals = [event for event in place.events if event.name == "refused"]
    assert len(refusals) == 2
    assert {event.attributes["berth.reason"] for event in refusals if event.attributes} == {
        "unavailable"
    }
    assert len(_by_name(spans, "berth.scheduler.confirm")) == 2
    assert not place.status.is_ok  # the NoCapacity left the span: recorded as its error


def test_with_tracing_off_the_context_still_passes_through(nats_server: NatsServer) -> None:
    """No provider in this process: no spans are made, but a caller's context reaches the
    node through the scheduler service (so a traced caller and traced agents stay one trace
    across an untraced scheduler)."""
    assert not tracing.enabled()
    configs = embedded_configs(1, runtime="fake", heartbeat_s=1.0)
    names = Names.namespaced(unique_name("pass"))
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    incoming = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}

    async def scenario() -> dict[str, str]:
        async with nats_cluster(nats_server.url, configs, names=names) as running:
            seen: list[dict[str, str]] = []

            async def spy(msg: Any) -> None:  # a second subscriber sees what the node sees
                seen.append(dict(msg.headers or {}))

            node = next(iter(running.node_services))
            subscription = await running.client.subscribe(
                f"{names.node_prefix}.{node}.admit", cb=spy
            )
            await running.client.flush()
            token = context.attach(propagate.extract(incoming))
            try:
                await running.scheduler.schedule(Request(namespace="t", name="p", spec=SMALL))
            finally:
                context.detach(token)
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
            await subscription.unsubscribe()
            return seen[0]

    headers = asyncio.run(scenario())
    assert headers["traceparent"].split("-")[1] == trace_id


def test_headers_and_server_span_without_a_context() -> None:
    assert tracing.headers() is None  # nothing to carry: the message has no headers
    assert tracing.headers({"Berth-Idempotency-Key": "k"}) == {"Berth-Idempotency-Key": "k"}
    before = context.get_current()
    with tracing.server_span("berth.node.admit", {"Berth-Idempotency-Key": "k"}) as span:
        assert not span.is_recording()
        assert context.get_current() == before  # no trace fields: the context is untouched
    with tracing.server_span("berth.node.admit", None):
        pass


# -- configuration ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flag", "environ", "expected"),
    [
        (None, {}, None),
        ("http://127.0.0.1:4318", {}, "http://127.0.0.1:4318/v1/traces"),
        ("http://collector:4318/", {}, "http://collector:4318/v1/traces"),
        ("https://otel.example.com/v1/traces", {}, "https://otel.example.com/v1/traces"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1]:4318"}, "http://[::1]:4318/v1/traces"),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:1/x"}, "http://h:1/x"),
        (
            "http://flag:4318",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318"},
            "http://flag:4318/v1/traces",
        ),
        (None, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, None),
    ],
)
def test_the_otlp_url_comes_from_the_flag_or_the_environment(
    flag: str | None, environ: dict[str, str], expected: str | None
) -> None:
    assert tracing.otlp_traces_url(flag, environ=environ) == expected


@pytest.mark.parametrize(
    ("flag", "environ", "field", "quoted"),
    [
        ("http//bad", {}, "--otlp", "'http//bad'"),
        ("ftp://host:21", {}, "--otlp", "'ftp://host:21'"),
        ("http://host:99999", {}, "--otlp", "'http://host:99999'"),
        ("http://host:0", {}, "--otlp", "'http://host:0'"),
        ("http://", {}, "--otlp", "'http://'"),
        ("http://a b:4318", {}, "--otlp", "'http://a b:4318'"),
        ("http://user:pw@host:4318", {}, "--otlp", "credentials"),
        ("localhost:4318", {}, "--otlp", "'localhost:4318'"),
        ("", {}, "--otlp", "''"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector"}, "OTEL_EXPORTER_OTLP_ENDPOINT", ""),
        (
            None,
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x\n:1"},
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "",
        ),
        (None, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL", "'grpc'"),
    ],
)
def test_a_malformed_otlp_setting_is_invalid_naming_where_it_came_from(
    flag: str | None, environ: dict[str, str], field: str, quoted: str
) -> None:
    with pytest.raises(Invalid) as caught:
        tracing.otlp_traces_url(flag, environ=environ)
    assert caught.value.field == field
    assert quoted in caught.value.message
    assert "\n" not in str(caught.value)


def test_configure_turns_tracing_on_only_with_an_endpoint() -> None:
    try:
        assert tracing.configure(None, service_name="t", environ={}) is None
        assert not tracing.enabled()
        disabled = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
            "OTEL_SDK_DISABLED": "true",
        }
        assert tracing.configure(None, service_name="t", environ=disabled) is None
        assert not tracing.enabled()
        url = tracing.configure("http://127.0.0.1:9", service_name="t", environ={})
        assert url == "http://127.0.0.1:9/v1/traces" and tracing.enabled()
    finally:
        tracing.use(None)


# -- across processes ------------------------------------------------------------------------
class Receiver:
    """An OTLP/HTTP trace receiver on loopback: decodes every export, keeps its spans."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    with self.lock:
                        self.spans.append(
                            {
                                "service": service,
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                            }
                        )

    def find(self, service: str, name: str, trace_id: str) -> dict[str, Any] | None:
        with self.lock:
            for span in self.spans:
                if (span["service"], span["name"], span["trace_id"]) == (service, name, trace_id):
                    return span
        return None

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow  # starts a whole berth up
def test_one_placement_is_one_trace_across_processes(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test (caller) → a scheduler process → an agent process: the two processes export
    OTLP/HTTP (configured by the environment they inherit) to a receiver on loopback, and
    their spans join the caller's trace with the right parents."""
    with Receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # ms: export promptly
        cluster = LocalCluster(1, schedulers=1, heartbeat_s=0.5, auth=False, runtime="fake")
        with cluster:

            async def place() -> None:
                client = await connect(cluster.url, name="test")
                try:
                    request = Request(namespace="t", name="xp", spec=SMALL)
                    await NatsScheduler(client).schedule(request)
                finally:
                    await client.close()

            asyncio.run(place())
            client = _one(exporter.get_finished_spans(), "berth.client.schedule")
            assert client.context is not None
            trace_id = f"{client.context.trace_id:032x}"
            deadline = time.monotonic() + 20
            wanted = {
                ("berth-scheduler", "berth.scheduler.schedule"),
                ("berth-scheduler", "berth.nodeclient.admit"),
                ("berth-agent", "berth.node.admit"),
            }
            found: dict[tuple[str, str], dict[str, Any]] = {}
            while time.monotonic() < deadline and len(found) < len(wanted):
                for service, name in wanted:
                    span = receiver.find(service, name, trace_id)
                    if span is not None:
                        found[service, name] = span
                time.sleep(0.1)
            assert set(found) == wanted, (set(found), receiver.spans)
    served = found["berth-scheduler", "berth.scheduler.schedule"]
    assert served["parent"] == f"{client.context.span_id:016x}"  # caller → scheduler process
    admitted = found["berth-agent", "berth.node.admit"]
    asked = found["berth-scheduler", "berth.nodeclient.admit"]
    assert admitted["parent"] == asked["span_id"]  # scheduler process → agent process


def test_an_api_request_continues_the_callers_trace(exporter: InMemorySpanExporter) -> None:
    """``TracingMiddleware`` (on the API): the HTTP caller's ``traceparent`` is the parent of
    the request's span, and what the route does (a placement) is its child."""
    app = FastAPI()
    app.add_middleware(tracing.TracingMiddleware)

    @app.get("/v1/things/{name}")
    async def thing(name: str) -> dict[str, str]:
        with tracing.span("berth.scheduler.place"):
            return {"name": name}

    trace_id, caller_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://berth") as client:
            headers = {"traceparent": f"00-{trace_id}-{caller_span}-01"}
            return await client.get("/v1/things/a", headers=headers)

    assert asyncio.run(call()).status_code == 200
    spans = exporter.get_finished_spans()
    request = _one(spans, "berth.api.request")
    inner = _one(spans, "berth.scheduler.place")
    assert request.kind == SpanKind.SERVER and request.context is not None
    assert f"{request.context.trace_id:032x}" == trace_id
    assert request.parent is not None and f"{request.parent.span_id:016x}" == caller_span
    assert _parent_of(inner, request)
    assert request.attributes is not None
    assert request.attributes["http.route"] == "/v1/things/{name}"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["http.request.method"] == "GET"


@pytest.mark.slow  # starts a whole berth up
def test_an_api_placement_on_berth_up_is_one_trace_and_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``berth up`` with its HTTP API, every process exporting OTLP/HTTP to a receiver on
    loopback: a ``POST /v1/workloads`` carrying the caller's ``traceparent`` becomes one trace
    — the API's request, the queue-group hop, the scheduler's decision, the agent's admission
    and boot — and ``GET /metrics`` counts it."""
    with Receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        cluster = LocalCluster(2, heartbeat_s=0.5, runtime="fake", http=("127.0.0.1", 0))
        with cluster:
            assert cluster.api_url is not None
            headers = {"Authorization": f"Bearer {cluster.api_token}"}
            with httpx.Client(base_url=cluster.api_url, headers=headers, timeout=20) as api:

                def sample(name: str, **labels: str) -> float:
                    text = api.get("/metrics").text
                    for family in text_string_to_metric_families(text):
                        for found in family.samples:
                            if found.name == name and found.labels == labels:
                                return float(found.value)
                    raise AssertionError(f"no {name}{labels} in /metrics")

                assert sample("berth_nodes", state="ready") == 2
                trace_id, caller = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
                created = api.post(
                    "/v1/workloads",
                    json={"name": "xp", "type": "micro", "command": ["sleep", "5"]},
                    headers={"traceparent": f"00-{trace_id}-{caller}-01"},
                )
                assert created.status_code == 201, created.text
                assert sample("berth_api_placements_total", outcome="placed") == 1
                assert sample("berth_placements_total", outcome="placed") == 1
                assert sample("berth_confirmation_attempts_count") == 1

            wanted = {
                ("berth-scheduler", "berth.api.request"),
                ("berth-scheduler", "berth.client.schedule"),
                ("berth-scheduler", "berth.scheduler.schedule"),
                ("berth-scheduler", "berth.nodeclient.admit"),
                ("berth-scheduler", "berth.nodeclient.run"),
                ("berth-agent", "berth.node.admit"),
                ("berth-agent", "berth.node.run"),
                ("berth-agent", "berth.node.boot"),
            }
            found: dict[tuple[str, str], dict[str, Any]] = {}
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and len(found) < len(wanted):
                for service, name in wanted - set(found):
                    span = receiver.find(service, name, trace_id)
                    if span is not None:
                        found[service, name] = span
                time.sleep(0.1)
            assert set(found) == wanted, (wanted - set(found), receiver.spans)

    def parent(child: str, of: str) -> None:
        (child_span,) = [span for key, span in found.items() if key[1] == child]
        (parent_span,) = [span for key, span in found.items() if key[1] == of]
        assert child_span["parent"] == parent_span["span_id"], (child, of)

    assert found["berth-scheduler", "berth.api.request"]["parent"] == caller
    parent("berth.client.schedule", of="berth.api.request")
    parent("berth.scheduler.schedule", of="berth.client.schedule")
    parent("berth.node.admit", of="berth.nodeclient.admit")
    parent("berth.nodeclient.run", of="berth.api.request")
    parent("berth.node.run", of="berth.nodeclient.run")
    parent("berth.node.boot", of="berth.node.run")
