"""Tracing for berth: the switch, OTLP export when configured, and trace context on NATS.

**Off by default, and then free.**  Until :func:`use` (or :func:`configure` with an endpoint)
gives berth a tracer provider, :func:`span` makes no span object at all — it hands out one
shared no-op span — so the scheduler's hot path pays a function call, not OpenTelemetry's
no-op machinery (about 3 µs a span, measured; ``benchmarks/observability_overhead.py``).
berth keeps its own reference to the provider instead of OpenTelemetry's process-global one,
which can be set only once per process: tests swap an in-memory provider in and out, and a
library embedding berth keeps its own tracing untouched.

**OTLP/HTTP when configured.**  :func:`configure` reads ``--otlp URL`` (a command's flag) or
the standard environment — ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (used as it is) or
``OTEL_EXPORTER_OTLP_ENDPOINT`` (the collector's base URL: ``/v1/traces`` is appended);
``--otlp`` is a base URL like the latter, unless it already ends in ``/v1/traces``.  A value
that is not an ``http(s)://host[:port][/path]`` URL is ``Invalid`` naming the flag or the
variable and quoting the value, before anything starts.  Spans leave in batches from a
background thread (``OTEL_BSP_*`` tune it) and are flushed when the process exits.

**One placement, one trace.**  A request crossing NATS carries the W3C trace context
(``traceparent``, ``tracestate``, ``baggage``) in its message headers: :func:`headers` adds
the current context to a request's headers, :func:`server_span` continues it on the receiving
side.  Propagation works whether or not this process records spans: a scheduler without an
exporter still forwards its caller's context to the nodes, so the caller's and the agents'
spans stay one trace.

Span names are fixed strings, ``berth.<part>.<operation>`` (``berth.scheduler.place``,
``berth.nodeclient.admit``, ``berth.node.boot`` …), never built from request data.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import context, propagate, trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Tracer, TracerProvider

from berth.errors import Invalid
from berth.validation import shown

__all__ = [
    "ENDPOINT_ENV",
    "TRACES_ENDPOINT_ENV",
    "SpanKind",
    "TracingMiddleware",
    "annotate",
    "configure",
    "enabled",
    "headers",
    "otlp_traces_url",
    "server_span",
    "span",
    "use",
]

TRACER_NAME = "berth"
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
PROTOCOL_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
TRACES_PATH = "/v1/traces"
MAX_URL_LENGTH = 2048

_tracer: Tracer | None = None


def use(provider: TracerProvider | None) -> None:
    """Record berth's spans with ``provider`` from now on; ``None`` turns tracing off."""
    global _tracer
    _tracer = None if provider is None else provider.get_tracer(TRACER_NAME)


def enabled() -> bool:
    """Whether berth records spans in this process."""
    return _tracer is not None


@contextlib.contextmanager
def span(
    name: str, kind: SpanKind = SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None
) -> Iterator[Span]:
    """A span named ``name`` around the block, current inside it; a shared no-op span when
    tracing is off.  An exception leaving the block is recorded on the span and marks it an
    error.  Check ``span.is_recording()`` before computing costly attributes."""
    tracer = _tracer
    if tracer is None:
        yield INVALID_SPAN
        return
    with tracer.start_as_current_span(name, kind=kind, attributes=attributes) as current:
        yield current


def annotate(attributes: Mapping[str, Any]) -> None:
    """Set ``attributes`` on the current span (nothing when it does not record)."""
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(attributes)


def headers(base: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """``base`` plus the current trace context, for a NATS request; ``None`` when empty (a
    message without headers is cheaper, and what every berth peer accepted before)."""
    carrier: dict[str, str] = dict(base) if base else {}
    propagate.inject(carrier)
    return carrier or None


@contextlib.contextmanager
def server_span(
    name: str,
    received: Mapping[str, str] | None,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Span]:
    """Continue the trace whose context arrived in ``received`` (a message's headers): the
    context is current inside the block, under a ``SERVER`` span when tracing is on.  Headers
    without trace context leave the current context as it is."""
    token = None
    if received and any(field in received for field in propagate.get_global_textmap().fields):
        token = context.attach(propagate.extract(received))
    try:
        with span(name, SpanKind.SERVER, attributes) as current:
            yield current
    finally:
        if token is not None:
            context.detach(token)


class TracingMiddleware:
    """An ASGI middleware: every HTTP request is a ``berth.api.request`` SERVER span that
    continues the caller's trace (a ``traceparent`` header), so an API call, the placement it
    asks of the schedulers and the nodes' admission are one trace.  With tracing off it only
    passes the caller's context through (nothing is recorded)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        received = {
            key.decode("latin-1").lower(): value.decode("latin-1")
            for key, value in scope.get("headers") or ()
        }
        attributes = {"http.request.method": scope.get("method", ""), "url.path": scope["path"]}
        with server_span("berth.api.request", received, attributes) as current:
            status: list[int] = []

            async def sending(message: Any) -> None:
                if message.get("type") == "http.response.start":
                    status.append(int(message.get("status", 0)))
                await send(message)

            try:
                await self.app(scope, receive, sending)
            finally:
                if current.is_recording():
                    route = getattr(scope.get("route"), "path", None)
                    if route:
                        current.set_attribute("http.route", route)
                    if status:
                        current.set_attribute("http.response.status_code", status[0])


# -- OTLP configuration ----------------------------------------------------------------------
def otlp_traces_url(
    flag_value: str | None,
    *,
    flag: str = "--otlp",
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The URL to send spans to, from ``flag_value`` or the environment; ``None`` when none
    is set.  ``Invalid`` (naming ``flag`` or the variable, quoting the value) for a malformed
    URL or a protocol other than ``http/protobuf``."""
    environ = os.environ if environ is None else environ
    for variable in PROTOCOL_ENVS:
        protocol = environ.get(variable)
        if protocol and protocol.strip() != "http/protobuf":
            raise Invalid(
                f"berth exports OTLP over HTTP only (http/protobuf), got {shown(protocol)}",
                field=variable,
            )
    if flag_value is not None:
        return _traces_url(_checked_url(flag_value, flag))
    traces = environ.get(TRACES_ENDPOINT_ENV, "").strip()
    if traces:
        return _checked_url(traces, TRACES_ENDPOINT_ENV)
    base = environ.get(ENDPOINT_ENV, "").strip()
    if base:
        return _traces_url(_checked_url(base, ENDPOINT_ENV))
    return None


def configure(
    flag_value: str | None,
    *,
    service_name: str,
    flag: str = "--otlp",
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """Turn OTLP/HTTP export on for this process when ``flag_value`` or the environment
    names a collector (see the module docstring); returns the URL spans go to, or ``None``
    (tracing stays off).  ``OTEL_SDK_DISABLED=true`` keeps it off.  Call it once, early."""
    url = otlp_traces_url(flag_value, flag=flag, environ=environ)
    environ = os.environ if environ is None else environ
    if url is None or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = SdkTracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    use(provider)  # the provider flushes and shuts down at exit (shutdown_on_exit)
    return url


def _checked_url(value: str, field: str) -> str:
    """``value`` if it is an ``http(s)://host[:port][/path]`` URL, else ``Invalid``."""
    example = "an http(s) URL such as http://127.0.0.1:4318"
    if (
        not isinstance(value, str)
        or len(value) > MAX_URL_LENGTH
        or not value.isprintable()
        or any(ch.isspace() for ch in value)
    ):
        raise Invalid(f"expected {example}, got {shown(value)}", field=field)
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError for a port that is not 0-65535
    except ValueError:
        raise Invalid(f"expected {example}, got {shown(value)}", field=field) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Invalid(f"expected {example}, got {shown(value)}", field=field)
    if port == 0:
        raise Invalid(f"port 0 is not a collector's port, got {shown(value)}", field=field)
    if parts.query or parts.fragment or parts.username is not None:
        raise Invalid(
            f"expected a collector URL without credentials, query or fragment, got {shown(value)}",
            field=field,
        )
    host = parts.hostname
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return value
    if not all(label and len(label) <= 63 for label in host.split(".")) or not all(
        ch.isalnum() or ch in "-._" for ch in host
    ):
        raise Invalid(f"expected {example}, got {shown(value)}", field=field)
    return value


def _traces_url(base: str) -> str:
    if base.rstrip("/").endswith(TRACES_PATH):
        return base
    return base.rstrip("/") + TRACES_PATH
