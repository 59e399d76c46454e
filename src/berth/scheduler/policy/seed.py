"""The seed's ordering — the default policy — and the engine's fast path for it.

``SEED`` orders the fitting nodes exactly as the seed's ``candidates/2`` does: most colocated
bytes first (the request's layers *mounted* on the node), ties by node name in code-point
order.  It is every ranker's default; the other policies (:mod:`~berth.scheduler.policy`'s
registry) are simulated and measured against it before any becomes a default.

Two implementations, held equal by property tests:

* :meth:`SeedPolicy.order` — on any :class:`~berth.scheduler.policy.base.ClusterView`, the
  definition spelled as a ``lexsort`` of (bytes desc, name rank);
* :func:`seed_order` — what the engine runs whenever the policy is the seed's, because this
  ordering is the one a scheduler pays for on every decision.  It returns a
  :class:`SeedOrder`, which orders the fitting slots only as far as they are read.

**Packed keys.**  Each slot's sort key and its name position share one unsigned integer::

    packed = ((key_limit − key) << shift  |  (2**shift − 1 − name_position)) × fit

where ``key`` is the dense rank of the slot's colocated bytes (0 for the most; the engine's
:class:`~berth.scheduler.layer_index.LayerMatch`) and ``shift`` the bits a name position needs.
The best node has the *largest* integer; among equal keys the first name wins; all packed
keys of fitting slots are distinct and non-zero, and every unfit slot is 0 — the product by
``fit`` is one branch-free pass (a ``where`` on a random mask mispredicts a branch per
slot).  When the request's layers are ranked through a subset mask per slot, the first
factor is one gather from a ``2**R``-entry table; the rest is one OR with the engine's cached
per-slot tie-breaks and one multiply: three passes over the nodes.

**Lazy order.**  A scheduler's walk almost always stops at the first node, so
:class:`SeedOrder` does not sort what it will not use: the first node is one ``argmax``;
reading past it selects the next ``chunk`` nodes (the threshold by ``np.partition`` of a
copy, linear time; the nodes at or above it by one comparison) and sorts only those; reading
past those orders everything left at once (a walk that far has met a wall of refusals, and
``candidates()`` reads everything anyway).  An extension happens only when every node already
ordered has been read, and what it appends is exactly the next stretch of the full order:
the selected packed keys are the largest of those left, and sorting them by value is sorting
by (bytes desc, name).  So however far a walk reads, it reads the seed's order.  Ordered
slots are zeroed in the packed array, which otherwise keeps its slot order; it belongs to
the order alone, so the order stays a value however the engine changes after it was made.

**Sorting everything.**  NumPy sorts 32- and 64-bit integers with a SIMD sort where the CPU
has one (AVX-512: 10,000 keys in ~13 µs) and about twenty times slower where it has not
(~300 µs).  Its *stable* sort of 16-bit keys is a radix sort either way (~13 µs).  So when
slots are name positions (the engine compacted), the rest may instead be ordered by a stable
radix argsort of the 16-bit key alone, over the remaining slots in slot order — ties keep
slot order, which is name order.  :func:`radix_sorts_faster` measures once per process which
of the two is faster here.

(The reference ranker runs the seed's literal sort instead; see
:mod:`~berth.scheduler.reference`.)
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from berth.model import Layer
from berth.scheduler.policy.base import ClusterView, PlacementRequest, Slots, order_fitting

__all__ = [
    "CHUNK",
    "SEED",
    "ColocationKey",
    "CompleteOrder",
    "SeedOrder",
    "SeedPolicy",
    "SlotOrder",
    "TieBreaks",
    "name_shift",
    "radix_sorts_faster",
    "seed_order",
]

CHUNK = 32
"""Nodes selected by the extension past the first node (a walk that got refusals); the
extension after that orders everything left."""

TieBreaks = Callable[[int, type[np.unsignedinteger[Any]]], npt.NDArray[Any]]
"""``tie_breaks(shift, dtype)``: per slot, ``2**shift − 1 − (its position in name order)`` as
``dtype`` — the first name gets the largest value (free slots: any value).  May be cached."""


def name_shift(count: int) -> int:
    """Bits a name position among ``count`` live nodes needs (at least 1)."""
    return max(count - 1, 1).bit_length()


@functools.cache
def radix_sorts_faster() -> bool:
    """Whether ordering by a stable radix argsort of 16-bit keys (and the gathers around it,
    about twice the argsort) beats NumPy's sort of packed 32-bit keys on this machine.

    Measured once per process on 8,192 keys, best of five each (under 2 ms even without
    SIMD); the two differ by 2× one way or 10× the other, so noise does not decide.
    """
    packed = np.random.default_rng(0).integers(1, 2**31, 8192).astype(np.uint32)
    keys = (packed >> 19).astype(np.uint16)

    def fastest(run: Callable[[], object]) -> int:
        best = None
        for _ in range(5):
            start = time.perf_counter_ns()
            run()
            elapsed = time.perf_counter_ns() - start
            best = elapsed if best is None else min(best, elapsed)
        return best or 0

    radix = fastest(lambda: np.argsort(keys, kind="stable"))
    return 2 * radix < fastest(lambda: np.sort(packed))


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

    def descending_keys(
        self, shift: int, dtype: type[np.unsignedinteger[Any]]
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any]] | None:
        """``(mask, table)`` with ``table[mask[slot]] == (key_limit − key[slot]) << shift``
        as ``dtype`` — per slot the bit mask of the request layers it holds, per mask the
        shifted descending key (a small table, memoised) — or ``None`` (then :attr:`key`)."""
        ...


class SlotOrder(Protocol):
    """Fitting slots in a policy's order, possibly ordered only as far as they are read."""

    def __len__(self) -> int: ...

    def prefix(self, length: int) -> Slots:
        """The first ``min(length, len(self))`` slots, in order."""
        ...

    def ordered(self) -> int:
        """How many slots are ordered so far (reading those costs no further ordering)."""
        ...


class CompleteOrder:
    """An order computed in full (every policy but the seed's, and the no-layer case)."""

    __slots__ = ("_slots",)

    def __init__(self, slots: Slots) -> None:
        self._slots = slots

    def __len__(self) -> int:
        return int(self._slots.size)

    def prefix(self, length: int) -> Slots:
        return self._slots[:length]

    def ordered(self) -> int:
        return int(self._slots.size)


class SeedPolicy:
    """The seed's ranking: most colocated bytes first, ties by node name."""

    name = "seed"

    def order(self, view: ClusterView, request: PlacementRequest) -> Slots:
        return order_fitting(view, request, -request.colocated)


SEED = SeedPolicy()


def seed_order(
    fit: npt.NDArray[np.bool_],
    match: ColocationKey,
    by_name: Slots,
    in_name_order: bool,
    tie_breaks: TieBreaks,
    *,
    chunk: int = CHUNK,
    radix: bool | None = None,
) -> SlotOrder:
    """The seed's order of the slots where ``fit`` is true, ordered lazily (see the module
    docstring).

    ``by_name`` lists the live slots in name order; ``in_name_order`` says the slots already
    *are* name positions (the engine after compaction: ``by_name`` is ``arange``), which
    saves a gather per node read.  ``radix`` chooses how a full order is sorted where both
    ways apply (default: :func:`radix_sorts_faster`); the order is the same either way.
    """
    if not match.layers:  # every node ties at 0 bytes: name order is the answer, in O(n)
        fitting: Slots = np.flatnonzero(fit) if in_name_order else by_name[fit[by_name]]
        return CompleteOrder(fitting)
    shift = name_shift(by_name.size)
    limit = match.key_limit
    packed_type: type[np.unsignedinteger[Any]] = (
        np.uint32 if (limit + 1) << shift <= 2**32 else np.uint64
    )
    masks = match.descending_keys(shift, packed_type)
    packed: npt.NDArray[Any]
    if masks is not None:
        mask, table = masks
        packed = table.take(mask)
    else:
        packed = (limit - match.key).astype(packed_type)
        np.left_shift(packed, shift, out=packed)
    np.bitwise_or(packed, tie_breaks(shift, packed_type), out=packed)
    np.multiply(packed, fit, out=packed)
    if in_name_order and limit < 2**16:
        radix = radix_sorts_faster() if radix is None else radix
    else:
        radix = False
    return SeedOrder(
        packed,
        int(np.count_nonzero(fit)),
        shift,
        None if in_name_order else by_name,
        chunk,
        radix=radix,
    )


class SeedOrder:
    """The seed's order of the fitting slots, selected and sorted only as far as it is read.

    Holds the packed keys (its own array; see the module docstring) of the slots not yet
    ordered — ordered and unfit slots are 0 there — and the slots ordered so far.
    Thread-safe: extensions happen under a lock.
    """

    def __init__(
        self,
        packed: npt.NDArray[Any],
        count: int,
        shift: int,
        by_name: Slots | None,
        chunk: int = CHUNK,
        *,
        radix: bool = False,
    ) -> None:
        self._rest = packed
        self._count = count
        self._left = count  # fitting slots not ordered yet: the non-zero entries of _rest
        self._shift = shift
        self._low = (1 << shift) - 1
        # Order the rest by a radix argsort of the key: only where slots are name positions.
        self._radix = radix and by_name is None
        self._by_name = by_name
        self._next = max(int(chunk), 1)
        self._slots: Slots = np.zeros(0, dtype=np.intp)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._count

    def ordered(self) -> int:
        return int(self._slots.size)

    def prefix(self, length: int) -> Slots:
        if length > self._slots.size and self._left:
            with self._lock:
                while length > self._slots.size and self._left:
                    self._extend(length - int(self._slots.size))
        return self._slots[:length]

    def _extend(self, wanted: int) -> None:
        rest, left = self._rest, self._left
        if not self._slots.size and wanted == 1:
            # The packed keys are distinct: the maximum is the best node.  Scalar arithmetic
            # from here on (this is the path of nearly every decision).
            at = int(rest.argmax())
            position = self._low - (int(rest[at]) & self._low)
            rest[at] = 0
            slot = position if self._by_name is None else int(self._by_name[position])
            self._slots = np.array((slot,), dtype=np.intp)
            self._left -= 1
            return
        wanted = max(wanted, self._next)
        self._next = left  # after one selection, the next extension orders all that is left
        slots: Slots
        if 2 * wanted < left:  # select the `wanted` best, sort only those
            cut = rest.size - wanted
            threshold = np.partition(rest, cut)[cut]  # on a copy: `rest` keeps slot order
            selected = np.flatnonzero(rest >= threshold)  # exactly `wanted`: keys are distinct
            slots = self._decode(np.sort(rest[selected])[::-1])
            rest[selected] = 0
        elif self._radix:  # all that is left, by a radix sort of the 16-bit key
            fitting = np.flatnonzero(rest)  # ascending slots, i.e. name order
            keys = (rest[fitting] >> self._shift).astype(np.uint16)
            np.invert(keys, out=keys)  # the largest packed key first; ties keep name order
            slots = fitting[np.argsort(keys, kind="stable")]
            self._rest = rest[:0]
        else:  # all that is left, by one sort of the packed keys
            rest.sort()
            slots = self._decode(rest[: -left - 1 : -1])
            self._rest = rest[:0]
        self._slots = np.concatenate((self._slots, slots)) if self._slots.size else slots
        self._left -= slots.size

    def _decode(self, packed: npt.NDArray[Any]) -> Slots:
        """The slots of packed keys (their low bits hold ``2**shift - 1 - name position``)."""
        positions = (self._low - (packed & self._low)).astype(np.intp)
        return positions if self._by_name is None else self._by_name[positions]
