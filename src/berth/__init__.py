"""berth — decides which node runs each workload, and makes the decision stick.

The public API lives here; submodules are organised by architecture, each port in its own
module with its drivers beside it and its contract suite in ``berth.testing``:
``scheduler`` (the placement port, its drivers, the rankers, the assume cache and the
policies), ``store`` (the replicated node-state store port and its drivers), ``nodeclient``
(the port a scheduler reaches a node's admission through, and its drivers), ``node`` (a
node's authoritative budget, layers, runtime port and drivers, monitors, configuration and
agent), ``embedded`` (the whole system wired in one process), ``sim`` (workloads and the
simulator).  Shared vocabulary sits at the top: ``model`` (requests, specs, placements),
``state`` (node snapshots), ``ownership`` (owners, leases, refusals), ``boot`` (what a node is
asked to boot, the orders a node is sent — ``AdmitOrder``, ``RunOrder`` —, a failed boot, a
workload's status), ``errors``.

Importing ``berth`` loads this file only: each public name is imported from its module the
first time it is read (``berth.Spec``, ``from berth import Spec``), and then only the core it
needs — the NATS drivers, the HTTP API, the commands, the simulator and the microVM/OCI stack
are loaded by the modules that need them.  Python runs this file before any ``berth.…``
submodule, so a light one keeps every entry point light: ``berth --help`` does not pay for the
embedded cluster, the agent or numpy (``tests/unit/test_layout.py`` holds it so, and holds
every import to the layers' direction).
"""

__version__ = "0.1.0"

from importlib import import_module as _import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names for type checkers and readers; at run time, ``__getattr__``
    from berth.embedded import EmbeddedCluster
    from berth.errors import BerthError, Invalid, NoCapacity, NoMatchingPlatform, Unavailable
    from berth.model import (
        INSTANCE_TYPES,
        Layer,
        Placement,
        Request,
        ReschedulePolicy,
        RestartPolicy,
        Spec,
        instance_type,
    )
    from berth.node.agent import Agent
    from berth.node.budget import BudgetLimits, NodeBudget
    from berth.node.config import AgentConfig, load_config
    from berth.nodeclient import AgentNodes, LocalNodes, NodeClient
    from berth.ownership import Admission, Lease, Owner, Refused
    from berth.platform import Platform
    from berth.scheduler import Scheduler, SingleNode
    from berth.scheduler.decision import Confirmed
    from berth.scheduler.multinode import ClusterScheduler
    from berth.scheduler.policy import ClusterView, PlacementRequest, Policy, Scorer, Weighted
    from berth.state import NodeState, colocation_score, fits
    from berth.store.memory import MemoryStore
    from berth.store.port import StateStore
    from berth.units import format_bandwidth, format_information, parse_bandwidth, parse_information

__all__ = [
    "INSTANCE_TYPES",
    "Admission",
    "Agent",
    "AgentConfig",
    "AgentNodes",
    "BerthError",
    "BudgetLimits",
    "ClusterScheduler",
    "ClusterView",
    "Confirmed",
    "EmbeddedCluster",
    "Invalid",
    "Layer",
    "Lease",
    "LocalNodes",
    "MemoryStore",
    "NoCapacity",
    "NoMatchingPlatform",
    "NodeBudget",
    "NodeClient",
    "NodeState",
    "Owner",
    "Placement",
    "PlacementRequest",
    "Platform",
    "Policy",
    "Refused",
    "Request",
    "ReschedulePolicy",
    "RestartPolicy",
    "Scheduler",
    "Scorer",
    "SingleNode",
    "Spec",
    "StateStore",
    "Unavailable",
    "Weighted",
    "__version__",
    "colocation_score",
    "fits",
    "format_bandwidth",
    "format_information",
    "instance_type",
    "load_config",
    "parse_bandwidth",
    "parse_information",
]

_PUBLIC: dict[str, str] = {
    "Admission": "berth.ownership",
    "Agent": "berth.node.agent",
    "AgentConfig": "berth.node.config",
    "AgentNodes": "berth.nodeclient",
    "BerthError": "berth.errors",
    "BudgetLimits": "berth.node.budget",
    "ClusterScheduler": "berth.scheduler.multinode",
    "ClusterView": "berth.scheduler.policy",
    "Confirmed": "berth.scheduler.decision",
    "EmbeddedCluster": "berth.embedded",
    "INSTANCE_TYPES": "berth.model",
    "Invalid": "berth.errors",
    "Layer": "berth.model",
    "Lease": "berth.ownership",
    "LocalNodes": "berth.nodeclient",
    "MemoryStore": "berth.store.memory",
    "NoCapacity": "berth.errors",
    "NoMatchingPlatform": "berth.errors",
    "NodeBudget": "berth.node.budget",
    "NodeClient": "berth.nodeclient",
    "NodeState": "berth.state",
    "Owner": "berth.ownership",
    "Placement": "berth.model",
    "PlacementRequest": "berth.scheduler.policy",
    "Platform": "berth.platform",
    "Policy": "berth.scheduler.policy",
    "Refused": "berth.ownership",
    "Request": "berth.model",
    "ReschedulePolicy": "berth.model",
    "RestartPolicy": "berth.model",
    "Scheduler": "berth.scheduler",
    "Scorer": "berth.scheduler.policy",
    "SingleNode": "berth.scheduler",
    "Spec": "berth.model",
    "StateStore": "berth.store.port",
    "Unavailable": "berth.errors",
    "Weighted": "berth.scheduler.policy",
    "colocation_score": "berth.state",
    "fits": "berth.state",
    "format_bandwidth": "berth.units",
    "format_information": "berth.units",
    "instance_type": "berth.model",
    "load_config": "berth.node.config",
    "parse_bandwidth": "berth.units",
    "parse_information": "berth.units",
}
"""Each public name → the module it comes from, imported on first use (``__getattr__``)."""


def __getattr__(name: str) -> Any:
    """The public name ``name``, its module imported the first time it is asked for (PEP 562):
    ``import berth`` (and so every ``berth.…`` import, the command line's too) loads nothing
    but this file, and ``berth.EmbeddedCluster`` still works as if imported here."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value  # asked once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
