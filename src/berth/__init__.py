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
asked to boot, a failed boot, a workload's status), ``errors``.

Importing ``berth`` loads this core only: the NATS drivers, the HTTP API, the commands, the
simulator and the microVM/OCI stack are loaded by the modules that need them
(``tests/unit/test_layout.py`` holds it so, and holds every import to the layers' direction).
"""

__version__ = "0.1.0"

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
