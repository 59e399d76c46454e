"""The ``berth`` command line.

Thin by design: each command parses flags into berth's validated types, calls the library and
renders the result with rich.  Every ``BerthError`` (bad input, no capacity) is printed as one
clear line on stderr with exit status 2 — never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from berth.errors import BerthError, Invalid
from berth.model import Layer, Request
from berth.platform import host
from berth.scheduler.singlenode import SingleNode
from berth.service.commands import register as register_service
from berth.sim.commands import register as register_sim
from berth.units import format_bandwidth, format_information

__all__ = ["app", "main"]

app = typer.Typer(
    name="berth",
    help="berth decides which node runs each workload, and makes the decision stick.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
errors = Console(stderr=True)


@app.callback()
def _root() -> None:
    """berth decides which node runs each workload, and makes the decision stick."""


def parse_layer_flag(text: str) -> Layer:
    """``ID:SIZE`` (``sha256:abc…:12MiB`` — the size is after the last colon)."""
    layer_id, sep, size = text.rpartition(":")
    if not sep:
        raise Invalid(f"expected ID:SIZE, got {text!r}", field="--layer")
    return Layer(id=layer_id, size=size)


@app.command()
def schedule(
    name: Annotated[str, typer.Option(help="Workload name.")] = "hello",
    namespace: Annotated[str, typer.Option(help="Workload namespace.")] = "default",
    replica: Annotated[int, typer.Option(help="Replica index (>= 0).")] = 0,
    platform: Annotated[
        list[str] | None, typer.Option(help="A platform the artifact provides (repeatable).")
    ] = None,
    instance: Annotated[str | None, typer.Option(help="Instance type, e.g. micro.")] = None,
    layer: Annotated[
        list[str] | None, typer.Option(help="An image layer ID:SIZE (repeatable).")
    ] = None,
    node: Annotated[str, typer.Option(help="The local worker's name.")] = "local",
    node_platform: Annotated[
        str | None, typer.Option(help="The local worker's platform (default: this host's).")
    ] = None,
) -> None:
    """Schedule one request on the single-node driver and print the placement."""
    request = Request(
        namespace=namespace,
        name=name,
        replica=replica,
        platforms=tuple(platform or ()),
        spec=instance,
        layers=tuple(parse_layer_flag(text) for text in layer or ()),
    )
    driver = SingleNode(node, node_platform or host())
    placement = asyncio.run(driver.schedule(request))
    table = Table(title=f"placement of {request.key}", show_header=False)
    table.add_row("worker node", placement.worker_node)
    table.add_row("driver", repr(driver))
    table.add_row("platforms", ", ".join(map(str, request.platforms)) or "any")
    table.add_row("spec", str(request.spec) if request.spec else "none declared")
    table.add_row(
        "layers",
        f"{len(request.layers)} ({format_information(sum(x.size for x in request.layers))})",
    )
    console.print(table)


@app.command()
def agent(
    config: Annotated[Path, typer.Option(help="The agent's TOML configuration file.")],
    check: Annotated[
        bool, typer.Option("--check", help="Validate and print the effective configuration.")
    ] = False,
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many seconds (default: run until ^C).")
    ] = None,
) -> None:
    """Start a node agent from a config file (on the embedded in-memory store)."""
    from berth.node.agent import Agent
    from berth.node.config import load_config
    from berth.store.memory import MemoryStore

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
        console.print(table)
        console.print("[green]configuration is valid[/]")
        return
    if duration is not None and duration <= 0:
        raise Invalid(f"must be positive, got {duration}", field="--duration")

    async def serve() -> None:
        store = MemoryStore()
        node = Agent.from_config(loaded, store)
        async with node:
            console.print(f"agent {node.name} ({node.platform}) advertising every "
                          f"{node.heartbeat_s:g}s; ^C to stop")  # fmt: skip
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


@app.command()
def cluster(
    nodes: Annotated[int, typer.Option(help="How many in-process agents.")] = 3,
    workloads: Annotated[int, typer.Option(help="How many workloads to boot.")] = 10,
    command: Annotated[str, typer.Option(help="The command each workload runs.")] = "sleep 2",
    runtime: Annotated[str, typer.Option(help="process (real processes) or fake.")] = "process",
    live_monitors: Annotated[
        bool,
        typer.Option(
            "--live-monitors",
            help="Soft checks read this host's live load (all agents share one machine).",
        ),
    ] = False,
) -> None:
    """Start an embedded cluster, boot workloads of mixed instance types, show where they ran."""
    import shlex

    from berth.embedded import EmbeddedCluster, embedded_configs
    from berth.errors import NoCapacity
    from berth.node.runtime import BootSpec

    if runtime not in ("process", "fake"):
        raise Invalid(f"must be 'process' or 'fake', got {runtime!r}", field="--runtime")
    if workloads < 0:
        raise Invalid(f"must not be negative, got {workloads}", field="--workloads")
    argv = tuple(shlex.split(command))
    if not argv:
        raise Invalid("must not be empty", field="--command")
    configs = embedded_configs(nodes, runtime=runtime)  # type: ignore[arg-type]
    types = ("micro", "milli", "centi", "deci")

    async def go() -> None:
        async with EmbeddedCluster(configs, live_monitors=live_monitors) as embedded:
            table = Table(title=f"{workloads} workloads on {nodes} embedded agents")
            for column in ("workload", "type", "node", "rank", "refused on the way"):
                table.add_column(column)
            for index in range(workloads):
                kind = types[index % len(types)]
                request = Request(namespace="cli", name="job", replica=index, spec=kind)
                boot = BootSpec(name=f"job-{index}", command=argv)
                try:
                    started = await embedded.run(request, boot)
                except NoCapacity as error:
                    table.add_row(str(index), kind, "-", "-", str(error))
                    continue
                refused = ", ".join(f"{n}: {r}" for n, r in started.refusals)
                table.add_row(started.result.id, kind, started.node, str(started.rank),
                              refused)  # fmt: skip
            console.print(table)
            for name, node in embedded.agents.items():
                headroom = node.budget.headroom()
                console.print(
                    f"{name} ({node.platform}): {len(node.workloads())} running, "
                    f"mem_free={format_information(headroom.mem_free)}",
                    highlight=False,
                )

    asyncio.run(go())


def _human(key: str, value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        if key.endswith("_cap"):
            return format_bandwidth(value)
        if key.endswith(("_max", "cache")):
            return format_information(value)
    return "-" if value is None else str(value)


register_sim(app)
register_service(app)


def main() -> None:
    """Console-script entry point: run the app, turning berth errors into one clear line."""
    try:
        app()
    except BerthError as error:
        errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
