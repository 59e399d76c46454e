"""Helpers shared by test modules that are not about one subject: loading a benchmark script
as a module (its harness runs bounded in CI), a fresh typer app carrying ``berth sim`` and
``berth demo``, and the state a spread test's node publishes from its budget.

Imported as ``tests.helpers`` (``tests`` is a package; pytest's default import mode puts the
repository's root on ``sys.path``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import typer

from berth.cli.sim import register
from berth.node.budget import NodeBudget
from berth.state import NodeState
from berth.units import GiB

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as the module ``name`` (registered in ``sys.modules`` first,
    so its dataclasses resolve; a second load keeps the first registration)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


def sim_app() -> typer.Typer:
    """A fresh app with the sim commands registered, as ``berth.cli`` does."""
    fresh = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @fresh.callback()
    def _root() -> None:
        """berth (test app)."""

    register(fresh)
    return fresh


def budget_state(
    name: str, budget: NodeBudget, generation: int, zone: str | None, layers: frozenset[str]
) -> NodeState:
    """What a linux/amd64 node of 4 cores and 1 GiB/s disk and network, labelled with its
    ``zone`` (none: unlabelled), publishes of ``budget``: its admissions and headroom."""
    headroom = budget.headroom()
    return NodeState(
        node=name,
        platform="linux/amd64",
        generation=generation,
        admitted=budget.admitted,
        labels={} if zone is None else {"zone": zone},
        mem_free=headroom.mem_free,
        disk_free=headroom.disk_free,
        cpu_capacity=4.0,
        disk_bw_ceiling=float(GiB),
        net_bw_ceiling=float(GiB),
        layers=layers,
    )
