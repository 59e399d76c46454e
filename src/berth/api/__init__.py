"""berth's HTTP service: the API (FastAPI) that operators, the CLI and the dashboard use.

:func:`berth.api.app.create_app` builds the application over a backend
(:class:`~berth.api.backend.ClusterBackend`, written against ports: a scheduler's view and
node client, the placement port with its release, the registries of
:mod:`berth.registry.port`); :mod:`~berth.api.server` serves it with uvicorn inside the
scheduler's event loop, over NATS, and :mod:`berth.api.testing` runs it in this process over
the embedded cluster.  The routes, the error format and the authentication are in
``docs/api.md``; the OpenAPI document is committed as ``docs/openapi.json``.
"""
