"""``berth deploy DIR``: a real cluster's files, written once for every machine.

Thin like the rest of the command line: the flags become a :class:`~berth.deploy.Plan`
(each ``--server``, ``--node`` and ``--scheduler`` checked there, errors naming the flag),
:func:`berth.deploy.write_deployment` writes the directory, and this prints what goes where.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

__all__ = ["deploy_command", "register"]

console = Console()


def deploy_command(
    directory: Annotated[Path, typer.Argument(help="A new directory to write the files into.")],
    server: Annotated[
        list[str],
        typer.Option(
            "--server",
            help="A NATS server's HOST[:PORT] (default port 4222, routes on PORT+2000); give "
            "1, 3 or 5.",
        ),
    ],
    scheduler: Annotated[
        list[str],
        typer.Option(
            "--scheduler", help="A scheduler's HOST[:PORT] (its HTTPS API; default port 8080)."
        ),
    ],
    node: Annotated[
        list[str] | None, typer.Option("--node", help="A node's name (repeat for each agent).")
    ] = None,
    sync_interval: Annotated[
        str,
        typer.Option(
            help="JetStream's fsync: 'always' (every write before it is acknowledged) or a "
            "Go duration such as '2m' (nats-server's default, which can lose acknowledged "
            "writes on a power loss)."
        ),
    ] = "always",
) -> None:
    """Write a real cluster's configuration, credentials, certificates and systemd units."""
    from berth.deploy import HTTP_PORT, NATS_PORT, Endpoint, Plan, write_deployment
    from berth.errors import Invalid

    if sync_interval != "always" and not _go_duration(sync_interval):
        raise Invalid(
            f"expected 'always' or a duration such as '2m', got {sync_interval!r}",
            field="--sync-interval",
        )
    plan = Plan(
        servers=tuple(Endpoint.parse(text, NATS_PORT, "--server") for text in server),
        nodes=tuple(node or ()),
        schedulers=tuple(Endpoint.parse(text, HTTP_PORT, "--scheduler") for text in scheduler),
        sync_interval=sync_interval,
    )
    root = write_deployment(directory, plan)
    console.print(f"wrote a {len(plan.servers)}-server berth cluster into {root}", highlight=False)
    console.print(f"  see {root / 'README.md'} for what to copy to each machine", highlight=False)


def _go_duration(text: str) -> bool:
    """``text`` is a positive Go duration of one unit (``30s``, ``2m``, ``1h``, ``500ms``)."""
    for unit in ("ms", "s", "m", "h"):
        number = text.removesuffix(unit)
        if number != text and number.isdigit() and int(number) > 0:
            return True
    return False


def register(app: typer.Typer) -> None:
    """Add ``berth deploy`` to ``app``."""
    app.command("deploy")(deploy_command)
