"""The node's layer mounts: each erofs layer file mounted read-only once, shared by containers.

A container's root filesystem is its image's layers stacked by overlayfs with an upper
directory of its own.  The layers are the node's erofs image files
(:class:`~berth.node.layer_files.LayerFiles`); :class:`LayerMounts` mounts each one
read-only at ``<root>/sha256-<hex>`` the first time a container needs it, and every later
container of an image sharing that layer stacks the same mount: a second workload of an
image mounts nothing new.  A mount lives as long as its file is this node's — held by a
running container, or kept in the layer cache — and is unmounted when the cache lets the
layer go (the eviction that deletes the file), so a warm start finds its layers mounted.
Mounts outlive the agent (they are the kernel's): a restarted agent finds its mounts again,
and unmounts the ones whose layer file is no longer here.

The kernel mounts an erofs *file* directly (file-backed erofs, Linux 6.12 and later); an
older kernel needs a loop device, which this module does not set up: :func:`probe` says
which this node can do, and the container runtime refuses to start without it.

Mounting and unmounting are ``mount(2)`` and ``umount2(2)`` through the C library: both
need ``CAP_SYS_ADMIN`` (the agent runs as root for the container runtime, as ``runc``
does).  This module is only the mounts: which containers use them is the runtime's
(:mod:`berth.node.runtime.container`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from berth.errors import BerthError
from berth.node.layer_files import LayerFiles
from berth.oci import OciLayer

__all__ = [
    "LayerMounts",
    "MountFailed",
    "mount",
    "mounted",
    "overlay",
    "probe",
    "unmount",
    "unmount_under",
]

log = logging.getLogger("berth.container")

MS_RDONLY = 1
MNT_DETACH = 2
_MOUNT_NAME = re.compile(r"sha256-([0-9a-f]{64})")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mount.argtypes = (
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


class MountFailed(BerthError):
    """A mount this node needed could not be made; the message says which and why."""


def mount(source: str | Path, target: Path, fstype: str, *, flags: int = 0, data: str = "") -> None:
    """``mount(2)``; ``MountFailed`` naming the target and the kernel's reason."""
    result = _libc.mount(
        os.fsencode(source), os.fsencode(target), fstype.encode(), flags, data.encode() or None
    )
    if result != 0:
        errno = ctypes.get_errno()
        raise MountFailed(f"cannot mount {fstype} {source} on {target}: {os.strerror(errno)}")


def unmount(target: Path) -> None:
    """Unmount ``target`` (lazily when it is busy); nothing when it is not mounted."""
    if not mounted(target):
        return
    if _libc.umount2(os.fsencode(target), 0) != 0:
        errno = ctypes.get_errno()
        if _libc.umount2(os.fsencode(target), MNT_DETACH) != 0:
            log.error("cannot unmount %s: %s", target, os.strerror(errno))


def unmount_under(root: Path) -> list[Path]:
    """Unmount every mount point under ``root``, deepest first (a directory about to be
    removed: a mounted layer would refuse, an overlay would lose its upper files to the
    removal); the points unmounted."""
    try:
        with open("/proc/mounts", encoding="utf-8", errors="replace") as table:
            points = [Path(line.split()[1]) for line in table if len(line.split()) > 1]
    except OSError:
        return []
    root = root.absolute()
    under = [point for point in points if point.is_relative_to(root) and point != root]
    for point in sorted(under, key=lambda path: len(path.parts), reverse=True):
        unmount(point)
    return under


def mounted(target: Path) -> bool:
    """Whether ``target`` is a mount point."""
    return os.path.ismount(target)


def overlay(lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
    """Mount an overlayfs on ``target``: ``lowers`` topmost first, ``upper`` writable."""
    lowerdir = ":".join(str(path) for path in lowers)
    mount(
        "overlay",
        target,
        "overlay",
        data=f"lowerdir={lowerdir},upperdir={upper},workdir={work}",
    )


def probe(work_dir: Path) -> str | None:
    """``None`` when this node can mount an erofs file and stack an overlay on it; else what
    is missing, as an operator would fix it."""
    if os.geteuid() != 0:
        return "the container runtime mounts layers: run the agent as root"
    mkfs = shutil.which("mkfs.erofs")
    if mkfs is None:
        return "mkfs.erofs is not installed (apt-get install erofs-utils)"
    work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir, prefix=".probe-") as scratch:
        root = Path(scratch)
        tree, image, lower = root / "tree", root / "layer.erofs", root / "lower"
        upper, work, merged = root / "upper", root / "work", root / "merged"
        for path in (tree, lower, upper, work, merged):
            path.mkdir()
        (tree / "probe").write_text("berth\n")
        made = subprocess.run(
            [mkfs, "--quiet", str(image), str(tree)], capture_output=True, timeout=60
        )
        if made.returncode != 0:
            return f"mkfs.erofs failed: {made.stderr.decode(errors='replace').strip()}"
        try:
            mount(image, lower, "erofs", flags=MS_RDONLY)
            try:
                overlay([lower], upper, work, merged)
                ok = (merged / "probe").read_text() == "berth\n"
                unmount(merged)
            finally:
                unmount(lower)
        except MountFailed as error:
            return f"{error} (file-backed erofs needs Linux 6.12 or later; overlayfs too)"
        return None if ok else "an overlay of an erofs layer did not show the layer's files"


class LayerMounts:
    """Each layer file of ``files`` mounted read-only once under ``root`` (see the module
    docstring)."""

    def __init__(self, files: LayerFiles, root: Path) -> None:
        self.files = files
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.mounts = 0
        """How many mounts this node made (a warm start makes none)."""
        self._lock = threading.Lock()
        files.registry.add_eviction_listener(self._evicted)
        self._sweep()

    def path(self, digest: str) -> Path:
        """Where ``digest``'s layer is mounted (whether or not it is)."""
        return self.root / f"sha256-{digest.removeprefix('sha256:')}"

    async def acquire(self, layers: tuple[OciLayer, ...]) -> tuple[Path, ...]:
        """The mount points of ``layers`` (base first), each file acquired from the node's
        layer files (converted if it is not here) and mounted if it is not yet; all or nothing:
        a failure releases what it took.  Release each digest with :meth:`release`."""
        files = await self.files.acquire_all(layers)
        try:
            return tuple(
                self._mount(layer.digest, file) for layer, file in zip(layers, files, strict=True)
            )
        except BaseException:
            for layer in layers:
                self.files.release(layer.digest)
            raise

    def hold(self, layers: tuple[OciLayer, ...]) -> bool:
        """Take the layers of a container adopted after an agent's restart: each file held and
        mounted (it still is, unless someone unmounted it); ``False`` (nothing taken) when a
        file is gone or cannot be mounted."""
        held: list[str] = []
        try:
            for layer in layers:
                file = self.files.hold(layer)
                if file is None:
                    raise MountFailed(f"layer {layer.digest} is no longer on this node")
                held.append(layer.digest)
                self._mount(layer.digest, file)
        except MountFailed as error:
            log.warning("%s", error)
            for digest in held:
                self.files.release(digest)
            return False
        return True

    def release(self, digests: tuple[str, ...]) -> None:
        """Drop a container's references; a layer stays mounted while its file is cached."""
        for digest in digests:
            try:
                self.files.release(digest)
            except BerthError as error:
                log.error("releasing layer %s: %s", digest, error)

    def close(self) -> None:
        """Unmount every layer no container uses (an agent that stops; one killed leaves
        them for the next to find)."""
        with self._lock:
            for digest in self.files.files():
                if not self.files.registry.is_mounted(digest):
                    target = self.path(digest)
                    unmount(target)
                    with contextlib.suppress(OSError):
                        target.rmdir()

    def _mount(self, digest: str, file: Path) -> Path:
        target = self.path(digest)
        with self._lock:
            if not mounted(target):
                target.mkdir(exist_ok=True)
                mount(file, target, "erofs", flags=MS_RDONLY)
                self.mounts += 1
        return target

    def _evicted(self, digests: tuple[str, ...]) -> None:
        with self._lock:
            for digest in digests:
                if self.files.registry.is_mounted(digest) or self.files.registry.is_cached(digest):
                    continue  # acquired again meanwhile
                target = self.path(digest)
                unmount(target)
                with contextlib.suppress(OSError):
                    target.rmdir()

    def _sweep(self) -> None:
        """Unmount what an earlier agent left mounted whose layer file is gone."""
        present = set(self.files.files())
        for entry in os.scandir(self.root):
            match = _MOUNT_NAME.fullmatch(entry.name)
            if match is None or f"sha256:{match.group(1)}" in present:
                continue
            target = Path(entry.path)
            unmount(target)
            with contextlib.suppress(OSError):
                target.rmdir()

    def __repr__(self) -> str:
        return f"LayerMounts({str(self.root)!r}, mounts={self.mounts})"
