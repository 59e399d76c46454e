"""The engine's layer → nodes index, and one request's layer match over it.

Which nodes already hold a request's layers is the question the seed's ranking turns on
(most colocated bytes first), asked on every decision over every node.  This module
answers it for :class:`~berth.scheduler.engine.Engine`, by slot (the engine's index for a
node), fast:

* **Layer → nodes index** (:class:`LayerIndex`).  Layer ids are interned to ints; for each
  layer the index keeps the slots that hold it (a growable int32 buffer), plus a dense
  bitmap for layers on a large share of the nodes.  It follows the engine's slots: one
  slot's layer set rewritten on an update (no work when unchanged), its capacity grown,
  its slots renumbered on compaction.  The engine keeps two: mounted layers (the seed's
  colocation) and cached ones (for policies that value them).
* **A request's match** (:class:`LayerMatch`).  A per-slot bit mask (bit ``j``: holds layer
  ``j``), built by one scatter or one word-wide OR per layer; colocated bytes and the
  ranking key are lookups in the request's ``2**R`` subset-sum table (memoised per layer
  sizes).  More than ``MASK_LAYERS`` layers fall back to summing sizes per slot.

What this module is not: it holds no node's figures and orders nothing — the engine's
columns and the fit checks are :mod:`~berth.scheduler.engine`'s, the ordering is the
policy's (:mod:`~berth.scheduler.policy.seed` for the seed's).  Sums are exact int64, as in
the reference ranker.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from berth.model import Layer
from berth.scheduler.policy.base import held_bytes

__all__ = ["MASK_LAYERS", "LayerIndex", "LayerMatch"]

_EMPTY_LAYERS = np.zeros(0, dtype=np.int32)
MASK_LAYERS = 12  # request layers ranked through a 2**R subset-sum table
_DENSE_SHARE = 8  # a layer on >= 1/8 of the slots gets a dense bitmap …
_DENSE_MIN = 1024  # … once it is on at least this many


class LayerIndex:
    """Layer id → slots of the nodes that hold it, with each slot's own layer list.

    Every layer keeps a growable int32 buffer of holder slots.  A layer held by a large share
    of the nodes (a popular base layer: on real Docker Hub data the top layer sits on most
    hosts) also gets a dense boolean bitmap over slots, kept in step by every add and drop:
    OR-ing a bitmap into a request's match costs one pass over the nodes, cheaper than
    scattering thousands of slot numbers.  Bitmaps are created when a query first needs them
    and dropped when the layer becomes rare again, so memory stays proportional to use.
    """

    def __init__(self, interned: dict[str, int], capacity: int) -> None:
        self._interned = interned  # shared with the engine's other index
        self._capacity = capacity
        self._holders: list[npt.NDArray[np.int32]] = []
        self._counts: list[int] = []
        self._dense: dict[int, npt.NDArray[np.bool_]] = {}
        self._node_layers: dict[int, npt.NDArray[np.int32]] = {}

    def _intern(self, layer_id: str) -> int:
        lid = self._interned.get(layer_id)
        if lid is None:
            lid = self._interned[layer_id] = len(self._interned)
        while len(self._holders) <= lid:
            self._holders.append(np.zeros(4, dtype=np.int32))
            self._counts.append(0)
        return lid

    def resize(self, capacity: int) -> None:
        """Follow the engine's slot capacity (dense bitmaps span every slot)."""
        for lid, bitmap in self._dense.items():
            grown = np.zeros(capacity, dtype=bool)
            grown[: bitmap.size] = bitmap
            self._dense[lid] = grown
        self._capacity = capacity

    def set(self, slot: int, layer_ids: Iterable[str]) -> None:
        """Make ``layer_ids`` the set held by ``slot`` (no work when it is unchanged)."""
        new = np.array(sorted(self._intern(layer_id) for layer_id in layer_ids), dtype=np.int32)
        old = self._node_layers.get(slot, _EMPTY_LAYERS)
        if np.array_equal(old, new):
            return
        old_set, new_set = set(old.tolist()), set(new.tolist())
        for lid in old_set - new_set:
            self._drop(lid, slot)
        for lid in new_set - old_set:
            self._add(lid, slot)
        if new.size:
            self._node_layers[slot] = new
        else:
            self._node_layers.pop(slot, None)

    def clear(self, slot: int) -> None:
        self.set(slot, ())

    def renumber(self, order: npt.NDArray[np.intp], new_of_old: npt.NDArray[np.intp]) -> None:
        """Follow the engine's compaction: old slot ``order[i]`` becomes slot ``i``."""
        count = int(order.size)
        for lid, held in enumerate(self._counts):
            if held:
                buffer = self._holders[lid]
                buffer[:held] = new_of_old[buffer[:held]]
        for bitmap in self._dense.values():
            bitmap[:count] = bitmap[order]
            bitmap[count:] = False
        self._node_layers = {
            int(new_of_old[slot]): layers for slot, layers in self._node_layers.items()
        }

    def _add(self, lid: int, slot: int) -> None:
        buffer, count = self._holders[lid], self._counts[lid]
        if count == buffer.size:
            grown = np.zeros(buffer.size * 2, dtype=np.int32)
            grown[:count] = buffer
            buffer = self._holders[lid] = grown
        buffer[count] = slot
        self._counts[lid] = count + 1
        bitmap = self._dense.get(lid)
        if bitmap is not None:
            bitmap[slot] = True

    def _drop(self, lid: int, slot: int) -> None:
        buffer, count = self._holders[lid], self._counts[lid]
        where = int(np.flatnonzero(buffer[:count] == slot)[0])
        buffer[where] = buffer[count - 1]
        self._counts[lid] = count - 1
        bitmap = self._dense.get(lid)
        if bitmap is not None:
            bitmap[slot] = False

    def holders(self, layer_id: str) -> npt.NDArray[np.int32]:
        """Slots holding ``layer_id`` (a view; do not keep it across updates)."""
        lid = self._interned.get(layer_id)
        if lid is None or lid >= len(self._holders):
            return _EMPTY_LAYERS
        return self._holders[lid][: self._counts[lid]]

    def count(self, layer_id: str) -> int:
        """How many slots hold ``layer_id``."""
        lid = self._interned.get(layer_id)
        return 0 if lid is None or lid >= len(self._counts) else self._counts[lid]

    def bitmap(self, layer_id: str, size: int) -> npt.NDArray[np.bool_] | None:
        """A dense holder bitmap over the first ``size`` slots, if the layer is popular enough.

        ``None`` means: scatter :meth:`holders` instead (the layer is held by few nodes).
        """
        lid = self._interned.get(layer_id)
        if lid is None or lid >= len(self._counts):
            return None
        count = self._counts[lid]
        bitmap = self._dense.get(lid)
        if count < max(_DENSE_MIN, size // _DENSE_SHARE):
            if bitmap is not None and count < size // (4 * _DENSE_SHARE):
                del self._dense[lid]  # rare again: give the memory back
            return None
        if bitmap is None:
            bitmap = np.zeros(self._capacity, dtype=bool)
            bitmap[self._holders[lid][:count]] = True
            self._dense[lid] = bitmap
        return bitmap[:size]

    def scores(self, layers: Sequence[Layer], size: int) -> npt.NDArray[np.int64]:
        """Per slot, the bytes of ``layers`` held (an int64 array of length ``size``)."""
        return held_bytes(self, layers, size)

    def nbytes(self) -> int:
        """Bytes used by the buffers and per-node arrays (for memory accounting)."""
        per_node = sum(array.nbytes + 112 for array in self._node_layers.values())
        dense = sum(bitmap.nbytes + 112 for bitmap in self._dense.values())
        return sum(buffer.nbytes + 112 for buffer in self._holders) + per_node + dense


@functools.lru_cache(maxsize=4096)
def _subset_tables(sizes: tuple[int, ...]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint16]]:
    """For layer sizes ``s``: the bytes of every subset (indexed by bit mask) and its dense rank.

    A pure function of the sizes, memoised because requests for the same image repeat.
    """
    sums = np.zeros(1 << len(sizes), dtype=np.int64)
    for j, size in enumerate(sizes):
        half = 1 << j
        sums[half : 2 * half] = sums[:half] + size
    _, rank = np.unique(-sums, return_inverse=True)
    sums.flags.writeable = False
    dense = rank.reshape(-1).astype(np.uint16)
    dense.flags.writeable = False
    return sums, dense


@functools.lru_cache(maxsize=4096)
def _descending_table(sizes: tuple[int, ...], shift: int, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """Per subset mask of layers sized ``sizes``: ``(key_limit - key) << shift`` as ``dtype``."""
    _, rank = _subset_tables(sizes)
    limit = int(rank[0]) + 1  # the empty subset has the largest key
    table = (limit - rank.astype(np.int64)).astype(dtype)
    np.left_shift(table, shift, out=table)
    table.flags.writeable = False
    return table


class LayerMatch:
    """Which of one request's layers each slot holds, and the bytes that adds up to.

    For up to ``MASK_LAYERS`` request layers, each slot gets a bit mask (bit ``j`` set when it
    holds layer ``j``), built with one scatter or bitmap OR per layer.  Colocated bytes are
    then a lookup in the table of all ``2**R`` subset sums, and the ranking key — the dense
    rank of a slot's bytes, 0 for the most — a lookup in that table's rank, so ordering needs
    only a radix sort of small integers.  More layers than that fall back to summing sizes
    per slot and ranking the distinct sums.  Sums are exact int64, as in the reference.
    """

    def __init__(self, index: LayerIndex, layers: Sequence[Layer], size: int) -> None:
        self.layers = layers
        self.size = size
        self._index = index
        self._colocated: npt.NDArray[np.int64] | None = None
        self._key: npt.NDArray[Any] | None = None
        self.bits: npt.NDArray[Any] | None = None
        self._sizes: tuple[int, ...] = ()
        self._sums: npt.NDArray[np.int64] | None = None
        self._rank: npt.NDArray[np.uint16] | None = None
        if 0 < len(layers) <= MASK_LAYERS:
            self._build_mask()

    def _build_mask(self) -> None:
        layers, size, index = self.layers, self.size, self._index
        wide = len(layers) > 8
        # Work on a length rounded up to whole 64-bit words: a dense bitmap's 0/1 lanes are
        # shifted and OR-ed eight (or four) slots at a time through a uint64 view — a lane
        # holding 1 << j never carries into its neighbour.
        padded = -(-size // 8) * 8
        bits: npt.NDArray[Any] = np.zeros(padded, dtype=np.uint16 if wide else np.uint8)
        words = bits.view(np.uint64)
        shifted = np.empty_like(words)
        for j, layer in enumerate(layers):
            bitmap = index.bitmap(layer.id, padded)
            if bitmap is not None:
                lanes = bitmap.astype(np.uint16) if wide else bitmap
                np.left_shift(lanes.view(np.uint64), j, out=shifted)
                np.bitwise_or(words, shifted, out=words)
                continue
            holders = index.holders(layer.id)
            if holders.size:
                at = holders.astype(np.intp)  # intp indexes about twice as fast as int32
                bits[at] = bits[at] | (1 << j)
        self.bits = bits[:size]
        self._sizes = tuple(layer.size for layer in layers)
        self._sums, self._rank = _subset_tables(self._sizes)

    @property
    def colocated(self) -> npt.NDArray[np.int64]:
        """Per slot, the bytes of the request's layers it holds."""
        if self._colocated is None:
            if self.bits is not None and self._sums is not None:
                self._colocated = self._sums[self.bits]
            else:
                self._colocated = self._index.scores(self.layers, self.size)
        return self._colocated

    def colocated_at(self, slots: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        """Colocated bytes of just ``slots`` (no full-width pass)."""
        if self._colocated is None and self.bits is not None and self._sums is not None:
            at: npt.NDArray[np.int64] = self._sums[self.bits[slots]]
            return at
        selected: npt.NDArray[np.int64] = self.colocated[slots]
        return selected

    def descending_keys(
        self, shift: int, dtype: type[np.unsignedinteger[Any]]
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any]] | None:
        """``(bits, table)`` with ``table[bits[slot]] == (key_limit - key[slot]) << shift`` as
        ``dtype`` (the seed's packed key, :func:`~berth.scheduler.policy.seed.seed_order`);
        ``None`` without subset masks (more than ``MASK_LAYERS`` layers, or none)."""
        if self.bits is None:
            return None
        return self.bits, _descending_table(self._sizes, shift, np.dtype(dtype))

    @property
    def key_limit(self) -> int:
        """One more than the largest key (the key of a slot holding none of the layers)."""
        if self._rank is not None:
            return int(self._rank[0]) + 1  # the empty subset has the fewest bytes
        return int(self.key.max(initial=0)) + 1

    @property
    def key(self) -> npt.NDArray[Any]:
        """Per slot, the dense rank of its colocated bytes (0 = most); ties share a key."""
        if self._key is None:
            if self.bits is not None and self._rank is not None:
                self._key = self._rank[self.bits]
            else:
                _, rank = np.unique(-self.colocated, return_inverse=True)
                self._key = rank.reshape(-1)
        return self._key
