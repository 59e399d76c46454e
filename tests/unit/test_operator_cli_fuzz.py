"""Fuzz of the operator's commands (``run ps stop nodes explain cordon uncordon drain
images``), in process, with the invariant and helpers of ``test_fuzz_cli.py``: any arguments
end in exit status 0 or in exit status 2 with exactly one ``error:`` line naming a flag, an
argument (``IMAGE``, ``CMD``, ``ID``, ``NODE``, ``PATH``), the API's URL or what was wrong with
the command line — never a traceback, never a hang.

No API is running: ``--api`` is a closed loopback port (or junk), and ``$BERTH_HOME`` is an
empty directory, so every command that gets past its own checks ends at "cannot reach the
berth API at …" or "no API to talk to".  What the API answers to bad values is the
walk-through's and the API's own tests' business.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from berth.cli.main import app
from tests.unit.test_fuzz_cli import FUZZ, USAGE, alarm, check, command_line, value

runner = CliRunner()
TIMEOUT_S = 60
ARGUMENTS = ("IMAGE", "CMD", "ID", "NODE", "NAME", "PATH")
FAILURES = ("cannot reach the berth API", "--api")


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


CLOSED = f"http://127.0.0.1:{_closed_port()}"
API = {"--api": [CLOSED, CLOSED, "http://[::1", "ftp://x", "http://127.0.0.1:99999"]}
COMMON = {**API, "--token": ["t0k3n", "a b", "é"]}
RUN = {
    **COMMON,
    "--type": ["micro", "deci", "huge"],
    "--platform": ["linux/amd64", "linux/arm64"],
    "--namespace": ["default", "team.a"],
    "--name": ["web", "[/]x"],
    "--replica": ["0", "3"],
    "--env": ["A=1", "B=", "=x", "NOEQUALS"],
    "--spread": ["node", "zone", "a b"],
    "--max-skew": ["1", "0", "x"],
}
SPREAD_SWITCHES = ("--spread-hard", "--spread-soft")
PS = {**COMMON, "--namespace": ["default"], "--node": ["node-00"], "--state": ["running", "x"]}
GRACE = {**COMMON, "--grace": ["0", "1.5", "10"]}
IMAGES_ADD = {
    **COMMON,
    "--layer": ["sha256:ab:12MiB", "x:0", "nocolon", "a:-1"],
    "--platform": ["linux/amd64"],
}


def invoke(args: list[str], home: Path) -> Result:
    env: dict[str, str | None] = {key: None for key in os.environ if key.startswith("BERTH_")}
    env |= {"BERTH_HOME": str(home), "COLUMNS": "200"}
    with alarm(TIMEOUT_S):
        return runner.invoke(app, args, env=env)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("empty-berth-home")


NAMES = (*RUN, *SPREAD_SWITCHES, *PS, *GRACE, *IMAGES_ADD, *ARGUMENTS, *FAILURES, *USAGE, "--help")


@FUZZ
@given(
    command_line("run", RUN, switches=("--json", "--restartable", *SPREAD_SWITCHES)),
    value(["hello", "python:3.12"]),
    st.sampled_from([[], ["--"], ["--", "true"], ["--", "sleep", "60"], ["sleep"]]),
)
def test_run(home: Path, args: list[str], image: str, command: list[str]) -> None:
    line = [*args, image, *command]
    check(invoke(line, home), line, NAMES)


@FUZZ
@given(
    st.sampled_from(["ps", "nodes", "stop", "explain", "cordon", "uncordon", "drain"]),
    st.data(),
)
def test_the_other_commands(home: Path, command: str, data: st.DataObject) -> None:
    options = {"ps": PS, "stop": GRACE, "drain": GRACE, "explain": RUN}.get(command, COMMON)
    switches = ("--json", *SPREAD_SWITCHES) if command == "explain" else ("--json",)
    args = data.draw(command_line(command, options, switches=switches))
    if command in ("stop", "explain", "cordon", "uncordon", "drain"):
        args.append(data.draw(value(["node-00", "w-0123456789ab", "hello"])))
    check(invoke(args, home), args, NAMES)


@FUZZ
@given(
    st.sampled_from(["add", "import-oci", None]),
    value(["hello", "layout", "/nonexistent"]),
    st.data(),
)
def test_images(home: Path, sub: str | None, operand: str, data: st.DataObject) -> None:
    options = IMAGES_ADD if sub == "add" else COMMON
    args = ["images", *data.draw(command_line(sub or "--json", options))]
    if sub is not None:
        args.append(operand)
    check(invoke(args, home), args, NAMES)


def test_the_fuzz_reaches_the_network_and_the_flags(home: Path) -> None:
    refused = invoke(["nodes", "--api", CLOSED], home)
    check(refused, [], ("cannot reach the berth API",))
    assert refused.exit_code == 2
    bad = invoke(["stop", "w-1", "--grace", "nan", "--api", CLOSED], home)
    check(bad, [], ("--grace",))
    assert bad.exit_code == 2
