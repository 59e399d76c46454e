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


def _classes(
    columns: str, *rows: tuple[str | float, ...], **common: str | float
) -> tuple[NodeClass, ...]:
    """A table of node classes: each row's values in ``columns`` (space-separated field
    names), each with the ``common`` fields beside them."""
    names = columns.split()
    return tuple(
        NodeClass.model_validate({**dict(zip(names, row, strict=True)), **common}) for row in rows
    )


EMBEDDED_CLASSES: tuple[NodeClass, ...] = _classes(
    "name mem disk cpus",
    ("small", "2GiB", "32GiB", 2),
    ("medium", "4GiB", "64GiB", 4),
    ("large", "8GiB", "128GiB", 8),
    disk_bw="2GiBps",
    net_bw="1GiBps",
    cpu_max_load=0.9,
    disk_bw_max_load=0.8,
    net_bw_max_load=0.8,
)
"""The embedded cluster's sizes, cycled in order: small enough that a few real processes on
one host fill them, with 10 % CPU and 20 % bandwidth headroom kept free."""

_SIZES = "name mem disk cpus disk_bw net_bw weight"
"""The columns of a weighted mix's table."""

SIMULATED_CLASSES: tuple[NodeClass, ...] = _classes(
    _SIZES,
    ("small", "4GiB", "128GiB", 10, "1GiBps", "512MiBps", 0.5),
    ("medium", "8GiB", "256GiB", 20, "2GiBps", "1GiBps", 0.3),
    ("large", "16GiB", "512GiB", 40, "4GiBps", "2GiBps", 0.2),
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
    *_classes(_SIZES, ("tiny", "2GiB", "64GiB", 5, "512MiBps", "256MiBps", 0.35)),
    _weighted(_SMALL, 0.35),
    _weighted(_LARGE, 0.2),
    *_classes(_SIZES, ("huge", "64GiB", "2TiB", 160, "16GiBps", "8GiBps", 0.1)),
)
"""Node sizes 32× apart in one cluster (the simulator's small and large among them), with
:data:`SIMULATED_CLASSES`' per-GiB proportions."""

FLEET_CLASSES: tuple[NodeClass, ...] = _classes(
    _SIZES,
    ("small", "32GiB", "400GiB", 8.0, "1GiBps", "10Gbps", 0.45),
    ("medium", "128GiB", "1600GiB", 32.0, "2GiBps", "25Gbps", 0.40),
    ("large", "384GiB", "3840GiB", 96.0, "4GiBps", "100Gbps", 0.15),
)
"""Data-centre machines (8 to 96 cores, 10 to 100 Gbit/s), in the shares a large cluster of
them might have."""
