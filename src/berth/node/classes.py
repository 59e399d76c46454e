"""Node size classes: one definition of "a node of this size", for every cluster berth builds.

A :class:`NodeClass` names a node size — hard budget (``mem``, ``disk``), cores, bandwidth
caps and the soft ceilings' load fractions — and is turned into a node's budget by exactly one
rule, :meth:`NodeClass.budget_section` (the ``[budget]`` table an agent configuration holds;
:meth:`NodeClass.limits` resolves it).  The embedded cluster (:mod:`berth.embedded`) and the
simulator (:mod:`berth.sim.simulator`) both describe their nodes with it; each keeps its own
*instances*, because they are sized for different jobs (a few real processes on one host
versus a hundred simulated nodes with memory as the binding resource).

It owns sizes only: which classes a cluster mixes, and in what proportion or order, is the
cluster builder's business (``weight`` is read by the simulator's layout; the embedded
cluster cycles through its classes in order).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from berth.model import Bytes, BytesPerSecond, Cores, Name
from berth.node.budget import BudgetLimits
from berth.node.config import BudgetSection
from berth.validation import BerthModel

__all__ = ["NodeClass"]

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
