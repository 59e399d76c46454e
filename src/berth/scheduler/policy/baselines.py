"""The baselines every contender is measured against: random order, binpack and spread.

* ``random`` — a seeded uniform permutation of the fitting nodes: the "no information"
  baseline.  The permutation is drawn over the fitting nodes taken in name order, so it
  depends only on the seed, the call sequence and the set of fitting nodes — not on slot
  numbering (the engine and the reference draw the same order).
* ``binpack`` — most allocated first (fill nodes up before opening new ones) and ``spread`` —
  least allocated first (keep nodes evenly filled): one scorer, :class:`Allocated`, weighted
  +1 or −1 by :class:`~berth.scheduler.policy.base.Weighted`; ties by node name.

**Allocation** is the mean reserved fraction of the two hard resources a snapshot
advertises::

    allocation(n) = ½·(1 − mem_free/mem_max) + ½·(1 − disk_free/disk_max)

(a resource with a zero maximum counts as fully allocated).  It is the node's state before
the request — unlike kube's LeastAllocated (:mod:`~berth.scheduler.policy.kube`), which counts
the request too; these two baselines are kept exactly as they were measured.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from berth.scheduler.policy.base import (
    ClusterView,
    Floats,
    PlacementRequest,
    SeedLike,
    Slots,
    Weighted,
    fitting_in_name_order,
    generator,
)

__all__ = [
    "Allocated",
    "BinpackPolicy",
    "LeastAllocatedPolicy",
    "RandomPolicy",
    "allocation",
    "free_fraction",
]


def free_fraction(view: ClusterView, resource: Literal["mem", "disk"]) -> Floats:
    """Per slot, ``<resource>_free / <resource>_max`` (0 when the maximum is 0)."""
    free = (view.mem_free if resource == "mem" else view.disk_free).astype(np.float64)
    total = (view.mem_max if resource == "mem" else view.disk_max).astype(np.float64)
    out = np.zeros(view.size, dtype=np.float64)
    np.divide(free, total, out=out, where=total > 0)
    return out


def allocation(view: ClusterView) -> Floats:
    """Per slot, the mean reserved fraction of memory and disk (0 = empty, 1 = full)."""
    allocated: Floats = 1.0 - 0.5 * (free_fraction(view, "mem") + free_fraction(view, "disk"))
    return allocated


class Allocated:
    """Scorer: :func:`allocation`, the node's mean reserved fraction (0..1)."""

    name = "allocated"

    def score(self, view: ClusterView, request: PlacementRequest) -> Floats:
        return allocation(view)


class BinpackPolicy(Weighted):
    """Most allocated first; ties by node name."""

    def __init__(self) -> None:
        super().__init__([(Allocated(), 1.0)], name="binpack")


class LeastAllocatedPolicy(Weighted):
    """Least allocated first; ties by node name."""

    def __init__(self) -> None:
        super().__init__([(Allocated(), -1.0)], name="spread")


class RandomPolicy:
    """A uniform random order of the fitting nodes, from a generator seeded at construction."""

    name = "random"

    def __init__(self, seed: SeedLike = 0) -> None:
        self._rng = generator(seed)

    def order(self, view: ClusterView, request: PlacementRequest) -> Slots:
        return self._rng.permutation(fitting_in_name_order(view, request))
