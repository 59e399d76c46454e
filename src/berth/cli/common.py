"""What several ``berth`` commands share: their common flags, and the helpers behind them.

Owns only what more than one command module uses (a flag or a helper of one command lives in
that command's module), so each is defined once:

* the flags of the commands that join or ask a NATS cluster (``agent --nats``, ``scheduler``,
  ``up``, ``place``, ``whereis``, ``routes``) and their helpers: the credentials, the client
  TLS context, logging, ``--policy`` and ``--duration`` checked, the stop event of a service;
* the flags of the commands that call the HTTP API (``run``, ``ps``, ``stop``, ``explain``,
  ``nodes``, ``cordon``, ``uncordon``, ``drain``, ``images``) and how they print its answers:
  ``--json`` documents, tables that fit (or, piped, are never cut), plain lines;
* ``--layer ID:SIZE`` (``schedule``, ``place``, ``images add``) and the one stdout console.

Every command that connects to NATS takes ``--nats URL`` (default ``$BERTH_NATS`` or
``nats://127.0.0.1:4222``) and ``--creds FILE`` (a JSON ``{"user", "password"}`` file, as
``berth up`` writes; default ``$BERTH_NATS_CREDS``), and, for a cluster whose servers require
TLS, ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` (all three: the CA the servers' certificates
are checked against, and this client's certificate and key — mutual TLS;
:meth:`berth.pki.TlsFiles.from_flags`).  Every command that calls the HTTP API finds it as
:func:`berth.api.client.locate` says: ``--api``/``$BERTH_API``, ``--token``/``$BERTH_TOKEN``,
else the ``$BERTH_HOME/api.json`` that ``berth up`` writes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console

from berth.errors import Invalid

# Only what the commands' signatures need is imported here: ``berth --help`` and a command's
# ``--help`` load this module, so pydantic, httpx, nats-py and the models are imported by the
# helpers that use them, when a command runs (``tests/unit/test_layout.py`` holds it so).
if TYPE_CHECKING:
    import ssl

    from pydantic import BaseModel
    from rich.table import Table

    from berth.api.client import ApiClient
    from berth.model import Layer, Request
    from berth.nats.connection import Credentials

__all__ = [
    "DEFAULT_URL",
    "MAX_PIPED_WIDTH",
    "NODE_GONE_AFTER_HELP",
    "ApiOption",
    "ClientNatsOption",
    "CredsOption",
    "DurationOption",
    "GraceOption",
    "HttpPublicOption",
    "JsonOption",
    "NatsOption",
    "OtlpOption",
    "PolicyOption",
    "TlsCaOption",
    "TlsCertOption",
    "TlsKeyOption",
    "TokenOption",
    "api_client",
    "ask_api",
    "checked_duration",
    "checked_grace",
    "checked_policy",
    "client_tls",
    "configure_logging",
    "console",
    "counted",
    "load_credentials",
    "parse_layer_flag",
    "print_json",
    "request_from_flags",
    "say",
    "show_table",
    "size_text",
]

console = Console()

T = TypeVar("T", bound="BaseModel")

# -- the NATS commands' flags and helpers ----------------------------------------------------
DEFAULT_URL = "nats://127.0.0.1:4222"
NatsOption = Annotated[
    str,
    typer.Option(
        "--nats",
        envvar="BERTH_NATS",
        help="The NATS server's URL; a cluster's servers comma-separated (fails over).",
    ),
]
ClientNatsOption = Annotated[
    str | None,
    typer.Option(
        "--nats",
        envvar="BERTH_NATS",
        help="The NATS server's URL; a cluster's servers comma-separated (fails over). "
        "Default: the berth up cluster's (its api.json gives the URL, credentials and TLS "
        "files), else " + DEFAULT_URL + ".",
        show_default=False,
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
HttpPublicOption = Annotated[
    bool,
    typer.Option("--http-public", help="Allow --http on a non-loopback address."),
]
OtlpOption = Annotated[
    str | None,
    typer.Option(
        "--otlp",
        help="Send traces to this OTLP/HTTP collector, e.g. http://127.0.0.1:4318 "
        "(default: $OTEL_EXPORTER_OTLP_ENDPOINT; neither: tracing off).",
    ),
]
PolicyOption = Annotated[
    str,
    typer.Option(
        help="The placement policy: seed (the seed's ordering), berth (mounted and cached "
        "layer bytes, room priced by scarcity), kube, binpack, spread or random.",
    ),
]

NODE_GONE_AFTER_HELP = (
    "Seconds a workload's node may stay unreachable and out of the cluster before the API "
    "declares it gone: its workloads lost, restartable ones placed again"
)
"""``--node-gone-after``'s help (``scheduler``, ``up``), without its ending."""


def load_credentials(path: Path | None) -> Credentials | None:
    """The credentials of ``--creds FILE``; ``None`` without it."""
    if path is None:
        return None
    from berth.nats.connection import Credentials

    return Credentials.load(path)


def client_tls(ca: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The client TLS context of ``--tls-ca``/``--tls-cert``/``--tls-key`` (all or none,
    checked: :meth:`berth.pki.TlsFiles.from_flags`); ``None`` without them."""
    from berth.pki import TlsFiles

    files = TlsFiles.from_flags(ca, cert, key)
    return None if files is None else files.client_context()


def configure_logging() -> None:
    """A service's log: INFO and up, timestamped, on stderr."""
    import logging

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def checked_policy(name: str) -> str:
    """``name`` when it names a registered policy, else ``Invalid`` naming ``--policy``."""
    from berth.scheduler.policy.registry import policy_name

    return policy_name(name, field="--policy")


def checked_duration(duration: float | None) -> float | None:
    """``--duration``: a finite period (1 ms to a year), or ``None`` for "until ^C"."""
    if duration is None:
        return None
    from berth.model import INTERVAL_RULE

    return INTERVAL_RULE(duration, "--duration")


def parse_layer_flag(text: str) -> Layer:
    """``--layer ID:SIZE`` (``sha256:abc…:12MiB`` — the size is after the last colon)."""
    from berth.model import Layer
    from berth.validation import fields_as, shown

    layer_id, sep, size = text.rpartition(":")
    if not sep:
        raise Invalid(f"expected ID:SIZE, got {shown(text)}", field="--layer")
    with fields_as({"id": "--layer", "size": "--layer"}):
        return Layer(id=layer_id, size=size)


def request_from_flags(
    namespace: str,
    name: str,
    replica: int,
    platform: list[str] | None,
    instance: str | None,
    layer: list[str] | None,
) -> Request:
    """The request of ``--namespace``, ``--name``, ``--replica``, ``--platform``, ``--instance``
    and ``--layer`` (``schedule``, ``place``); the caller names the fields as flags."""
    from berth.model import Request

    return Request(
        namespace=namespace,
        name=name,
        replica=replica,
        platforms=tuple(platform or ()),
        spec=instance,
        layers=tuple(parse_layer_flag(text) for text in layer or ()),
    )


# -- the HTTP API's commands: flags, the client, output --------------------------------------------
MAX_PIPED_WIDTH = 1000
"""The widest a table printed to a pipe or a file gets (a long command is folded there)."""

ApiOption = Annotated[
    str | None,
    typer.Option(
        "--api", envvar="BERTH_API", help="The API's URL (default: $BERTH_HOME/api.json)."
    ),
]
TokenOption = Annotated[
    str | None, typer.Option("--token", envvar="BERTH_TOKEN", help="The API's bearer token.")
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print the API's answer as one JSON document.")
]
GraceOption = Annotated[
    float, typer.Option("--grace", help="Seconds a workload gets between SIGTERM and SIGKILL.")
]


def checked_grace(grace: float) -> float:
    """``--grace``: seconds, by the runtime's own bound on a stop's grace
    (:data:`~berth.node.runtime.port.StopGrace`); ``Invalid`` naming ``--grace`` otherwise."""
    from berth.node.runtime.port import configured_grace

    return configured_grace(grace, field="--grace")


@contextmanager
def api_client(api: str | None, token: str | None) -> Iterator[ApiClient]:
    from berth.api.client import ApiClient, locate

    with ApiClient(locate(api, token)) as client:
        yield client


def ask_api(
    api: str | None,
    token: str | None,
    as_json: bool,
    call: Callable[[ApiClient], T],
    fields: AbstractContextManager[None] | None = None,
) -> T | None:
    """``call``'s answer from the API, ``fields`` renaming its errors' fields to the flags
    (:func:`~berth.validation.fields_as`); with ``--json`` it is printed as one JSON document
    instead and ``None`` returned: the command has nothing more to print."""
    with api_client(api, token) as client, fields or nullcontext():
        answer = call(client)
    if as_json:
        print_json(answer)
        return None
    return answer


def print_json(document: BaseModel | Mapping[str, Any]) -> None:
    from pydantic import BaseModel

    data = document.model_dump(mode="json") if isinstance(document, BaseModel) else document
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


def show_table(table: Table, whole: tuple[str, ...] = ()) -> None:
    """A table on a terminal fits the terminal, except the ``whole`` columns (names, ids),
    which are never shortened; piped or captured, no column is cut to 80 characters (a node
    name or an id shortened to ``n…`` would be useless to ``grep``)."""
    from rich.measure import Measurement

    for column in table.columns:
        if column.header in whole:
            column.no_wrap = True
            column.min_width = max(len(str(cell)) for cell in [column.header, *column.cells])
        else:
            column.overflow = "fold"  # a narrow terminal folds a value, never drops its end
    if console.is_terminal:
        console.print(table)
        return
    widest = Measurement.get(console, console.options.update_width(MAX_PIPED_WIDTH), table)
    Console(file=console.file, width=max(widest.maximum, console.width)).print(table)


def size_text(value: int | None) -> str:
    from berth.units import format_information

    return "-" if value is None else format_information(value)


def counted(number: int, noun: str) -> str:
    """``1 node``, ``3 nodes``."""
    return f"{number} {noun}{'s' if number != 1 else ''}"


def say(text: str, *, soft_wrap: bool = True) -> None:
    """One line of plain text on stdout: API strings in it are never read as rich markup."""
    console.print(text, highlight=False, markup=False, soft_wrap=soft_wrap)
