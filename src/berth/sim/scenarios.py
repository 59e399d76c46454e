"""The scenario suite: named simulations every policy is judged on, and how to run them.

This module owns *which* situations placement quality is measured in — each a
:class:`~berth.sim.simulator.SimConfig` with a name and a sentence saying what it is for —
and running one of them for a set of policies on common arrivals.  The figures are
:mod:`berth.sim.report`'s, the regime and the goals :mod:`berth.sim.goals`'s (the regime is
computed from the offered load; the ``intent`` below is what the scenario was built to show).

=============  ===================================================================  ==========
scenario       what it is                                                           intent
=============  ===================================================================  ==========
default        100 mixed nodes, 2,000 requests at 2/s living ~5 min                 moderate
overload       the default cluster offered ~3.6× its memory (20/s, 12,000)          overload
stale          the default load through K = 4 schedulers on views 5 s stale         moderate
bursty         on/off bursts (×10 rate, long bursts) that exceed memory at peaks    loaded
multi-arch     55/45 amd64/arm64 nodes; 70 % of images multi-platform (synthetic)   moderate
heterogeneous  2 GiB to 64 GiB nodes in one cluster, larger requests                moderate
large          1,000 nodes, 20,000 requests at 25/s, K = 2 schedulers 1 s stale,    moderate
               every node pre-seeded with its platform's 8 most used layers
=============  ===================================================================  ==========

**Quick mode** (``quick=True``, ``berth sim --scenario … --quick``) keeps each scenario's
shape and offered load at a fraction of its size: a tenth of the nodes (at least 10), a
twentieth of the requests (at least 200), the arrival rate scaled with the nodes (and burst
lengths, which count inter-arrival times, with it, so bursts last as many seconds) — for CI
and tests.

Entry points other code relies on (``benchmarks/spread_cost.py`` among them):
:data:`SCENARIOS` (name → :class:`Scenario`), :func:`scenario` (by name, quick or not),
:func:`run_scenario` (``(scenario, policies) → (results by policy, Report)``; pass
``out`` to also write ``report.json`` and plots) and :func:`run_suite`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from berth.errors import Invalid
from berth.node.classes import HETEROGENEOUS_CLASSES, SIMULATED_CLASSES
from berth.platform import Platform
from berth.scheduler.policy import POLICIES
from berth.sim.report import Report, build_report, write_outputs
from berth.sim.simulator import SimConfig, SimResult, simulate_policies

__all__ = ["SCENARIOS", "Scenario", "run_scenario", "run_suite", "scenario"]

HETEROGENEOUS_MIX: Mapping[str, float] = MappingProxyType(
    {"micro": 0.2, "milli": 0.2, "centi": 0.2, "deci": 0.25, "base": 0.15}
)
"""The heterogeneous scenario's instance types: more large requests than the default mix."""


@dataclass(frozen=True)
class Scenario:
    """A named simulation: ``config``, what it is (``summary``) and the regime it was built
    for (``intent``; the report's regime is computed from the offered load)."""

    name: str
    summary: str
    intent: str
    config: SimConfig

    def quick(self) -> Scenario:
        """The same shape and offered load, smaller (module docstring)."""
        config = self.config
        nodes = max(10, config.nodes // 10)
        workload = config.workload.model_copy(
            update={
                "requests": max(200, config.workload.requests // 20),
                "rate": config.workload.rate * nodes / config.nodes,
                # burst lengths count mean inter-arrival times: keep them as long in seconds
                "burst_length": max(1.0, config.workload.burst_length * nodes / config.nodes),
            }
        )
        quick = config.model_copy(update={"nodes": nodes, "workload": workload})
        return Scenario(self.name, f"{self.summary} (quick: smaller)", self.intent, quick)

    def describe(self) -> dict[str, str]:
        """What the report says about the scenario."""
        return {"name": self.name, "summary": self.summary, "intent": self.intent}


def _build() -> dict[str, Scenario]:
    base = SimConfig()
    workload = base.workload
    return {
        "default": Scenario(
            "default",
            "100 nodes of three sizes, 92 % linux/amd64; 2,000 requests at 2/s, ~5 min each",
            "moderate",
            base,
        ),
        "overload": Scenario(
            "overload",
            "the default cluster offered ~3.6x its memory: 12,000 requests at 20/s",
            "overload",
            base.model_copy(
                update={"workload": workload.model_copy(update={"requests": 12_000, "rate": 20.0})}
            ),
        ),
        "stale": Scenario(
            "stale",
            "the default load through K = 4 schedulers whose views are 5 s stale",
            "moderate",
            base.model_copy(update={"concurrency": 4, "staleness": 5.0}),
        ),
        "bursty": Scenario(
            "bursty",
            "on/off arrivals at 4/s on average, x10 in bursts of ~50 s: over memory at peaks",
            "loaded",
            base.model_copy(
                update={
                    "workload": workload.model_copy(
                        update={
                            "requests": 4_000,
                            "rate": 4.0,
                            "arrival": "bursty",
                            "burst_length": 200.0,
                        }
                    )
                }
            ),
        ),
        "multi-arch": Scenario(
            "multi-arch",
            "55 % linux/amd64, 45 % linux/arm64/v8 nodes; 70 % of images multi-platform "
            "(synthetic arm64 variants: new digests, same sizes)",
            "moderate",
            base.model_copy(
                update={
                    "node_platforms": {"linux/amd64": 0.55, "linux/arm64/v8": 0.45},
                    "workload": workload.model_copy(
                        update={
                            "multi_platform": (
                                Platform.parse("linux/amd64"),
                                Platform.parse("linux/arm64/v8"),
                            ),
                            "multi_platform_share": 0.7,
                        }
                    ),
                }
            ),
        ),
        "heterogeneous": Scenario(
            "heterogeneous",
            "2, 4, 16 and 64 GiB nodes in one cluster; 3,000 larger requests at 4/s",
            "moderate",
            base.model_copy(
                update={
                    "node_classes": HETEROGENEOUS_CLASSES,
                    "workload": workload.model_copy(
                        update={
                            "requests": 3_000,
                            "rate": 4.0,
                            "instance_types": dict(HETEROGENEOUS_MIX),
                        }
                    ),
                }
            ),
        ),
        "large": Scenario(
            "large",
            "1,000 nodes, 20,000 requests at 25/s; K = 2 schedulers 1 s stale; nodes "
            "pre-seeded with their platform's 8 most used layers",
            "moderate",
            base.model_copy(
                update={
                    "nodes": 1_000,
                    "concurrency": 2,
                    "staleness": 1.0,
                    "preseed_layers": 8,
                    "node_classes": SIMULATED_CLASSES,
                    "workload": workload.model_copy(update={"requests": 20_000, "rate": 25.0}),
                }
            ),
        ),
    }


SCENARIOS: Mapping[str, Scenario] = MappingProxyType(_build())
"""Every scenario of the suite, by name, in the order the suite runs them."""


def scenario(name: str, *, quick: bool = False) -> Scenario:
    """The scenario called ``name`` (its quick form with ``quick``); ``Invalid`` (field
    ``scenario``) lists the valid names."""
    try:
        found = SCENARIOS[name]
    except (KeyError, TypeError):
        raise Invalid(
            f"unknown scenario {name!r}; valid scenarios: {', '.join(SCENARIOS)}, or all",
            field="scenario",
        ) from None
    return found.quick() if quick else found


Progress = Callable[[str, int, int], None]


def run_scenario(
    chosen: Scenario,
    policies: Iterable[str] = tuple(POLICIES),
    *,
    out: Path | None = None,
    plots: bool = True,
    progress: Progress | None = None,
) -> tuple[dict[str, SimResult], Report]:
    """Every policy of ``policies`` on ``chosen``'s arrivals (the same for all), and the
    report; with ``out``, ``report.json`` (and plots) are written there.
    ``progress(policy, done, total)`` after each arrival."""
    results = simulate_policies(chosen.config, dict.fromkeys(policies), progress=progress)
    if out is None:
        return results, build_report(results, scenario=chosen.describe())
    return results, write_outputs(results, out, chosen.describe(), plots=plots)


def run_suite(
    names: Iterable[str] = tuple(SCENARIOS),
    policies: Iterable[str] = tuple(POLICIES),
    *,
    quick: bool = False,
    out: Path | None = None,
    plots: bool = True,
    progress: Progress | None = None,
) -> dict[str, Report]:
    """Each named scenario (quick or not) for ``policies``; with ``out``, each scenario's
    outputs go to ``out/<scenario>/``."""
    chosen = [scenario(name, quick=quick) for name in names]
    policy_names = list(policies)
    reports: dict[str, Report] = {}
    for each in chosen:
        directory = None if out is None else out / each.name
        _, reports[each.name] = run_scenario(
            each, policy_names, out=directory, plots=plots, progress=progress
        )
    return reports
