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

:class:`LayerFiles` puts real bytes behind the same record, for runtimes that boot from
layers (the ``microvm`` runtime): each layer is an erofs image file under the node's data
directory, made once from the OCI layer blob (:mod:`berth.node.erofs`).  A layer is *present*
when its file exists; ``acquire`` converts it if it is not (one conversion per digest however
many callers wait for it) and takes a reference, ``release`` drops it; at the last release the
layer enters the LRU cache, and an eviction deletes the file.  The registry's ``present`` hook
keeps a layer whose file does not exist (a failed conversion) out of the cache, so what the
node advertises — ``layers`` and ``cached_layers`` — is exactly the files it holds: the
colocation the scheduler ranks by is these files.  Files left by an earlier run are adopted
into the cache at start, least recently used first (their mtime is touched at each release);
the leftovers of a conversion killed mid-way are removed.

**Bytes charged**: a layer counts its *descriptor size* (the compressed blob's bytes), not its
image file's bytes.  The scheduler ranks colocation in the request's layer sizes, which are
descriptor sizes (what a node without the layer must fetch); ``NodeCore`` mounts a request's
layers by those same ``(id, size)`` pairs; and the size is known before converting, identical
on every node.  The cache budget therefore bounds compressed bytes; the files on disk are
larger (an erofs image holds the uncompressed tree: about 2-3x a gzip layer), which
``LayerFiles.disk_bytes`` reports exactly.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from berth.errors import Invalid
from berth.node.erofs import SHARED_MEMORY, ErofsImage, convert_layer, remove_leftovers
from berth.oci import OciLayer
from berth.validation import shown

__all__ = ["LayerFiles", "LayerRegistry", "MountOutcome", "MountResult", "UnmountResult"]


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


_IMAGE_NAME = re.compile(r"sha256-([0-9a-f]{64})\.([0-9]{1,19})\.erofs")


@dataclass(frozen=True, slots=True)
class _File:
    path: Path
    size: int  # the descriptor size the registry charges
    disk_bytes: int  # the image file's real size


class LayerFiles:
    """Layers kept as erofs image files under ``root``, recorded by :attr:`registry`.

    Give ``registry`` to the node (``NodeCore(..., layers=files.registry)``) so it advertises
    these files; a runtime calls :meth:`acquire` for each layer it boots from and
    :meth:`release` when the workload has ended.  ``cache_budget_bytes`` bounds the unused
    layers kept (descriptor bytes, see the module docstring); ``on_change`` is the registry's.
    ``scratch_dir`` is where layers are extracted before ``mkfs.erofs`` (default: chosen per
    layer by :func:`~berth.node.erofs.scratch_for`, RAM when it fits).
    """

    def __init__(
        self,
        root: Path | str,
        cache_budget_bytes: int = 0,
        *,
        on_change: Callable[[], None] | None = None,
        scratch_dir: Path | str | None = None,
    ) -> None:
        if not isinstance(root, str | os.PathLike) or not str(root):
            raise Invalid(f"expected a directory path, got {shown(root)}", field="layer_dir")
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise Invalid(f"cannot create {shown(str(self.root))}: {error.strerror}",
                          field="layer_dir") from None  # fmt: skip
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise Invalid(f"{shown(str(self.root))} is not writable", field="layer_dir")
        self._lock = threading.RLock()
        self._files: dict[str, _File] = {}
        self._converting: dict[str, asyncio.Future[ErofsImage]] = {}
        self.conversions = 0
        """Layers converted by this store (a concurrent wait for the same one counts once)."""
        self.conversion_seconds = 0.0
        """Wall-clock seconds those conversions took together."""
        self.registry = LayerRegistry(
            cache_budget_bytes, on_change=on_change, present=self._has_file
        )
        self.registry.add_eviction_listener(self._evicted)
        self.scratch_dir = None if scratch_dir is None else Path(scratch_dir)
        remove_leftovers(self.root)
        remove_leftovers(self.scratch_dir or SHARED_MEMORY)
        self._adopt()

    # --- the runtime's side -----------------------------------------------------------------

    async def acquire(self, layer: OciLayer) -> Path:
        """The image file of ``layer``, converted first if this node does not hold it; takes
        one reference (the layer counts as mounted until the matching :meth:`release`).

        Concurrent calls for one digest share one conversion.  A failed conversion raises
        (``Invalid`` for a bad layer, ``Unavailable`` for this machine) and takes no reference.
        """
        if not isinstance(layer, OciLayer):
            raise Invalid(f"expected an OciLayer, got {shown(layer)}", field="layer")
        path = self.path(layer)
        with self._lock:
            self.registry.mount(layer.digest, layer.size)
            ready = layer.digest in self._files and path.exists()
        if ready:
            return path
        try:
            await asyncio.shield(self._conversion(layer, path))
        except BaseException:
            self.registry.unmount(layer.digest)
            raise
        return path

    async def acquire_all(self, layers: Sequence[OciLayer]) -> tuple[Path, ...]:
        """:meth:`acquire` each layer in order; all or nothing (a failure releases the rest)."""
        paths: list[Path] = []
        try:
            for layer in layers:
                paths.append(await self.acquire(layer))
        except BaseException:
            for layer in layers[: len(paths)]:
                self.release(layer.digest)
            raise
        return tuple(paths)

    def release(self, digest: str) -> UnmountResult:
        """Drop one reference taken by :meth:`acquire`; the last one caches the layer (or,
        past the budget, deletes older files).  Releasing a layer not held is ``Invalid``."""
        result = self.registry.unmount(digest)
        if result.cached:
            entry = self._files.get(digest)
            if entry is not None:  # the cache's order survives a restart through the mtime
                now = time.time()
                os.utime(entry.path, (now, now))
        return result

    def path(self, layer: OciLayer) -> Path:
        """Where ``layer``'s image file lives (whether or not it exists yet)."""
        return self.root / f"sha256-{layer.digest.removeprefix('sha256:')}.{layer.size}.erofs"

    # --- what the store holds ----------------------------------------------------------------

    def has(self, digest: str) -> bool:
        """Whether ``digest``'s image file is on this node."""
        return self._has_file(digest)

    def files(self) -> dict[str, Path]:
        """The image file of every layer present, by digest (a copy)."""
        with self._lock:
            return {digest: entry.path for digest, entry in self._files.items()}

    @property
    def disk_bytes(self) -> int:
        """Bytes the image files take on disk together (their real sizes)."""
        with self._lock:
            return sum(entry.disk_bytes for entry in self._files.values())

    def _has_file(self, digest: str) -> bool:
        # Called under the registry's lock: reads one dict entry, takes no lock of ours.
        return digest in self._files

    def _conversion(self, layer: OciLayer, path: Path) -> asyncio.Future[ErofsImage]:
        future = self._converting.get(layer.digest)
        if future is None:
            future = asyncio.ensure_future(self._convert(layer, path))
            self._converting[layer.digest] = future
        return future

    async def _convert(self, layer: OciLayer, path: Path) -> ErofsImage:
        try:
            image = await asyncio.to_thread(
                convert_layer, layer, path, scratch_dir=self.scratch_dir
            )
            with self._lock:
                self._files[layer.digest] = _File(path, layer.size, image.size)
                if image.seconds:
                    self.conversions += 1
                    self.conversion_seconds += image.seconds
                known = self.registry.is_mounted(layer.digest) or self.registry.is_cached(
                    layer.digest
                )
            if not known:  # every acquirer gave up (cancelled) meanwhile: cache the file
                self.registry.cache(layer.digest, layer.size)  # (or, too big, delete it)
            return image
        finally:
            self._converting.pop(layer.digest, None)

    def _evicted(self, digests: tuple[str, ...]) -> None:
        with self._lock:
            for digest in digests:
                if self.registry.is_mounted(digest) or self.registry.is_cached(digest):
                    continue  # acquired again between the eviction and now: keep its file
                entry = self._files.pop(digest, None)
                if entry is not None:
                    entry.path.unlink(missing_ok=True)

    def _adopt(self) -> None:
        found: list[tuple[float, str, _File]] = []
        for entry in os.scandir(self.root):
            match = _IMAGE_NAME.fullmatch(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            info = entry.stat(follow_symlinks=False)
            digest = f"sha256:{match.group(1)}"
            found.append(
                (info.st_mtime, digest, _File(Path(entry.path), int(match.group(2)), info.st_size))
            )
        for _, digest, file in sorted(found, key=lambda item: (item[0], item[1])):
            with self._lock:
                self._files[digest] = file
            self.registry.cache(digest, file.size)  # past the budget: evicted, so deleted

    def __repr__(self) -> str:
        return f"LayerFiles({str(self.root)!r}, {len(self._files)} files, {self.registry!r})"
