"""How long a ``berth`` command takes to start, against typer and rich alone, whole processes.

Every ``berth`` command starts an interpreter and imports the command line before it does
anything; typer and rich, which every command needs, are the yardstick (issue 23, item 8:
``berth --help`` and the operator's commands within 3× of them).  Each command is timed as a
whole process, from its start to its exit (``subprocess``; CPU time from the children's
``getrusage``), in the same run as the reference:

* ``reference`` — ``python -c 'import typer, rich.console'``;
* ``help`` — ``berth --help``;
* ``ps_help``, ``nodes_help``, ``images_help`` — ``berth ps --help``, ``berth nodes --help``,
  ``berth images --help``;
* ``ps_unreachable`` — ``berth ps --api http://127.0.0.1:9``: an operator's real call that
  fails fast (nothing listens on the discard port: connection refused, one error line,
  exit status 2), so it pays for everything a call loads without waiting on a server.

A round runs the reference and each command once, in an order rotated from round to round,
so that a machine speeding up or slowing down hits them alike; a command's ``ratio_p50`` is
the median over the rounds of its wall time over the same round's reference time (the
target: at most 3.0), beside its wall time's median and p99 and its CPU time's median.  The
first round is a warm-up and is not counted.

The berth measured is the one this interpreter imports (``PYTHONPATH`` is honoured): the
commands run the ``berth`` script beside this interpreter (else ``python -m berth.cli``) with
that berth's source first on ``PYTHONPATH``, ``COLUMNS=100``, no ``BERTH_API`` or
``BERTH_TOKEN`` and an empty ``BERTH_HOME``.  They write and read their bytecode in a scratch
``PYTHONPYCACHEPREFIX`` (the warm-up round fills it), as an installed berth runs from its
bytecode: under ``PYTHONDONTWRITEBYTECODE`` every run would compile berth's sources again.
Each run is checked — its exit status and what it printed — so a command that broke cannot
pass as a fast one.

``--json`` prints one JSON object (``targets``, ``met``, the machine's load average before
and after).  The exit status is 1 when a command misbehaves, or when a full run misses the
target; ``--quick`` (CI: three rounds, a few seconds) exits 0 whatever it measured.

    python benchmarks/cli_startup.py                # 30 rounds, about 30 s
    python benchmarks/cli_startup.py --quick --json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TARGET_RATIO = 3.0
"""A command's wall time over the reference's, median over the rounds: at most this."""
UNREACHABLE = "http://127.0.0.1:9"
"""An API nothing answers: the discard port on loopback, refused at once."""
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Command:
    """One command timed: its arguments after the interpreter or ``berth``, and what a run
    that did its job ends with (exit status, a text its output contains)."""

    name: str
    args: tuple[str, ...]
    berth: bool = True
    status: int = 0
    says: str = ""


COMMANDS = (
    Command("reference", ("-c", "import typer, rich.console"), berth=False),
    Command("help", ("--help",), says="Usage: berth [OPTIONS] COMMAND"),
    Command("ps_help", ("ps", "--help"), says="Usage: berth ps [OPTIONS]"),
    Command("nodes_help", ("nodes", "--help"), says="Usage: berth nodes [OPTIONS]"),
    Command("images_help", ("images", "--help"), says="Usage: berth images [OPTIONS]"),
    Command(
        "ps_unreachable",
        ("ps", "--api", UNREACHABLE),
        status=2,
        says=f"error: cannot reach the berth API at {UNREACHABLE}",
    ),
)


@dataclass
class Samples:
    """One command's runs: wall and CPU seconds, and what went wrong in any of them."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def berth_source() -> Path:
    """The directory this interpreter imports berth from (``src`` of a checkout)."""
    spec = importlib.util.find_spec("berth")
    if spec is None or spec.origin is None:
        raise SystemExit("cli_startup: berth is not importable by this interpreter")
    return Path(spec.origin).resolve().parent.parent


def berth_command() -> list[str]:
    """The ``berth`` command as a user runs it: the script installed beside this interpreter,
    or ``python -m berth.cli`` without one."""
    script = Path(sys.executable).with_name("berth")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "berth.cli"]


def environment(source: Path, scratch: Path) -> dict[str, str]:
    """The commands' environment: this one, with the measured berth first on the path, the
    bytecode cached in ``scratch``, a fixed width, and no API to find."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONDONTWRITEBYTECODE", "BERTH_API", "BERTH_TOKEN")
    }
    path = [str(source), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    home = scratch / "home"
    home.mkdir(exist_ok=True)
    env.update(
        PYTHONPATH=os.pathsep.join(path),
        PYTHONPYCACHEPREFIX=str(scratch / "pycache"),
        COLUMNS="100",
        BERTH_HOME=str(home),
    )
    return env


def run_once(argv: list[str], env: dict[str, str], command: Command, into: Samples) -> None:
    """Run ``argv`` once, timing it whole, and record what was wrong with it, if anything."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT_S
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    into.wall.append(wall)
    into.cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    output = (done.stdout + done.stderr).decode(errors="replace")
    if done.returncode != command.status or command.says not in output:
        last = output.strip().splitlines()[-1:] or ["(nothing)"]
        into.problems.append(f"exit {done.returncode}, last line: {last[0]}")


def measure(rounds: int, scratch: Path) -> tuple[dict[str, Samples], dict[str, Any]]:
    """``rounds`` counted rounds after one warm-up, the commands' order rotated each round."""
    source = berth_source()
    env = environment(source, scratch)
    berth = berth_command()
    argv = {
        command.name: [*berth, *command.args] if command.berth else [sys.executable, *command.args]
        for command in COMMANDS
    }
    samples = {command.name: Samples() for command in COMMANDS}
    for index in range(rounds + 1):
        shift = index % len(COMMANDS)
        for command in COMMANDS[shift:] + COMMANDS[:shift]:
            into = samples[command.name] if index else Samples()  # round 0: the warm-up
            run_once(argv[command.name], env, command, into)
            if not index:
                samples[command.name].problems += into.problems
    setup = {
        "berth_source": str(source),
        "berth": " ".join(berth),
        "python": sys.version.split()[0],
    }
    return samples, setup


def summary(samples: dict[str, Samples]) -> dict[str, dict[str, Any]]:
    """Each command's figures; a berth command's ratio to the reference, round by round."""
    reference = samples["reference"].wall
    figures: dict[str, dict[str, Any]] = {}
    for command in COMMANDS:
        own = samples[command.name]
        row: dict[str, Any] = {
            "command": shlex.join(("berth" if command.berth else "python", *command.args)),
            "wall_p50_ms": round(statistics.median(own.wall) * 1000, 1),
            "wall_p99_ms": round(percentile(own.wall, 0.99) * 1000, 1),
            "cpu_p50_ms": round(statistics.median(own.cpu) * 1000, 1),
            "ok": not own.problems,
        }
        if command.berth:
            ratios = [mine / theirs for mine, theirs in zip(own.wall, reference, strict=True)]
            row["ratio_p50"] = round(statistics.median(ratios), 2)
            row["ratio_p99"] = round(percentile(ratios, 0.99), 2)
        if own.problems:
            row["problems"] = sorted(set(own.problems))
        figures[command.name] = row
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="counted rounds (default 30)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="CI smoke run: 3 rounds")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    load_before = os.getloadavg()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="berth-cli-startup-") as scratch:
        samples, setup = measure(rounds, Path(scratch))
    commands = summary(samples)
    met = {
        name: row["ratio_p50"] <= TARGET_RATIO
        for name, row in commands.items()
        if "ratio_p50" in row
    }
    ok = all(row["ok"] for row in commands.values())
    result: dict[str, Any] = {
        "benchmark": "cli_startup",
        "commands": commands,
        "targets": {"ratio_to_reference": TARGET_RATIO},
        "met": met,
        "ok": ok,
        "load_average": [round(x, 2) for x in load_before],
        "load_average_1m": round(os.getloadavg()[0], 2),
        "config": {"rounds": rounds, "quick": args.quick, "cpus": os.cpu_count(), **setup},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        report(result)
    if not ok:
        return 1
    return 0 if args.quick or all(met.values()) else 1


def report(result: dict[str, Any]) -> None:
    """The run in a few lines."""
    config = result["config"]
    print(
        f"{config['rounds']} rounds, {config['berth']} (berth from {config['berth_source']}), "
        f"load average {result['load_average']} → {result['load_average_1m']}"
    )
    for name, row in result["commands"].items():
        ratio = row.get("ratio_p50")
        verdict = "" if ratio is None else f"  ×{ratio:.2f} (p99 ×{row['ratio_p99']:.2f})"
        if ratio is not None:
            verdict += "  met" if result["met"][name] else f"  above ×{TARGET_RATIO:g}"
        print(
            f"{name:15} median {row['wall_p50_ms']:6.1f} ms  p99 {row['wall_p99_ms']:6.1f} ms  "
            f"cpu {row['cpu_p50_ms']:6.1f} ms{verdict}  {row['command']}"
        )
        for problem in row.get("problems", ()):
            print(f"{'':15} not what it should do: {problem}")


if __name__ == "__main__":
    sys.exit(main())
