#!/usr/bin/env python3
"""Mutation testing of the budget, the checks table and the unit and platform parsers.

Runs ``mutmut`` (3.x, configured in ``pyproject.toml`` under ``[tool.mutmut]``) on a copy of
the working tree in a scratch folder, so the ``mutants/`` folder it writes never lands in the
repository and other work in the tree is not disturbed.  Then it scores each module:

    score = (killed + timeout + caught by type check) / (mutants - skipped)

A mutant for which no test ran counts against the score, like a survivor.  The survivors are
printed with their diffs; the README's "Testing" section says why each of those left is equivalent.

    .venv/bin/pip install -e '.[test,mutation]'
    .venv/bin/python scripts/mutation.py                  # minutes; exit 1 below --min-score
    .venv/bin/python scripts/mutation.py --workdir /tmp/m # keep the copy (re-runs are cached)
    .venv/bin/python scripts/mutation.py --json           # one JSON line of scores at the end
    .venv/bin/python scripts/mutation.py --mutate src/berth/ownership.py \
        'berth.ownership.xǁLeaseǁ*' 'berth.ownership.x__checked_ttl*'   # an ad-hoc selection

It is not part of CI (two to three minutes on two cores, more as tests grow).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("src", "tests", "pyproject.toml")
KILLED = {"killed", "timeout", "caught by type check"}
_RESULT = re.compile(r"^\s*(?P<name>\S+): (?P<status>.+?)\s*$")


def module_of(mutant: str) -> str:
    """``berth.node.budget.xǁNodeBudgetǁrelease__mutmut_3`` → ``berth.node.budget``."""
    head = mutant.split("__mutmut_")[0]
    parts = head.split(".")
    return ".".join(parts[:-1])


def modules_to_mutate(pyproject: Path) -> list[str]:
    config = tomllib.loads(pyproject.read_text("utf-8"))["tool"]["mutmut"]
    paths = config.get("only_mutate", [])
    return [
        path.removeprefix("src/").removesuffix(".py").replace("/", ".")
        for path in paths
        if path.endswith(".py")
    ]


def mutmut_command() -> list[str]:
    beside = Path(sys.executable).parent / "mutmut"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("mutmut")
    if found is None:
        sys.exit("mutmut is not installed: pip install -e '.[mutation]'")
    return [found]


def prepare(workdir: Path, mutate: list[str]) -> None:
    """Copy the tree's sources, tests and configuration into ``workdir`` (kept if present);
    ``mutate`` (paths), when given, replaces ``only_mutate`` in the copy's configuration."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        source, target = ROOT / name, workdir / name
        if source.is_dir():
            shutil.copytree(
                source,
                target,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis"),
            )
        else:
            shutil.copy2(source, target)
    if mutate:
        pyproject = workdir / "pyproject.toml"
        paths = ", ".join(json.dumps(path) for path in mutate)
        text, count = re.subn(
            r"^only_mutate = \[.*?\]",
            lambda _: f"only_mutate = [{paths}]",
            pyproject.read_text("utf-8"),
            count=1,
            flags=re.MULTILINE | re.DOTALL,
        )
        if count != 1:
            sys.exit("pyproject.toml has no [tool.mutmut] only_mutate to replace")
        pyproject.write_text(text, "utf-8")


def run(workdir: Path, max_children: int | None, mutants: list[str]) -> None:
    command = [*mutmut_command(), "run"]
    if max_children:
        command += ["--max-children", str(max_children)]
    command += mutants
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    completed = subprocess.run(command, cwd=workdir, env=env, check=False)
    if completed.returncode != 0:
        sys.exit(f"mutmut run failed with status {completed.returncode}")


def results(workdir: Path) -> dict[str, str]:
    out = subprocess.run(
        [*mutmut_command(), "results", "--all", "true"],
        cwd=workdir,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    statuses: dict[str, str] = {}
    for line in out.splitlines():
        match = _RESULT.match(line)
        if match and match["status"] != "not checked":  # not run by this selection
            statuses[match["name"]] = match["status"]
    return statuses


def show(workdir: Path, mutant: str) -> str:
    return subprocess.run(
        [*mutmut_command(), "show", mutant],
        cwd=workdir,
        check=False,
        capture_output=True,
        text=True,
    ).stdout


def score(statuses: dict[str, str], modules: list[str]) -> dict[str, dict[str, float | int]]:
    table: dict[str, dict[str, float | int]] = {}
    for module in modules:
        counts = Counter(status for name, status in statuses.items() if module_of(name) == module)
        total = sum(counts.values()) - counts["skipped"]
        killed = sum(counts[status] for status in KILLED)
        table[module] = {
            "mutants": sum(counts.values()),
            "killed": killed,
            "survived": counts["survived"],
            "no_tests": counts["no tests"],
            "other": total - killed - counts["survived"] - counts["no tests"],
            "score": round(100 * killed / total, 1) if total else 100.0,
        }
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="copy here and keep it (default: a temp dir)")
    parser.add_argument("--max-children", type=int, help="parallel mutant workers (default: cores)")
    parser.add_argument("--min-score", type=float, default=90.0, help="per module, percent")
    parser.add_argument("--json", action="store_true", help="print one JSON line of scores")
    parser.add_argument("--no-diffs", action="store_true", help="list survivors without diffs")
    parser.add_argument(
        "--mutate", action="append", default=[], help="mutate this file instead (repeatable)"
    )
    parser.add_argument("mutants", nargs="*", help="only these mutants (names or globs)")
    args = parser.parse_args()

    keep = args.workdir is not None
    workdir = args.workdir.resolve() if keep else Path(tempfile.mkdtemp(prefix="berth-mutmut-"))
    try:
        prepare(workdir, args.mutate)
        run(workdir, args.max_children, args.mutants)
        statuses = results(workdir)
        modules = modules_to_mutate(workdir / "pyproject.toml")
        table = score(statuses, modules)
        survivors = sorted(
            name for name, status in statuses.items() if status not in KILLED | {"skipped"}
        )
        print()
        print(
            f"{'module':<22} {'mutants':>8} {'killed':>7} {'survived':>9} {'no tests':>9} "
            f"{'score':>7}"
        )
        for module, row in table.items():
            print(
                f"{module:<22} {row['mutants']:>8} {row['killed']:>7} {row['survived']:>9} "
                f"{row['no_tests']:>9} {row['score']:>6.1f}%"
            )
        if survivors:
            print(f"\n{len(survivors)} not killed:")
            for name in survivors:
                print(f"  {name}: {statuses[name]}")
                if not args.no_diffs:
                    print("    " + show(workdir, name).strip().replace("\n", "\n    "))
        if args.json:
            print(json.dumps({"modules": table, "survivors": survivors}))
        low = [module for module, row in table.items() if row["score"] < args.min_score]
        if low:
            print(f"\nbelow {args.min_score:g} %: {', '.join(low)}", file=sys.stderr)
            return 1
        return 0
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"\nkept {workdir} (mutmut results / mutmut show NAME / mutmut browse there)")


if __name__ == "__main__":
    sys.exit(main())
