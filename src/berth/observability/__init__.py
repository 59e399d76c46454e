"""berth's observability: Prometheus metrics of the scheduler and OpenTelemetry traces across
the processes of one placement.

* :mod:`berth.observability.metrics` — every metric's name, help and buckets in one place, on
  a berth registry (never prometheus-client's global one), and the collector that reads the
  scheduler's view of the cluster at scrape time;
* :mod:`berth.observability.tracing` — the tracing switch (off by default: no span is made),
  OTLP/HTTP export when configured, and the trace context carried in NATS message headers;
* :mod:`berth.observability.probe` — what one placement reports (its spans and its metrics),
  the one object the scheduler's walk talks to.

The package sits low in berth's layout: it imports only berth's vocabulary (errors,
ownership, checks, state), so the scheduler, the node client, the node and the services can
all import it without a cycle.
"""
