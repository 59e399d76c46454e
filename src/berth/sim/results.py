"""What a simulated run produces: one decision per arrival, and the run's tallies.

This module owns the record of a run — :class:`Decision` (what happened to one arrival: its
outcome, node, bytes local and pulled, modelled start latency, the refusals met on the way),
:class:`SimResult` (every decision, the cumulative bytes pulled, the utilisation samples, the
lower bounds of :mod:`berth.sim.bounds`) and :class:`Tally`, what a run accumulates as its
events are handled.  It computes no metrics: :mod:`berth.sim.report` turns a ``SimResult``
into figures, tables and plots; and it runs nothing: :mod:`berth.sim.simulator` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from berth.model import Layer
from berth.scheduler.multinode import ClusterScheduler
from berth.sim.cluster import SimNode
from berth.sim.config import SimConfig
from berth.sim.workload import Arrival

__all__ = ["Decision", "Observer", "Outcome", "SimResult", "Tally"]

Outcome = Literal["placed", "no_capacity", "gave_up", "no_matching_platform"]


@dataclass(frozen=True)
class Decision:
    """What happened to one arrival.

    ``refusals`` are the nodes that refused at confirmation during this decision (whether or
    not another then accepted), as ``(node, reason)``; ``local_bytes`` the request's layer
    bytes already on the chosen node (mounted or cached), ``pulled_bytes`` the rest;
    ``start_latency`` the modelled wait from arrival to start (refusal round trips, pulls,
    unpacking, boot); ``decision_seconds`` the wall-clock time of the real ``schedule`` call;
    ``layers`` what the chosen node mounted (its platform's variant), ``mem`` the memory
    reserved; ``could_hold`` — for a request not placed for capacity — a node whose true state
    could have held it at that moment.
    """

    index: int
    at: float
    request: str
    image: str
    instance_type: str
    platform: str
    scheduler: int
    outcome: Outcome
    decision_seconds: float
    refusals: tuple[tuple[str, str], ...] = ()
    node: str | None = None
    rank: int | None = None
    colocated_bytes: int = 0
    local_bytes: int = 0
    pulled_bytes: int = 0
    start_latency: float | None = None
    ends_at: float | None = None
    node_platform: str | None = None
    layers: tuple[Layer, ...] = ()
    mem: int = 0
    could_hold: str | None = None

    @property
    def placed(self) -> bool:
        return self.outcome == "placed"

    @property
    def refused(self) -> bool:
        """Not placed for lack of capacity (``no_capacity`` or ``gave_up``)."""
        return self.outcome in ("no_capacity", "gave_up")


@dataclass
class SimResult:
    """Everything one simulated run produced (metrics are computed by :mod:`berth.sim.report`).

    ``pulls`` is ``(simulated time, cumulative bytes pulled)`` after every placement that
    pulled; ``utilisation[s, n]`` is node ``n``'s reserved memory fraction at
    ``sample_times[s]``; ``lower_bound_bytes`` and ``capacity_bound_bytes`` the two lower
    bounds of :mod:`berth.sim.bounds` on this run's bytes pulled; ``preseeded`` maps a
    platform to the layers some node of it started with.
    """

    config: SimConfig
    policy: str
    nodes: tuple[SimNode, ...]
    decisions: list[Decision]
    pulls: list[tuple[float, int]]
    sample_times: npt.NDArray[np.float64]
    utilisation: npt.NDArray[np.float64]
    lower_bound_bytes: int
    end_time: float
    wall_seconds: float
    capacity_bound_bytes: int = 0
    preseeded: dict[str, frozenset[str]] = field(default_factory=dict)

    @property
    def pulled_bytes(self) -> int:
        return self.pulls[-1][1] if self.pulls else 0

    def placements(self) -> list[tuple[str, str | None]]:
        """``(request key, node or None)`` per arrival, in arrival order."""
        return [(decision.request, decision.node) for decision in self.decisions]


Observer = Callable[[Decision, Arrival, ClusterScheduler], None]
"""Called after each decision, before the chosen node re-publishes: the scheduler's replica
is still the view the decision was made from (``berth demo`` explains placements with it)."""


@dataclass
class Tally:
    """What a run accumulates as its events are handled: the decisions, the cumulative bytes
    pulled, the utilisation samples (and whom to tell of each decision)."""

    mem_max: npt.NDArray[np.float64]
    utilisation: npt.NDArray[np.float64]
    progress: Callable[[int, int], None] | None
    observer: Observer | None
    samples: int = 0
    decisions: list[Decision] = field(default_factory=list)
    pulls: list[tuple[float, int]] = field(default_factory=list)
    pulled_total: int = 0

    def record(self, decision: Decision, now: float) -> None:
        """Keep ``decision``; one that pulled adds its bytes to the cumulative total at ``now``."""
        self.decisions.append(decision)
        if decision.placed and decision.pulled_bytes:
            self.pulled_total += decision.pulled_bytes
            self.pulls.append((now, self.pulled_total))

    def sample(self, mem_free: npt.NDArray[np.int64]) -> None:
        """Record every node's reserved memory fraction, from its free memory (in name order)."""
        free = mem_free.astype(np.float64)
        mem_max = self.mem_max
        self.utilisation[self.samples] = 1.0 - np.divide(
            free, mem_max, out=np.ones_like(free), where=mem_max > 0
        )
        self.samples += 1
