"""``berth agent``: node agents from config files, embedded or on a NATS cluster.

One command, registered once (:mod:`berth.cli.main`): ``berth agent --config FILE`` starts an
agent on the embedded in-memory store (``--check`` validates the file and prints the effective
configuration, and what the microVM runtime still lacks); with ``--nats URL`` the agent joins a
cluster instead — it publishes its state to the cluster's nodes bucket and answers its own
subjects, and several ``--config`` run several agents in one process.  On SIGINT or SIGTERM an
agent on NATS stops answering and deletes its key.  Its own flags, the agent's renderings and
the serving loops live here; the flags it shares with the other NATS commands are
:mod:`berth.cli.common`'s.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from berth.cli.common import (
    CredsOption,
    DurationOption,
    OtlpOption,
    TlsCaOption,
    TlsCertOption,
    TlsKeyOption,
    checked_duration,
    client_tls,
    configure_logging,
    console,
    load_credentials,
    show_table,
)
from berth.defaults import ORPHAN_GRACE_S
from berth.errors import Invalid

# What the agent needs when it runs (asyncio, the models, TLS, tracing, the node) is imported
# in the functions that run it: ``--help`` loads this module and its flags only.
if TYPE_CHECKING:
    import ssl

    from berth.node.config import AgentConfig

__all__ = ["agent"]


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
            f"(default: the config's \\[agent] orphan_grace_s, {ORPHAN_GRACE_S:g})."
        ),
    ] = None,
) -> None:
    """Start node agents from config files: embedded, or on a NATS cluster with --nats."""
    if nats is None or check:
        from berth.pki import TLS_FLAGS

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
        _embedded_agent(config=config[0], check=check, duration=duration)
        return
    tls = client_tls(tls_ca, tls_cert, tls_key)
    _serve_agents(
        config, nats, creds, creds_dir, idle_load, duration, otlp, state_dir, orphan_grace, tls
    )


def _embedded_agent(config: Path, check: bool, duration: float | None) -> None:
    """Start a node agent from a config file (on the embedded in-memory store)."""
    import asyncio

    from rich.table import Table

    from berth.model import INTERVAL_RULE
    from berth.node.agent import Agent
    from berth.node.config import load_config
    from berth.store.memory import MemoryStore
    from berth.units import format_bandwidth, format_information
    from berth.validation import fields_as

    if duration is not None:
        duration = INTERVAL_RULE(duration, "--duration")
    with fields_as({"config": "--config"}):
        loaded = load_config(config)
    if check:
        limits = loaded.budget.limits()
        table = Table(title=f"effective configuration of {config}", show_header=False)
        table.add_row("node.name", loaded.node.name)
        table.add_row("node.platform", str(loaded.node.platform))
        table.add_row("node.labels", ", ".join(f"{k}={v}" for k, v in loaded.node.labels.items()))
        for key, value in limits.model_dump().items():
            table.add_row(f"budget.{key}", _human(key, value))
        table.add_row("budget.disk_bw_ceiling", format_bandwidth(int(limits.disk_bw_ceiling)))
        table.add_row("budget.net_bw_ceiling", format_bandwidth(int(limits.net_bw_ceiling)))
        for key, value in loaded.agent.model_dump().items():
            table.add_row(f"agent.{key}", _human(key, value))
        missing: list[str] = []
        rows: list[tuple[str, str]] = []
        if loaded.agent.runtime == "microvm":
            from berth.node.microvm.setup import check_rows

            rows, missing = check_rows(loaded)
        elif loaded.agent.runtime == "container":
            from berth.node.container.setup import check_rows as container_rows

            rows, missing = container_rows(loaded)
        elif loaded.agent.runtime == "process":
            rows = _process_rows(loaded)
        for row in rows:
            table.add_row(*row)
        show_table(table)
        if missing:  # the runtime cannot run workloads yet: say what to do
            raise Invalid("; ".join(missing), field=loaded.agent.runtime)
        console.print("[green]configuration is valid[/]")
        return

    async def serve() -> None:
        store = MemoryStore()
        node = Agent.from_config(loaded, store)
        async with node:
            console.print(
                f"agent {node.name} ({node.platform}) advertising every "
                f"{node.heartbeat_s:g}s; ^C to stop"
            )
            accel = getattr(node.runtime, "accel_detail", None)
            if accel is not None:  # the microvm runtime: how its guests run
                console.print(f"microVMs under {accel}", highlight=False)
            deadline = None if duration is None else asyncio.get_running_loop().time() + duration
            while deadline is None or asyncio.get_running_loop().time() < deadline:
                state = node.snapshot()
                console.print(
                    f"{node.name}: mem_free={format_information(state.mem_free)} "
                    f"disk_free={format_information(state.disk_free)} "
                    f"cpu_load={state.cpu_load:.3f} layers={len(state.layers)}",
                    highlight=False,
                )
                wait = node.heartbeat_s
                if deadline is not None:
                    wait = min(wait, max(deadline - asyncio.get_running_loop().time(), 0))
                await asyncio.sleep(wait)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


def _process_rows(config: AgentConfig) -> list[tuple[str, str]]:
    """The ``[process]`` settings in effect (``Invalid`` naming ``process.user`` when this
    host has no such user)."""
    user = config.process.run_as()
    scratch = config.process.scratch()
    return [
        ("process.user", "the agent's own" if user is None else str(user)),
        ("process.scratch_dir", "a temporary directory" if scratch is None else str(scratch)),
        (
            "process.log_dir",
            str(config.process.logs() or "- (output not kept: berth logs shows none)"),
        ),
        ("process.isolation", 'none: development and tests (runtime = "container" isolates)'),
    ]


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
    """``berth agent --nats``: the flags checked, the process run
    (:func:`berth.processes.agent.serve_agents`)."""
    import asyncio

    from berth.node.runtime.process import checked_orphan_grace
    from berth.observability import tracing
    from berth.processes.agent import agent_configs, serve_agents

    duration = checked_duration(duration)
    grace = None if orphan_grace is None else checked_orphan_grace(orphan_grace, "--orphan-grace")
    configs = agent_configs(paths, orphan_grace_s=grace)
    if creds is not None and len(configs) > 1:
        raise Invalid("one --creds serves one agent; use --creds-dir", field="--creds")
    credentials = None if creds_dir else load_credentials(creds)
    tracing.configure(otlp, service_name="berth-agent")
    configure_logging()
    asyncio.run(
        serve_agents(
            configs,
            url,
            credentials=credentials,
            creds_dir=creds_dir,
            idle_load=idle_load,
            duration_s=duration,
            state_dir=state_dir,
            tls=tls,
            say=lambda line: console.print(line, highlight=False),
        )
    )


def _human(key: str, value: object) -> str:
    from berth.units import format_bandwidth, format_information

    if isinstance(value, int) and not isinstance(value, bool):
        if key.endswith("_cap"):
            return format_bandwidth(value)
        if key.endswith(("_max", "cache")):
            return format_information(value)
    return "-" if value is None else str(value)
