"""berth's HTTP service: the API (FastAPI) that operators, the CLI and the dashboard use.

:func:`berth.api.app.create_app` builds the application over a backend
(:class:`~berth.api.backend.ClusterBackend`: a scheduler's NATS connection, its
replica and the registries); :mod:`~berth.api.server` serves it with uvicorn inside
the scheduler's event loop.  The routes, the error format and the authentication are in
``docs/api.md``; the OpenAPI document is committed as ``docs/openapi.json``.
"""
