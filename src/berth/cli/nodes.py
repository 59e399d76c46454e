"""``berth nodes``, ``berth cordon``, ``berth uncordon``, ``berth drain``: the cluster's nodes.

List the nodes (platform, reservations, live load, cordon state), take one out of placement
and put it back, and drain one: the server cordons it and stops its workloads (restartable ones
are placed again elsewhere) while this shows its progress on stderr, then a table of what
happened to each.  Each is a call (or a few) to the HTTP API through :mod:`berth.api.client`;
``--json`` prints the API's answer as one JSON document instead.  A NODE that is no name and
``--grace`` are checked here, everything else by the server.  The drain's progress (a thread
beside the call, polling the node's workloads) and its bounds live here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from berth.cli.common import (
    ApiOption,
    GraceOption,
    JsonOption,
    TokenOption,
    ask_api,
    checked_grace,
    counted,
    print_json,
    say,
    show_table,
    size_text,
)
from berth.defaults import API_STOP_GRACE_S

# What a command needs when it runs (the API's client and schemas, the models) is imported in
# its body: ``--help`` loads this module and its flags only (berth.cli.common).
if TYPE_CHECKING:
    from berth.api.schemas import NodeInfo

__all__ = ["DRAIN_MARGIN_S", "DRAIN_POLL_S", "cordon", "drain", "nodes", "uncordon"]

progress_console = Console(stderr=True)

T = TypeVar("T")

DRAIN_POLL_S = 0.5
"""How often ``berth drain`` looks at the node's workloads while the server drains it."""
DRAIN_MARGIN_S = 60.0
"""A drain may take its grace period per workload; this much more before giving up."""

NodeArgument = Annotated[str, typer.Argument(metavar="NODE", help="The node's name.")]


def _pct(used: float, total: float) -> str:
    return f"{100 * used / total:.0f}%" if total > 0 else "-"


def nodes(
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the cluster's nodes: platform, reservations, live load, cordon state."""
    from berth.units import format_bandwidth

    found = ask_api(api, token, as_json, lambda client: client.nodes())
    if found is None:
        return
    items = sorted(found.items, key=lambda n: n.name)
    table = Table(title=counted(len(items), "node"))
    for column in ("node", "platform", "state", "mem", "disk", "cpu", "disk bw", "net bw"):
        table.add_column(column)
    table.add_column("workloads", justify="right")
    table.add_column("layers", justify="right")
    for node in items:
        table.add_row(
            escape(node.name),
            escape(node.platform),
            "[yellow]cordoned[/]" if node.cordoned else "[green]ready[/]",
            f"{size_text(node.mem_reserved)} / {size_text(node.mem_max)}",
            f"{size_text(node.disk_reserved)} / {size_text(node.disk_max)}",
            f"{_pct(node.cpu_load, 1.0)} of {node.cpu_capacity:g}",
            f"{_pct(node.disk_bw_load, node.disk_bw_ceiling)} of "
            f"{format_bandwidth(int(node.disk_bw_ceiling))}",
            f"{_pct(node.net_bw_load, node.net_bw_ceiling)} of "
            f"{format_bandwidth(int(node.net_bw_ceiling))}",
            str(node.workloads),
            str(node.layers),
        )
    show_table(table, whole=("node",))


def cordon(
    node: NodeArgument,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Mark a node unschedulable: it gets no new placements; its workloads keep running."""
    info = _cordon(node, api, token, as_json, cordoned=True)
    if info is None:
        return
    say(
        f"{info.name} cordoned: no new placements; {counted(info.workloads, 'workload')} "
        f"keep running (berth drain {info.name} stops them)"
    )


def uncordon(
    node: NodeArgument,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make a cordoned node schedulable again."""
    info = _cordon(node, api, token, as_json, cordoned=False)
    if info is None:
        return
    say(f"{info.name} uncordoned: it takes placements again", soft_wrap=False)


def _cordon(
    node: str, api: str | None, token: str | None, as_json: bool, *, cordoned: bool
) -> NodeInfo | None:
    """``berth cordon`` (``cordoned``) or ``uncordon``: the node's answer, ``None`` when it is
    printed as JSON."""
    from berth.model import NAME_RULE

    NAME_RULE(node, "NODE")
    return ask_api(
        api,
        token,
        as_json,
        lambda client: client.cordon(node) if cordoned else client.uncordon(node),
    )


def drain(
    node: NodeArgument,
    grace: GraceOption = API_STOP_GRACE_S,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cordon a node, then stop its workloads (restartable ones are placed again elsewhere)."""
    from berth.api.client import ApiClient, locate
    from berth.model import NAME_RULE
    from berth.validation import fields_as

    grace = checked_grace(grace)
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
        print_json(report)
        return
    table = Table(title=escape(f"drained {report.node}: {counted(len(report.items), 'workload')}"))
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
    show_table(table, whole=("workload",))
    failed = sum(1 for item in report.items if item.outcome == "failed")
    say(
        f"{report.node} is cordoned and drained"
        + (f"; {counted(failed, 'workload')} failed to stop" if failed else ""),
        soft_wrap=False,
    )
    if failed:
        raise typer.Exit(1)


def _with_progress(call: Callable[[], T], remaining: Callable[[], int], node: str, total: int) -> T:
    """Run ``call`` in a thread; meanwhile show how many of ``total`` workloads are gone."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

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
