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

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from berth.scheduler.engine import Engine, LayerMatch, Slots

__all__ = ["SEED", "Policy", "SeedPolicy"]


class Policy(Protocol):
    """Orders the fitting slots of an engine for one request."""

    name: str

    def order(self, engine: Engine, fit: npt.NDArray[np.bool_], match: LayerMatch) -> Slots:
        """The slots where ``fit`` is true, best first.

        ``match`` describes the request's layers on every slot: ``match.colocated`` (bytes
        mounted), ``match.key`` (dense rank of those bytes), ``match.layers``.
        """
        ...


class SeedPolicy:
    """The seed's ranking: most colocated bytes first, ties by node name.

    The colocation key (:class:`LayerMatch.key`, a small dense rank) of every slot, taken in
    name order, is packed with the slot's name position into one unsigned integer — key in
    the high bits, position in the low bits — so a plain (SIMD) sort of those integers is the
    stable sort by key with the name tie-break, and unfit slots (a key above every real one)
    sort last.
    """

    name = "seed"

    def order(self, engine: Engine, fit: npt.NDArray[np.bool_], match: LayerMatch) -> Slots:
        if engine.in_name_order:  # slots are name positions: no gathers
            if not match.layers:
                return np.flatnonzero(fit)
            return _packed_sort(fit, match, None, engine)
        by_name = engine.name_order()
        if not match.layers:
            by_name_fit: Slots = by_name[fit[by_name]]
            return by_name_fit
        return _packed_sort(fit, match, by_name, engine)


def _packed_sort(
    fit: npt.NDArray[np.bool_], match: LayerMatch, by_name: Slots | None, engine: Engine
) -> Slots:
    key = match.key
    count = fit.size if by_name is None else by_name.size
    shift = max(count - 1, 1).bit_length()
    unfit = match.key_limit
    packed_type = np.uint32 if (unfit << shift) < 2**32 else np.uint64
    keyed: npt.NDArray[Any] = np.where(fit, key, unfit)
    if by_name is not None:
        keyed = keyed[by_name]
    keyed = keyed.astype(packed_type)
    np.left_shift(keyed, shift, out=keyed)
    np.bitwise_or(keyed, engine.positions(count, packed_type), out=keyed)
    keyed.sort()
    positions = keyed[: np.count_nonzero(fit)] & ((1 << shift) - 1)
    if by_name is None:
        slots: Slots = positions.astype(np.intp)
        return slots
    ordered: Slots = by_name[positions]
    return ordered


SEED = SeedPolicy()
