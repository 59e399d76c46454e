"""The vectorised candidate engine: the seed's ranking over struct-of-arrays, in NumPy.

Same answers as :mod:`~berth.scheduler.reference` (property tests hold them equal), at a
cost that grows gently with the cluster:

* **Struct of arrays.**  Each snapshot field the filter reads is one NumPy column indexed by
  a node *slot*; ``fits`` becomes a handful of vector comparisons over all slots.  The
  expressions are the reference's, in the same order and in float64, so results agree bit for
  bit (``cpu_load + vcpus / cpu_capacity <= cpu_max_load`` …; an absent over-commit ceiling is
  ``+inf``).
* **Layer → nodes index.**  Layer ids are interned to ints; for each layer the engine keeps
  the slots that mount it (a growable int32 buffer), so a request's colocated bytes cost
  ``Σ |holders(L)|`` scattered adds, not a scan of every node's layer set.  A second index
  holds *cached* layers for policies that value them.
* **Incremental updates.**  ``upsert`` rewrites one slot's columns and, only when the node's
  layer set changed, moves that slot in and out of the affected holder buffers.  Slots of
  departed nodes are reused.
* **Ordering** (the seed policy, :mod:`~berth.scheduler.policy`): nodes with colocated bytes
  are few and are sorted by (bytes desc, name); zero-colocation nodes keep name order through
  a cached name permutation, rebuilt only when membership changes.

Memory per node: ~130 bytes of columns, the node's interned layer array, its slots in the
holder buffers (4 bytes per mounted layer, up to 2× slack) and the name → slot map.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from berth.model import Layer, Spec
from berth.platform import Platform
from berth.scheduler.ranking import Ranking
from berth.state import NodeState, Overcommit

if TYPE_CHECKING:
    from berth.scheduler.policy import Policy

__all__ = ["Engine", "EngineRanking", "LayerIndex"]

Slots = npt.NDArray[np.intp]
_EMPTY_LAYERS = np.zeros(0, dtype=np.int32)


class LayerIndex:
    """Layer id → slots of the nodes that hold it, with each slot's own layer list."""

    def __init__(self, interned: dict[str, int]) -> None:
        self._interned = interned  # shared with the engine's other index
        self._holders: list[npt.NDArray[np.int32]] = []
        self._counts: list[int] = []
        self._node_layers: dict[int, npt.NDArray[np.int32]] = {}

    def _intern(self, layer_id: str) -> int:
        lid = self._interned.get(layer_id)
        if lid is None:
            lid = self._interned[layer_id] = len(self._interned)
        while len(self._holders) <= lid:
            self._holders.append(np.zeros(4, dtype=np.int32))
            self._counts.append(0)
        return lid

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

    def _add(self, lid: int, slot: int) -> None:
        buffer, count = self._holders[lid], self._counts[lid]
        if count == buffer.size:
            grown = np.zeros(buffer.size * 2, dtype=np.int32)
            grown[:count] = buffer
            buffer = self._holders[lid] = grown
        buffer[count] = slot
        self._counts[lid] = count + 1

    def _drop(self, lid: int, slot: int) -> None:
        buffer, count = self._holders[lid], self._counts[lid]
        where = int(np.flatnonzero(buffer[:count] == slot)[0])
        buffer[where] = buffer[count - 1]
        self._counts[lid] = count - 1

    def holders(self, layer_id: str) -> npt.NDArray[np.int32]:
        """Slots holding ``layer_id`` (a view; do not keep it across updates)."""
        lid = self._interned.get(layer_id)
        if lid is None or lid >= len(self._holders):
            return _EMPTY_LAYERS
        return self._holders[lid][: self._counts[lid]]

    def scores(self, layers: Sequence[Layer], size: int) -> npt.NDArray[np.int64]:
        """Per slot, the bytes of ``layers`` held (an int64 array of length ``size``)."""
        scores = np.zeros(size, dtype=np.int64)
        for layer in layers:
            holders = self.holders(layer.id)
            if holders.size:
                scores[holders] += layer.size
        return scores

    def nbytes(self) -> int:
        """Bytes used by the buffers and per-node arrays (for memory accounting)."""
        per_node = sum(array.nbytes + 112 for array in self._node_layers.values())
        return sum(buffer.nbytes + 112 for buffer in self._holders) + per_node


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


_NO_OVERCOMMIT = Overcommit()


def _ceiling(value: float | None) -> float:
    return np.inf if value is None else value


class Engine:
    """The NumPy ranker (see the module docstring).  Thread-safe."""

    def __init__(self, capacity: int = 64) -> None:
        self._lock = threading.RLock()
        self._capacity = max(capacity, 1)
        self._size = 0  # high-water mark of used slots
        self._slot_of: dict[str, int] = {}
        self._names: list[str | None] = []
        self._free: list[int] = []
        self.alive = np.zeros(self._capacity, dtype=bool)
        self.platform_id = np.zeros(self._capacity, dtype=np.int16)
        self.columns: dict[str, npt.NDArray[Any]] = {
            **{name: np.zeros(self._capacity, dtype=np.float64) for name in _FLOAT_COLUMNS},
            **{name: np.zeros(self._capacity, dtype=np.int64) for name in _INT_COLUMNS},
        }
        self._platforms: list[Platform] = []
        self._platform_ids: dict[Platform, int] = {}
        self._platform_counts: dict[int, int] = {}
        self._overcommitting: set[int] = set()  # slots whose node runs the β_max stage
        interned: dict[str, int] = {}
        self.mounted = LayerIndex(interned)
        self.cached = LayerIndex(interned)
        self._order: Slots | None = None
        self._name_rank: npt.NDArray[np.int64] | None = None

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
            self._names[slot] = None
            self.mounted.clear(slot)
            self.cached.clear(slot)
            self._free.append(slot)
            self._order = self._name_rank = None

    def _allocate(self, node: str) -> int:
        if self._free:
            slot = self._free.pop()
            self._names[slot] = node
        else:
            slot = self._size
            if slot == self._capacity:
                self._grow()
            self._size += 1
            self._names.append(node)
        self._slot_of[node] = slot
        self._order = self._name_rank = None
        return slot

    def _grow(self) -> None:
        capacity = self._capacity * 2

        def grown(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
            bigger = np.zeros(capacity, dtype=array.dtype)
            bigger[: self._capacity] = array
            return bigger

        self.alive = grown(self.alive)
        self.platform_id = grown(self.platform_id)
        self.columns = {name: grown(column) for name, column in self.columns.items()}
        self._capacity = capacity

    def _untrack(self, slot: int) -> None:
        pid = int(self.platform_id[slot])
        self._platform_counts[pid] -= 1
        self._overcommitting.discard(slot)

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
        over = state.overcommit
        if over is None:
            over = _NO_OVERCOMMIT  # columns of a reused slot must not keep old ceilings
        else:
            self._overcommitting.add(slot)
        c["oc_vcpus_reserved"][slot] = over.vcpus_reserved
        c["oc_disk_bw_reserved"][slot] = over.disk_bw_reserved
        c["oc_net_bw_reserved"][slot] = over.net_bw_reserved
        c["oc_vcpus_ceiling"][slot] = _ceiling(over.vcpus_ceiling)
        c["oc_disk_bw_ceiling"][slot] = _ceiling(over.disk_bw_ceiling)
        c["oc_net_bw_ceiling"][slot] = _ceiling(over.net_bw_ceiling)
        self.mounted.set(slot, state.layers)
        self.cached.set(slot, state.cached_layers)

    # -- queries -----------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Number of slots in use or free (array length the queries work over)."""
        return self._size

    def name(self, slot: int) -> str:
        name = self._names[slot]
        assert name is not None, f"slot {slot} is free"
        return name

    def slot(self, node: str) -> int | None:
        return self._slot_of.get(node)

    def name_order(self) -> Slots:
        """Live slots sorted by node name (cached until membership changes)."""
        if self._order is None:
            live = [(name, slot) for slot, name in enumerate(self._names) if name is not None]
            live.sort()
            self._order = np.array([slot for _, slot in live], dtype=np.intp)
        return self._order

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
        """Per slot: live, runs one of ``platforms`` (empty: any) and ``fits(state, spec)``."""
        n = self._size
        c = self.columns
        fit = self.alive[:n].copy()
        if platforms:
            pids = [self._platform_ids[p] for p in platforms if p in self._platform_ids]
            if not pids:
                fit[:] = False
                return fit
            if len(pids) == 1:
                fit &= self.platform_id[:n] == pids[0]
            else:
                fit &= np.isin(self.platform_id[:n], pids)
        if spec is None:
            return fit
        fit &= c["mem_free"][:n] >= spec.mem
        fit &= c["disk_free"][:n] >= spec.disk
        if self._overcommitting:
            fit &= c["oc_vcpus_reserved"][:n] + spec.vcpus <= c["oc_vcpus_ceiling"][:n]
            fit &= c["oc_disk_bw_reserved"][:n] + spec.disk_bw <= c["oc_disk_bw_ceiling"][:n]
            fit &= c["oc_net_bw_reserved"][:n] + spec.net_bw <= c["oc_net_bw_ceiling"][:n]
        fit &= c["cpu_load"][:n] + spec.vcpus / c["cpu_capacity"][:n] <= c["cpu_max_load"][:n]
        fit &= c["disk_bw_load"][:n] + spec.disk_bw <= c["disk_bw_ceiling"][:n]
        fit &= c["net_bw_load"][:n] + spec.net_bw <= c["net_bw_ceiling"][:n]
        return fit

    def rank(
        self,
        spec: Spec | None,
        layers: Sequence[Layer],
        platforms: Sequence[Platform] = (),
        policy: Policy | None = None,
    ) -> EngineRanking:
        """Fitting nodes ordered by ``policy`` (default: the seed's colocation ranking)."""
        from berth.scheduler.policy import SEED

        with self._lock:
            fit = self.fit_mask(spec, platforms)
            colocated = self.mounted.scores(layers, self._size)
            slots = (policy or SEED).order(self, fit, colocated, layers)
            return EngineRanking(self, slots, colocated[slots])

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
        names = sum(len(name) + 49 + 8 + 100 for name in self._slot_of)  # str, list, dict entry
        return columns + self.mounted.nbytes() + self.cached.nbytes() + names


class EngineRanking(Ranking):
    """A ranking as engine slots; node names are looked up only when asked for."""

    def __init__(self, engine: Engine, slots: Slots, colocated: npt.NDArray[np.int64]) -> None:
        super().__init__((), colocated)
        self._engine = engine
        self.slots = slots

    def __len__(self) -> int:
        return int(self.slots.size)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self._engine.name(int(slot)) for slot in self.slots[index]]
        return self._engine.name(int(self.slots[index]))

    def __iter__(self) -> Any:
        return (self._engine.name(int(slot)) for slot in self.slots)
