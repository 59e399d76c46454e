"""The package layout: no import cycles between berth's parts, and every module says what it is.

A *part* is a top-level subpackage (``berth.scheduler``, ``berth.node``, ``berth.store``,
``berth.nodeclient``, ``berth.sim``, ``berth.testing`` …) or a top-level module
(``berth.units``, ``berth.ownership`` …, and ``berth`` itself for ``berth/__init__.py``).  Every
``berth`` import counts — at module level, inside functions and under ``TYPE_CHECKING`` — since
a cycle hidden in a function or a type-only import is still a cycle in the design.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "berth"


@dataclass(frozen=True)
class Edge:
    """``source`` (a module) imports ``target`` (a module or package) at ``line``."""

    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("berth", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def part(module: str) -> str:
    """The top-level subpackage or module ``module`` belongs to."""
    return ".".join(module.split(".")[:2])


def _is_module_or_package(dotted: str) -> bool:
    relative = PACKAGE.joinpath(*dotted.split(".")[1:])
    return relative.is_dir() or relative.with_suffix(".py").is_file()


def berth_imports(module: str, path: Path) -> Iterator[Edge]:
    """Every import of a ``berth`` module in ``path``, wherever it sits in the file."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "berth" or alias.name.startswith("berth."):
                    yield Edge(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".")
                if not is_package:
                    package = package[:-1]
                base_parts = package[: len(package) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base != "berth" and not base.startswith("berth."):
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                # ``from berth import units`` imports a module; ``from berth import Spec`` a name.
                target = candidate if _is_module_or_package(candidate) else base
                yield Edge(module, target, node.lineno)


def part_graph() -> dict[str, dict[str, list[Edge]]]:
    """Part → imported part → the imports that make the edge (self-edges left out)."""
    graph: dict[str, dict[str, list[Edge]]] = {}
    for module, path in modules().items():
        graph.setdefault(part(module), {})
        for edge in berth_imports(module, path):
            source, target = part(edge.source), part(edge.target)
            if source != target:
                graph[source].setdefault(target, []).append(edge)
    return graph


def find_cycle(graph: dict[str, dict[str, list[Edge]]]) -> list[str] | None:
    """One cycle as ``[a, b, …, a]``, or ``None``."""
    state: dict[str, str] = {}  # "active" on the current path, "done" once fully explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "active"
        path.append(node)
        for target in sorted(graph.get(node, {})):
            if state.get(target) == "active":
                return [*path[path.index(target) :], target]
            if target not in state:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle is not None:
                return cycle
    return None


def describe(cycle: list[str], graph: dict[str, dict[str, list[Edge]]]) -> str:
    lines = [" -> ".join(cycle)]
    for source, target in itertools.pairwise(cycle):
        lines.append(f"  {source} -> {target}:")
        lines.extend(f"    {edge}" for edge in graph[source][target])
    return "\n".join(lines)


def test_the_parts_of_the_package_import_each_other_without_cycles() -> None:
    graph = part_graph()
    assert {"berth.scheduler", "berth.node", "berth.store", "berth.nodeclient"} <= set(graph)
    cycle = find_cycle(graph)
    if cycle is not None:
        print(describe(cycle, graph))
    assert cycle is None, "import cycle between berth's parts:\n" + describe(cycle, graph)


def test_every_module_has_a_docstring() -> None:
    missing = [
        module
        for module, path in modules().items()
        if not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert missing == [], f"modules without a docstring: {missing}"


# --- the checker checks itself ---------------------------------------------------------------


def test_find_cycle_reports_the_cycle_with_its_imports() -> None:
    a_b, b_c, c_a = Edge("x.a", "x.b", 1), Edge("x.b", "x.c", 2), Edge("x.c.m", "x.a", 3)
    graph: dict[str, dict[str, list[Edge]]] = {
        "a": {"b": [a_b]},
        "b": {"c": [b_c]},
        "c": {"a": [c_a]},
        "d": {"a": []},
    }
    cycle = find_cycle(graph)
    assert cycle == ["a", "b", "c", "a"]
    assert "x.c.m:3 imports x.a" in describe(cycle, graph)
    assert find_cycle({"a": {"b": []}, "b": {}, "c": {"a": []}}) is None


def test_imports_inside_functions_and_type_checking_blocks_count(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        '"""Sample."""\n'
        "from typing import TYPE_CHECKING\n"
        "import berth.units\n"
        "from berth import ownership, Spec\n"
        "if TYPE_CHECKING:\n"
        "    from berth.scheduler.engine import Engine\n"
        "def late():\n"
        "    from berth.sim import simulator\n"
        "    import berth.store.memory as memory\n"
        "from . import errors\n"
        "from .node import budget\n",
        encoding="utf-8",
    )
    edges = sorted(berth_imports("berth.sample", source), key=lambda edge: edge.line)
    assert [(edge.target, edge.line) for edge in edges] == [
        ("berth.units", 3),
        ("berth.ownership", 4),
        ("berth", 4),
        ("berth.scheduler.engine", 6),
        ("berth.sim.simulator", 8),
        ("berth.store.memory", 9),
        ("berth.errors", 10),
        ("berth.node.budget", 11),
    ]
    assert [part(edge.target) for edge in edges][3:5] == ["berth.scheduler", "berth.sim"]


def test_every_contract_suite_in_berth_testing_is_run_by_some_driver() -> None:
    """A suite nobody subclasses checks nothing: each ``*Contract`` shipped in ``berth.testing``
    has at least one test class deriving from it under ``tests/``."""
    suites = {
        node.name
        for module, path in modules().items()
        if part(module) == "berth.testing"
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.ClassDef) and node.name.endswith("Contract")
    }
    assert {"NodeClientContract", "RuntimeContract", "SchedulerContract",
            "StateStoreContract"} <= suites  # fmt: skip
    run: set[str] = set()
    for path in Path(__file__).parent.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                run.update(base.id for base in node.bases if isinstance(base, ast.Name))
    assert suites - run == set(), f"contract suites no driver runs: {sorted(suites - run)}"
