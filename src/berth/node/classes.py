"""Node size classes: what "a node of this size" means, and every cluster's table of them.

A :class:`NodeClass` names a node size — hard budget (``mem``, ``disk``), cores, bandwidth
caps and the soft ceilings' load fractions — and is turned into a node's budget by exactly one
rule, :meth:`NodeClass.budget_section` (the ``[budget]`` table an agent configuration holds;
:meth:`NodeClass.limits` resolves it).

The tables berth builds clusters from are here too, one definition each, because they are
sized for different jobs and a reader comparing them should find them side by side:

* :data:`EMBEDDED_CLASSES` — the embedded cluster (:mod:`berth.embedded`, ``berth up``): a
  few real processes on one host fill them;
* :data:`SIMULATED_CLASSES` — the simulator's default mix (``SimConfig``'s
  ``DEFAULT_NODE_CLASSES``), memory the binding resource;
  :data:`HETEROGENEOUS_CLASSES` — its heterogeneous scenario, sizes 32× apart with the same
  per-GiB proportions (:mod:`berth.sim.scenarios`);
* :data:`FLEET_CLASSES` — data-centre machines, for the decision-latency benchmark's clusters
  of 10,000 to a million snapshots (``benchmarks/decision_latency.py``).

It owns sizes only: which classes a cluster mixes, and in what proportion or order, is the
cluster builder's business (``weight`` is read by the simulator's layout and the benchmark;
the embedded cluster cycles through its classes in order).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from berth.model import Bytes, BytesPerSecond, Cores, Name
from berth.node.budget import BudgetLimits
from berth.node.config import BudgetSection
from berth.validation import BerthModel

__all__ = [
    "EMBEDDED_CLASSES",
    "FLEET_CLASSES",
    "HETEROGENEOUS_CLASSES",
    "SIMULATED_CLASSES",
    "NodeClass",
]

Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class NodeClass(BerthModel):
    """One node size (see the module docstring).

    ``mem``/``disk`` are the hard budget in bytes (or unit strings), ``cpus`` the soft CPU
    capacity in cores, ``disk_bw``/``net_bw`` the bandwidth caps in bytes/s; the soft
    ceilings are ``cpu_max_load`` of the cores and ``*_bw_max_load`` of each cap (all 1 by
    default: the whole machine).  ``weight`` is the class's share in a weighted mix.
    """

    name: Name
    mem: Bytes
    disk: Bytes
    cpus: Cores
    disk_bw: BytesPerSecond
    net_bw: BytesPerSecond
    cpu_max_load: Fraction = 1.0
    disk_bw_max_load: Fraction = 1.0
    net_bw_max_load: Fraction = 1.0
    weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0

    def budget_section(self) -> BudgetSection:
        """The ``[budget]`` table of a node of this class (the one rule from size to budget)."""
        return BudgetSection(
            mem_max=self.mem,
            disk_max=self.disk,
            cpu_max_load=self.cpu_max_load,
            cpu_max_cap=self.cpus,
            disk_bw_cap=self.disk_bw,
            disk_bw_max_load=self.disk_bw_max_load,
            net_bw_cap=self.net_bw,
            net_bw_max_load=self.net_bw_max_load,
        )

    def limits(self) -> BudgetLimits:
        """The resolved budget limits of a node of this class."""
        return self.budget_section().limits()


EMBEDDED_CLASSES: tuple[NodeClass, ...] = (
    NodeClass(
        name="small",
        mem="2GiB",
        disk="32GiB",
        cpus=2,
        disk_bw="2GiBps",
        net_bw="1GiBps",
        cpu_max_load=0.9,
        disk_bw_max_load=0.8,
        net_bw_max_load=0.8,
    ),
    NodeClass(
        name="medium",
        mem="4GiB",
        disk="64GiB",
        cpus=4,
        disk_bw="2GiBps",
        net_bw="1GiBps",
        cpu_max_load=0.9,
        disk_bw_max_load=0.8,
        net_bw_max_load=0.8,
    ),
    NodeClass(
        name="large",
        mem="8GiB",
        disk="128GiB",
        cpus=8,
        disk_bw="2GiBps",
        net_bw="1GiBps",
        cpu_max_load=0.9,
        disk_bw_max_load=0.8,
        net_bw_max_load=0.8,
    ),
)
"""The embedded cluster's sizes, cycled in order: small enough that a few real processes on
one host fill them, with 10 % CPU and 20 % bandwidth headroom kept free."""

SIMULATED_CLASSES: tuple[NodeClass, ...] = (
    NodeClass(
        name="small",
        mem="4GiB",
        disk="128GiB",
        cpus=10,
        disk_bw="1GiBps",
        net_bw="512MiBps",
        weight=0.5,
    ),
    NodeClass(
        name="medium",
        mem="8GiB",
        disk="256GiB",
        cpus=20,
        disk_bw="2GiBps",
        net_bw="1GiBps",
        weight=0.3,
    ),
    NodeClass(
        name="large",
        mem="16GiB",
        disk="512GiB",
        cpus=40,
        disk_bw="4GiBps",
        net_bw="2GiBps",
        weight=0.2,
    ),
)
"""The simulator's three sizes, half of them small.  Hyper's instance types all ask 2 vCPUs,
16 GiB disk, 128 MiBps disk and 64 MiBps network per GiB of memory; these nodes offer 2.5
cores, 32 GiB disk, 256 MiBps and 128 MiBps per GiB, so memory is what fills first.  Small on
purpose: a default run of 2,000 requests then spans several workload lifetimes at moderate
load."""


def _weighted(node_class: NodeClass, weight: float) -> NodeClass:
    return node_class.model_copy(update={"weight": weight})


_SMALL, _MEDIUM, _LARGE = SIMULATED_CLASSES
HETEROGENEOUS_CLASSES: tuple[NodeClass, ...] = (
    NodeClass(
        name="tiny",
        mem="2GiB",
        disk="64GiB",
        cpus=5,
        disk_bw="512MiBps",
        net_bw="256MiBps",
        weight=0.35,
    ),
    _weighted(_SMALL, 0.35),
    _weighted(_LARGE, 0.2),
    NodeClass(
        name="huge",
        mem="64GiB",
        disk="2TiB",
        cpus=160,
        disk_bw="16GiBps",
        net_bw="8GiBps",
        weight=0.1,
    ),
)
"""Node sizes 32× apart in one cluster (the simulator's small and large among them), with
:data:`SIMULATED_CLASSES`' per-GiB proportions."""

FLEET_CLASSES: tuple[NodeClass, ...] = (
    NodeClass(
        name="small",
        mem="32GiB",
        disk="400GiB",
        cpus=8.0,
        disk_bw="1GiBps",
        net_bw="10Gbps",
        weight=0.45,
    ),
    NodeClass(
        name="medium",
        mem="128GiB",
        disk="1600GiB",
        cpus=32.0,
        disk_bw="2GiBps",
        net_bw="25Gbps",
        weight=0.40,
    ),
    NodeClass(
        name="large",
        mem="384GiB",
        disk="3840GiB",
        cpus=96.0,
        disk_bw="4GiBps",
        net_bw="100Gbps",
        weight=0.15,
    ),
)
"""Data-centre machines (8 to 96 cores, 10 to 100 Gbit/s), in the shares a large cluster of
them might have."""
