"""The seed's ordering — the default policy — and the engine's fast path for it.

``SEED`` orders the fitting nodes exactly as the seed's ``candidates/2`` does: most colocated
bytes first (the request's layers *mounted* on the node), ties by node name in code-point
order.  It is every ranker's default; the other policies (:mod:`~berth.scheduler.policy`'s
registry) are simulated and measured against it before any becomes a default.

Two implementations, held equal by property tests:

* :meth:`SeedPolicy.order` — on any :class:`~berth.scheduler.policy.base.ClusterView`, the
  definition spelled as a ``lexsort`` of (bytes desc, name rank);
* :func:`fast_order` — what the engine runs whenever the policy is the seed's, because this
  ordering is the one a scheduler pays for on every decision.  The colocation key (the
  engine's dense rank of colocated bytes, 0 for the most) of every slot, taken in name order,
  is packed with the slot's name position into one unsigned integer — key in the high bits,
  position in the low bits — so a plain (SIMD) sort of those integers is the stable sort by
  key with the name tie-break, and unfit slots (a key above every real one) sort last.  Once
  the engine has compacted its slots into name order there are no name-order gathers at all.

(The reference ranker runs the seed's literal sort instead; see
:mod:`~berth.scheduler.reference`.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from berth.model import Layer
from berth.scheduler.policy.base import ClusterView, PlacementRequest, Slots, order_fitting

__all__ = ["SEED", "ColocationKey", "Positions", "SeedPolicy", "fast_order"]

Positions = Callable[[int, type[np.unsignedinteger[Any]]], npt.NDArray[Any]]
"""``positions(count, dtype)``: ``arange(count)`` of an unsigned ``dtype`` (may be cached)."""


class ColocationKey(Protocol):
    """What the fast path needs of a request's layer match (the engine's ``LayerMatch``)."""

    @property
    def layers(self) -> Sequence[Layer]: ...

    @property
    def key(self) -> npt.NDArray[Any]:
        """Per slot, the dense rank of its colocated bytes (0 = most); ties share a key."""
        ...

    @property
    def key_limit(self) -> int:
        """One more than the largest key."""
        ...


class SeedPolicy:
    """The seed's ranking: most colocated bytes first, ties by node name."""

    name = "seed"

    def order(self, view: ClusterView, request: PlacementRequest) -> Slots:
        return order_fitting(view, request, -request.colocated)


SEED = SeedPolicy()


def fast_order(
    fit: npt.NDArray[np.bool_],
    match: ColocationKey,
    by_name: Slots | None,
    positions: Positions,
) -> Slots:
    """The seed's order of the slots where ``fit`` is true, by one packed integer sort.

    ``by_name`` lists the live slots in name order; ``None`` says the slots already *are* name
    positions (the engine after compaction), which saves two gathers.
    """
    if not match.layers:  # every node ties at 0 bytes: name order is the answer
        if by_name is None:
            return np.flatnonzero(fit)
        fitting: Slots = by_name[fit[by_name]]
        return fitting
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
    np.bitwise_or(keyed, positions(count, packed_type), out=keyed)
    keyed.sort()
    name_positions = keyed[: np.count_nonzero(fit)] & ((1 << shift) - 1)
    if by_name is None:
        slots: Slots = name_positions.astype(np.intp)
        return slots
    ordered: Slots = by_name[name_positions]
    return ordered
