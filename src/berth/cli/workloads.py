"""``berth run``, ``berth ps``, ``berth stop``, ``berth explain``: workloads through the HTTP API.

The kubectl/nomad side of berth for one workload: place and boot it, list them (or show one
with its history), stop one, and ask every node's verdict for one without placing it.  Each is
one call (or a few) to the API through :mod:`berth.api.client`; lists are rich tables and
``--json`` prints the API's answer as one JSON document on stdout instead (for scripts; errors
still go to stderr).  ``run`` and ``explain`` ask about the same request, so what builds it —
the workload's identity, image, type, platforms and spread, and the renaming of the API's
fields to the flags the user typed — lives here, beside them.

What they are not: a second scheduler or validator.  The server checks every request and
answers ``application/problem+json``; these commands only rename a problem's field to the flag
the user typed (``type`` → ``--type``) and let berth's command group print it as its one
``error:`` line.  Only what never reaches the server is checked here (``--env KEY=VALUE``,
``--grace``, a missing command, an ID that is no name).  Every string from the API is printed
as text: rich markup in a name or a command (``[red]``, ``[/]``) is escaped, never interpreted.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
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
    say,
    show_table,
    size_text,
)
from berth.errors import Invalid

# What a command needs when it runs (the models, the API's client, the registry's states) is
# imported in its body: ``--help`` loads this module and its flags only (berth.cli.common).
if TYPE_CHECKING:
    from berth.api.client import ApiClient
    from berth.boot import WorkloadLogs

FOLLOW_EVERY_S = 0.5
"""How often ``berth logs --follow`` asks for new output."""

__all__ = ["PER_NODE", "explain", "ps", "run", "stop"]

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


def _parse_env(items: list[str]) -> dict[str, str]:
    from berth.validation import shown

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
    from berth.validation import fields_as

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


def run(
    image: Annotated[
        str, typer.Argument(metavar="IMAGE", help="A registered image (see `berth images`).")
    ],
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="-- CMD",
            help="The workload's command (default: its image's Cmd; the process runtime needs "
            "one).",
        ),
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
    from berth.model import ReschedulePolicy, RestartPolicy
    from berth.validation import fields_as

    parsed_env = _parse_env(env) if env else None
    body = _request_body(
        image, type_, platform, namespace, name, _spread(spread, spread_hard, max_skew)
    )
    body.update(replica=replica, command=list(command or ()), restartable=restartable)
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
    workload = ask_api(
        api, token, as_json, lambda client: client.create_workload(body), _flags(_RUN_FLAGS)
    )
    if workload is None:
        return
    key = f"{workload.namespace}/{workload.name}/{workload.replica}"
    say(
        f"{workload.id} {workload.state} on {workload.node}: {key} (rank {workload.rank}, "
        f"colocated {size_text(workload.colocated_bytes)}, reservation {workload.reservation_id})"
    )


def ps(
    workload_id: Annotated[
        str | None,
        typer.Argument(
            metavar="[ID]",
            help="One workload (its id, or NAMESPACE/NAME\\[/REPLICA]): its record and history.",
        ),
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
    from berth.registry.port import LIVE_STATES
    from berth.validation import fields_as

    if workload_id is not None:
        _ps_one(_checked_ref(workload_id), api, token, as_json)
        return

    def listed(client: Any) -> Any:
        found = client.workloads(namespace=namespace, node=node, state=state)
        if node is not None and not found.items:  # a typo, or a node that holds nothing?
            known = sorted(item.name for item in client.nodes().items)
            if node not in known:
                raise Invalid(
                    f"no node {node!r} in the cluster (its nodes: {', '.join(known) or 'none'})",
                    field="--node",
                )
        return found

    found = ask_api(api, token, as_json, listed, fields_as(_PS_FLAGS))
    if found is None:
        return
    items = sorted(found.items, key=lambda w: (w.namespace, w.name, w.replica, w.created_at))
    table = Table(title=counted(len(items), "workload"))
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
                    shlex.join(workload.command) or "(the image's)",
                    _age(now - workload.created_at),
                ),
            )
        )
    show_table(table, whole=("id", "node"))
    if not items:
        filtered = namespace is not None or node is not None or state is not None
        say(
            "none matches the filters (berth ps alone lists every one)"
            if filtered
            else "run one: berth run IMAGE --type micro -- CMD (berth images lists the images)"
        )


def _checked_ref(ref: str) -> str:
    """``ref`` if it is a workload id or ``NAMESPACE/NAME[/REPLICA]``; ``Invalid`` naming
    ``ID`` otherwise (before anything is sent)."""
    from berth.model import NAME_RULE
    from berth.validation import shown

    if "/" not in ref:
        return NAME_RULE(ref, "ID")
    parts = ref.split("/")
    if len(parts) not in (2, 3) or (len(parts) == 3 and not parts[2].isdigit()):
        raise Invalid(f"expected an id or NAMESPACE/NAME[/REPLICA], got {shown(ref)}", field="ID")
    for part in parts[:2]:
        NAME_RULE(part, "ID")
    return ref


def _resolved(client: ApiClient, ref: str) -> str:
    """The id ``ref`` names: an id as it is, or ``NAMESPACE/NAME/REPLICA`` (``/REPLICA``
    optional: 0) — the one live workload of that identity, else its newest record;
    ``Invalid`` naming ``ID`` when none has it."""
    from berth.registry.port import LIVE_STATES

    if "/" not in ref:
        return ref
    parts = ref.split("/")
    namespace, name = parts[0], parts[1]
    replica = int(parts[2]) if len(parts) == 3 else 0
    found = [
        workload
        for workload in client.workloads(namespace=namespace).items
        if workload.name == name and workload.replica == replica
    ]
    if not found:
        raise Invalid(f"no workload {namespace}/{name}/{replica}", field="ID")
    live = [workload for workload in found if workload.state in LIVE_STATES]
    return max(live or found, key=lambda workload: workload.created_at).id


def _ps_one(workload_id: str, api: str | None, token: str | None, as_json: bool) -> None:
    """``berth ps ID``: one workload's record, its policies and its history."""
    from berth.validation import fields_as

    workload = ask_api(
        api,
        token,
        as_json,
        lambda client: client.workload(_resolved(client, workload_id)),
        fields_as({"id": "ID"}),
    )
    if workload is None:
        return
    key = f"{workload.namespace}/{workload.name}/{workload.replica}"
    state = workload.state + (f" ({workload.exit_code})" if workload.exit_code is not None else "")
    say(f"{workload.id} {state} on {workload.node}: {key}")
    if workload.detail:
        say(f"  detail: {workload.detail}")
    say(f"  {workload.restart or 'restart never'}; restarts: {workload.restarts}")
    reschedule = workload.reschedule
    allowed = "unlimited" if reschedule.unlimited else str(reschedule.attempts)
    say(f"  reschedules: {workload.reschedules} of {allowed}")
    if workload.replaced_by:
        say(f"  replaced by {workload.replaced_by}")
    table = Table(title=counted(len(workload.history), "event"))
    for column in ("at", "event", "node", "reason"):
        table.add_column(column)
    for event in workload.history:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.at))
        table.add_row(*map(escape, (at, event.event, event.node or "-", event.reason or "")))
    show_table(table, whole=("at",))


def _age(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def stop(
    workload_id: Annotated[
        str, typer.Argument(metavar="ID", help="The workload's id, or NAMESPACE/NAME\\[/REPLICA].")
    ],
    grace: GraceOption = 10.0,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Stop a workload (SIGTERM, then SIGKILL after the grace period); stopping twice is fine."""
    from berth.registry.port import LIVE_STATES
    from berth.validation import fields_as

    grace = checked_grace(grace)
    _checked_ref(workload_id)
    workload = ask_api(
        api,
        token,
        as_json,
        lambda client: client.stop(_resolved(client, workload_id), grace_s=grace),
        fields_as({"grace_s": "--grace", "id": "ID"}),
    )
    if workload is None:
        return
    kept = (
        "; the stop is kept and delivered when its node answers"
        if workload.stop_requested and workload.state in LIVE_STATES
        else ""
    )
    say(
        f"{workload.id} {workload.state}: {workload.namespace}/{workload.name}/"
        f"{workload.replica} on {workload.node}{kept}"
    )


def logs(
    workload_id: Annotated[
        str, typer.Argument(metavar="ID", help="The workload's id, or NAMESPACE/NAME\\[/REPLICA].")
    ],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new output until it ends.")
    ] = False,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Print a workload's output (stdout and stderr), as its node keeps it."""
    from berth.registry.port import LIVE_STATES
    from berth.validation import fields_as

    _checked_ref(workload_id)
    state: dict[str, Any] = {"id": None, "offset": 0}

    def read(client: ApiClient) -> WorkloadLogs:
        if state["id"] is None:
            state["id"] = _resolved(client, workload_id)
        return client.logs(state["id"], state["offset"])

    while True:
        piece = ask_api(api, token, False, read, fields_as({"id": "ID"}))
        if piece is None:
            return
        if not piece.kept:
            say(f"{state['id']}: its node keeps no output (its runtime has no log directory)")
            return
        if piece.text:
            sys.stdout.write(piece.text)
            sys.stdout.flush()
        moved = piece.next_offset > state["offset"]
        state["offset"] = piece.next_offset
        if moved and piece.next_offset < piece.size:
            continue  # more is there already
        if not follow:
            return
        workload = ask_api(api, token, False, lambda client: client.workload(state["id"]))
        if workload is None or (workload.state not in LIVE_STATES and not moved):
            return
        time.sleep(FOLLOW_EVERY_S)


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
    explanation = ask_api(
        api, token, as_json, lambda client: client.explain(body), _flags(_RUN_FLAGS)
    )
    if explanation is None:
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
            size_text(verdict.colocated_bytes),
            "" if verdict.detail == verdict.verdict else escape(verdict.detail),
        )
    show_table(table, whole=("node",))
    say(explanation.summary)
