"""The image layers on this node: which are mounted, which are still cached on disk.

This module owns the node's layer bookkeeping.  A layer is *mounted* while at least one
workload uses it (a reference count per layer, because images share base layers); when its
last user leaves it moves to a *cache* of recently unmounted layers that are still on local
disk, bounded by a byte budget with least-recently-unmounted eviction.  Mounting a cached
layer moves it back without a pull.  Every mount reports whether it needed a pull, so a
simulator can count pulled bytes and a scheduler's layer-colocation ranking can be judged by
what it saves.

The node advertises ``mounted()`` as its ``layers`` (what the seed's colocation score reads)
and ``cached()`` separately as ``cached_layers``: cached bytes are cheaper to start from than a
pull but are not what the seed's ranking means by "mounted".  A layer is never in both sets.

:class:`LayerRegistry` is deliberately *not* the thing that pulls, unpacks or mounts bytes,
nor does it account layer bytes against the node's ``disk`` budget: this is the record the
node advertises and the simulator measures (the fake and process runtimes and the simulator
use it alone, in memory).  It is thread-safe (one lock), because the agent, the runtime's exit
handling and the advertiser may touch it from different threads; the ``on_change`` callback
runs after the lock is released so it may read the registry.

Real bytes behind the same record — each layer an erofs image file, for runtimes that boot
from layers (the ``microvm`` runtime) — are :class:`~berth.node.layer_files.LayerFiles`, in
its own module so that a node without them never loads erofs conversion or OCI reading.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from berth.errors import Invalid

__all__ = ["LayerRegistry", "MountOutcome", "MountResult", "UnmountResult"]


class MountOutcome(StrEnum):
    """Where a mounted layer came from."""

    ALREADY_MOUNTED = "already_mounted"
    """Another workload already had it mounted; only its reference count grew."""
    FROM_CACHE = "from_cache"
    """It was in the cache of recently unmounted layers: no pull."""
    PULLED = "pulled"
    """It was nowhere on this node and had to be pulled."""


@dataclass(frozen=True, slots=True)
class MountResult:
    """What ``mount`` did: the layer, its size in bytes, where it came from, its new refcount."""

    layer_id: str
    size: int
    outcome: MountOutcome
    refcount: int

    @property
    def pulled_bytes(self) -> int:
        """``size`` when the layer had to be pulled, else ``0``."""
        return self.size if self.outcome is MountOutcome.PULLED else 0


@dataclass(frozen=True, slots=True)
class UnmountResult:
    """What ``unmount`` did.

    ``refcount`` is the users left; when it reached zero the layer was ``cached`` (kept on
    disk) unless it alone exceeds the cache budget; ``evicted`` lists the cached layers dropped
    to stay within the budget, least recently unmounted first.
    """

    layer_id: str
    refcount: int
    cached: bool
    evicted: tuple[str, ...] = ()


def _layer_id(layer_id: str) -> str:
    if not isinstance(layer_id, str) or not layer_id:
        raise Invalid(f"a layer id must be a non-empty string, got {layer_id!r}", field="layer")
    return layer_id


def _byte_count(value: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"must be a whole number of bytes, got {value!r}", field=field)
    if value < 0:
        raise Invalid(f"must not be negative, got {value}", field=field)
    return value


class LayerRegistry:
    """Reference-counted mounted layers plus a byte-bounded LRU cache of unmounted ones.

    ``cache_budget_bytes`` bounds the cache (``0``: nothing is kept after its last unmount).
    ``on_change()`` is called after every operation that changed ``mounted()`` or
    ``cached()`` — not when only a reference count changed.
    """

    def __init__(
        self,
        cache_budget_bytes: int = 0,
        *,
        on_change: Callable[[], None] | None = None,
        present: Callable[[str], bool] | None = None,
    ) -> None:
        self.cache_budget_bytes = _byte_count(cache_budget_bytes, "cache_budget_bytes")
        self._listeners: list[Callable[[], None]] = [on_change] if on_change else []
        self._eviction_listeners: list[Callable[[tuple[str, ...]], None]] = []
        self._present = present
        self._lock = threading.Lock()
        self._refcounts: dict[str, int] = {}
        self._mounted_sizes: dict[str, int] = {}
        self._cache: OrderedDict[str, int] = OrderedDict()  # least recently unmounted first
        self._cached_bytes = 0

    # --- changes ----------------------------------------------------------------------------

    def add_change_listener(self, listener: Callable[[], None]) -> None:
        """Also call ``listener()`` after every change of the mounted or cached sets."""
        self._listeners.append(listener)

    def add_eviction_listener(self, listener: Callable[[tuple[str, ...]], None]) -> None:
        """Call ``listener(ids)`` with the layers that left this node's record: evicted from
        the cache, or dropped at their last unmount instead of cached (larger than the whole
        budget, or not ``present``).  Called outside the lock: the listener may read the
        registry, and must check that a layer has not been mounted again meanwhile before
        deleting what backs it."""
        self._eviction_listeners.append(listener)

    def cache(self, layer_id: str, size: int) -> UnmountResult:
        """Record an unused layer found on this node (a restart's leftovers) as cached.

        It goes in as the most recently unmounted, evicting older ones past the budget; a
        layer larger than the whole budget is not kept (``cached=False``).  A layer already
        mounted or cached is left as it is.
        """
        layer_id = _layer_id(layer_id)
        size = _byte_count(size, "size")
        with self._lock:
            if layer_id in self._refcounts or layer_id in self._cache:
                return UnmountResult(layer_id, self._refcounts.get(layer_id, 0), cached=False)
            cached, evicted = self._cache_unmounted(layer_id, size)
        self._changed(evicted if cached else (*evicted, layer_id), changed=cached or bool(evicted))
        return UnmountResult(layer_id, 0, cached=cached, evicted=evicted)

    def mount(self, layer_id: str, size: int) -> MountResult:
        """Take one reference on ``layer_id`` of ``size`` bytes; say whether it was pulled.

        A layer id names content, so a known layer must come with the size it is known by.
        """
        layer_id = _layer_id(layer_id)
        size = _byte_count(size, "size")
        with self._lock:
            known = self._mounted_sizes.get(layer_id, self._cache.get(layer_id))
            if known is not None and known != size:
                raise Invalid(
                    f"layer {layer_id!r} is known with size {known}, got {size}", field="size"
                )
            refcount = self._refcounts.get(layer_id, 0) + 1
            if refcount > 1:
                outcome = MountOutcome.ALREADY_MOUNTED
            elif layer_id in self._cache:
                del self._cache[layer_id]
                self._cached_bytes -= size
                outcome = MountOutcome.FROM_CACHE
            else:
                outcome = MountOutcome.PULLED
            self._refcounts[layer_id] = refcount
            self._mounted_sizes[layer_id] = size
        if outcome is not MountOutcome.ALREADY_MOUNTED:
            self._changed()
        return MountResult(layer_id, size, outcome, refcount)

    def unmount(self, layer_id: str) -> UnmountResult:
        """Release one reference; the last one moves the layer to the cache.

        Unmounting a layer that is not mounted is ``Invalid`` (field ``layer``): it means a
        caller's bookkeeping is wrong, and silently ignoring it would hide a double release.
        """
        layer_id = _layer_id(layer_id)
        with self._lock:
            refcount = self._refcounts.get(layer_id, 0)
            if refcount == 0:
                raise Invalid(f"layer {layer_id!r} is not mounted", field="layer")
            if refcount > 1:
                self._refcounts[layer_id] = refcount - 1
                return UnmountResult(layer_id, refcount - 1, cached=False)
            del self._refcounts[layer_id]
            size = self._mounted_sizes.pop(layer_id)
            cached, evicted = self._cache_unmounted(layer_id, size)
        self._changed(evicted if cached else (*evicted, layer_id))
        return UnmountResult(layer_id, 0, cached=cached, evicted=evicted)

    def _cache_unmounted(self, layer_id: str, size: int) -> tuple[bool, tuple[str, ...]]:
        # Called with the lock held.  A layer larger than the whole budget is not cached, and
        # evicts nothing: dropping other layers to make room it cannot use would be pure loss.
        # Nor is one whose bytes are not on this node (``present`` says so: a conversion
        # that failed), which the cache would otherwise advertise as there.
        if size > self.cache_budget_bytes:
            return False, ()
        if self._present is not None and not self._present(layer_id):
            return False, ()
        evicted: list[str] = []
        while self._cached_bytes + size > self.cache_budget_bytes:
            oldest, oldest_size = self._cache.popitem(last=False)
            self._cached_bytes -= oldest_size
            evicted.append(oldest)
        self._cache[layer_id] = size
        self._cached_bytes += size
        return True, tuple(evicted)

    def _changed(self, gone: tuple[str, ...] = (), *, changed: bool = True) -> None:
        if gone:
            for gone_listener in list(self._eviction_listeners):
                gone_listener(gone)
        if changed:
            for listener in list(self._listeners):
                listener()

    # --- queries ----------------------------------------------------------------------------

    def mounted(self) -> frozenset[str]:
        """Ids of the layers in use by at least one workload (advertised as ``layers``)."""
        with self._lock:
            return frozenset(self._refcounts)

    def cached(self) -> frozenset[str]:
        """Ids of unmounted layers still on disk (advertised as ``cached_layers``)."""
        with self._lock:
            return frozenset(self._cache)

    def is_mounted(self, layer_id: str) -> bool:
        with self._lock:
            return layer_id in self._refcounts

    def is_cached(self, layer_id: str) -> bool:
        with self._lock:
            return layer_id in self._cache

    def refcount(self, layer_id: str) -> int:
        """How many workloads use ``layer_id`` (``0`` when not mounted)."""
        with self._lock:
            return self._refcounts.get(layer_id, 0)

    def sizes(self) -> Mapping[str, int]:
        """Size in bytes of every mounted or cached layer (a copy)."""
        with self._lock:
            return {**self._cache, **self._mounted_sizes}

    @property
    def mounted_bytes(self) -> int:
        """Total size of the mounted layers."""
        with self._lock:
            return sum(self._mounted_sizes.values())

    @property
    def cached_bytes(self) -> int:
        """Total size of the cached layers; never more than ``cache_budget_bytes``."""
        with self._lock:
            return self._cached_bytes

    def __repr__(self) -> str:
        with self._lock:
            return (
                f"LayerRegistry(mounted={len(self._refcounts)}, cached={len(self._cache)}, "
                f"cached_bytes={self._cached_bytes}/{self.cache_budget_bytes})"
            )
