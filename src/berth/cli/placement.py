"""``berth place``, ``berth whereis``, ``berth routes``: the caller's side of a NATS cluster.

Place a workload through the cluster's schedulers, find the node one runs on, list every
route — each one request over a connection of its own (``--nats``, ``--creds`` and the TLS
flags: :mod:`berth.cli.common`).  The checks of what the user typed before anything connects
(a request's fields, a ``namespace/name/replica`` key) live here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.table import Table

from berth.cli.common import (
    DEFAULT_URL,
    ClientNatsOption,
    CredsOption,
    TlsCaOption,
    TlsCertOption,
    TlsKeyOption,
    client_tls,
    console,
    load_credentials,
    request_from_flags,
    show_table,
)
from berth.errors import Invalid

# What the commands need when they run (asyncio, nats-py, the models, the registry) is imported
# in their bodies: ``--help`` loads this module and its flags only.
if TYPE_CHECKING:
    from nats.aio.client import Client

    from berth.registry.port import Route

__all__ = ["place", "routes", "whereis"]

T = TypeVar("T")

_PLACE_FLAGS = {
    "namespace": "--namespace",
    "name": "--name",
    "replica": "--replica",
    "spec": "--instance",
    "platforms": "--platform",
    "layers": "--layer",
}


def _check_workload_key(workload: str) -> None:
    """``namespace/name/replica``, each part as a request's (names, a replica index)."""
    from pydantic import Field, Strict

    from berth.model import MAX_REPLICA, NAME_RULE
    from berth.validation import Rule

    replica: Rule[int] = Rule(Annotated[int, Strict(), Field(ge=0, le=MAX_REPLICA)])
    parts = workload.split("/")
    if len(parts) != 3 or not parts[2].isdigit():
        raise Invalid(f"expected namespace/name/replica, got {workload!r}", field="WORKLOAD")
    NAME_RULE(parts[0], "WORKLOAD")
    NAME_RULE(parts[1], "WORKLOAD")
    replica(int(parts[2]), "WORKLOAD")


def _ask(
    nats: str | None,
    creds: Path | None,
    tls: tuple[Path | None, Path | None, Path | None],
    name: str,
    ask: Callable[[Client], Awaitable[T]],
) -> T:
    """``ask``'s answer over a connection of its own, named ``name``: to ``--nats``, with
    ``--creds`` and the TLS flags (``tls``: ``--tls-ca``, ``--tls-cert``, ``--tls-key``), which
    are checked before it connects; without any of them, to the cluster ``berth up`` wrote
    into ``api.json``, else to :data:`DEFAULT_URL`.  Closed after; a cluster it cannot reach
    is one line at once, saying what to do."""
    import asyncio

    from berth.api.client import api_file, written_nats
    from berth.errors import Unavailable
    from berth.nats.connection import connect

    given = not (nats is None and creds is None and tls == (None, None, None))
    written = None
    if not given:
        written = written_nats()
        if written is not None:
            nats, files = written.url, written.files
            creds = files.get("creds")
            tls = (files.get("tls_ca"), files.get("tls_cert"), files.get("tls_key"))
    url = nats or DEFAULT_URL
    credentials = load_credentials(creds)
    context = client_tls(*tls)

    async def go() -> T:
        try:
            client = await connect(url, name=name, credentials=credentials, tls=context, once=True)
        except Unavailable as error:
            reason = str(error).lower()
            if "authorization" in reason:
                hint = "pass the cluster's credentials with --creds FILE"
            elif "certificate" in reason or "ssl" in reason:
                hint = "pass the cluster's TLS files with --tls-ca, --tls-cert and --tls-key"
            else:
                hint = "pass --nats URL"
            if given:
                other = f"or give no --nats at all for the berth up cluster ({api_file()})"
            elif written is None:
                other = f"or start a cluster with `berth up` (it writes {api_file()})"
            else:  # what api.json names is gone: a berth up that was killed
                other = f"or start `berth up` again ({written.source} is stale)"
            raise Unavailable(f"{error}: {hint}, {other}") from None
        try:
            return await ask(client)
        finally:
            await client.close()

    return asyncio.run(go())


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
    nats: ClientNatsOption = None,
    creds: CredsOption = None,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
) -> None:
    """Place one workload through the cluster's schedulers and print the placement."""
    from berth.scheduler.nats import NatsScheduler
    from berth.units import format_information
    from berth.validation import fields_as

    with fields_as(_PLACE_FLAGS):
        request = request_from_flags(namespace, name, replica, platform, instance, layer)
    placement = _ask(
        nats,
        creds,
        (tls_ca, tls_cert, tls_key),
        "berth-place",
        lambda client: NatsScheduler(client).schedule(request),
    )
    table = Table(title=f"placement of {request.key}", show_header=False)
    table.add_row("worker node", placement.worker_node)
    table.add_row("reservation", placement.reservation_id or "-")
    table.add_row("rank", str(placement.rank))
    table.add_row("colocated", format_information(placement.colocated_bytes))
    refused = ", ".join(f"{node}: {reason}" for node, reason in placement.refusals)
    table.add_row("refused on the way", refused or "-")
    show_table(table)


def whereis(
    workload: Annotated[str, typer.Argument(help="namespace/name/replica, e.g. default/hello/0")],
    nats: ClientNatsOption = None,
    creds: CredsOption = None,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
) -> None:
    """Which node holds a workload (from the routing registry)."""
    from berth.registry.nats_routes import NatsRoutes

    _check_workload_key(workload)

    async def ask(client: Client) -> Route | None:
        return await (await NatsRoutes(client).start()).whereis(workload)

    route = _ask(nats, creds, (tls_ca, tls_cert, tls_key), "berth-whereis", ask)
    if route is None:
        console.print(f"{workload} is not placed (no route)", highlight=False)
        raise typer.Exit(1)
    console.print(
        f"{route.workload} → {route.node} (reservation {route.reservation_id or '-'}"
        f"{', ' + str(route.spec) if route.spec else ''})",
        highlight=False,
    )


def routes(
    node: Annotated[str | None, typer.Option(help="Only this node's routes.")] = None,
    nats: ClientNatsOption = None,
    creds: CredsOption = None,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
) -> None:
    """Every route in the registry: workload → node."""
    from berth.registry.nats_routes import NatsRoutes
    from berth.units import format_information

    async def ask(client: Client) -> list[Route]:
        return await (await NatsRoutes(client).start()).list(node)

    found = _ask(nats, creds, (tls_ca, tls_cert, tls_key), "berth-routes", ask)
    table = Table(title=f"{len(found)} route{'s' if len(found) != 1 else ''}")
    for column in ("workload", "node", "reservation", "mem"):
        table.add_column(column)
    for route in found:
        mem = format_information(route.spec.mem) if route.spec else "-"
        table.add_row(route.workload, route.node, route.reservation_id or "-", mem)
    show_table(table)
