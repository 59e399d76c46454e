"""Fuzz of the ``berth`` command line, in process (typer's ``CliRunner``).

The invariant, for any arguments: exit status 0, or exit status 2 with exactly one line on
stderr — ``error: …`` naming a flag (``--nodes``), a configuration key (``budget.mem_max``)
or what was wrong with the command line (an unexpected argument, an unknown command) — and
never a traceback, never a hang (every example runs under an alarm).

Each command gets its own flags with plausible values (small, so a valid run finishes in a
fraction of a second) and hostile ones (empty, NaN, infinities, huge numbers, unbalanced
quotes, control characters, paths that are files), plus unknown flags and flags missing
their value.  ``berth agent --check`` is fuzzed through its configuration file: a valid file
with keys spoiled, dropped or added, or not a TOML text at all.  ``berth cluster`` uses the
fake runtime or commands that end at once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.text import Text
from typer.testing import CliRunner, Result

from berth.cli.main import app

runner = CliRunner()
SCRATCH = Path(tempfile.gettempdir()) / f"berth-fuzz-cli-{os.getpid()}"  # made by _scratch
A_FILE = SCRATCH / "a-file"

JUNK = [
    "",
    " ",
    "-1",
    "0",
    "-0",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e309",
    "1e-300",
    "9" * 40,
    "1_000",
    "abc",
    "\x00",
    "a\nb",
    "'",
    '"',
    "--",
    "-",
    "true",
    "8 GiBs",
    "-5MiB",
    "99999999999999TiB",
    "linux/amd46",
    "linux/amd64/v99",
    "x" * 300,
    "é",
    "\u200b",
]
TIMEOUT_S = 60


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    """Fail instead of hanging: SIGALRM after ``seconds`` raises in the test's thread."""

    def timed_out(signum: int, frame: object) -> None:
        raise TimeoutError(f"the command did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def invoke(args: list[str]) -> Result:
    with alarm(TIMEOUT_S):
        return runner.invoke(app, args, env={"COLUMNS": "200"})


def check(result: Result, args: list[str], names: tuple[str, ...]) -> None:
    """Exit 0; or exit 2 with one ``error:`` line naming a flag, a key or the problem."""
    assert not isinstance(result.exception, TimeoutError), args
    if result.exit_code == 0:
        assert result.exception is None, (args, result.exception)
        return
    stderr = result.stderr
    assert result.exit_code == 2, (args, result.exit_code, stderr, result.exception)
    assert isinstance(result.exception, SystemExit), (args, result.exception)
    assert "Traceback" not in stderr + result.stdout, args
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, (args, stderr)
    line = lines[0]
    assert line.startswith("error: "), (args, line)
    assert any(name in line for name in names), (args, line)


def value(plausible: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(plausible), st.sampled_from(plausible), st.sampled_from(JUNK))


@st.composite
def command_line(
    draw: st.DrawFn,
    command: str,
    options: dict[str, list[str]],
    switches: tuple[str, ...] = (),
    always: tuple[str, ...] = (),
) -> list[str]:
    """``command`` with some of its ``options`` (plausible or hostile values), some
    ``switches``, sometimes an unknown flag or a flag without its value."""
    args = [command]
    chosen = draw(st.lists(st.sampled_from(sorted(options)), max_size=len(options)))
    for flag in [*always, *chosen]:
        args += [flag, draw(value(options[flag]))]
    args += draw(st.lists(st.sampled_from(switches), max_size=2, unique=True)) if switches else []
    trouble = draw(st.integers(0, 9))
    if trouble == 0:
        args.append(draw(st.sampled_from(["--nope", "-z", "--node-s", "stray", "--help"])))
    elif trouble == 1:
        args.append(draw(st.sampled_from(sorted(options))))  # a flag missing its value
    return args


FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
USAGE = ("argument", "command", "Missing", "option")

# -- berth schedule -----------------------------------------------------------------------------
SCHEDULE = {
    "--name": ["hello", "web-1"],
    "--namespace": ["default", "team.a"],
    "--replica": ["0", "3"],
    "--platform": ["linux/amd64", "linux/x86_64", "linux/arm64"],
    "--instance": ["micro", "deci"],
    "--layer": ["sha256:ab:12MiB", "x:0", "base:1.5GiB"],
    "--node": ["w1", "local"],
    "--node-platform": ["linux/amd64", "linux/arm64"],
}


@FUZZ
@given(command_line("schedule", SCHEDULE))
def test_schedule(args: list[str]) -> None:
    check(invoke(args), args, (*SCHEDULE, *USAGE, "platforms", "[linux/"))


# -- berth sim ----------------------------------------------------------------------------------
SIM = {
    "--nodes": ["2", "3"],
    "--requests": ["0", "5", "20"],
    "--rate": ["2", "0.5", "1e6"],
    "--lifetime": ["5", "0.5"],
    "--arrival": ["poisson", "bursty"],
    "--flatten": ["0", "0.5", "1"],
    "--policy": ["seed", "berth", "kube,random"],
    "--concurrency": ["1", "2"],
    "--staleness": ["0", "1.5"],
    "--seed": ["0", "7"],
    "--cache": ["8GiB", "1MiB", "0"],
    "--pull-bandwidth": ["125MBps", "1Gbps"],
    "--boot": ["0", "0.1"],
}
SIM_OUT = [
    str(SCRATCH / "sim"),
    str(SCRATCH / "sim" / "deeper"),
    "",
    str(A_FILE),
    str(A_FILE / "under"),
    "/proc/berth-fuzz",
]


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    command_line("sim", SIM, switches=("--quiet", "--no-assume", "--assume")),
    st.sampled_from(SIM_OUT),
)
def test_sim(args: list[str], out: str) -> None:
    # Small by default: a fuzzed flag may override these (typer keeps the last occurrence).
    args = [
        args[0],
        "--nodes",
        "2",
        "--requests",
        "4",
        "--policy",
        "seed",
        "--quiet",
        "--out",
        out,
        *args[1:],
    ]
    check(invoke(args), args, (*SIM, "--out", *USAGE, "--quiet", "--assume"))


# -- berth cluster ------------------------------------------------------------------------------
CLUSTER = {
    "--nodes": ["1", "2", "3"],
    "--workloads": ["0", "1", "4"],
    "--command": ["true", "sleep 0", "'sleep' '0'", "no-such-program-berth"],
    "--runtime": ["fake", "process"],
}


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(command_line("cluster", CLUSTER, switches=("--live-monitors",)))
def test_cluster(args: list[str]) -> None:
    # Quick by default: a fuzzed flag may override these.
    args = [args[0], "--runtime", "fake", "--command", "true", "--workloads", "2", *args[1:]]
    check(invoke(args), args, (*CLUSTER, *USAGE, "--live-monitors"))


# -- berth agent --check, through its configuration file ----------------------------------------
CONFIG: dict[str, dict[str, Any]] = {
    "node": {"name": '"w1"', "platform": '"linux/amd64"', "labels": '{ zone = "a" }'},
    "budget": {
        "mem_max": '"8GiB"',
        "disk_max": '"100GiB"',
        "cpu_max_load": "0.9",
        "cpu_max_cap": "16",
        "disk_bw_cap": '"2GiBps"',
        "disk_bw_max_load": "0.8",
        "net_bw_cap": '"10Gbps"',
        "net_bw_max_load": "0.8",
        "cpu_overcommit": "4.0",
    },
    "agent": {"heartbeat_s": "5.0", "layer_cache": '"10GiB"', "runtime": '"fake"'},
}
TOML_JUNK = [
    "true",
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "1e400",
    "9" * 40,
    '""',
    '"  "',
    '"\\u0000"',
    '"8 GiBs"',
    '"-1GiB"',
    "[1, 2]",
    '["linux/amd64"]',
    "{ a = 1 }",
    '{ "" = "x" }',
    '"linux/amd64/v99"',
    "1979-05-27",
    '"' + "x" * 300 + '"',
    "0.0",
    "1.5",
]
KEYS = ("node", "budget", "agent", "config", "--config", "--duration", *USAGE)


def render(config: dict[str, dict[str, Any]]) -> str:
    return "".join(
        f"[{section}]\n" + "".join(f"{key} = {text}\n" for key, text in table.items())
        for section, table in config.items()
    )


@st.composite
def config_files(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:  # not a TOML text at all
        return draw(
            st.sampled_from(
                [
                    b"",
                    b"\xff\xfe[\x00n\x00",
                    "[node]\nname = 'caf\xe9'\n".encode("latin-1"),
                    b"\xef\xbb\xbf" + render(CONFIG).encode(),
                    render(CONFIG).encode("utf-16"),
                    b"a = " + b"[" * 3000 + b"]" * 3000,
                    b"[node\nname=",
                    b"\x00" * 64,
                    b"x = '" + b"a" * (1 << 20) + b"'",
                ]
            )
        )
    config = {section: dict(table) for section, table in CONFIG.items()}
    for _ in range(draw(st.integers(0, 3))):
        section = draw(st.sampled_from(sorted(config)))
        table = config[section]
        action = draw(st.integers(0, 3))
        if action == 0 and table:
            del table[draw(st.sampled_from(sorted(table)))]
        elif action == 1:
            table[draw(st.sampled_from(["gpus", "mem_maxx", '"a b"', "name"]))] = '"x"'
        else:
            key = draw(st.sampled_from(sorted(CONFIG[section])))
            table[key] = draw(st.sampled_from(TOML_JUNK))
    if draw(st.integers(0, 5)) == 0:
        del config[draw(st.sampled_from(sorted(config)))]
    return render(config).encode()


@FUZZ
@given(config_files(), st.one_of(st.none(), value(["1", "0.5"])), st.booleans())
def test_agent_check(content: bytes, duration: str | None, as_directory: bool) -> None:
    path = SCRATCH / "agent.toml"
    path.write_bytes(content)
    args = ["agent", "--config", str(SCRATCH if as_directory else path), "--check"]
    if duration is not None:
        args += ["--duration", duration]
    check(invoke(args), args, KEYS)


# -- anything at the top ------------------------------------------------------------------------
@FUZZ
@given(st.lists(st.sampled_from([*JUNK, "schedule", "sim", "--nodes", "--help", "x"]), max_size=3))
def test_anything(args: list[str]) -> None:
    if args[:1] in (["sim"], ["demo"]) or "demo" in args:
        args = ["schedule", *args[1:]]  # a run with default flags would simulate for seconds
    result = invoke(args)
    if not args or args == ["--help"]:
        assert result.exit_code in (0, 2)
        return
    check(result, args, (*SCHEDULE, *SIM, *USAGE, "--help"))


def test_every_command_shows_its_help_as_written() -> None:
    """``--help`` of the app, each group and each command: exit status 0 — and every help
    text reads as written.  typer renders help as rich markup, so a ``[`` in one is escaped
    (``\\[``): unescaped, ``NAME[/REPLICA]`` is a closing tag that crashed ``berth ps
    --help`` with a traceback, and ``[agent]`` a style that vanished from ``berth agent``'s."""
    root = typer.main.get_command(app)

    def walk(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    for path, command in walk(root, []):
        result = invoke([*path, "--help"])
        assert result.exit_code == 0, (path, result.output, result.exception)
        assert "Usage:" in result.output, path
        texts = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
        for text in texts:
            assert Text.from_markup(text).plain == text.replace("\\[", "["), (path, text)


def test_the_fuzz_reaches_both_outcomes() -> None:
    check(invoke(["schedule", "--instance", "micro"]), [], ())
    bad = invoke(["schedule", "--layer", "x:-1"])
    check(bad, [], ("--layer",))
    assert bad.exit_code == 2


@pytest.fixture(autouse=True, scope="module")
def _scratch() -> Iterator[None]:
    SCRATCH.mkdir(parents=True, exist_ok=True)
    A_FILE.write_text("")
    yield
    shutil.rmtree(SCRATCH, ignore_errors=True)
