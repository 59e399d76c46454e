"""The ``berth`` command line.

Thin by design: each command parses flags into berth's validated types, calls the library and
renders the result with rich.  Every ``BerthError`` (bad input, no capacity) is printed as one
clear line on stderr with exit status 2 — never a traceback.

That rule is enforced once, by the app's command group (:class:`OneLineErrors`), so it holds
for every command registered on the app and under typer's ``CliRunner`` as well as from a
shell: usage errors (an unknown option, ``--nodes abc``, a missing ``--config``) are one line
too, naming the flag, instead of click's usage block.  Each command names the flags the user
typed in its errors (``--layer``, ``--node``), not the model fields they set
(:func:`~berth.validation.fields_as`), and counts have ceilings (:data:`MAX_CLUSTER_NODES`,
:data:`MAX_WORKLOADS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from berth.cli.cluster import parse_layer_flag
from berth.cli.cluster import register as register_cluster
from berth.cli.deploy import register as register_deploy
from berth.cli.microvm import register as register_microvm
from berth.cli.operator import register as register_operator
from berth.cli.sim import register as register_sim
from berth.errors import BerthError, Invalid
from berth.model import INTERVAL_RULE, NAME_RULE, Request
from berth.platform import host
from berth.scheduler.singlenode import SingleNode
from berth.units import format_bandwidth, format_information
from berth.validation import fields_as, one_line, shown

__all__ = ["MAX_CLUSTER_NODES", "MAX_WORKLOADS", "OneLineErrors", "app", "main"]

MAX_CLUSTER_NODES = 256
"""The most agents ``berth cluster`` starts (they share this process)."""
MAX_WORKLOADS = 10_000
"""The most workloads ``berth cluster`` boots."""

console = Console()
errors = Console(stderr=True)


def _usage_errors() -> tuple[type[Exception], ...]:
    """What typer raises for a usage error: its own ``TyperException`` since typer 0.26
    (which vendors click), click's ``ClickException`` before."""
    kinds: list[type[Exception]] = []
    vendored = getattr(typer, "TyperException", None)
    if isinstance(vendored, type) and issubclass(vendored, Exception):
        kinds.append(vendored)
    with contextlib.suppress(ImportError):
        kinds.append(importlib.import_module("click").ClickException)
    return tuple(kinds)


USAGE_ERRORS = _usage_errors()


def fail(message: str) -> None:
    """Print ``message`` as berth's one error line on stderr."""
    errors.print(
        f"[bold red]error:[/] {escape(one_line(message))}", highlight=False, soft_wrap=True
    )


class OneLineErrors(TyperGroup):
    """berth's command group: every error a command or its flags raise is one line.

    ``BerthError`` → ``error: <field>: <message>``, exit status 2; a usage error (unknown
    option, a value typer cannot convert, a missing option) → ``error: <what click says>``
    with its exit status (2); an ``OSError`` (a disk that filled up) → one line, status 1.
    """

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            result = super().main(
                args, prog_name, complete_var, False, windows_expand_args, **extra
            )
        except USAGE_ERRORS as error:
            if not standalone_mode:
                raise
            usage: Any = error
            if type(error).__name__ == "NoArgsIsHelpError":  # ``berth`` alone: the help
                usage.show()
            else:  # typer words a conversion error as pydantic does; say it plainly
                message = str(usage.format_message()).replace("Value error, ", "")
                fail(message.replace("Input should be", "must be"))
            sys.exit(usage.exit_code)
        except BerthError as error:
            if not standalone_mode:
                raise
            fail(str(error))
            sys.exit(2)
        except typer.Abort:
            if not standalone_mode:
                raise
            fail("aborted")
            sys.exit(1)
        except OSError as error:
            if not standalone_mode:
                raise
            where = f"{shown(error.filename)}: " if error.filename else ""
            fail(f"{where}{error.strerror or error}")
            sys.exit(1)
        if not standalone_mode:
            return result
        sys.exit(result if isinstance(result, int) and not isinstance(result, bool) else 0)


app = typer.Typer(
    name="berth",
    help="berth decides which node runs each workload, and makes the decision stick.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=OneLineErrors,
)

# Model fields → the flags that set them, so an error names what the user typed.
_SCHEDULE_FLAGS = {
    "namespace": "--namespace",
    "name": "--name",
    "replica": "--replica",
    "platforms": "--platform",
    "spec": "--instance",
    "instance_type": "--instance",
    "layers": "--layer",
    "local": "--node",
    "platform": "--node-platform",
    "host": "--node-platform",
}


@app.callback()
def _root() -> None:
    """berth decides which node runs each workload, and makes the decision stick."""


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
    with fields_as(_SCHEDULE_FLAGS):
        request = Request(
            namespace=namespace,
            name=name,
            replica=replica,
            platforms=tuple(platform or ()),
            spec=instance,
            layers=tuple(parse_layer_flag(text) for text in layer or ()),
        )
        driver = SingleNode(NAME_RULE(node, "local"), node_platform or host())
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
        if loaded.agent.runtime == "microvm":
            from berth.node.microvm.setup import check_rows

            rows, missing = check_rows(loaded)
            for row in rows:
                table.add_row(*row)
        console.print(table)
        if missing:  # the runtime cannot boot guests yet: say what to run
            raise Invalid("; ".join(missing), field="microvm")
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
        raise Invalid(f"must be 'process' or 'fake', got {shown(runtime)}", field="--runtime")
    if not 1 <= nodes <= MAX_CLUSTER_NODES:
        raise Invalid(f"must be from 1 to {MAX_CLUSTER_NODES}, got {shown(nodes)}", field="--nodes")
    if not 0 <= workloads <= MAX_WORKLOADS:
        raise Invalid(
            f"must be from 0 to {MAX_WORKLOADS}, got {shown(workloads)}", field="--workloads"
        )
    try:
        argv = tuple(shlex.split(command))
    except ValueError as error:  # an unbalanced quote
        raise Invalid(
            f"cannot split {shown(command)} into words: {error}", field="--command"
        ) from None
    if not argv:
        raise Invalid("must not be empty", field="--command")
    with fields_as({"command": "--command"}):
        BootSpec(name="job-0", command=argv)  # the command's own rules, before anything starts
    configs = embedded_configs(nodes, runtime=runtime)  # type: ignore[arg-type]
    types = ("micro", "milli", "centi", "deci")
    refusals: list[str] = []

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
                    refusals.append(str(error))
                    why = "; ".join(sorted(set(error.reasons.values()))) or str(error)
                    table.add_row(str(index), kind, "-", "-", why)
                    continue
                refused = ", ".join(f"{n}: {r}" for n, r in started.refusals)
                table.add_row(started.result.id, kind, started.node, str(started.rank), refused)
            console.print(table)
            for name, node in embedded.agents.items():
                headroom = node.budget.headroom()
                console.print(
                    f"{name} ({node.platform}): {len(node.workloads())} running, "
                    f"mem_free={format_information(headroom.mem_free)}",
                    highlight=False,
                )

    asyncio.run(go())
    if workloads and len(refusals) == workloads:  # nothing ran: say so, and do not exit 0
        boot_failures = [text for text in refusals if "boot_failed" in text]
        raise Invalid(
            f"none of the {workloads} workloads ran: {(boot_failures or refusals)[0]}",
            field="--command" if boot_failures else "--nodes",
        )


def _human(key: str, value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        if key.endswith("_cap"):
            return format_bandwidth(value)
        if key.endswith(("_max", "cache")):
            return format_information(value)
    return "-" if value is None else str(value)


register_sim(app)
register_cluster(app)
register_microvm(app)
register_operator(app)
register_deploy(app)


def main() -> None:
    """Console-script entry point: run the app, turning berth errors into one clear line."""
    try:
        app()
    except BerthError as error:
        errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
