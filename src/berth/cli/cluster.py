"""berth across machines on the command line: agents and schedulers on NATS, ``berth up``.

:func:`register` adds to a typer app (berth's own in :mod:`berth.cli`):

* ``berth agent --config FILE --nats URL`` — the agent command gains ``--nats``: the agent
  publishes its state to the cluster's nodes bucket and answers its own subjects; several
  ``--config`` run several agents in one process.  Without ``--nats`` it is the embedded agent
  command it extends, unchanged;
* ``berth scheduler --nats URL`` — a scheduler in the ``berth-schedulers`` queue group;
* ``berth up --nodes N`` — a local cluster (nats-server, agents, schedulers), Ctrl-C stops it;
* ``berth place``, ``berth whereis``, ``berth routes`` — the caller's side: place a workload
  through the schedulers, find where one runs, list every route;
* ``berth scheduler --http ADDR`` and ``berth up`` also serve the HTTP API
  (:mod:`berth.api`); ``berth api openapi`` prints its OpenAPI document.

Every command that connects takes ``--nats URL`` (default ``$BERTH_NATS`` or
``nats://127.0.0.1:4222``) and ``--creds FILE`` (a JSON ``{"user", "password"}`` file, as
``berth up`` writes; default ``$BERTH_NATS_CREDS``), and, for a cluster whose servers require
TLS, ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` (all three: the CA the servers' certificates
are checked against, and this client's certificate and key — mutual TLS;
:meth:`berth.pki.TlsFiles.from_flags`).  ``berth scheduler --http`` serves HTTPS with
``--https-cert`` and ``--https-key``.  Services stop gracefully on SIGINT and
SIGTERM: a scheduler leaves the queue group and finishes what it started, an agent stops
answering and deletes its key.  Bad flags and unreachable servers are one line on stderr
(``berth.cli.main`` prints every ``BerthError``), exit status 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import Field, Strict
from rich.console import Console
from rich.table import Table

from berth.defaults import (
    HEARTBEAT_S,
    LEASE_TTL_S,
    LOCAL_HEARTBEAT_S,
    NODE_GONE_AFTER_S,
    ORPHAN_GRACE_S,
    RECONCILE_EVERY_S,
    SHUTDOWN_GRACE_S,
)
from berth.errors import Invalid
from berth.model import INTERVAL_RULE, MAX_REPLICA, NAME_RULE, Layer, Request
from berth.nats.connection import Credentials, connect, until_stopped
from berth.observability import tracing
from berth.pki import TLS_FLAGS
from berth.units import format_information
from berth.validation import Rule, fields_as, shown

__all__ = ["parse_layer_flag", "register"]

console = Console()

DEFAULT_URL = "nats://127.0.0.1:4222"
NatsOption = Annotated[
    str,
    typer.Option(
        "--nats",
        envvar="BERTH_NATS",
        help="The NATS server's URL; a cluster's servers comma-separated (fails over).",
    ),
]
CredsOption = Annotated[
    Path | None,
    typer.Option(
        "--creds", envvar="BERTH_NATS_CREDS", help="A credentials file (berth up writes them)."
    ),
]
TlsCaOption = Annotated[
    Path | None,
    typer.Option(
        "--tls-ca",
        envvar="BERTH_TLS_CA",
        help="TLS to NATS: the CA that signed the servers' certificates (with --tls-cert, "
        "--tls-key).",
    ),
]
TlsCertOption = Annotated[
    Path | None,
    typer.Option(
        "--tls-cert", envvar="BERTH_TLS_CERT", help="TLS to NATS: this client's certificate."
    ),
]
TlsKeyOption = Annotated[
    Path | None,
    typer.Option("--tls-key", envvar="BERTH_TLS_KEY", help="TLS to NATS: its private key."),
]
DurationOption = Annotated[
    float | None, typer.Option(help="Stop after this many seconds (default: until ^C).")
]
HttpOption = Annotated[
    str | None,
    typer.Option(
        "--http",
        help="Serve the HTTP API on HOST:PORT (loopback unless --http-public), e.g. "
        "127.0.0.1:8080.",
    ),
]
HttpPublicOption = Annotated[
    bool,
    typer.Option("--http-public", help="Allow --http on a non-loopback address."),
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", help="The API's bearer token (default: generated, in api.json)."),
]
TokenFileOption = Annotated[
    Path | None,
    typer.Option("--token-file", help="Read the API's bearer token from this file."),
]
OtlpOption = Annotated[
    str | None,
    typer.Option(
        "--otlp",
        help="Send traces to this OTLP/HTTP collector, e.g. http://127.0.0.1:4318 "
        "(default: $OTEL_EXPORTER_OTLP_ENDPOINT; neither: tracing off).",
    ),
]


def _credentials(path: Path | None) -> Credentials | None:
    return None if path is None else Credentials.load(path)


def _tls(ca: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The client TLS context of ``--tls-ca``/``--tls-cert``/``--tls-key`` (all or none,
    checked: :meth:`berth.pki.TlsFiles.from_flags`); ``None`` without them."""
    from berth.pki import TlsFiles

    files = TlsFiles.from_flags(ca, cert, key)
    return None if files is None else files.client_context()


def _logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


MAX_UP_NODES = 256
"""``berth up`` runs every agent on this machine: more would only exhaust it."""
MAX_UP_SCHEDULERS = 16

_REPLICA: Rule[int] = Rule(Annotated[int, Strict(), Field(ge=0, le=MAX_REPLICA)])
_UP_NODES: Rule[int] = Rule(Annotated[int, Strict(), Field(ge=1, le=MAX_UP_NODES)])
_UP_SCHEDULERS: Rule[int] = Rule(Annotated[int, Strict(), Field(ge=1, le=MAX_UP_SCHEDULERS)])
_PLACE_FLAGS = {
    "namespace": "--namespace",
    "name": "--name",
    "replica": "--replica",
    "spec": "--instance",
    "platforms": "--platform",
    "layers": "--layer",
}


def parse_layer_flag(text: str) -> Layer:
    """``--layer ID:SIZE`` (``sha256:abc…:12MiB`` — the size is after the last colon)."""
    layer_id, sep, size = text.rpartition(":")
    if not sep:
        raise Invalid(f"expected ID:SIZE, got {shown(text)}", field="--layer")
    with fields_as({"id": "--layer", "size": "--layer"}):
        return Layer(id=layer_id, size=size)


def _check_workload_key(workload: str) -> None:
    """``namespace/name/replica``, each part as a request's (names, a replica index)."""
    parts = workload.split("/")
    if len(parts) != 3 or not parts[2].isdigit():
        raise Invalid(f"expected namespace/name/replica, got {workload!r}", field="WORKLOAD")
    NAME_RULE(parts[0], "WORKLOAD")
    NAME_RULE(parts[1], "WORKLOAD")
    _REPLICA(int(parts[2]), "WORKLOAD")


PolicyOption = Annotated[
    str,
    typer.Option(
        help="The placement policy: seed (the seed's ordering, the default), berth (mounted and "
        "cached layer bytes, room priced by scarcity), kube, binpack, spread or random.",
    ),
]


def _checked_policy(name: str) -> str:
    """``name`` when it names a registered policy, else ``Invalid`` naming ``--policy``."""
    from berth.scheduler.policy.registry import policy_name

    return policy_name(name, field="--policy")


def _checked_duration(duration: float | None) -> float | None:
    """``--duration``: a finite period (1 ms to a year), or ``None`` for "until ^C"."""
    return None if duration is None else INTERVAL_RULE(duration, "--duration")


def _stop_event(duration: float | None) -> asyncio.Event:
    """Set on SIGINT/SIGTERM or after ``duration`` seconds (call inside the running loop)."""
    duration = _checked_duration(duration)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if duration is not None:
        loop.call_later(duration, stop.set)
    return stop


# -- berth agent --nats ----------------------------------------------------------------------
def _extend_agent(app: typer.Typer) -> None:
    """Replace ``app``'s ``agent`` command with one that also takes ``--nats``."""
    embedded: Callable[..., Any] | None = None
    for info in list(app.registered_commands):
        callback = info.callback
        name = info.name or (callback.__name__ if callback is not None else None)
        if name == "agent":
            embedded = callback
            app.registered_commands.remove(info)

    @app.command("agent")
    def agent(
        config: Annotated[
            list[Path],
            typer.Option(help="An agent's TOML configuration file (repeat for several agents)."),
        ],
        check: Annotated[
            bool, typer.Option("--check", help="Validate and print the effective configuration.")
        ] = False,
        duration: DurationOption = None,
        nats: Annotated[
            str | None,
            typer.Option(help="Join the cluster on this NATS server (default: embedded store)."),
        ] = None,
        creds: CredsOption = None,
        tls_ca: TlsCaOption = None,
        tls_cert: TlsCertOption = None,
        tls_key: TlsKeyOption = None,
        creds_dir: Annotated[
            Path | None,
            typer.Option(help="A folder of per-node credentials (node-<name>.creds.json)."),
        ] = None,
        idle_load: Annotated[
            bool,
            typer.Option(
                "--idle-load",
                help="Read idle load instead of this host's (agents sharing one machine).",
            ),
        ] = False,
        otlp: OtlpOption = None,
        state_dir: Annotated[
            Path | None,
            typer.Option(
                help="Keep what must survive a restart (a cordon, the workload journal) in "
                "DIR/<node> (with --nats)."
            ),
        ] = None,
        orphan_grace: Annotated[
            float | None,
            typer.Option(
                help="Seconds a process workload outlives this agent before it is killed "
                f"(default: the config's [agent] orphan_grace_s, {ORPHAN_GRACE_S:g})."
            ),
        ] = None,
    ) -> None:
        """Start node agents from config files: embedded, or on a NATS cluster with --nats."""
        if nats is None or check:
            if state_dir is not None and not check:
                raise Invalid("--state-dir goes with --nats", field="--state-dir")
            if orphan_grace is not None and not check:
                raise Invalid(
                    "--orphan-grace goes with --nats (or [agent] orphan_grace_s)",
                    field="--orphan-grace",
                )
            if len(config) != 1:
                raise Invalid("give exactly one --config without --nats", field="--config")
            for flag, given in zip(TLS_FLAGS, (tls_ca, tls_cert, tls_key), strict=True):
                if given is not None and not check:
                    raise Invalid(f"{flag} goes with --nats", field=flag)
            if embedded is None:  # pragma: no cover - berth's app always has one
                raise Invalid("the embedded agent command is not available", field="--nats")
            embedded(config=config[0], check=check, duration=duration)
            return
        tls = _tls(tls_ca, tls_cert, tls_key)
        _serve_agents(
            config, nats, creds, creds_dir, idle_load, duration, otlp, state_dir, orphan_grace, tls
        )


def _serve_agents(
    paths: list[Path],
    url: str,
    creds: Path | None,
    creds_dir: Path | None,
    idle_load: bool,
    duration: float | None,
    otlp: str | None = None,
    state_dir: Path | None = None,
    orphan_grace: float | None = None,
    tls: ssl.SSLContext | None = None,
) -> None:
    from berth.events.nats import NatsEvents
    from berth.nats.wire import node_token
    from berth.node.budget import IDLE
    from berth.node.config import load_config
    from berth.node.runtime.process import checked_orphan_grace
    from berth.nodeclient.nats_node import NodeService
    from berth.registry.nats_routes import NatsRoutes

    configs = [load_config(path) for path in paths]
    if orphan_grace is not None:
        grace = checked_orphan_grace(orphan_grace, "--orphan-grace")
        configs = [
            config.model_copy(
                update={"agent": config.agent.model_copy(update={"orphan_grace_s": grace})}
            )
            for config in configs
        ]
    names = [config.node.name for config in configs]
    if len(set(names)) != len(names):
        raise Invalid(f"node names must be unique, got {names}", field="--config")
    if creds is not None and len(configs) > 1:
        raise Invalid("one --creds serves one agent; use --creds-dir", field="--creds")
    tracing.configure(otlp, service_name="berth-agent")
    _logging()

    def credentials_of(node: str) -> Credentials:
        assert creds_dir is not None
        return Credentials.load(creds_dir / f"node-{node_token(node)}.creds.json")

    async def serve() -> None:
        stop = _stop_event(duration)
        clients: list[Any] = []
        async with contextlib.AsyncExitStack() as stack:

            async def connection(name: str, credentials: Credentials | None) -> Any:
                client = await connect(url, name=name, credentials=credentials, tls=tls)
                stack.push_async_callback(client.close)
                clients.append(client)
                return client

            # each node as its own user needs its own connection; otherwise they share one
            shared = None if creds_dir else await connection("berth-agents", _credentials(creds))
            for config in configs:
                client = shared or await connection(
                    config.node.name, credentials_of(config.node.name)
                )
                routes = await NatsRoutes(client).start()
                events = NatsEvents(client)
                node_dir = None if state_dir is None else state_dir / node_token(config.node.name)
                service = NodeService(
                    client,
                    config,
                    routes=routes,
                    readings=IDLE if idle_load else None,
                    state_dir=node_dir,
                    events=events,
                )
                await stack.enter_async_context(service)
                accel = getattr(service.agent.runtime, "accel_detail", None)
                console.print(
                    f"agent {service.name} ({service.agent.platform}) on {url}, "
                    f"heartbeat {config.agent.heartbeat_s:g}s"
                    + ("" if accel is None else f", microVMs under {accel}"),
                    highlight=False,
                )
            await until_stopped(stop, clients)  # a connection closed for good: exit, restarted
            console.print("stopping: leaving the cluster", highlight=False)

    asyncio.run(serve())


# -- berth scheduler -------------------------------------------------------------------------
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
    token: TokenOption = None,
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
        typer.Option(
            help="Seconds a workload's node may stay unreachable and out of the cluster "
            "before the API declares it gone: its workloads lost, restartable ones placed "
            "again (with --http)."
        ),
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
    from berth.api.server import HttpsFiles, parse_address, resolve_token
    from berth.registry.nats_routes import NatsRoutes
    from berth.scheduler.nats_server import scheduler_service
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
    _checked_duration(duration)
    _checked_policy(policy)
    address = None if http is None else parse_address(http, public=http_public)
    api_flags = (token, token_file, https_cert, https_key)
    if http is None and (any(flag is not None for flag in api_flags) or http_public):
        raise Invalid(
            "--token, --token-file, --https-cert, --https-key and --http-public go with --http",
            field="--http",
        )
    api_token, generated = resolve_token(token, token_file)
    https = HttpsFiles.from_flags(https_cert, https_key)
    credentials = _credentials(creds)
    tls = _tls(tls_ca, tls_cert, tls_key)
    tracing.configure(otlp, service_name="berth-scheduler")
    _logging()

    async def serve() -> None:
        stop = _stop_event(duration)
        client = await connect(
            nats, name=f"berth-scheduler-{os.getpid()}", credentials=credentials, tls=tls
        )
        try:
            routes = await NatsRoutes(client).start()
            async with scheduler_service(
                client,
                heartbeat_s=heartbeat,
                lease_ttl_s=lease_ttl,
                routes=routes,
                grace_s=grace,
                policy=policy_of(policy, seed=None),  # unseeded: schedulers' jitters differ
            ) as service:
                console.print(
                    f"scheduler {service.id} serving {service.prefix}.* in queue group "
                    f"{service.queue} on {nats}; {len(service.scheduler.states())} nodes seen",
                    highlight=False,
                )
                async with contextlib.AsyncExitStack() as api_stack:
                    if address is not None:
                        await _serve_api(
                            api_stack,
                            client,
                            service,
                            address,
                            api_token,
                            generated,
                            node_gone_after_s=node_gone_after,
                            reconcile_every_s=reconcile_every,
                            https=https,
                        )
                    await until_stopped(stop, [client])
                    console.print("stopping: finishing in-flight requests", highlight=False)
        finally:
            await client.close()

    asyncio.run(serve())


async def _serve_api(
    stack: contextlib.AsyncExitStack,
    client: Any,
    service: Any,
    address: tuple[str, int],
    token: str,
    generated: bool,
    *,
    node_gone_after_s: float = NODE_GONE_AFTER_S,
    reconcile_every_s: float = RECONCILE_EVERY_S,
    https: Any = None,
) -> None:
    """The HTTP API beside a running scheduler (over HTTPS with ``https``, an
    :class:`~berth.api.server.HttpsFiles`); a generated token goes to api.json."""
    from berth.api.server import remove_api_file, scheduler_api, write_api_file

    host, port = address
    api = await stack.enter_async_context(
        scheduler_api(
            client,
            service,
            host=host,
            port=port,
            token=token,
            node_gone_after_s=node_gone_after_s,
            reconcile_every_s=reconcile_every_s,
            https=https,
        )
    )
    where = ""
    if generated:
        where = f"; token in {write_api_file(api.url, token)}"
        stack.callback(remove_api_file, token)
    console.print(f"API on {api.url} (dashboard {api.url}/){where}", highlight=False)


# -- berth up --------------------------------------------------------------------------------
def up(
    nodes: Annotated[int, typer.Option(help="How many node agents.")] = 3,
    schedulers: Annotated[int, typer.Option(help="How many schedulers.")] = 1,
    heartbeat: Annotated[
        float, typer.Option(help="The agents' heartbeat in seconds.")
    ] = LOCAL_HEARTBEAT_S,
    per_process: Annotated[
        int | None, typer.Option(help="Agents per process (default: 1 up to 8 nodes).")
    ] = None,
    auth: Annotated[
        bool, typer.Option("--auth/--no-auth", help="Users and permissions per role.")
    ] = True,
    runtime: Annotated[
        str,
        typer.Option(
            help="process (real processes), fake, or microvm (QEMU guests; berth microvm setup)."
        ),
    ] = "process",
    duration: DurationOption = None,
    otlp: OtlpOption = None,
    http: Annotated[
        str,
        typer.Option(
            "--http",
            help="Serve the HTTP API and dashboard on HOST:PORT (port 0: a free one; 'off': none).",
        ),
    ] = "127.0.0.1:8080",
    http_public: HttpPublicOption = False,
    policy: PolicyOption = "seed",
    node_gone_after: Annotated[
        float,
        typer.Option(
            help="Seconds a workload's node may stay unreachable and out of the cluster "
            "before the API declares it gone: its workloads lost, restartable ones placed "
            "again."
        ),
    ] = NODE_GONE_AFTER_S,
    nats_servers: Annotated[
        int,
        typer.Option(
            help="How many nats-servers: 1, or 3 (up to 7) clustered with R3 buckets, so one "
            "can die."
        ),
    ] = 1,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls/--no-tls",
            help="A local CA and certificates: mutual TLS to NATS (and between its servers), "
            "HTTPS for the API (its CA in api.json, which the CLI trusts).",
        ),
    ] = True,
) -> None:
    """A local cluster: nats-server, N agents as processes, schedulers; ^C stops it all."""
    from berth.up import LocalCluster, wait_for_signal

    if runtime not in ("process", "fake", "microvm"):
        raise Invalid(f"must be 'process', 'fake' or 'microvm', got {runtime!r}", field="--runtime")
    duration = _checked_duration(duration)
    _checked_policy(policy)
    _UP_NODES(nodes, "--nodes")
    _UP_SCHEDULERS(schedulers, "--schedulers")
    INTERVAL_RULE(heartbeat, "--heartbeat")
    INTERVAL_RULE(node_gone_after, "--node-gone-after")
    if per_process is not None:
        _UP_NODES(per_process, "--per-process")
    traces = tracing.otlp_traces_url(otlp)  # checked here; the processes started export
    if otlp is not None and traces is not None:  # (they inherit the environment)
        os.environ[tracing.TRACES_ENDPOINT_ENV] = traces
    from berth.api.server import parse_address, remove_api_file, write_api_file

    address = None if http == "off" else parse_address(http, public=http_public)
    cluster = LocalCluster(
        nodes,
        http=address,
        schedulers=schedulers,
        heartbeat_s=heartbeat,
        auth=auth,
        runtime=runtime,  # type: ignore[arg-type]
        per_process=per_process,
        policy=policy,
        node_gone_after_s=node_gone_after,
        nats_servers=nats_servers,
        tls=tls,
    )
    servers = "nats-server" if nats_servers == 1 else f"{nats_servers} nats-servers"
    console.print(f"starting {servers}, {nodes} agents and {schedulers} scheduler(s)…")

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # while starting: unwind through the cleanup below

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        cluster.start()
    except KeyboardInterrupt:
        console.print("interrupted while starting; stopped, nothing left behind")
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    with cluster:
        if cluster.api_url is not None and cluster.api_token is not None:
            path = write_api_file(
                cluster.api_url, cluster.api_token, others=cluster.api_urls[1:], ca=cluster.api_ca
            )
            console.print(f"API address and token written to {path}", highlight=False)
        console.print(cluster.describe(), highlight=False, soft_wrap=True)

        def restart_exited() -> None:
            for line in cluster.restart_exited():
                console.print(line, highlight=False)

        try:
            wait_for_signal(duration, every=restart_exited)
        finally:
            if cluster.api_token is not None:
                remove_api_file(cluster.api_token)
        console.print("stopping schedulers, agents and nats-server…")
    console.print("stopped; nothing left behind")


# -- the caller's side -----------------------------------------------------------------------
def place(
    name: Annotated[str, typer.Option(help="Workload name.")] = "hello",
    namespace: Annotated[str, typer.Option(help="Workload namespace.")] = "default",
    replica: Annotated[int, typer.Option(help="Replica index (>= 0).")] = 0,
    instance: Annotated[str, typer.Option(help="Instance type, e.g. micro.")] = "micro",
    platform: Annotated[
        list[str] | None, typer.Option(help="A platform the artifact provides (repeatable).")
    ] = None,
    layer: Annotated[
        list[str] | None, typer.Option(help="An image layer ID:SIZE (repeatable).")
    ] = None,
    nats: NatsOption = DEFAULT_URL,
    creds: CredsOption = None,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
) -> None:
    """Place one workload through the cluster's schedulers and print the placement."""
    from berth.scheduler.nats import NatsScheduler

    with fields_as(_PLACE_FLAGS):
        request = Request(
            namespace=namespace,
            name=name,
            replica=replica,
            platforms=tuple(platform or ()),
            spec=instance,
            layers=tuple(parse_layer_flag(text) for text in layer or ()),
        )
    credentials = _credentials(creds)
    tls = _tls(tls_ca, tls_cert, tls_key)

    async def go() -> None:
        client = await connect(nats, name="berth-place", credentials=credentials, tls=tls)
        try:
            placement = await NatsScheduler(client).schedule(request)
        finally:
            await client.close()
        table = Table(title=f"placement of {request.key}", show_header=False)
        table.add_row("worker node", placement.worker_node)
        table.add_row("reservation", placement.reservation_id or "-")
        table.add_row("rank", str(placement.rank))
        table.add_row("colocated", format_information(placement.colocated_bytes))
        refused = ", ".join(f"{node}: {reason}" for node, reason in placement.refusals)
        table.add_row("refused on the way", refused or "-")
        console.print(table)

    asyncio.run(go())


def whereis(
    workload: Annotated[str, typer.Argument(help="namespace/name/replica, e.g. default/hello/0")],
    nats: NatsOption = DEFAULT_URL,
    creds: CredsOption = None,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
) -> None:
    """Which node holds a workload (from the routing registry)."""
    from berth.registry.nats_routes import NatsRoutes

    _check_workload_key(workload)
    credentials = _credentials(creds)
    tls = _tls(tls_ca, tls_cert, tls_key)

    async def go() -> None:
        client = await connect(nats, name="berth-whereis", credentials=credentials, tls=tls)
        try:
            route = await (await NatsRoutes(client).start()).whereis(workload)
        finally:
            await client.close()
        if route is None:
            console.print(f"{workload} is not placed (no route)", highlight=False)
            raise typer.Exit(1)
        console.print(
            f"{route.workload} → {route.node} (reservation {route.reservation_id or '-'}"
            f"{', ' + str(route.spec) if route.spec else ''})",
            highlight=False,
        )

    asyncio.run(go())


def routes(
    node: Annotated[str | None, typer.Option(help="Only this node's routes.")] = None,
    nats: NatsOption = DEFAULT_URL,
    creds: CredsOption = None,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
) -> None:
    """Every route in the registry: workload → node."""
    from berth.registry.nats_routes import NatsRoutes

    credentials = _credentials(creds)
    tls = _tls(tls_ca, tls_cert, tls_key)

    async def go() -> None:
        client = await connect(nats, name="berth-routes", credentials=credentials, tls=tls)
        try:
            found = await (await NatsRoutes(client).start()).list(node)
        finally:
            await client.close()
        table = Table(title=f"{len(found)} route{'s' if len(found) != 1 else ''}")
        for column in ("workload", "node", "reservation", "mem"):
            table.add_column(column)
        for route in found:
            mem = format_information(route.spec.mem) if route.spec else "-"
            table.add_row(route.workload, route.node, route.reservation_id or "-", mem)
        console.print(table)

    asyncio.run(go())


def openapi() -> None:
    """Print the HTTP API's OpenAPI document (docs/openapi.json is this output)."""
    import json

    from berth.api.app import generated_openapi

    print(json.dumps(generated_openapi(), indent=2, ensure_ascii=False))


def register(app: typer.Typer) -> None:
    """Add the NATS commands to ``app`` (and ``--nats`` to its ``agent`` command)."""
    _extend_agent(app)
    app.command("scheduler")(scheduler)
    app.command("up")(up)
    app.command("place")(place)
    app.command("whereis")(whereis)
    app.command("routes")(routes)
    api_app = typer.Typer(help="The HTTP API (served by berth up and berth scheduler --http).")
    api_app.command("openapi")(openapi)
    app.add_typer(api_app, name="api")
