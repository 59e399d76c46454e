"""The node's image layers as real files: each layer an erofs image, recorded by a registry.

:class:`LayerFiles` puts real bytes behind a :class:`~berth.node.layers.LayerRegistry`, for
runtimes that boot from layers (the ``microvm`` runtime): each layer is an erofs image file
under the node's data directory, made once from the OCI layer blob (:mod:`berth.node.erofs`).
A layer is *present* when its file exists; ``acquire`` converts it if it is not (one
conversion per digest however many callers wait for it) and takes a reference, ``release``
drops it; at the last release the layer enters the LRU cache, and an eviction deletes the
file.  The registry's ``present`` hook keeps a layer whose file does not exist (a failed
conversion) out of the cache, so what the node advertises — ``layers`` and ``cached_layers``
— is exactly the files it holds: the colocation the scheduler ranks by is these files.
Files left by an earlier run are adopted into the cache at start, least recently used first
(their mtime is touched at each release); the leftovers of a conversion killed mid-way are
removed.

**Bytes charged**: a layer counts its *descriptor size* (the compressed blob's bytes), not its
image file's bytes.  The scheduler ranks colocation in the request's layer sizes, which are
descriptor sizes (what a node without the layer must fetch); ``NodeCore`` mounts a request's
layers by those same ``(id, size)`` pairs; and the size is known before converting, identical
on every node.  The cache budget therefore bounds compressed bytes; the files on disk are
larger (an erofs image holds the uncompressed tree: about 2-3x a gzip layer), which
``LayerFiles.disk_bytes`` reports exactly.

It is deliberately not the record itself (:mod:`berth.node.layers`, which the fake and process
runtimes and the simulator use alone) nor the conversion (:mod:`berth.node.erofs`): it keeps
the files and the record in step.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from berth.errors import Invalid
from berth.node.erofs import SHARED_MEMORY, ErofsImage, convert_layer, remove_leftovers
from berth.node.layers import LayerRegistry, UnmountResult
from berth.oci import OciLayer
from berth.validation import shown

__all__ = ["LayerFiles"]


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
            raise Invalid(
                f"cannot create {shown(str(self.root))}: {error.strerror}", field="layer_dir"
            ) from None
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

    def hold(self, layer: OciLayer) -> Path | None:
        """Take one reference on ``layer`` if its image file is on this node — a guest adopted
        after its agent's restart still uses the file it booted from — without converting
        anything; ``None`` (nothing taken) when the file is not here."""
        path = self.path(layer)
        with self._lock:
            if layer.digest not in self._files or not path.exists():
                return None
            self.registry.mount(layer.digest, layer.size)
        return path

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
