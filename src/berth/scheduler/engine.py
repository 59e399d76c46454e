"""The vectorised candidate engine: the seed's ranking over struct-of-arrays, in NumPy.

Same answers as :mod:`~berth.scheduler.reference` (property tests hold them equal), at a
cost that grows gently with the cluster:

* **Struct of arrays.**  Each snapshot field the filter reads is one NumPy column indexed by
  a node *slot*; ``fits`` becomes the vectorised form of every check in the one table
  (:data:`berth.checks.CHECKS`), a vector comparison or two per check over all slots into
  preallocated scratch buffers.  Each check's vector and scalar forms evaluate the same
  expression in the same order in float64, so results agree bit for bit with the reference
  (``cpu_load + vcpus / cpu_capacity <= cpu_max_load`` …; an absent over-commit ceiling is
  ``+inf``).
* **Layer → nodes index** (:mod:`~berth.scheduler.layer_index`).  For each layer the slots
  that mount it, plus a dense bitmap for layers on a large share of the nodes; a request's
  match (:class:`~berth.scheduler.layer_index.LayerMatch`) is a per-slot bit mask of the
  layers held, so colocated bytes and the ranking key are lookups in the request's 2**R
  subset-sum table.  A second index holds *cached* layers for policies that value them.
* **Incremental updates.**  ``upsert`` rewrites one slot's columns and, only when the node's
  layer set changed, moves that slot in and out of the affected holder buffers.  Slots of
  departed nodes are reused; the name order is kept up to date by insertion.
* **Ordering, lazily.**  The seed's ordering runs on a fast path
  (:func:`~berth.scheduler.policy.seed.seed_order`): each slot's key is packed with its name
  position into one integer (0 for an unfit slot) in three passes over the nodes, and the
  order is *selected*, not sorted: the first node is one ``argmax``, and reading further
  selects the next stretch in linear time and sorts only that.  A scheduler's walk almost
  always stops at the first node, so a decision costs the filter, the layer match and those
  three passes; ``candidates()``, which reads everything, pays one sort more.  Once
  membership has been stable for a while, :meth:`Engine.compact` renumbers slots into name
  order so that turning name positions back into slots needs no gather.  Any other policy
  gets a read-only :class:`~berth.scheduler.policy.base.ClusterView` of the columns
  (:meth:`Engine.view`) and the request with its fit mask and colocated bytes, and returns
  its full order (policies other than the seed's are not lazy).

Memory per node: ~130 bytes of columns, the node's interned layer array, its slots in the
holder buffers (4 bytes per mounted layer, up to 2× slack), a byte per dense layer bitmap and
the name → slot map, and the cached tie-break column (4 bytes) — under 1 KiB per node at
100,000 and 1,000,000 nodes with 30 layers each (see benchmarks/).
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from berth.checks import CHECKS, COLUMN_FIELDS, Check, Demand, NodeColumns, Scratch, narrow
from berth.model import Layer, Spec
from berth.platform import Platform
from berth.scheduler.layer_index import LayerIndex, LayerMatch
from berth.scheduler.policy.base import ClusterView, PlacementRequest, Policy
from berth.scheduler.policy.seed import (
    CHUNK,
    CompleteOrder,
    SeedPolicy,
    SlotOrder,
    seed_order,
)
from berth.scheduler.ranking import Ranking
from berth.state import NodeState

__all__ = ["Engine", "EngineRanking"]

Slots = npt.NDArray[np.intp]

_FLOAT_COLUMNS = (
    "cpu_load",
    "cpu_capacity",
    "cpu_max_load",
    "disk_bw_load",
    "disk_bw_ceiling",
    "net_bw_load",
    "net_bw_ceiling",
    "oc_vcpus_reserved",
    "oc_vcpus_ceiling",
    "oc_disk_bw_reserved",
    "oc_disk_bw_ceiling",
    "oc_net_bw_reserved",
    "oc_net_bw_ceiling",
)
_INT_COLUMNS = ("generation", "mem_free", "disk_free", "mem_max", "disk_max")
_BOOL_COLUMNS = ("cordoned",)


class Engine:
    """The NumPy ranker (see the module docstring).  Thread-safe."""

    def __init__(
        self,
        capacity: int = 64,
        *,
        compact_after: int | None = 64,
        checks: Sequence[Check] = CHECKS,
        chunk: int = CHUNK,
    ) -> None:
        self._lock = threading.RLock()
        self.checks = tuple(checks)  # the fit rule fit_mask applies (vectorised)
        # The seed's lazy order selects ``chunk`` nodes when a walk reads past the first.
        self.chunk = chunk
        # After ``compact_after`` rankings without a membership change, slots are renumbered
        # into name order (see :meth:`compact`); ``None`` never compacts.
        self.compact_after = compact_after
        self._in_name_order = True  # slot order is name order and no slot is free
        self._ranks_since_change = 0
        self._capacity = max(8, -(-capacity // 8) * 8)  # whole 64-bit words of bool lanes
        self._size = 0  # high-water mark of used slots
        self._slot_of: dict[str, int] = {}
        # Slot → node name (None: free), an object array so that a ranking turns thousands
        # of slots into names in one gather.  Copy on write (see _set_name).
        self._names: npt.NDArray[np.object_] = np.empty(self._capacity, dtype=object)
        self._free: list[int] = []
        self.alive = np.zeros(self._capacity, dtype=bool)
        self.platform_id = np.zeros(self._capacity, dtype=np.int16)
        self.columns: dict[str, npt.NDArray[Any]] = {
            **{name: np.zeros(self._capacity, dtype=np.float64) for name in _FLOAT_COLUMNS},
            **{name: np.zeros(self._capacity, dtype=np.int64) for name in _INT_COLUMNS},
            **{name: np.zeros(self._capacity, dtype=bool) for name in _BOOL_COLUMNS},
        }
        self._platforms: list[Platform] = []
        self._platform_ids: dict[Platform, int] = {}
        self._platform_counts: dict[int, int] = {}
        self._overcommitting: set[int] = set()  # slots whose node runs the β_max stage
        self._cordoned: set[int] = set()  # slots whose node is cordoned
        interned: dict[str, int] = {}
        self.mounted = LayerIndex(interned, self._capacity)
        self.cached = LayerIndex(interned, self._capacity)
        # Name order: live names sorted, and their slots in that order.  Kept up to date
        # incrementally once built (O(n) memmove per join or leave); rebuilt lazily in one
        # vectorised sort after bulk loading.
        self._sorted_names: list[str] | None = None
        self._order: Slots | None = None
        self._name_rank: npt.NDArray[np.int64] | None = None
        self._ties: dict[tuple[int, type], npt.NDArray[Any]] = {}  # see tie_breaks
        self._scratch_bool = np.zeros(self._capacity, dtype=bool)
        self._scratch_float = np.zeros(self._capacity, dtype=np.float64)
        self._fit_views: tuple[NodeColumns, Scratch] | None = None  # see _fit_columns

    # -- updates -----------------------------------------------------------------------------
    def upsert(self, state: NodeState) -> None:
        with self._lock:
            slot = self._slot_of.get(state.node)
            if slot is None:
                slot = self._allocate(state.node)
            elif state.generation < self.columns["generation"][slot]:
                return
            else:
                self._untrack(slot)
            self._write(slot, state)

    def remove(self, node: str) -> None:
        with self._lock:
            slot = self._slot_of.pop(node, None)
            if slot is None:
                return
            self._untrack(slot)
            self.alive[slot] = False
            self._set_name(slot, None)
            self.mounted.clear(slot)
            self.cached.clear(slot)
            self._free.append(slot)
            self._membership_changed()
            if self._sorted_names is not None and self._order is not None:
                at = bisect.bisect_left(self._sorted_names, node)
                del self._sorted_names[at]
                self._order = np.delete(self._order, at)
            self._names_moved()

    def _allocate(self, node: str) -> int:
        if self._free:
            slot = self._free.pop()
            self._set_name(slot, node)
        else:
            slot = self._size
            if slot == self._capacity:
                self._grow()
            self._size += 1
            self._names[slot] = node  # a slot no ranking handed out so far refers to
        self._slot_of[node] = slot
        if self._sorted_names is not None and self._sorted_names and node < self._sorted_names[-1]:
            self._membership_changed()  # appended after a greater name: slots leave name order
        if self._sorted_names is None:
            self._membership_changed()
        if self._sorted_names is not None and self._order is not None:
            at = bisect.bisect_left(self._sorted_names, node)
            self._sorted_names.insert(at, node)
            self._order = np.insert(self._order, at, slot)
        self._names_moved()
        return slot

    def _set_name(self, slot: int, name: str | None) -> None:
        # Copy on write: rankings already handed out keep the table they were made with, so
        # their slots name the nodes they named then (appends change no slot in use).
        names = self._names.copy()
        names[slot] = name
        self._names = names

    def _names_moved(self) -> None:
        """Name positions changed: drop what is derived from them."""
        self._name_rank = None
        self._ties = {}

    def _membership_changed(self) -> None:
        self._in_name_order = False
        self._ranks_since_change = 0

    @property
    def in_name_order(self) -> bool:
        """Whether slot ``i`` is the ``i``-th node by name (no gathers needed to rank)."""
        return self._in_name_order

    def compact(self) -> None:
        """Renumber slots into name order and drop free slots.

        Costs O(n + index size); :meth:`rank` calls it once membership has been stable for
        ``compact_after`` rankings, after which ranking needs no name-order gathers.
        """
        with self._lock:
            order = self.name_order()
            count = int(order.size)
            new_of_old = np.full(self._size, -1, dtype=np.intp)
            new_of_old[order] = np.arange(count, dtype=np.intp)
            for column in self.columns.values():
                column[:count] = column[order]
            self.platform_id[:count] = self.platform_id[order]
            self.alive[:count] = True
            self.alive[count:] = False
            names = np.empty(self._capacity, dtype=object)
            names[:count] = self._names[order]
            self._names = names
            self._slot_of = {name: index for index, name in enumerate(names[:count].tolist())}
            self._free = []
            self._overcommitting = {int(new_of_old[slot]) for slot in self._overcommitting}
            self._cordoned = {int(new_of_old[slot]) for slot in self._cordoned}
            self.mounted.renumber(order, new_of_old)
            self.cached.renumber(order, new_of_old)
            self._size = count
            self._order = np.arange(count, dtype=np.intp)
            self._names_moved()
            self._in_name_order = True

    def _grow(self) -> None:
        capacity = self._capacity * 2

        def grown(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
            bigger = np.zeros(capacity, dtype=array.dtype)
            bigger[: self._capacity] = array
            return bigger

        self.alive = grown(self.alive)
        self.platform_id = grown(self.platform_id)
        names = np.empty(capacity, dtype=object)
        names[: self._capacity] = self._names
        self._names = names
        self.columns = {name: grown(column) for name, column in self.columns.items()}
        self.mounted.resize(capacity)
        self.cached.resize(capacity)
        self._scratch_bool = np.zeros(capacity, dtype=bool)
        self._scratch_float = np.zeros(capacity, dtype=np.float64)
        self._fit_views = None  # they viewed the old arrays
        self._capacity = capacity

    def _untrack(self, slot: int) -> None:
        pid = int(self.platform_id[slot])
        self._platform_counts[pid] -= 1
        self._overcommitting.discard(slot)
        self._cordoned.discard(slot)

    def _write(self, slot: int, state: NodeState) -> None:
        c = self.columns
        pid = self._platform_ids.get(state.platform)
        if pid is None:
            pid = self._platform_ids[state.platform] = len(self._platforms)
            self._platforms.append(state.platform)
        self.platform_id[slot] = pid
        self._platform_counts[pid] = self._platform_counts.get(pid, 0) + 1
        self.alive[slot] = True
        c["generation"][slot] = state.generation
        c["mem_free"][slot] = state.mem_free
        c["disk_free"][slot] = state.disk_free
        c["mem_max"][slot] = state.mem_total
        c["disk_max"][slot] = state.disk_total
        c["cpu_load"][slot] = state.cpu_load
        c["cpu_capacity"][slot] = state.cpu_capacity
        c["cpu_max_load"][slot] = state.cpu_max_load
        c["disk_bw_load"][slot] = state.disk_bw_load
        c["disk_bw_ceiling"][slot] = state.disk_bw_ceiling
        c["net_bw_load"][slot] = state.net_bw_load
        c["net_bw_ceiling"][slot] = state.net_bw_ceiling
        c["cordoned"][slot] = state.cordoned
        if state.cordoned:
            self._cordoned.add(slot)
        if state.overcommit is not None:
            self._overcommitting.add(slot)
        # Written for every node (0 and +inf without the stage): a reused slot must not keep
        # an old node's ceilings.
        c["oc_vcpus_reserved"][slot] = state.oc_vcpus_reserved
        c["oc_disk_bw_reserved"][slot] = state.oc_disk_bw_reserved
        c["oc_net_bw_reserved"][slot] = state.oc_net_bw_reserved
        c["oc_vcpus_ceiling"][slot] = state.oc_vcpus_ceiling
        c["oc_disk_bw_ceiling"][slot] = state.oc_disk_bw_ceiling
        c["oc_net_bw_ceiling"][slot] = state.oc_net_bw_ceiling
        self.mounted.set(slot, state.layers)
        self.cached.set(slot, state.cached_layers)

    # -- queries -----------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Number of slots in use or free (array length the queries work over)."""
        return self._size

    def name(self, slot: int) -> str:
        name: str | None = self._names[slot]
        assert name is not None, f"slot {slot} is free"
        return name

    def slot(self, node: str) -> int | None:
        return self._slot_of.get(node)

    def name_order(self) -> Slots:
        """Live slots sorted by node name (code-point order)."""
        if self._order is None or self._sorted_names is None:
            slots = np.fromiter(self._slot_of.values(), dtype=np.intp, count=len(self._slot_of))
            names = np.array(list(self._slot_of), dtype=str)
            by_name = np.argsort(names, kind="stable")
            self._order = slots[by_name]
            self._sorted_names = names[by_name].tolist()
        return self._order

    def tie_breaks(self, shift: int, dtype: type[np.unsignedinteger[Any]]) -> npt.NDArray[Any]:
        """Per slot, ``2**shift - 1 - (its position in name order)`` as ``dtype`` (free
        slots: 0), cached until a node joins or leaves.  The seed's packed keys carry it in
        their low bits (:func:`~berth.scheduler.policy.seed.seed_order`)."""
        ties = self._ties.get((shift, dtype))
        if ties is None:
            low = (1 << shift) - 1
            if self._in_name_order:
                positions = np.arange(self._size, dtype=np.int64)
            else:
                positions = np.minimum(self.name_rank(), low)
            ties = self._ties[(shift, dtype)] = (low - positions).astype(dtype)
            ties.flags.writeable = False
        return ties

    def name_rank(self) -> npt.NDArray[np.int64]:
        """Per slot, its position in name order (free slots: a large number)."""
        if self._name_rank is None:
            order = self.name_order()
            rank = np.full(self._size, np.iinfo(np.int64).max, dtype=np.int64)
            rank[order] = np.arange(order.size, dtype=np.int64)
            self._name_rank = rank
        return self._name_rank

    def fit_mask(
        self, spec: Spec | None, platforms: Sequence[Platform] = ()
    ) -> npt.NDArray[np.bool_]:
        """Per slot: live and passing every check of the table (``fits(state, spec, platforms)``).

        Allocates only the returned mask: each check computes into the scratch buffers.
        """
        with self._lock:
            fit = self.alive[: self._size].copy()
            columns, scratch = self._fit_columns()
            narrow(columns, Demand.of(spec, platforms), fit, scratch, self.checks)
            return fit

    def _fit_columns(self) -> tuple[NodeColumns, Scratch]:
        """The checks' columns and scratch buffers over the used slots (views, kept until the
        slot count changes or the arrays grow, so a ranking builds none)."""
        views = self._fit_views
        n = self._size
        if views is None or views[1].mask.size != n:
            c = self.columns
            columns = NodeColumns(
                self.platform_id[:n], self._platform_ids, *(c[name][:n] for name in COLUMN_FIELDS)
            )
            views = self._fit_views = (
                columns,
                Scratch(self._scratch_bool[:n], self._scratch_float[:n]),
            )
        views[0].overcommitting = bool(self._overcommitting)
        views[0].any_cordoned = bool(self._cordoned)
        return views

    def rank(
        self,
        spec: Spec | None,
        layers: Sequence[Layer],
        platforms: Sequence[Platform] = (),
        policy: Policy | None = None,
    ) -> EngineRanking:
        """Fitting nodes ordered by ``policy`` (default: the seed's colocation ranking).

        The seed's policy takes the lazy packed-key fast path (the ranking orders nodes only as
        far as it is read); any other gets :meth:`view` and a
        :class:`~berth.scheduler.policy.base.PlacementRequest` (fit mask, colocated bytes)
        and returns its full order.
        """
        with self._lock:
            if not self._in_name_order and self.compact_after is not None:
                self._ranks_since_change += 1
                if self._ranks_since_change > self.compact_after:
                    self.compact()
            fit = self.fit_mask(spec, platforms)
            match = LayerMatch(self.mounted, layers, self._size)
            order: SlotOrder
            if policy is None or type(policy) is SeedPolicy:
                order = seed_order(
                    fit,
                    match,
                    self.name_order(),
                    self._in_name_order,
                    self.tie_breaks,
                    chunk=self.chunk,
                )
            else:
                request = PlacementRequest(spec, layers, platforms, fit, lambda: match.colocated)
                order = CompleteOrder(policy.order(self.view(), request))
            return EngineRanking(self._names, order, match)

    def view(self) -> ClusterView:
        """The slots as a read-only :class:`~berth.scheduler.policy.base.ClusterView`.

        Its arrays are windows on the live columns, valid until the next update: :meth:`rank`
        hands one to a policy under the engine's lock.
        """
        with self._lock:
            n, c = self._size, self.columns
            return ClusterView(
                size=n,
                count=len(self._slot_of),
                alive=self.alive[:n],
                name_order=self.name_order(),
                name_rank=self.name_rank(),
                mem_free=c["mem_free"][:n],
                mem_max=c["mem_max"][:n],
                disk_free=c["disk_free"][:n],
                disk_max=c["disk_max"][:n],
                cpu_load=c["cpu_load"][:n],
                cpu_capacity=c["cpu_capacity"][:n],
                cpu_max_load=c["cpu_max_load"][:n],
                disk_bw_load=c["disk_bw_load"][:n],
                disk_bw_ceiling=c["disk_bw_ceiling"][:n],
                net_bw_load=c["net_bw_load"][:n],
                net_bw_ceiling=c["net_bw_ceiling"][:n],
                mounted=self.mounted,
                cached=self.cached,
                names=cast(Sequence[str | None], self._names),  # indexing is all it needs
            )

    def platforms(self) -> dict[Platform, int]:
        with self._lock:
            return {
                self._platforms[pid]: count
                for pid, count in self._platform_counts.items()
                if count > 0
            }

    def __len__(self) -> int:
        return len(self._slot_of)

    def nbytes(self) -> int:
        """Approximate bytes held by the engine (columns, indexes, names) for benchmarks."""
        columns = sum(column.nbytes for column in self.columns.values())
        columns += self.alive.nbytes + self.platform_id.nbytes
        columns += sum(ties.nbytes for ties in self._ties.values())
        names = sum(len(name) + 49 + 100 for name in self._slot_of)  # str, dict entry
        names += self._names.nbytes  # the slot → name table's pointers
        return columns + self.mounted.nbytes() + self.cached.nbytes() + names


class EngineRanking(Ranking):
    """A ranking as engine slots, ordered only as far as it is read; an immutable value.

    The order is a :class:`~berth.scheduler.policy.seed.SlotOrder`: for the seed's policy a
    lazy one (the first node costs one ``argmax``; reading further selects and sorts the next
    stretch), for any other policy the policy's full order.  Whatever is read is exactly the
    full order's beginning, so a walk that stops at the first confirming node sorts nothing
    it did not use, and ``list(ranking)`` is the whole order.

    Node names are looked up only when asked for, in the slot → name table *as it was when
    the ranking was made*: the engine replaces that table, never edits it, when a node leaves,
    a free slot is reused or slots are compacted.  The order's packed keys and the name order
    it decodes them with are its own, and colocated bytes come from the request's own layer
    match, fixed at the same moment.  So a walk that awaits between nodes visits exactly the
    nodes it was given, however far it reads and whatever the engine does meanwhile.
    """

    def __init__(self, names: npt.NDArray[np.object_], order: SlotOrder, match: LayerMatch) -> None:
        super().__init__((), ())
        self._names = names
        self._order = order
        self.match = match
        self._colocated_prefix: list[int] = []  # of the nodes ordered so far
        if match.bits is None:
            match.colocated  # noqa: B018 - the fallback sums read the live index: fix them now

    @property
    def slots(self) -> Slots:
        """Every slot of the ranking, in order (orders the rest if it was not read yet)."""
        return self._order.prefix(len(self._order))

    def ordered(self) -> int:
        """How many nodes are ordered so far (a walk that stopped early: a few)."""
        return self._order.ordered()

    def _position(self, index: int) -> int:
        size = len(self._order)
        position = index + size if index < 0 else index
        if not 0 <= position < size:
            raise IndexError("ranking index out of range")
        return position

    def colocated(self, index: int) -> int:
        position = self._position(index)
        known = self._colocated_prefix
        if position >= len(known):
            self._order.prefix(position + 1)
            slots = self._order.prefix(self._order.ordered())[len(known) :]
            known.extend(self.match.colocated_at(slots).tolist())
        return known[position]

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step > 0:  # read only as far as the slice reaches
                return self._names_of(self._order.prefix(stop)[start:stop:step])
            return self._names_of(self.slots[index])
        position = self._position(index)
        return self._name(int(self._order.prefix(position + 1)[position]))

    def __iter__(self) -> Iterator[str]:
        # A chain of name lists, one per stretch of the order: C-speed iteration, and the
        # next stretch is ordered only once the previous one has been read to its end.
        return itertools.chain.from_iterable(self._stretches())

    def _stretches(self) -> Iterator[list[str]]:
        order, read = self._order, 0
        while read < len(order):
            if order.ordered() <= read:
                order.prefix(read + 1)
            ordered = order.ordered()
            yield self._names_of(order.prefix(ordered)[read:ordered])
            read = ordered

    def pairs(self) -> list[tuple[str, int]]:
        slots = self.slots
        colocated = self.match.colocated_at(slots).tolist()
        return list(zip(self._names_of(slots), colocated, strict=True))

    def _names_of(self, slots: Slots) -> list[str]:
        # Only slots live when the ranking was made are in its order, so none is None here.
        named: list[str] = self._names[slots].tolist()
        return named

    def _name(self, slot: int) -> str:
        name: str | None = self._names[slot]
        assert name is not None, f"slot {slot} was free when the ranking was made"
        return name
