"""The ``berth`` command line.

Thin by design: each command parses flags into berth's validated types, calls the library and
renders the result with rich.  Every ``BerthError`` (bad input, no capacity) is printed as one
clear line on stderr with exit status 2 — never a traceback.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from berth.errors import BerthError
from berth.model import Layer, Request
from berth.platform import host
from berth.scheduler.singlenode import SingleNode
from berth.units import format_information

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
        from berth.errors import Invalid

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


def main() -> None:
    """Console-script entry point: run the app, turning berth errors into one clear line."""
    try:
        app()
    except BerthError as error:
        errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
