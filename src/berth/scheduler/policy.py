"""Placement policies: how fitting nodes are ordered once the filter has run.

Following kube-scheduler's split, *filtering* ("can this node run it?") is the engine's
``fit_mask`` — the seed's ``fits`` — and never varies; a *policy* only answers "how good is
it?" by ordering the fitting slots.  A new rule is a new policy (or a scorer a policy
combines), not an edit inside the engine.

``SEED`` is the default and is exactly the seed's ordering: colocated bytes descending, ties
by node name.  Other policies (simulated and measured before any becomes a default) live in
:mod:`berth.scheduler.policies`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from berth.model import Layer

if TYPE_CHECKING:
    from berth.scheduler.engine import Engine, Slots

__all__ = ["SEED", "Policy", "SeedPolicy"]


class Policy(Protocol):
    """Orders the fitting slots of an engine for one request."""

    name: str

    def order(
        self,
        engine: Engine,
        fit: npt.NDArray[np.bool_],
        colocated: npt.NDArray[np.int64],
        layers: Sequence[Layer],
    ) -> Slots:
        """The slots where ``fit`` is true, best first."""
        ...


class SeedPolicy:
    """The seed's ranking: most colocated bytes first, ties by node name.

    Nodes holding none of the request's layers are usually the majority and are already in
    name order through the engine's cached permutation; only the few with colocated bytes
    need sorting.
    """

    name = "seed"

    def order(
        self,
        engine: Engine,
        fit: npt.NDArray[np.bool_],
        colocated: npt.NDArray[np.int64],
        layers: Sequence[Layer],
    ) -> Slots:
        by_name = engine.name_order()
        if not layers:
            return by_name[fit[by_name]]
        positive = fit & (colocated > 0)
        best = np.flatnonzero(positive)
        rest = by_name[(fit & ~positive)[by_name]]
        if not best.size:
            return rest
        keys = np.lexsort((engine.name_rank()[best], -colocated[best]))
        return np.concatenate((best[keys], rest))


SEED = SeedPolicy()
