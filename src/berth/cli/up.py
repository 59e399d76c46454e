"""``berth up``: a local cluster on this machine — nats-servers, agents, schedulers, the API.

The command checks its flags, starts :class:`berth.processes.up.LocalCluster`, writes the API's
address and token to ``api.json`` and waits for ^C (or ``--duration``), restarting a process
that exited; then it stops everything and leaves nothing behind.  Its bounds
(:data:`MAX_UP_NODES`, :data:`MAX_UP_SCHEDULERS`) and own flags live here; the flags it shares
with the other NATS commands are :mod:`berth.cli.common`'s.
"""

from __future__ import annotations

import os
import signal
from typing import Annotated

import typer

from berth.cli.common import (
    NODE_GONE_AFTER_HELP,
    DurationOption,
    HttpPublicOption,
    OtlpOption,
    PolicyOption,
    checked_duration,
    checked_policy,
    console,
)
from berth.defaults import LOCAL_HEARTBEAT_S, NODE_GONE_AFTER_S, UP_POLICY
from berth.errors import Invalid

__all__ = ["MAX_UP_NODES", "MAX_UP_SCHEDULERS", "up"]

MAX_UP_NODES = 256
"""``berth up`` runs every agent on this machine: more would only exhaust it."""
MAX_UP_SCHEDULERS = 16


def _count(value: int, most: int, flag: str) -> int:
    """``value`` if it is a count from 1 to ``most``, else ``Invalid`` naming ``flag`` (the
    rule is built here, when ``up`` runs: ``--help`` does not load pydantic)."""
    from pydantic import Field, Strict

    from berth.validation import Rule

    rule: Rule[int] = Rule(Annotated[int, Strict(), Field(ge=1, le=most)])
    return rule(value, flag)


def _labels(pairs: list[str]) -> dict[str, str]:
    """``--label KEY=VALUE`` flags as a mapping (``Invalid`` naming ``--label`` for one
    without ``=`` or given twice); the names and values are checked with the node's labels."""
    labels: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise Invalid(f"expected KEY=VALUE, got {pair!r}", field="--label")
        if key in labels:
            raise Invalid(f"{key!r} is given twice", field="--label")
        labels[key] = value
    return labels


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
            help="auto (container where this host can run them, else process), container "
            "(each workload isolated, from its image's layers; root and runc), process (host "
            "processes: development and tests, no image isolation), fake, or microvm (QEMU "
            "guests; berth microvm setup)."
        ),
    ] = "auto",
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
    policy: PolicyOption = UP_POLICY,
    zones: Annotated[
        int,
        typer.Option(
            help="Put the nodes in this many zones: a 'zone' label (a, b, …) dealt out in turn, "
            "for --spread zone (0: no zone label).",
        ),
    ] = 0,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            metavar="KEY=VALUE",
            help="A label on every node (again for more).",
            show_default=False,
        ),
    ] = None,
    node_gone_after: Annotated[
        float,
        typer.Option(help=NODE_GONE_AFTER_HELP + "."),
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
    from berth.model import INTERVAL_RULE
    from berth.observability import tracing
    from berth.processes.up import LocalCluster, wait_for_signal

    if runtime not in ("auto", "container", "process", "fake", "microvm"):
        raise Invalid(
            f"must be 'auto', 'container', 'process', 'fake' or 'microvm', got {runtime!r}",
            field="--runtime",
        )
    duration = checked_duration(duration)
    checked_policy(policy)
    _count(nodes, MAX_UP_NODES, "--nodes")
    _count(schedulers, MAX_UP_SCHEDULERS, "--schedulers")
    INTERVAL_RULE(heartbeat, "--heartbeat")
    INTERVAL_RULE(node_gone_after, "--node-gone-after")
    if per_process is not None:
        _count(per_process, MAX_UP_NODES, "--per-process")
    traces = tracing.otlp_traces_url(otlp)  # checked here; the processes started export
    if otlp is not None and traces is not None:  # (they inherit the environment)
        os.environ[tracing.TRACES_ENDPOINT_ENV] = traces
    from berth.api.server import parse_address, remove_api_file, write_api_file

    address = None if http == "off" else parse_address(http, public=http_public)
    if runtime == "auto":  # containers where this host runs them; else say why not
        from berth.processes.runtimes import container_problems

        missing = container_problems()
        runtime = "process" if missing else "container"
        if missing:
            console.print(
                f"runtime: process (no image isolation), as containers cannot run here: "
                f"{'; '.join(missing)}",
                highlight=False,
            )
    cluster = LocalCluster(
        nodes,
        http=address,
        schedulers=schedulers,
        heartbeat_s=heartbeat,
        auth=auth,
        runtime=runtime,  # type: ignore[arg-type]
        per_process=per_process,
        policy=policy,
        zones=zones,
        labels=_labels(label or []),
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
                cluster.api_url,
                cluster.api_token,
                others=cluster.api_urls[1:],
                ca=cluster.api_ca,
                nats=(cluster.url, cluster.client_files()),
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
