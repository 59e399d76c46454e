"""The operator's commands: ``berth run / ps / stop / nodes / explain / cordon / uncordon /
drain / images``, each one call (or a few) to the HTTP API through :mod:`berth.api.client`.

:func:`register` adds them to a typer app (berth's own in :mod:`berth.cli`).  They are the
kubectl/nomad side of berth: lists are rich tables, a drain shows its progress while the
server stops the node's workloads and then a table of what happened to each, and ``--json``
on every command prints the API's answer as one JSON document on stdout instead (for
scripts; errors still go to stderr).  The API is found as :func:`berth.api.client.locate`
says: ``--api``/``$BERTH_API``, ``--token``/``$BERTH_TOKEN``, else the ``$BERTH_HOME/api.json``
that ``berth up`` writes.

What they are not: a second scheduler or validator.  The server checks every request and
answers ``application/problem+json``; these commands only rename a problem's field to the flag
the user typed (``type`` → ``--type``) and let berth's command group print it as its one
``error:`` line.  Only what never reaches the server is checked here (``--layer ID:SIZE``,
``--env KEY=VALUE``, ``--grace``, a missing command, a NODE or ID that is no name).  Every
string from the API is printed as text: rich markup in a name or a command (``[red]``,
``[/]``) is escaped, never interpreted.
"""

from __future__ import annotations

import json
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from berth.api.client import ApiClient, locate
from berth.cli.cluster import parse_layer_flag
from berth.defaults import API_STOP_GRACE_S
from berth.errors import Invalid
from berth.model import NAME_RULE, ReschedulePolicy, RestartPolicy
from berth.node.runtime.port import StopGrace
from berth.registry.port import LIVE_STATES
from berth.units import format_bandwidth, format_information
from berth.validation import Rule, fields_as, shown

__all__ = ["register"]

console = Console()
progress_console = Console(stderr=True)

T = TypeVar("T")

_GRACE: Rule[float] = Rule(StopGrace)  # the runtime's own bound on a stop's grace
MAX_PIPED_WIDTH = 1000
"""The widest a table printed to a pipe or a file gets (a long command is folded there)."""
DRAIN_POLL_S = 0.5
"""How often ``berth drain`` looks at the node's workloads while the server drains it."""
DRAIN_MARGIN_S = 60.0
"""A drain may take its grace period per workload; this much more before giving up."""

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
NodeArgument = Annotated[str, typer.Argument(metavar="NODE", help="The node's name.")]
GraceOption = Annotated[
    float, typer.Option("--grace", help="Seconds a workload gets between SIGTERM and SIGKILL.")
]

# What the API calls a field → what the user typed.
_RESTART_FLAGS = {
    "mode": "--restart",
    "attempts": "--restart-attempts",
    "interval_s": "--restart-interval",
    "delay_s": "--restart-delay",
    "max_delay_s": "--restart-max-delay",
}

_RUN_FLAGS = {
    "namespace": "--namespace",
    "name": "--name",
    "replica": "--replica",
    "image": "IMAGE",
    "type": "--type",
    "spec": "--type",
    "platforms": "--platform",
    "command": "CMD",
    "env": "--env",
    "layers": "IMAGE",
}
_SPREAD_FLAGS = {
    "spread.label": "--spread",
    "spread.hard": "--spread-hard",
    "spread.max_skew": "--max-skew",
}
"""A spread's own fields, which ``_RUN_FLAGS``' first-part mapping cannot tell apart."""
PER_NODE = "node"
"""``--spread node``: at most one replica per node (any other value names a node label)."""
_PS_FLAGS = {"namespace": "--namespace", "node": "--node", "state": "--state"}
_IMAGE_FLAGS = {"name": "NAME", "platform": "--platform", "layers": "--layer", "path": "PATH"}


@contextmanager
def _client(api: str | None, token: str | None) -> Iterator[ApiClient]:
    with ApiClient(locate(api, token)) as client:
        yield client


def _print_json(document: BaseModel | Mapping[str, Any]) -> None:
    data = document.model_dump(mode="json") if isinstance(document, BaseModel) else document
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


def _show(table: Table, whole: tuple[str, ...] = ()) -> None:
    """A table on a terminal fits the terminal, except the ``whole`` columns (names, ids),
    which are never shortened; piped or captured, no column is cut to 80 characters (a node
    name or an id shortened to ``n…`` would be useless to ``grep``)."""
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


def _size(value: int | None) -> str:
    return "-" if value is None else format_information(value)


def _parse_env(items: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise Invalid(f"expected KEY=VALUE, got {shown(item)}", field="--env")
        env[key] = value
    return env


SpreadOption = Annotated[
    str | None,
    typer.Option(
        "--spread",
        metavar="node|LABEL",
        help="Spread the function's replicas: `node` (at most one per node) or a node "
        "label (e.g. zone: across its values).",
    ),
]
SpreadHardOption = Annotated[
    bool | None,
    typer.Option(
        "--spread-hard/--spread-soft",
        help="Hard: refuse rather than break the spread; soft (the default with --spread): "
        "break it only when no node keeps it.",
        show_default=False,
    ),
]
MaxSkewOption = Annotated[
    int | None,
    typer.Option(
        "--max-skew",
        help="With --spread LABEL: how many replicas one value may be ahead of the least "
        "loaded one (default 1).",
    ),
]


def _spread(spread: str | None, hard: bool | None, max_skew: int | None) -> dict[str, Any] | None:
    """The request's ``spread`` from the flags (the API checks the values and names the
    field; ``spread.max_skew`` comes back as ``--max-skew``, see ``_flags``)."""
    if spread is None:
        for given, flag in (
            (hard, "--spread-hard" if hard else "--spread-soft"),
            (max_skew, "--max-skew"),
        ):
            if given is not None:
                raise Invalid(
                    "applies to a spread only: give --spread node or --spread LABEL too", field=flag
                )
        return None
    body: dict[str, Any] = {"hard": bool(hard)}
    if spread != PER_NODE:
        body["label"] = spread
    if max_skew is not None:
        body["max_skew"] = max_skew
    return body


@contextmanager
def _flags(names: Mapping[str, str]) -> Iterator[None]:
    """``fields_as(names)``, a spread's fields (``spread.max_skew``) first by their whole
    name (``--max-skew``), since ``fields_as`` maps by the first part only."""
    with fields_as(names):
        try:
            yield
        except Invalid as error:
            if error.field not in _SPREAD_FLAGS:
                raise
            raise Invalid(error.message, field=_SPREAD_FLAGS[error.field]) from None


def _request_body(
    image: str,
    type_: str,
    platforms: list[str] | None,
    namespace: str,
    name: str | None,
    spread: dict[str, Any] | None,
) -> dict[str, Any]:
    """What ``berth run`` and ``berth explain`` both ask about: the workload's identity, image,
    type, platforms and spread (``run`` adds its replica, command, env and restartability)."""
    body: dict[str, Any] = {
        "namespace": namespace,
        "name": name or _default_name(image),
        "image": image,
        "type": type_,
    }
    if platforms:
        body["platforms"] = list(platforms)
    if spread is not None:
        body["spread"] = spread
    return body


def _default_name(image: str) -> str:
    """A workload name from an image reference: ``docker.io/library/redis:7`` → ``redis``."""
    last = image.rsplit("/", 1)[-1]
    return last.split("@", 1)[0].split(":", 1)[0] or image


def _count(number: int, noun: str) -> str:
    """``1 node``, ``3 nodes``."""
    return f"{number} {noun}{'s' if number != 1 else ''}"


def _say(text: str, *, soft_wrap: bool = True) -> None:
    """One line of plain text on stdout: API strings in it are never read as rich markup."""
    console.print(text, highlight=False, markup=False, soft_wrap=soft_wrap)


def _pct(used: float, total: float) -> str:
    return f"{100 * used / total:.0f}%" if total > 0 else "-"


# -- workloads -------------------------------------------------------------------------------
def run(
    image: Annotated[
        str, typer.Argument(metavar="IMAGE", help="A registered image (see `berth images`).")
    ],
    command: Annotated[
        list[str] | None, typer.Argument(metavar="-- CMD", help="The workload's command.")
    ] = None,
    type_: Annotated[
        str, typer.Option("--type", help="Instance type: micro, milli, centi, deci, base, …")
    ] = "micro",
    platform: Annotated[
        list[str] | None,
        typer.Option(help="A platform the image provides (repeatable; default: the image's)."),
    ] = None,
    namespace: Annotated[str, typer.Option(help="The workload's namespace.")] = "default",
    name: Annotated[
        str | None, typer.Option(help="The workload's name (default: from the image).")
    ] = None,
    replica: Annotated[int, typer.Option(help="The replica index (>= 0).")] = 0,
    env: Annotated[
        list[str] | None, typer.Option(help="An environment variable KEY=VALUE (repeatable).")
    ] = None,
    restartable: Annotated[
        bool,
        typer.Option(
            "--restartable",
            help="Place it again elsewhere when its node is drained or lost, or its restarts "
            "are exhausted (every time; --reschedule N for at most N times).",
        ),
    ] = False,
    restart: Annotated[
        str | None,
        typer.Option(
            "--restart",
            help="When its node restarts it: never (default), on-failure or always.",
        ),
    ] = None,
    restart_attempts: Annotated[
        int | None, typer.Option(help="Restarts allowed within --restart-interval.")
    ] = None,
    restart_interval: Annotated[
        float | None, typer.Option(help="The window the attempts are counted in (s).")
    ] = None,
    restart_delay: Annotated[
        float | None, typer.Option(help="The first restart's delay (s), doubling each time.")
    ] = None,
    restart_max_delay: Annotated[
        float | None, typer.Option(help="The longest delay between restarts (s).")
    ] = None,
    reschedule: Annotated[
        int | None,
        typer.Option(help="Place it again elsewhere at most N times (lost node, restarts out)."),
    ] = None,
    spread: SpreadOption = None,
    spread_hard: SpreadHardOption = None,
    max_skew: MaxSkewOption = None,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Place a workload and boot it on the chosen node."""
    if not command:
        raise Invalid("give the workload's command after --, e.g. -- sleep 60", field="CMD")
    parsed_env = _parse_env(env) if env else None
    body = _request_body(
        image, type_, platform, namespace, name, _spread(spread, spread_hard, max_skew)
    )
    body.update(replica=replica, command=list(command), restartable=restartable)
    policy = {
        "mode": restart,
        "attempts": restart_attempts,
        "interval_s": restart_interval,
        "delay_s": restart_delay,
        "max_delay_s": restart_max_delay,
    }
    if any(value is not None for value in policy.values()):
        given = {key: value for key, value in policy.items() if value is not None}
        with fields_as(_RESTART_FLAGS):
            body["restart"] = RestartPolicy.from_dict(given).model_dump(mode="json")
    if reschedule is not None:
        with fields_as({"attempts": "--reschedule"}):
            checked = ReschedulePolicy.from_dict({"attempts": reschedule})
        body["reschedule"] = checked.model_dump(mode="json")
    if parsed_env is not None:
        body["env"] = parsed_env
    with _client(api, token) as client, _flags(_RUN_FLAGS):
        workload = client.create_workload(body)
    if as_json:
        _print_json(workload)
        return
    key = f"{workload.namespace}/{workload.name}/{workload.replica}"
    _say(
        f"{workload.id} {workload.state} on {workload.node}: {key} (rank {workload.rank}, "
        f"colocated {_size(workload.colocated_bytes)}, reservation {workload.reservation_id})"
    )


def ps(
    workload_id: Annotated[
        str | None,
        typer.Argument(metavar="[ID]", help="One workload: its record and its history."),
    ] = None,
    namespace: Annotated[str | None, typer.Option(help="Only this namespace.")] = None,
    node: Annotated[str | None, typer.Option(help="Only workloads on this node.")] = None,
    state: Annotated[
        str | None,
        typer.Option(
            help="Only this state: pending, running, unknown, exited, stopped, failed or lost."
        ),
    ] = None,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """List workloads (with an ID: that one, with its history)."""
    if workload_id is not None:
        _ps_one(NAME_RULE(workload_id, "ID"), api, token, as_json)
        return
    with _client(api, token) as client, fields_as(_PS_FLAGS):
        found = client.workloads(namespace=namespace, node=node, state=state)
    if as_json:
        _print_json(found)
        return
    items = sorted(found.items, key=lambda w: (w.namespace, w.name, w.replica, w.created_at))
    table = Table(title=_count(len(items), "workload"))
    for column in ("id", "workload", "node", "state", "restarts", "image", "command", "age"):
        table.add_column(column, no_wrap=column == "state")
    now = time.time()
    for workload in items:
        state_text: str = workload.state
        if workload.exit_code is not None:
            state_text += f" ({workload.exit_code})"
        if workload.state == "unknown" and workload.unknown_since is not None:
            state_text += f" ({_age(now - workload.unknown_since)})"
        if workload.stop_requested and workload.state in LIVE_STATES:
            state_text += ", stop kept"
        if workload.replaced_by:
            state_text += f" → {workload.replaced_by}"
        table.add_row(
            *map(
                escape,
                (
                    workload.id,
                    f"{workload.namespace}/{workload.name}/{workload.replica}",
                    workload.node,
                    state_text,
                    str(workload.restarts),
                    workload.image or "-",
                    shlex.join(workload.command),
                    _age(now - workload.created_at),
                ),
            )
        )
    _show(table, whole=("id", "node"))


def _ps_one(workload_id: str, api: str | None, token: str | None, as_json: bool) -> None:
    """``berth ps ID``: one workload's record, its policies and its history."""
    with _client(api, token) as client, fields_as({"id": "ID"}):
        workload = client.workload(workload_id)
    if as_json:
        _print_json(workload)
        return
    key = f"{workload.namespace}/{workload.name}/{workload.replica}"
    state = workload.state + (f" ({workload.exit_code})" if workload.exit_code is not None else "")
    _say(f"{workload.id} {state} on {workload.node}: {key}")
    if workload.detail:
        _say(f"  detail: {workload.detail}")
    _say(f"  {workload.restart or 'restart never'}; restarts: {workload.restarts}")
    reschedule = workload.reschedule
    allowed = "unlimited" if reschedule.unlimited else str(reschedule.attempts)
    _say(f"  reschedules: {workload.reschedules} of {allowed}")
    if workload.replaced_by:
        _say(f"  replaced by {workload.replaced_by}")
    table = Table(title=_count(len(workload.history), "event"))
    for column in ("at", "event", "node", "reason"):
        table.add_column(column)
    for event in workload.history:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.at))
        table.add_row(*map(escape, (at, event.event, event.node or "-", event.reason or "")))
    _show(table, whole=("at",))


def _age(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def stop(
    workload_id: Annotated[str, typer.Argument(metavar="ID", help="The workload's id.")],
    grace: GraceOption = 10.0,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Stop a workload (SIGTERM, then SIGKILL after the grace period); stopping twice is fine."""
    grace = _GRACE(grace, "--grace")
    NAME_RULE(workload_id, "ID")
    with _client(api, token) as client, fields_as({"grace_s": "--grace", "id": "ID"}):
        workload = client.stop(workload_id, grace_s=grace)
    if as_json:
        _print_json(workload)
        return
    kept = (
        "; the stop is kept and delivered when its node answers"
        if workload.stop_requested and workload.state in LIVE_STATES
        else ""
    )
    _say(
        f"{workload.id} {workload.state}: {workload.namespace}/{workload.name}/"
        f"{workload.replica} on {workload.node}{kept}"
    )


# -- placement questions ---------------------------------------------------------------------
def explain(
    image: Annotated[
        str, typer.Argument(metavar="IMAGE", help="A registered image (see `berth images`).")
    ],
    type_: Annotated[str, typer.Option("--type", help="Instance type, e.g. micro.")] = "micro",
    platform: Annotated[
        list[str] | None, typer.Option(help="A platform the image provides (repeatable).")
    ] = None,
    namespace: Annotated[str, typer.Option(help="The workload's namespace.")] = "default",
    name: Annotated[str | None, typer.Option(help="The workload's name.")] = None,
    spread: SpreadOption = None,
    spread_hard: SpreadHardOption = None,
    max_skew: MaxSkewOption = None,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every node's verdict for a workload, without placing it."""
    body = _request_body(
        image, type_, platform, namespace, name, _spread(spread, spread_hard, max_skew)
    )
    with _client(api, token) as client, _flags(_RUN_FLAGS):
        explanation = client.explain(body)
    if as_json:
        _print_json(explanation)
        return
    table = Table(
        title=escape(f"where {body['namespace']}/{body['name']} ({image}, {type_}) could go")
    )
    for column in ("node", "verdict", "rank", "colocated", "detail"):
        table.add_column(column, no_wrap=column != "detail")
    verdicts = sorted(
        explanation.verdicts,
        key=lambda v: (v.rank is None, v.rank if v.rank is not None else 0, v.node),
    )
    for verdict in verdicts:
        fits = verdict.verdict == "fits"
        table.add_row(
            escape(verdict.node),
            f"[{'green' if fits else 'red'}]{escape(verdict.verdict)}[/]",
            "-" if verdict.rank is None else str(verdict.rank),
            _size(verdict.colocated_bytes),
            "" if verdict.detail == verdict.verdict else escape(verdict.detail),
        )
    _show(table, whole=("node",))
    _say(explanation.summary)


# -- nodes -----------------------------------------------------------------------------------
def nodes(
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the cluster's nodes: platform, reservations, live load, cordon state."""
    with _client(api, token) as client:
        found = client.nodes()
    if as_json:
        _print_json(found)
        return
    items = sorted(found.items, key=lambda n: n.name)
    table = Table(title=_count(len(items), "node"))
    for column in ("node", "platform", "state", "mem", "disk", "cpu", "disk bw", "net bw"):
        table.add_column(column)
    table.add_column("workloads", justify="right")
    table.add_column("layers", justify="right")
    for node in items:
        table.add_row(
            escape(node.name),
            escape(node.platform),
            "[yellow]cordoned[/]" if node.cordoned else "[green]ready[/]",
            f"{_size(node.mem_reserved)} / {_size(node.mem_max)}",
            f"{_size(node.disk_reserved)} / {_size(node.disk_max)}",
            f"{_pct(node.cpu_load, 1.0)} of {node.cpu_capacity:g}",
            f"{_pct(node.disk_bw_load, node.disk_bw_ceiling)} of "
            f"{format_bandwidth(int(node.disk_bw_ceiling))}",
            f"{_pct(node.net_bw_load, node.net_bw_ceiling)} of "
            f"{format_bandwidth(int(node.net_bw_ceiling))}",
            str(node.workloads),
            str(node.layers),
        )
    _show(table, whole=("node",))


def cordon(
    node: NodeArgument,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Mark a node unschedulable: it gets no new placements; its workloads keep running."""
    NAME_RULE(node, "NODE")
    with _client(api, token) as client:
        info = client.cordon(node)
    if as_json:
        _print_json(info)
        return
    _say(
        f"{info.name} cordoned: no new placements; {_count(info.workloads, 'workload')} "
        f"keep running (berth drain {info.name} stops them)"
    )


def uncordon(
    node: NodeArgument,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make a cordoned node schedulable again."""
    NAME_RULE(node, "NODE")
    with _client(api, token) as client:
        info = client.uncordon(node)
    if as_json:
        _print_json(info)
        return
    _say(f"{info.name} uncordoned: it takes placements again", soft_wrap=False)


def drain(
    node: NodeArgument,
    grace: GraceOption = API_STOP_GRACE_S,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cordon a node, then stop its workloads (restartable ones are placed again elsewhere)."""
    grace = _GRACE(grace, "--grace")
    NAME_RULE(node, "NODE")
    location = locate(api, token)
    with ApiClient(location) as client:
        info = client.node(node)  # an unknown node is a 404 before anything changes
        before = client.workloads(node=info.name, state="running").items
        timeout = DRAIN_MARGIN_S + grace * (len(before) + 1)

        def call() -> Any:
            with ApiClient(location) as own, fields_as({"grace_s": "--grace"}):
                # its own connection: the poll below runs beside it
                return own.drain(info.name, grace_s=grace, timeout_s=timeout)

        def remaining() -> int:
            return len(client.workloads(node=info.name, state="running").items)

        if as_json or not before:  # nothing to count down
            report = call()
        else:
            report = _with_progress(call, remaining, info.name, len(before))
    if as_json:
        _print_json(report)
        return
    table = Table(title=escape(f"drained {report.node}: {_count(len(report.items), 'workload')}"))
    for column in ("workload", "outcome", "replacement", "detail"):
        table.add_column(column, no_wrap=column != "detail")
    colours = {"stopped": "green", "replaced": "cyan", "failed": "red"}
    for item in report.items:
        replacement = "-"
        if item.new_workload_id:
            replacement = f"{item.new_workload_id} on {item.new_node or '?'}"
        colour = colours.get(item.outcome, "white")
        table.add_row(
            escape(item.workload_id),
            f"[{colour}]{escape(item.outcome)}[/]",
            escape(replacement),
            escape(item.detail),
        )
    _show(table, whole=("workload",))
    failed = sum(1 for item in report.items if item.outcome == "failed")
    _say(
        f"{report.node} is cordoned and drained"
        + (f"; {_count(failed, 'workload')} failed to stop" if failed else ""),
        soft_wrap=False,
    )
    if failed:
        raise typer.Exit(1)


def _with_progress(call: Callable[[], T], remaining: Callable[[], int], node: str, total: int) -> T:
    """Run ``call`` in a thread; meanwhile show how many of ``total`` workloads are gone."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # re-raised in the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=target, name=f"drain-{node}", daemon=True)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} stopped"),
        TimeElapsedColumn(),
        console=progress_console,
        transient=True,
    ) as progress:
        task = progress.add_task(escape(f"draining {node}"), total=total)
        worker.start()
        while worker.is_alive():
            worker.join(DRAIN_POLL_S)
            if worker.is_alive():
                try:
                    left = remaining()
                except Exception:  # the poll is cosmetic; the drain's own answer decides
                    continue
                progress.update(task, completed=min(max(total - left, 0), total))
        progress.update(task, completed=total)
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value


# -- images ----------------------------------------------------------------------------------
images_app = typer.Typer(
    help="Registered images: list them (no command), add one, import an OCI layout."
)


@images_app.callback(invoke_without_command=True)
def images(
    context: typer.Context,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """List registered images (or: berth images add / import-oci)."""
    if context.invoked_subcommand is not None:
        return
    with _client(api, token) as client:
        found = client.images()
    if as_json:
        _print_json(found)
        return
    items = sorted(found.items, key=lambda image: image.name)
    table = Table(title=_count(len(items), "image"))
    for column in ("image", "platform", "layers", "size"):
        table.add_column(column, no_wrap=column != "image")
    for image in items:
        table.add_row(
            escape(image.name),
            escape(image.platform or "any"),
            str(len(image.layers)),
            _size(image.size),
        )
    _show(table, whole=("image",))


def _print_image(image: Any, verb: str) -> None:
    _say(
        f"{verb} {image.name}: {_count(len(image.layers), 'layer')}, {_size(image.size)}, "
        f"platform {image.platform or 'any'}"
    )


@images_app.command("add")
def images_add(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The image's name.")],
    layer: Annotated[
        list[str], typer.Option(help="A layer ID:SIZE, base layer first (repeatable).")
    ],
    platform: Annotated[str | None, typer.Option(help="The platform it was built for.")] = None,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register an image as its chain of layers with sizes."""
    body: dict[str, Any] = {
        "name": name,
        "layers": [parse_layer_flag(text).model_dump() for text in layer],
    }
    if platform is not None:
        body["platform"] = platform
    with _client(api, token) as client, fields_as(_IMAGE_FLAGS):
        image = client.add_image(body)
    if as_json:
        _print_json(image)
        return
    _print_image(image, "registered")


@images_app.command("import-oci")
def images_import_oci(
    path: Annotated[
        Path, typer.Argument(metavar="PATH", help="An OCI image layout directory (index.json…).")
    ],
    name: Annotated[str | None, typer.Option(help="The name to register it under.")] = None,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register an image read from a local OCI image layout (on the API's machine)."""
    with _client(api, token) as client, fields_as(_IMAGE_FLAGS):
        image = client.import_oci(str(path.absolute()), name)
    if as_json:
        _print_json(image)
        return
    _print_image(image, "imported")


def register(app: typer.Typer) -> None:
    """Add the operator's commands to ``app``."""
    for command in (run, ps, stop, nodes, explain, cordon, uncordon, drain):
        app.command(command.__name__)(command)
    app.add_typer(images_app, name="images")
