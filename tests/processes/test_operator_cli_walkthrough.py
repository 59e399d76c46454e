"""The operator's walk-through, as ``docs/operator.md`` shows it, against a real cluster.

``berth up`` runs as its own process (nats-server, three agents with the fake runtime, a
scheduler serving the HTTP API on a free loopback port) with ``$BERTH_HOME`` in a temporary
directory; every ``berth`` command after it is a separate process that finds the API through
the ``api.json`` ``berth up`` wrote there — no ``--api``, no ``--token``.  The walk: nodes,
register an image, run two workloads (one restartable), list them, explain, drain the node
they landed on (the plain one stopped, the restartable one placed again elsewhere), stop,
uncordon; tables for people and ``--json`` documents for scripts; errors as one line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from berth.cli.main import app
from berth.oci import ImageSpec, file, write_layout

pytestmark = pytest.mark.slow  # starts a whole berth up

NODES = ("node-00", "node-01", "node-02")
START_TIMEOUT_S = 120.0


@dataclass
class Up:
    """A running ``berth up``: its process, its ``$BERTH_HOME`` and its output so far."""

    process: subprocess.Popen[bytes]
    home: Path
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def environment(home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("BERTH_")}
    return {**env, "BERTH_HOME": str(home), "COLUMNS": "200", "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    home = tmp_path_factory.mktemp("berth-home")
    log = home / "up.log"
    args = ["up", "--nodes", "3", "--runtime", "fake", "--heartbeat", "0.5"]
    args += ["--http", "127.0.0.1:0"]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "berth.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment(home),
            start_new_session=True,
        )
    running = Up(process, home, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ctrl-C stops everything" not in running.output():
            assert process.poll() is None, f"berth up exited: {running.output()}"
            assert time.monotonic() < deadline, f"berth up not ready: {running.output()}"
            time.sleep(0.1)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def berth(
    up: Up, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``berth ARGS`` in this process (the app the console script runs: a new process per
    command costs more than a second on a busy 2-core machine); ``shell`` runs it as one."""
    overrides: dict[str, str | None] = {key: None for key in os.environ if key.startswith("BERTH_")}
    overrides |= {"BERTH_HOME": str(up.home), **(env or {})}
    result = CliRunner().invoke(app, list(args), env=overrides)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def shell(up: Up, *args: str) -> subprocess.CompletedProcess[str]:
    """``berth ARGS`` as its own process, as typed in a shell."""
    return subprocess.run(
        [sys.executable, "-m", "berth.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(up.home),
    )


def ok(up: Up, *args: str) -> str:
    result = berth(up, *args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stdout


def document(up: Up, *args: str) -> Any:
    """``berth ARGS --json``: exactly one JSON document on stdout."""
    at = args.index("--") if "--" in args else len(args)  # after --, it is the command's
    return json.loads(ok(up, *args[:at], "--json", *args[at:]))


def error_line(up: Up, *args: str, env: dict[str, str] | None = None) -> str:
    result = berth(up, *args, env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (args, result.stdout, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_berth_up_tells_where_the_api_and_dashboard_are(up: Up) -> None:
    written = json.loads((up.home / "api.json").read_text())
    # TLS is the default: HTTPS, the cluster's CA named in the file and printed
    assert written["url"].startswith("https://127.0.0.1:") and len(written["token"]) >= 16
    output = up.output()
    assert f"HTTPS CA:          {written['ca']}  (curl --cacert" in output
    assert f"dashboard:         {written['url']}/?token={written['token']}" in output
    assert f"export BERTH_API={written['url']}" in output


def test_the_walkthrough(up: Up) -> None:
    # -- the nodes (once from a shell, as typed) ---------------------------------------------
    shown = shell(up, "nodes")
    assert shown.returncode == 0 and not shown.stderr, shown
    assert all(f"│ {name} " in shown.stdout for name in NODES), shown.stdout
    table = ok(up, "nodes")
    assert "3 nodes" in table and all(name in table for name in NODES), table
    nodes = document(up, "nodes")
    assert sorted(node["name"] for node in nodes["items"]) == list(NODES)
    assert not any(node["cordoned"] for node in nodes["items"])

    # -- nothing yet: each empty list says what to do, as does an unknown image --------------
    assert "register one: berth images add NAME" in ok(up, "images")
    assert "run one: berth run IMAGE" in ok(up, "ps")
    assert "none matches the filters" in ok(up, "ps", "--node", "node-00")
    typo = berth(up, "ps", "--node", "node-0")
    assert typo.returncode == 2 and typo.stderr.strip() == (
        "error: --node: no node 'node-0' in the cluster (its nodes: node-00, node-01, node-02)"
    ), typo
    unknown = berth(up, "run", "hello", "--", "true")
    assert unknown.returncode == 2 and "berth images add" in unknown.stderr, unknown

    # -- an image, then two workloads of it --------------------------------------------------
    added = ok(
        up, "images", "add", "hello", "--layer", "sha256:1111:28MiB", "--layer", "sha256:2222:5MiB"
    )
    assert added.strip() == "registered hello: 2 layers, 33MiB, platform any", added
    assert [image["name"] for image in document(up, "images")["items"]] == ["hello"]
    again = ok(up, "images", "add", "other", "--layer", "sha256:3333:1MiB")
    assert again.strip() == "registered other: 1 layer, 1MiB, platform any", again
    again = ok(up, "images", "add", "other", "--layer", "sha256:4444:2MiB")  # never silently
    assert again.splitlines() == [
        "registered, replacing the image named other: 1 layer, 2MiB, platform any",
        "  (it was 1 layer, 1MiB, platform any; workloads already running keep their layers)",
    ], again
    assert "hello" in ok(up, "images")

    line = ok(up, "run", "hello", "--type", "micro", "--", "sleep", "600")
    found = re.match(
        r"(w-[0-9a-f]+) running on (node-\d\d): default/hello/0 \(rank \d+, colocated ", line
    )
    assert found, line
    plain, node = found.groups()
    web = document(
        up,
        "run",
        "hello",
        "--name",
        "web",
        "--type",
        "micro",
        "--restartable",
        "--restart",
        "always",
        "--",
        "python",
        "-m",
        "http.server",
    )
    assert web["state"] == "running" and web["restartable"] and web["image"] == "hello"
    assert web["command"] == ["python", "-m", "http.server"]
    assert web["node"] == node  # its layers are there already: the ranking prefers that node
    assert web["colocated_bytes"] == 33 * 2**20

    # -- ps: a table, the JSON list, filters -------------------------------------------------
    table = ok(up, "ps")
    assert "2 workloads" in table and plain in table and web["id"] in table, table
    assert "python -m http.server" in table and "restarts" in table
    one = ok(up, "ps", web["id"])
    assert one.startswith(f"{web['id']} running on {node}: default/web/0"), one
    assert "restart always: 3 in 600s" in one and "restarts: 0" in one, one
    assert "reschedules: 0 of unlimited" in one and "created" in one, one
    assert document(up, "ps", web["id"])["restart"]["mode"] == "always"
    listed = document(up, "ps")
    assert {item["id"] for item in listed["items"]} == {plain, web["id"]}
    assert {item["state"] for item in listed["items"]} == {"running"}
    assert (
        document(up, "ps", "--node", node)["items"]
        and not document(up, "ps", "--namespace", "elsewhere")["items"]
    )

    # -- explain: every node's verdict -------------------------------------------------------
    explained = document(up, "explain", "hello", "--type", "micro")
    assert sorted(verdict["node"] for verdict in explained["verdicts"]) == list(NODES)
    assert explained["summary"]
    assert node in ok(up, "explain", "hello", "--type", "micro")

    # -- drain the node they run on ----------------------------------------------------------
    table = ok(up, "drain", node, "--grace", "1")
    assert f"drained {node}: 2 workloads" in table, table
    assert f"{node} is cordoned and drained" in table
    rows = {row.split("│")[1].strip(): row for row in table.splitlines() if "│ w-" in row}
    assert "stopped" in rows[plain] and "replaced" in rows[web["id"]], table
    after = {item["id"]: item for item in document(up, "ps")["items"]}
    assert after[plain]["state"] == "stopped"
    replacement = after[web["id"]]["replaced_by"]
    assert replacement and after[replacement]["state"] == "running"
    assert after[replacement]["node"] != node and after[replacement]["name"] == "web"
    events = [event["event"] for event in after[web["id"]]["history"]]
    assert events == ["created", "stopped", "drained"], events
    assert after[replacement]["reschedules"] == 0  # a drain is not a failure
    assert web["id"] in after[replacement]["history"][0]["reason"]
    cordoned = {n["name"]: n["cordoned"] for n in document(up, "nodes")["items"]}
    assert cordoned == {name: name == node for name in NODES}

    # -- stop, twice (idempotent): by its identity, then by its id ---------------------------
    assert ok(up, "ps", "default/web").startswith(f"{replacement} running"), replacement
    stopped = ok(up, "stop", "default/web/0", "--grace", "1")
    assert stopped.strip().startswith(f"{replacement} stopped: default/web/0 on "), stopped
    assert document(up, "stop", replacement)["state"] == "stopped"
    assert not document(up, "ps", "--state", "running")["items"]

    # -- uncordon ----------------------------------------------------------------------------
    assert ok(up, "uncordon", node).strip() == f"{node} uncordoned: it takes placements again"
    assert not document(up, "nodes")["items"][NODES.index(node)]["cordoned"]

    # -- a node with nothing on it drains at once --------------------------------------------
    idle = next(name for name in NODES if name not in (node, after[replacement]["node"]))
    assert f"drained {idle}: 0 workloads" in ok(up, "drain", idle)
    assert ok(up, "uncordon", idle)


def test_errors_are_one_line_naming_the_flag(up: Up) -> None:
    assert "not found: no workload 'w-000000000000'" in error_line(up, "stop", "w-000000000000")
    assert error_line(up, "stop", "default/nothing/0") == "error: ID: no workload default/nothing/0"
    assert error_line(up, "stop", "a/b/c").startswith("error: ID: expected an id or NAMESPACE/")
    assert "no node 'node-99'" in error_line(up, "drain", "node-99")
    assert error_line(up, "run", "nope", "--", "true").startswith("error: IMAGE: ")
    assert error_line(up, "run", "hello", "--type", "huge", "--", "true").startswith(
        "error: --type: unknown instance type 'huge'"
    )
    line = error_line(up, "run", "hello", "--platform", "linux/s390x", "--", "true")
    assert line.startswith("error: --platform: ") and "linux/amd64" in line
    # --platform narrows an image's platform down, never replaces it (no silent override)
    ok(up, "images", "add", "armonly", "--layer", "sha256:5555:1MiB", "--platform", "linux/arm64")
    line = error_line(up, "run", "armonly", "--platform", "linux/amd64", "--", "true")
    assert line.startswith("error: --platform: image 'armonly' is built for linux/arm64"), line
    assert "not for linux/amd64" in line
    assert error_line(up, "ps", "--state", "sleeping").startswith("error: --state: must be ")
    line = error_line(up, "nodes", env={"BERTH_TOKEN": "x" * 43})
    assert "refused the token" in line and "BERTH_TOKEN" in line


def test_images_import_an_oci_layout(
    up: Up, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_layout(tmp_path / "layout", ImageSpec(layers=[[file("hello", "hi")]], cmd=("true",)))
    monkeypatch.chdir(tmp_path)  # a relative PATH is sent as an absolute one
    line = ok(up, "images", "import-oci", "layout", "--name", "from-oci")
    assert line.strip() == "imported from-oci: 1 layer, " + line.split(", ", 1)[1].strip(), line
    assert line.strip().endswith("platform linux/amd64"), line
    image = document(up, "images", "import-oci", "layout", "--name", "again")
    assert image["name"] == "again" and image["layers"][0]["id"].startswith("sha256:")
    assert {"from-oci", "again"} <= {item["name"] for item in document(up, "images")["items"]}
    line = error_line(up, "images", "import-oci", "nowhere")
    # the absolute path (the API's machine has no idea of this working directory)
    assert line.startswith("error: PATH: the OCI layout: "), line
    assert re.search(r"'/\S*/nowhere' does not exist", line), line
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    line = error_line(up, "images", "import-oci", "broken")  # what in the layout is wrong
    assert line.startswith("error: PATH: the OCI layout: index.json"), line


def test_names_and_commands_with_markup_print_as_typed(up: Up) -> None:
    # rich reads "[red]" as a style and "[/]" alone as an error: API strings are escaped
    line = ok(up, "run", "hello", "--name", "[/]odd[red]", "--", "echo", "[bold]x[/bold]", "[/]")
    assert "default/[/]odd[red]/0" in line, line
    table = ok(up, "ps", "--namespace", "default")
    assert "[/]odd[red]" in table and "echo '[bold]x[/bold]' '[/]'" in table, table


def test_run_spreads_replicas_one_per_node_then_refuses(up: Up) -> None:
    spread = ("--name", "spread-web", "--spread", "node", "--spread-hard")
    placed = [
        document(up, "run", "hello", *spread, "--replica", str(replica), "--", "sleep", "600")
        for replica in range(len(NODES))
    ]
    assert sorted(workload["node"] for workload in placed) == list(NODES), placed
    line = error_line(up, "run", "hello", *spread, "--replica", "3", "--", "sleep", "600")
    assert "hard spread (one replica per node)" in line, line
    explained = document(
        up, "explain", "hello", "--name", "spread-web", "--spread", "node", "--spread-hard"
    )
    assert {verdict["verdict"] for verdict in explained["verdicts"]} == {"spread"}, explained
    # soft (the default): the fourth replica goes beside a sibling rather than nowhere
    soft = document(
        up,
        "run",
        "hello",
        "--name",
        "spread-web",
        "--spread",
        "node",
        "--replica",
        "3",
        "--",
        "sleep",
        "600",
    )
    assert soft["node"] in NODES
    # the same replica again while it runs: its identity is taken, nothing placed
    line = error_line(up, "run", "hello", *spread, "--replica", "0", "--", "sleep", "600")
    assert line.startswith("error: default/spread-web/0 is taken: workload "), line
    assert placed[0]["id"] in line
    for workload in [*placed, soft]:
        ok(up, "stop", workload["id"], "--grace", "1")


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        (("--spread", "node", "--max-skew", "2"), "--max-skew"),
        (("--spread", "zone", "--max-skew", "0"), "--max-skew"),
        (("--spread", "a b"), "--spread"),
        (("--spread-hard",), "--spread-hard"),
        (("--spread-soft",), "--spread-soft"),
        (("--max-skew", "2"), "--max-skew"),
    ],
)
def test_bad_spread_flags_are_one_line_naming_the_flag(
    up: Up, flags: tuple[str, ...], flag: str
) -> None:
    before = len(document(up, "ps")["items"])
    for command in (("run", "hello", *flags, "--", "true"), ("explain", "hello", *flags)):
        line = error_line(up, *command)
        assert line.startswith(f"error: {flag}: "), line
    assert len(document(up, "ps")["items"]) == before  # nothing placed


def test_stopping_berth_up_removes_the_api_file(up: Up) -> None:
    # last in this module: the fixture's cluster is gone after it
    up.process.send_signal(signal.SIGINT)
    assert up.process.wait(60) == 0, up.output()
    assert not (up.home / "api.json").exists()
    assert "stopped; nothing left behind" in up.output()
    result = shell(up, "nodes")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: --api: ") and "berth up" in result.stderr
