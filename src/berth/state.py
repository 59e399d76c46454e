"""``NodeState``: the snapshot a node publishes, and the seed's two formulas on it.

Every node advertises a ``NodeState``; snapshots are replicated to every scheduler and are
*approximate by design* — eventually consistent, possibly stale.  A scheduler uses them only
to filter and rank; the node's own admission (:mod:`berth.node.budget`) is the sole
authority, so a node that no longer fits simply refuses at confirmation time.

The snapshot carries load *and* ceilings, so fit is judged without the target's config:

``fits(state, spec)`` (the seed's predicate; ``<=`` everywhere, so an exact fill fits):

* hard:  ``spec.mem <= mem_free`` and ``spec.disk <= disk_free``;
* over-commit (only when the node configures the β_max stage, DESIGN.md §1.3):
  ``reserved_β + spec.β <= ceiling_β`` for β in vcpus, disk_bw, net_bw;
* soft:  ``cpu_load + spec.vcpus / cpu_capacity <= cpu_max_load``,
  ``disk_bw_load + spec.disk_bw <= disk_bw_ceiling``,
  ``net_bw_load + spec.net_bw <= net_bw_ceiling``.

``colocation_score(state, layers) = Σ size(L)`` over the request's layers ``L`` whose id the
node advertises as mounted.

``first_failed_check`` returns the first check that fails, in the order above, as a reason
code shared with node admission (``mem_exhausted`` …), so explanations and refusals speak the
same language.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated

from pydantic import Field, StrictInt

from berth.model import Layer, Spec
from berth.platform import Platform
from berth.validation import BerthModel

__all__ = [
    "REASONS",
    "NodeState",
    "Overcommit",
    "colocation_score",
    "describe_reason",
    "first_failed_check",
    "fits",
    "soft_check",
]

NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]

REASONS: Mapping[str, str] = {
    "mem_exhausted": "insufficient memory",
    "disk_exhausted": "insufficient disk",
    "cpu_overcommitted": "cpu over-commit ceiling reached",
    "disk_bw_overcommitted": "disk bandwidth over-commit ceiling reached",
    "net_bw_overcommitted": "network bandwidth over-commit ceiling reached",
    "cpu_saturated": "cpu saturated",
    "disk_bw_saturated": "disk bandwidth saturated",
    "net_bw_saturated": "network bandwidth saturated",
}
"""Reason codes of a failed check (snapshot filter and node admission alike) → phrase."""


def describe_reason(code: str) -> str:
    """The human phrase for a reason code (unknown codes are returned as they are)."""
    return REASONS.get(code, code)


class Overcommit(BerthModel):
    """The β_max stage: soft amounts reserved by admitted workloads against their ceilings.

    ``ceiling = k_max * total`` per soft resource; a workload fits only while
    ``reserved + spec <= ceiling``.  Bounds cumulative over-commit, which the instantaneous
    load check alone cannot (a burst of admissions lands before the load rises).  A ceiling of
    ``None`` leaves that resource unbounded.
    """

    vcpus_reserved: NonNegativeFloat = 0.0
    vcpus_ceiling: NonNegativeFloat | None = None
    disk_bw_reserved: NonNegativeFloat = 0.0
    disk_bw_ceiling: NonNegativeFloat | None = None
    net_bw_reserved: NonNegativeFloat = 0.0
    net_bw_ceiling: NonNegativeFloat | None = None

    def first_failed_check(self, vcpus: float, disk_bw: int, net_bw: int) -> str | None:
        """The reason code of the first exceeded ceiling, or ``None``."""
        if self.vcpus_ceiling is not None and self.vcpus_reserved + vcpus > self.vcpus_ceiling:
            return "cpu_overcommitted"
        if (
            self.disk_bw_ceiling is not None
            and self.disk_bw_reserved + disk_bw > self.disk_bw_ceiling
        ):
            return "disk_bw_overcommitted"
        if self.net_bw_ceiling is not None and self.net_bw_reserved + net_bw > self.net_bw_ceiling:
            return "net_bw_overcommitted"
        return None


class NodeState(BerthModel):
    """One node's advertised snapshot (see the module docstring for its meaning).

    Sizes are bytes, bandwidths bytes/s, ``cpu_load`` the smoothed busy fraction (0..1) of the
    whole machine, ``cpu_capacity`` cores.  ``generation`` increases with every publication of
    the same node, so a replica can drop out-of-order updates; ``admitted`` counts the
    reservations the node had taken when it published (a scheduler's assumed reservation with
    ``Admission.seq <= admitted`` is accounted for by this snapshot).  ``layers`` are the ids of
    mounted image layers; ``cached_layers`` those recently unmounted but still on local disk.
    ``mem_max``/``disk_max`` are the hard budget totals (for utilisation-aware policies).
    """

    node: Annotated[str, Field(min_length=1)]
    platform: Platform
    generation: NonNegativeInt = 0
    admitted: NonNegativeInt = 0
    published_at: NonNegativeFloat = 0.0
    labels: dict[str, str] = Field(default_factory=dict)
    mem_free: NonNegativeInt
    disk_free: NonNegativeInt
    mem_max: NonNegativeInt | None = None
    disk_max: NonNegativeInt | None = None
    cpu_load: Fraction = 0.0
    cpu_capacity: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    cpu_max_load: Fraction = 1.0
    disk_bw_load: NonNegativeFloat = 0.0
    disk_bw_ceiling: NonNegativeFloat
    net_bw_load: NonNegativeFloat = 0.0
    net_bw_ceiling: NonNegativeFloat
    layers: frozenset[str] = frozenset()
    cached_layers: frozenset[str] = frozenset()
    overcommit: Overcommit | None = None

    @property
    def mem_total(self) -> int:
        """``mem_max`` when advertised, else the free memory (nothing known to be used)."""
        return self.mem_max if self.mem_max is not None else self.mem_free

    @property
    def disk_total(self) -> int:
        """``disk_max`` when advertised, else the free disk."""
        return self.disk_max if self.disk_max is not None else self.disk_free


def first_failed_check(state: NodeState, spec: Spec) -> str | None:
    """The reason code of the first check ``spec`` fails on ``state``; ``None`` if it fits."""
    if spec.mem > state.mem_free:
        return "mem_exhausted"
    if spec.disk > state.disk_free:
        return "disk_exhausted"
    if state.overcommit is not None:
        reason = state.overcommit.first_failed_check(spec.vcpus, spec.disk_bw, spec.net_bw)
        if reason is not None:
            return reason
    return soft_check(
        spec,
        cpu_load=state.cpu_load,
        cpu_capacity=state.cpu_capacity,
        cpu_max_load=state.cpu_max_load,
        disk_bw_load=state.disk_bw_load,
        disk_bw_ceiling=state.disk_bw_ceiling,
        net_bw_load=state.net_bw_load,
        net_bw_ceiling=state.net_bw_ceiling,
    )


def soft_check(
    spec: Spec,
    *,
    cpu_load: float,
    cpu_capacity: float,
    cpu_max_load: float,
    disk_bw_load: float,
    disk_bw_ceiling: float,
    net_bw_load: float,
    net_bw_ceiling: float,
) -> str | None:
    """The soft checks, shared by the snapshot filter and the node's live admission.

    ``cpu_load + vcpus / cpu_capacity <= cpu_max_load``, ``disk_bw_load + disk_bw <=
    disk_bw_ceiling``, ``net_bw_load + net_bw <= net_bw_ceiling``; the first that fails.
    """
    if cpu_load + spec.vcpus / cpu_capacity > cpu_max_load:
        return "cpu_saturated"
    if disk_bw_load + spec.disk_bw > disk_bw_ceiling:
        return "disk_bw_saturated"
    if net_bw_load + spec.net_bw > net_bw_ceiling:
        return "net_bw_saturated"
    return None


def fits(state: NodeState, spec: Spec) -> bool:
    """The seed's ``fits/2``: hard headroom, then the soft load ceilings (all ``<=``)."""
    return first_failed_check(state, spec) is None


def colocation_score(state: NodeState, layers: Iterable[Layer]) -> int:
    """Bytes of ``layers`` already mounted on ``state``'s node."""
    mounted = state.layers
    return sum(layer.size for layer in layers if layer.id in mounted)
