"""``berth schedule`` and ``berth cluster``: berth in this one process, nothing to connect to.

``schedule`` places one request on the single-node driver and prints the placement;
``cluster`` starts an embedded cluster of agents (:mod:`berth.embedded`), boots workloads of
mixed instance types on it and shows where each ran (and what refused it on the way).  Their
flags, the errors naming them and the counts' ceilings (:data:`MAX_CLUSTER_NODES`,
:data:`MAX_WORKLOADS`) live here.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from berth.cli.common import console, request_from_flags, show_table
from berth.errors import Invalid

# What the commands need when they run (asyncio, the models, the driver, the embedded cluster)
# is imported in their bodies: ``--help`` loads this module and its flags only.

__all__ = ["MAX_CLUSTER_NODES", "MAX_WORKLOADS", "cluster", "schedule"]

MAX_CLUSTER_NODES = 256
"""The most agents ``berth cluster`` starts (they share this process)."""
MAX_WORKLOADS = 10_000
"""The most workloads ``berth cluster`` boots."""

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
    import asyncio

    from berth.model import NAME_RULE
    from berth.platform import host
    from berth.scheduler.singlenode import SingleNode
    from berth.units import format_information
    from berth.validation import fields_as

    with fields_as(_SCHEDULE_FLAGS):
        request = request_from_flags(namespace, name, replica, platform, instance, layer)
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
    show_table(table)


def cluster(
    nodes: Annotated[int, typer.Option(help="How many in-process agents.")] = 3,
    workloads: Annotated[int, typer.Option(help="How many workloads to boot.")] = 10,
    command: Annotated[str, typer.Option(help="The command each workload runs.")] = "sleep 2",
    runtime: Annotated[
        str,
        typer.Option(
            help="process (real host processes: development and tests, no image isolation) or fake."
        ),
    ] = "process",
    live_monitors: Annotated[
        bool,
        typer.Option(
            "--live-monitors",
            help="Soft checks read this host's live load (all agents share one machine).",
        ),
    ] = False,
) -> None:
    """Start an embedded cluster, boot workloads of mixed instance types, show where they ran."""
    import asyncio
    import shlex

    from berth.embedded import EmbeddedCluster, embedded_configs
    from berth.errors import NoCapacity
    from berth.model import Request
    from berth.node.runtime import BootSpec
    from berth.units import format_information
    from berth.validation import fields_as, shown

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
            show_table(table)
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
