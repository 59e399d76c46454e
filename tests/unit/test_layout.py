"""The package layout: which way berth's parts import, no cycles, and every module says what it is.

A *part* is a top-level subpackage (``berth.scheduler``, ``berth.node``, ``berth.store``,
``berth.nodeclient``, ``berth.sim``, ``berth.testing`` …) or a top-level module
(``berth.units``, ``berth.ownership`` …, and ``berth`` itself for ``berth/__init__.py``).

**The layers contract** (:data:`LAYERS`): every part sits in one layer, lowest first, and a
module may import only from its own part or from a part of a *lower* layer — never upwards,
and never sideways into another part of its own layer (parts of one layer are independent).
:data:`NODE_LAYERS` says the same inside ``berth.node``, the one package that holds a port,
its drivers, their machinery and the agent over them.  A ``port`` module imports only the
vocabulary (:data:`VOCABULARY`): a port never imports a driver or a node.  Every ``berth``
import counts — at module level, inside functions and under ``TYPE_CHECKING`` — since a lazy
import is still a dependency of the design.  The few exceptions are :data:`ALLOWED`, each
with why.

**No circles**: no two modules import each other, directly or round a loop, at module level
(including ``TYPE_CHECKING`` blocks; a function's lazy import runs after both modules loaded).

**A light ``import berth``**: ``berth/__init__.py`` imports its public names on first use, so
``import berth`` loads no other module of berth; a name read loads the core it needs only —
not nats-py, FastAPI, matplotlib, the CLI's libraries, or the microVM/OCI stack; each is
loaded by the module that needs it.

**A light command line**: ``import berth.cli.main`` (the ``berth`` command's entry point)
loads typer, rich and the commands' modules with their flags, and of the rest of berth only
the errors and the shared defaults — no models, no pydantic, no HTTP client, no NATS, no
numpy: a command imports what it runs when it runs, so ``berth --help`` and an operator's
command start fast (``benchmarks/cli_startup.py`` times it).
"""

from __future__ import annotations

import ast
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "berth"


@dataclass(frozen=True)
class Edge:
    """``source`` (a module) imports ``target`` (a module or package) at ``line``."""

    source: str
    target: str
    line: int
    module_level: bool = True
    """Whether the import runs when ``source`` is loaded (``False``: inside a function)."""

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}"

    def where(self) -> str:
        """``src/berth/…/file.py:line imports target``: the import, by file and line."""
        path = modules()[self.source].relative_to(PACKAGE.parents[1])
        return f"{path}:{self.line} imports {self.target}"


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


def _imports(tree: ast.AST, *, module_level: bool = True) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement under ``tree``, and whether it runs at module level."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, module_level
        nested = module_level and not isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
        )
        yield from _imports(node, module_level=nested)


def berth_imports(module: str, path: Path) -> Iterator[Edge]:
    """Every import of a ``berth`` module in ``path``, wherever it sits in the file."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node, module_level in _imports(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "berth" or alias.name.startswith("berth."):
                    yield Edge(module, alias.name, node.lineno, module_level)
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
                yield Edge(module, target, node.lineno, module_level)


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


# --- the layers contract ---------------------------------------------------------------------

Layers = Sequence[Sequence[str]]

LAYERS: Layers = (
    # the vocabulary: errors, pydantic's rules, units, platforms, the shared defaults, …
    ("berth.errors",),
    ("berth.validation",),
    ("berth.units", "berth.platform", "berth.defaults", "berth.private", "berth.loops"),
    # … requests and specs, the one table of fit checks, admission, node snapshots, boots
    ("berth.model",),
    ("berth.checks",),
    ("berth.ownership", "berth.state", "berth.boot"),
    # certificates (the NATS servers' and clients' TLS, the API's HTTPS)
    ("berth.pki",),
    # leaf services: the Docker Hub data, OCI layouts, metrics and traces, the NATS wire
    ("berth.dataset", "berth.oci", "berth.observability", "berth.nats"),
    # what is replicated beside the nodes: node states, routes, workloads, images, events
    ("berth.store", "berth.registry", "berth.events"),
    # a node; the port a scheduler reaches it through; the schedulers
    ("berth.node",),
    ("berth.nodeclient",),
    ("berth.scheduler",),
    # whole systems: in one process, simulated
    ("berth.embedded", "berth.sim"),
    # the HTTP API
    ("berth.api",),
    # the processes berth runs, each composed in one place (agent, scheduler with its API, up)
    ("berth.processes",),
    # the contract suites and the test clusters (built as the processes build their parts)
    ("berth.testing",),
    # a real deployment's files (servers' configurations, credentials, certificates, units)
    ("berth.deploy",),
    ("berth.cli",),
    ("berth",),
)
"""berth's parts, lowest first.  A module imports from its own part or a lower layer's."""

NODE_LAYERS: Layers = (
    # a workload's supervisor (a standard-library script): files, and whether a process lives
    ("berth.node.runtime.supervisor",),
    # the budget, the layer record, erofs conversion, the runtime port, the microVM machinery
    (
        "berth.node.budget",
        "berth.node.layers",
        "berth.node.erofs",
        "berth.node.runtime.port",
        "berth.node.microvm",
    ),
    # a workload's kept output, the load monitor, layers as files, the two light runtime
    # drivers, the journal, a microVM guest's files
    (
        "berth.node.output",
        "berth.node.journal",
        "berth.node.monitor",
        "berth.node.layer_files",
        "berth.node.runtime.fake",
        "berth.node.runtime.process",
        "berth.node.microvm.scratch",
    ),
    # a microVM guest's QEMU, run as a process workload; the layer mounts and bundles
    # containers are built from
    ("berth.node.microvm.machine", "berth.node.container"),
    # the node core's parts, bottom up: its workloads' records, their journal entries and
    # events, their ends and restarts, then their boots and a restarted node's recovery
    ("berth.node.workloads",),
    ("berth.node.ledger",),
    ("berth.node.ends",),
    ("berth.node.lifecycle", "berth.node.recovery"),
    # the runtime package; the node core over a runtime
    ("berth.node.runtime", "berth.node.core"),
    # the agent's configuration file, then what reads it: the microVM and container drivers
    # (built from their [microvm] and [container] tables), then the agent, node classes, setup
    ("berth.node.config",),
    ("berth.node.runtime.microvm", "berth.node.runtime.container"),
    (
        "berth.node.agent",
        "berth.node.classes",
        "berth.node.microvm.setup",
        "berth.node.container.setup",
    ),
    ("berth.node",),
)
"""Inside ``berth.node``: no driver reaches up to the agent, and only the microVM and
container drivers to the configuration (their tables' models)."""

CONTRACTS: dict[str, Layers] = {"berth": LAYERS, "berth.node": NODE_LAYERS}
"""Each contract by the package it orders (its edges leaving the package are the outer's)."""

ALLOWED: dict[tuple[str, str], str] = {
    # Python runs berth/__init__.py before any submodule, and it binds __version__ before its
    # first import: reading the one version from the root loads nothing more.
    ("berth.api.app", "berth"): "the API's version is berth.__version__",
}
"""Wrong-way imports let through, by (importing module, imported module), each with why.
An allowance no import uses any more is reported too: the list only shrinks."""


def group(module: str, layers: Layers, container: str) -> str | None:
    """The listed name ``module`` belongs to (the longest that is it or a package of it);
    ``container`` itself only by its own name, so nothing unlisted falls into it."""
    listed = [name for layer in layers for name in layer]
    found = [
        name
        for name in listed
        if module == name or (name != container and module.startswith(name + "."))
    ]
    return max(found, key=len) if found else None


def layer_of(name: str, layers: Layers) -> int:
    return next(index for index, layer in enumerate(layers) if name in layer)


VOCABULARY = LAYERS[: layer_of("berth.boot", LAYERS) + 1]
"""What a port (a ``port`` module) may import: the vocabulary layers, up to ``berth.boot``'s."""


def inside(module: str, container: str) -> bool:
    return module == container or module.startswith(container + ".")


def wrong_way(edges: Sequence[Edge], container: str, layers: Layers) -> list[Edge]:
    """The edges between two modules of ``container`` that ``layers`` forbid: to a higher
    layer, or to another group of the same layer."""
    found: list[Edge] = []
    for edge in edges:
        if not (inside(edge.source, container) and inside(edge.target, container)):
            continue
        source, target = (
            group(edge.source, layers, container),
            group(edge.target, layers, container),
        )
        assert source is not None and target is not None, f"not in a layer: {edge}"
        if source == target:
            continue
        above = layer_of(target, layers) > layer_of(source, layers)
        beside = layer_of(target, layers) == layer_of(source, layers)
        if above or beside:
            found.append(edge)
    return found


def all_edges() -> list[Edge]:
    return [edge for module, path in modules().items() for edge in berth_imports(module, path)]


def module_graph(edges: Sequence[Edge]) -> dict[str, dict[str, list[Edge]]]:
    """Module → module it imports at module level → those imports."""
    graph: dict[str, dict[str, list[Edge]]] = {}
    for edge in edges:
        if edge.module_level and edge.source != edge.target:
            graph.setdefault(edge.source, {}).setdefault(edge.target, []).append(edge)
    return graph


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


def test_every_module_sits_in_one_layer_of_each_contract_it_falls_under() -> None:
    for container, layers in CONTRACTS.items():
        listed = [name for layer in layers for name in layer]
        assert len(listed) == len(set(listed)), f"{container}: a name listed twice"
        unplaced = [
            module
            for module in modules()
            if inside(module, container) and group(module, layers, container) is None
        ]
        assert unplaced == [], f"modules in no layer of {container}'s contract: {unplaced}"
    assert set(LAYERS[-1]) == {"berth"}, "the public API imports from every layer: it is on top"


def test_every_import_points_down_the_layers() -> None:
    """Each part imports only its own modules and lower layers' (module level, in functions
    and under ``TYPE_CHECKING``); inside ``berth.node`` the same by :data:`NODE_LAYERS`."""
    edges = all_edges()
    found = [
        edge
        for container, layers in CONTRACTS.items()
        for edge in wrong_way(edges, container, layers)
    ]
    forbidden = [edge for edge in found if (edge.source, edge.target) not in ALLOWED]
    assert forbidden == [], "imports against the layers (see LAYERS):\n" + "\n".join(
        edge.where() for edge in forbidden
    )
    used = {(edge.source, edge.target) for edge in found}
    stale = sorted(set(ALLOWED) - used)
    assert stale == [], f"allowances no import needs any more (remove them): {stale}"


def _port_of(module: str) -> str:
    """The port ``module`` is or belongs to (``berth.registry.port.claims`` → its package)."""
    names = module.split(".")
    return ".".join(names[: names.index("port") + 1])


def test_a_port_imports_only_the_vocabulary() -> None:
    """A port is the interface its drivers implement: it imports the shared vocabulary
    (:data:`VOCABULARY`), never a driver, a node or any other package's module.  A port of
    several protocols is a package (``berth.registry.port``: a module each) whose modules
    import each other too."""
    allowed = {name for layer in VOCABULARY for name in layer}
    ports = [module for module in modules() if "port" in module.split(".")]
    assert {
        "berth.scheduler.port",
        "berth.store.port",
        "berth.nodeclient.port",
        "berth.node.runtime.port",
        "berth.registry.port.workloads",
    } <= set(ports)
    found = [
        edge
        for port in ports
        for edge in berth_imports(port, modules()[port])
        if part(edge.target) not in allowed and not inside(edge.target, _port_of(port))
    ]
    assert found == [], "a port importing more than the vocabulary:\n" + "\n".join(
        edge.where() for edge in found
    )


def test_no_two_modules_import_each_other_at_module_level() -> None:
    graph = module_graph(all_edges())
    cycle = find_cycle(graph)
    assert cycle is None, "modules importing each other at module level:\n" + describe(cycle, graph)


COMPOSED = (
    "berth.node",
    "berth.nodeclient",
    "berth.scheduler",
    "berth.store",
    "berth.events",
    "berth.registry",
    "berth.api",
)
"""The packages whose ports and drivers the processes (``berth.processes``) put together."""


def test_each_process_is_composed_in_the_processes_layer() -> None:
    """``berth.processes`` (the agent, the scheduler with its API, ``berth up``) sits above
    every package it composes, and only what runs or tests whole processes imports it — the
    test clusters, the deployment files, the CLI.  The composed packages open no connection
    of their own: they are handed one (``connect`` is the processes' and the test clusters')."""
    above = layer_of("berth.processes", LAYERS)
    below = [name for name in COMPOSED if layer_of(name, LAYERS) >= above]
    assert below == [], f"composed packages not below berth.processes: {below}"
    importers = {
        part(edge.source)
        for edge in all_edges()
        if inside(edge.target, "berth.processes") and not inside(edge.source, "berth.processes")
    }
    assert importers <= {"berth.testing", "berth.deploy", "berth.cli"}, importers
    connecting = [
        f"{module}:{node.lineno}"
        for module, path in modules().items()
        if part(module) in COMPOSED
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom)
        and node.module == "berth.nats.connection"
        and any(alias.name == "connect" for alias in node.names)
    ]
    assert connecting == [], f"composed packages connecting by themselves: {connecting}"


FORBIDDEN_ON_IMPORT = (
    "nats",
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "matplotlib",
    "prometheus_client",
    "opentelemetry.sdk",
    "rich",
    "typer",
    "berth.oci",
    "berth.node.erofs",
    "berth.node.layer_files",
    "berth.node.microvm",
    "berth.node.runtime.microvm",
    "berth.node.container",
    "berth.node.runtime.container",
    "berth.nats",
    "berth.registry",
    "berth.api",
    "berth.cli",
    "berth.sim",
    "berth.processes",
    "berth.testing",
)
"""Packages ``import berth`` must not load: each is loaded by the module that needs it."""


def loaded_by(statement: str, *, before: str = "") -> list[str]:
    """The modules that ``statement`` loads in a fresh interpreter, after ``before``."""
    probe = (
        f"import sys\n{before}\nalready = set(sys.modules)\n{statement}\n"
        "print('\\n'.join(sorted(set(sys.modules) - already)))\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    return subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=environment
    ).stdout.split()


def among(loaded: Sequence[str], packages: Sequence[str]) -> list[str]:
    """The modules of ``loaded`` that are, or are inside, one of ``packages``."""
    return [m for m in loaded if any(m == p or m.startswith(p + ".") for p in packages)]


def test_import_berth_loads_the_core_only() -> None:
    """``import berth`` in a fresh interpreter loads none of :data:`FORBIDDEN_ON_IMPORT` —
    nor any module of berth but its ``__init__``: each public name is imported on first use;
    reading one loads the core, none of :data:`FORBIDDEN_ON_IMPORT` still."""
    loaded = loaded_by("import berth")
    assert among(loaded, FORBIDDEN_ON_IMPORT) == [], f"import berth loads {loaded}"
    assert among(loaded, ["berth"]) == ["berth"], "import berth loads more than berth/__init__"
    core = loaded_by("import berth\nberth.EmbeddedCluster, berth.Agent, berth.Spec")
    assert among(core, FORBIDDEN_ON_IMPORT) == [], f"berth's public names load {core}"
    assert {"berth.embedded", "berth.node.agent", "berth.model"} <= set(core)


def test_the_public_names_are_those_the_package_imports_for_type_checkers() -> None:
    """``berth/__init__.py`` names each public name twice — imported under ``TYPE_CHECKING``
    (for type checkers and readers) and in the table its ``__getattr__`` imports from: the
    two agree, cover ``__all__``, and each name is its module's own object."""
    import berth

    tree = ast.parse(modules()["berth"].read_text(encoding="utf-8"))
    guarded = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    typed = {
        alias.name: str(node.module)
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == berth._PUBLIC
    assert set(typed) == set(berth.__all__) - {"__version__"}
    for name, module in typed.items():
        assert getattr(berth, name) is getattr(sys.modules[module], name), name
    assert set(berth.__all__) <= set(dir(berth))


FORBIDDEN_ON_CLI_IMPORT = (
    "numpy",
    "pydantic",
    "httpx",
    "nats",
    "fastapi",
    "starlette",
    "uvicorn",
    "matplotlib",
    "prometheus_client",
    "opentelemetry",
    "cryptography",
    "psutil",
    "asyncio",
)
"""Packages ``import berth.cli.main`` must not load: a command loads them when it runs."""

LOADED_BY_THE_CLI = ("berth", "berth.errors", "berth.defaults")
"""Berth's modules that ``import berth.cli.main`` loads beside the ``berth.cli`` package's."""


def test_import_of_the_command_line_loads_its_flags_only() -> None:
    """``import berth.cli.main`` — what the ``berth`` command runs first — loads none of
    :data:`FORBIDDEN_ON_CLI_IMPORT`, and of berth only ``berth.cli`` and
    :data:`LOADED_BY_THE_CLI`: not the
    embedded cluster, the agent, the simulator, the models or the API's client."""
    loaded = loaded_by("import berth.cli.main", before="import typer, rich.console")
    assert "berth.cli.main" in loaded
    heavy = among(loaded, FORBIDDEN_ON_CLI_IMPORT)
    assert heavy == [], f"import berth.cli.main loads {sorted({m.split('.')[0] for m in heavy})}"
    beyond = [
        module
        for module in among(loaded, ["berth"])
        if module not in LOADED_BY_THE_CLI and not inside(module, "berth.cli")
    ]
    assert beyond == [], f"import berth.cli.main loads {beyond}"


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
    assert [edge.line for edge in edges if not edge.module_level] == [8, 9]
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
    assert {
        "NodeClientContract",
        "RuntimeContract",
        "SchedulerContract",
        "StateStoreContract",
    } <= suites
    run: set[str] = set()
    for path in Path(__file__).resolve().parents[1].rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                run.update(base.id for base in node.bases if isinstance(base, ast.Name))
    assert suites - run == set(), f"contract suites no driver runs: {sorted(suites - run)}"


def test_wrong_way_reports_imports_upwards_and_sideways_only() -> None:
    layers: Layers = (("x.low",), ("x.a", "x.b"), ("x.high",), ("x",))
    edges = [
        Edge("x.a.one", "x.low", 1),  # down: fine
        Edge("x.a.one", "x.a.two", 2),  # within its group: fine
        Edge("x.a.one", "x.high", 3, module_level=False),  # up, even lazily
        Edge("x.a.one", "x.b", 4),  # sideways, into another group of its layer
        Edge("x", "x.high", 5),  # the top imports anything
        Edge("x.low", "x", 6),  # the container's own module is on top too
        Edge("y.other", "x.high", 7),  # outside the contract
    ]
    assert [edge.line for edge in wrong_way(edges, "x", layers)] == [3, 4, 6]
    assert group("x.a.one.deep", layers, "x") == "x.a"
    assert group("x.unlisted", layers, "x") is None
    assert group("x", layers, "x") == "x"
    graph = module_graph([Edge("m.a", "m.b", 1), Edge("m.b", "m.a", 2, module_level=False)])
    assert find_cycle(graph) is None  # a function's import closes no module-level loop
