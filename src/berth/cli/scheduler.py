"""``berth scheduler``: a scheduler on NATS, and beside it the HTTP API (``--http``).

The scheduler serves the placement port in the ``berth-schedulers`` queue group; with
``--http ADDR`` it also serves the HTTP API (:mod:`berth.api`; HTTPS with ``--https-cert`` and
``--https-key``).  On SIGINT or SIGTERM it leaves the queue group and finishes what it started.
Its own flags (``--http``, ``--token``, ``--token-file`` …) are checked here; those it shares
with the other NATS commands are :mod:`berth.cli.common`'s.  The process itself is composed by
:mod:`berth.processes.scheduler`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from berth.cli.common import (
    DEFAULT_URL,
    NODE_GONE_AFTER_HELP,
    CredsOption,
    DurationOption,
    HttpPublicOption,
    NatsOption,
    OtlpOption,
    PolicyOption,
    TlsCaOption,
    TlsCertOption,
    TlsKeyOption,
    checked_duration,
    checked_policy,
    client_tls,
    configure_logging,
    console,
    load_credentials,
)
from berth.defaults import (
    HEARTBEAT_S,
    LEASE_TTL_S,
    NODE_GONE_AFTER_S,
    RECONCILE_EVERY_S,
    SHUTDOWN_GRACE_S,
)
from berth.errors import Invalid

__all__ = ["scheduler"]

HttpOption = Annotated[
    str | None,
    typer.Option(
        "--http",
        help="Serve the HTTP API on HOST:PORT (loopback unless --http-public), e.g. "
        "127.0.0.1:8080.",
    ),
]
ServeTokenOption = Annotated[
    str | None,
    typer.Option("--token", help="The API's bearer token (default: generated, in api.json)."),
]
TokenFileOption = Annotated[
    Path | None,
    typer.Option("--token-file", help="Read the API's bearer token from this file."),
]


def scheduler(
    nats: NatsOption = DEFAULT_URL,
    creds: CredsOption = None,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    heartbeat: Annotated[
        float, typer.Option(help="The nodes' heartbeat in seconds (states live 3 of them).")
    ] = HEARTBEAT_S,
    lease_ttl: Annotated[
        float, typer.Option(help="Seconds a placement's reservation waits to be bound.")
    ] = LEASE_TTL_S,
    grace: Annotated[
        float, typer.Option(help="Seconds in-flight requests get to finish on shutdown.")
    ] = SHUTDOWN_GRACE_S,
    duration: DurationOption = None,
    otlp: OtlpOption = None,
    http: HttpOption = None,
    http_public: HttpPublicOption = False,
    token: ServeTokenOption = None,
    token_file: TokenFileOption = None,
    https_cert: Annotated[
        Path | None,
        typer.Option(
            "--https-cert", help="Serve the API over HTTPS with this certificate (with --http)."
        ),
    ] = None,
    https_key: Annotated[
        Path | None, typer.Option("--https-key", help="The HTTPS certificate's private key.")
    ] = None,
    policy: PolicyOption = "seed",
    node_gone_after: Annotated[
        float,
        typer.Option(help=NODE_GONE_AFTER_HELP + " (with --http)."),
    ] = NODE_GONE_AFTER_S,
    reconcile_every: Annotated[
        float,
        typer.Option(
            help="Seconds between the reconciler's passes (with --http; one scheduler of "
            "the cluster reconciles at a time): ghosts are stopped within two of them."
        ),
    ] = RECONCILE_EVERY_S,
) -> None:
    """Serve the placement port on NATS, in the berth-schedulers queue group (and the HTTP
    API with --http)."""
    import asyncio

    from berth.api.server import HttpsFiles, parse_address, resolve_token
    from berth.model import INTERVAL_RULE
    from berth.observability import tracing
    from berth.processes.scheduler import ApiSettings, serve_scheduler
    from berth.scheduler.policy.registry import policy as policy_of

    intervals = (
        ("--heartbeat", heartbeat),
        ("--lease-ttl", lease_ttl),
        ("--grace", grace),
        ("--node-gone-after", node_gone_after),
        ("--reconcile-every", reconcile_every),
    )
    for flag, value in intervals:
        INTERVAL_RULE(value, flag)
    duration = checked_duration(duration)
    checked_policy(policy)
    address = None if http is None else parse_address(http, public=http_public)
    api_flags = (token, token_file, https_cert, https_key)
    if http is None and (any(flag is not None for flag in api_flags) or http_public):
        raise Invalid(
            "--token, --token-file, --https-cert, --https-key and --http-public go with --http",
            field="--http",
        )
    api_token, generated = resolve_token(token, token_file)
    https = HttpsFiles.from_flags(https_cert, https_key)
    credentials = load_credentials(creds)
    tls = client_tls(tls_ca, tls_cert, tls_key)
    tracing.configure(otlp, service_name="berth-scheduler")
    configure_logging()

    api = None
    if address is not None:
        api = ApiSettings(
            address=address,
            token=api_token,
            generated=generated,
            https=https,
            node_gone_after_s=node_gone_after,
            reconcile_every_s=reconcile_every,
        )
    asyncio.run(
        serve_scheduler(
            nats,
            credentials=credentials,
            tls=tls,
            heartbeat_s=heartbeat,
            lease_ttl_s=lease_ttl,
            grace_s=grace,
            policy=policy_of(policy, seed=None),  # unseeded: schedulers' jitters differ
            api=api,
            duration_s=duration,
            say=lambda line: console.print(line, highlight=False),
        )
    )
