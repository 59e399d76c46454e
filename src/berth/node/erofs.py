"""One OCI layer blob converted into one read-only erofs filesystem image, safely and once.

A microVM gets each image layer as a read-only virtio-blk disk, stacked with overlayfs in the
guest.  This module makes that disk: it streams a layer's blob (a tar, plain or gzip), checks
the blob's digest and size as it reads, extracts the tar into a scratch directory (in RAM when
it fits, see :func:`scratch_for`, else beside the destination), and runs ``mkfs.erofs`` on
it.  erofs-utils 1.5 (Debian 12) has no ``--tar`` mode, so the extraction is ours, and so
are its rules:

* **OCI whiteouts become overlayfs whiteouts** — ``dir/.wh.name`` becomes ``dir/name``, a
  character device 0/0; ``dir/.wh..wh..opq`` sets ``trusted.overlay.opaque=y`` on ``dir``.
  Other ``.wh..wh.*`` entries (aufs hard-link bookkeeping) are dropped.  This is the form the
  guest's overlayfs reads from a lower layer.
* **No entry leaves the root**: a member name that is absolute, has a ``..`` component, is
  empty, or whose parent path runs through a symbolic link (extracted earlier in the same
  tar) is refused; a hard link must point at an earlier member inside the root.  Files are
  opened with ``O_NOFOLLOW``, so a symlink planted by the tar is never written through.
  Symlink *targets* are stored as written (``/usr/bin/python3`` is a fine target inside
  the guest); they are only never followed here.
* **Kept**: file modes including setuid/setgid/sticky bits, owners (uid/gid), modification
  times (``--preserve-mtime``: Python checks ``.pyc`` files against their sources' mtimes),
  symlinks, hard links (one inode), devices and fifos, and the extended attributes
  ``security.capability`` and ``user.*`` from PAX headers.  Other xattrs in the tar
  (``trusted.overlay.*`` above all, which could redirect lookups across layers) are dropped.
* A later member of the same path replaces an earlier one, as ``tar`` does.

Output: the superblock's UUID is derived from the layer digest, so two nodes make the same
image up to the superblock's build time (erofs-utils 1.5 cannot fix that without also
flattening every file's mtime with ``-T``).  The destination appears atomically — the image
is written under a temporary name and hard-linked into place, which fails if a concurrent
conversion of the same digest won, whose result is then kept — and a failed conversion
leaves nothing behind (scratch directory and temporary image are removed in every case; a
killed conversion's leftovers are named after its process id, and
:func:`remove_leftovers` clears those of dead processes).
Whiteouts need ``mknod`` and owners need ``chown``, so conversion runs as root; without root
it refuses with :class:`ConversionUnavailable` before reading anything, as it does when
``mkfs.erofs`` is missing.

It is not a cache, a mount or a registry: :class:`berth.node.layer_files.LayerFiles` decides when
to convert, keeps the images and deletes them.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

from berth.errors import Invalid, Unavailable
from berth.node.runtime.supervisor import pid_alive
from berth.oci import OciLayer
from berth.validation import shown

__all__ = [
    "OPAQUE_XATTR",
    "SCRATCH_PREFIX",
    "ConversionUnavailable",
    "ErofsImage",
    "convert_layer",
    "mkfs_erofs",
    "remove_leftovers",
    "scratch_for",
    "unpacked_estimate",
]

OPAQUE_XATTR = "trusted.overlay.opaque"
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_KEPT_XATTRS = ("security.capability", "user.")
_PAX_XATTR = "SCHILY.xattr."
_CHUNK = 1 << 20


class ConversionUnavailable(Unavailable):
    """This machine cannot convert layers: ``mkfs.erofs`` is missing, or we are not root."""


@dataclass(frozen=True, slots=True)
class ErofsImage:
    """A converted layer: the image's ``path`` and ``size`` in bytes, the layer's ``digest``,
    and how long the conversion took (``seconds``; ``0`` when a concurrent one won)."""

    digest: str
    path: Path
    size: int
    seconds: float


def mkfs_erofs() -> str:
    """The path of ``mkfs.erofs``, or :class:`ConversionUnavailable` saying how to get it."""
    found = shutil.which("mkfs.erofs") or shutil.which("mkfs.erofs", path="/usr/sbin:/sbin")
    if found is None:
        raise ConversionUnavailable(
            "mkfs.erofs not found: install erofs-utils (apt-get install erofs-utils)"
        )
    return found


def convert_layer(layer: OciLayer, dest: Path, *, scratch_dir: Path | None = None) -> ErofsImage:
    """Convert ``layer`` into an erofs image at ``dest`` (see the module docstring).

    The tar is extracted under ``scratch_dir`` (default: :func:`scratch_for` picks RAM or the
    destination's directory).  If ``dest`` already exists it is returned as is.  Raises
    ``Invalid`` for a layer that is not what its descriptor says or holds an unsafe entry,
    :class:`ConversionUnavailable` when the machine cannot convert, ``Unavailable`` when
    extraction or ``mkfs.erofs`` fails; in every failure nothing is left at ``dest``, beside
    it or in the scratch directory.
    """
    if not isinstance(layer, OciLayer):
        raise Invalid(f"expected an OciLayer, got {shown(layer)}", field="layer")
    dest = Path(dest)
    mkfs = mkfs_erofs()
    if os.geteuid() != 0:
        raise ConversionUnavailable(
            "converting layers to erofs needs root (whiteouts are character devices made "
            "with mknod, owners are set with chown); run the node agent as root"
        )
    if dest.exists():
        return ErofsImage(layer.digest, dest, dest.stat().st_size, 0.0)
    started = time.perf_counter()
    dest.parent.mkdir(parents=True, exist_ok=True)
    prefix = f"{SCRATCH_PREFIX}{os.getpid()}-{layer.digest.removeprefix('sha256:')[:16]}-"
    fd, temp_name = tempfile.mkstemp(prefix=prefix, suffix=".erofs", dir=dest.parent)
    os.close(fd)
    temp_image = Path(temp_name)
    try:
        where = scratch_dir if scratch_dir is not None else scratch_for(layer, dest.parent)
        try:
            root = _extract_into(layer, Path(where), prefix, limit=where != dest.parent)
        except _ScratchTooSmall:  # the size estimate was wrong: extract beside the image
            root = _extract_into(layer, dest.parent, prefix, limit=False)
        try:
            _mkfs(mkfs, layer.digest, root, temp_image)
        finally:
            shutil.rmtree(root.parent, ignore_errors=True)
        # A concurrent conversion of the same digest may have got there first: keep its image.
        with contextlib.suppress(FileExistsError):
            os.link(temp_image, dest)
    finally:
        temp_image.unlink(missing_ok=True)
    return ErofsImage(layer.digest, dest, dest.stat().st_size, time.perf_counter() - started)


SCRATCH_PREFIX = ".berth-convert-"
"""Names of conversion leftovers: ``<prefix><pid>-<digest prefix>-<random>`` (see
:func:`remove_leftovers`)."""
SHARED_MEMORY = Path("/dev/shm")
_SCRATCH_SLACK = 256 * 2**20


def scratch_for(layer: OciLayer, dest_dir: Path) -> Path:
    """Where to extract ``layer``: RAM (``/dev/shm``) when the tree fits with room to spare
    — at most a quarter of the memory available, twice its size plus 256 MiB free there —
    else ``dest_dir``, on the images' own disk.

    Extraction creates and deletes one file per tar member; on a busy disk that metadata
    work, not decompression, dominates (a 115 MB layer of 16,000 files: about 50 s on disk
    against 10 s in RAM on a loaded test machine).  The tree's size is estimated from the
    gzip trailer (or is the blob's size for a plain tar); extraction stops using RAM if the
    stream grows past that estimate (a multi-member gzip) and starts over on disk.
    """
    estimate = unpacked_estimate(layer)
    if estimate is None:
        return dest_dir
    try:
        shm = os.statvfs(SHARED_MEMORY)
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return dest_dir
    free = shm.f_bavail * shm.f_frsize
    available = next(
        (
            int(line.split()[1]) * 1024
            for line in meminfo.splitlines()
            if line.startswith("MemAvailable:")
        ),
        0,
    )
    if estimate * 2 + _SCRATCH_SLACK <= free and estimate <= available // 4:
        return SHARED_MEMORY
    return dest_dir


def unpacked_estimate(layer: OciLayer) -> int | None:
    """The bytes of ``layer``'s tar stream: the blob's size for a plain tar, the gzip
    trailer's size (modulo 4 GiB, so ``None`` when it cannot be right) for gzip."""
    if layer.compression == "none":
        return layer.size
    if layer.size < 18 or layer.size >= 2**32 // 16:
        return None
    with layer.path.open("rb") as blob:
        blob.seek(-4, os.SEEK_END)
        isize = int.from_bytes(blob.read(4), "little")
    return isize if isize >= layer.size // 2 else None


def remove_leftovers(directory: Path) -> list[Path]:
    """Remove conversion leftovers in ``directory`` whose process is gone; return them.

    A conversion names its scratch directory and temporary image after its process id; one
    that was killed leaves them behind.  Those of live processes (another node agent sharing
    the directory, a conversion in flight here) are kept.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(SCRATCH_PREFIX):
            continue
        pid_text = entry.name[len(SCRATCH_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or pid_alive(int(pid_text)):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        removed.append(Path(entry.path))
    return removed


class _ScratchTooSmall(Exception):
    """The tar stream outgrew the size it was estimated at (RAM scratch only)."""


def _extract_into(layer: OciLayer, where: Path, prefix: str, *, limit: bool) -> Path:
    """Extract ``layer`` into a new directory under ``where``; its ``root`` subdirectory."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    try:
        root = scratch / "root"
        root.mkdir(mode=0o755)
        estimate = unpacked_estimate(layer) if limit else None
        try:
            _extract(layer, root, estimate)
        except OSError as error:
            if limit and error.errno == errno.ENOSPC:
                raise _ScratchTooSmall() from None
            raise Unavailable(f"extracting layer {layer.digest}: {error}") from None
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return root


def _mkfs(mkfs: str, digest: str, source: Path, image: Path) -> None:
    fs_uuid = str(uuid.UUID(hex=digest.removeprefix("sha256:")[:32]))
    command = [mkfs, "--quiet", "--preserve-mtime", f"-U{fs_uuid}", str(image), str(source)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise Unavailable(
            f"mkfs.erofs failed (exit {result.returncode}) for layer {digest}: "
            + (detail[-1] if detail else "no output")
        )


# --- reading the blob ------------------------------------------------------------------------


class _VerifyingReader:
    """A read-only stream over a blob that hashes and counts every byte read."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.sha = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1, /) -> bytes:
        data = self.stream.read(size)
        self.sha.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


class _HashingReader(_VerifyingReader):
    """The same over the decompressed tar stream (for the config's ``diff_id``)."""


@contextmanager
def _tar_stream(layer: OciLayer) -> Iterator[tuple[tarfile.TarFile, _HashingReader]]:
    field = f"layer {layer.digest}"
    with layer.path.open("rb") as raw:
        blob = _VerifyingReader(raw)
        decompressed: Any = (
            gzip.GzipFile(fileobj=cast(IO[bytes], blob), mode="rb")
            if layer.compression == "gzip"
            else blob
        )
        tar_bytes = _HashingReader(decompressed)
        try:
            with tarfile.open(fileobj=cast(IO[bytes], tar_bytes), mode="r|") as tar:
                yield tar, tar_bytes
            tar_bytes.drain()
            blob.drain()
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as error:
            what = "gzip stream" if layer.compression == "gzip" else "tar"
            raise Invalid(
                f"not a valid {what} ({error or type(error).__name__})", field=field
            ) from None
    digest = "sha256:" + blob.sha.hexdigest()
    if blob.size != layer.size:
        raise Invalid(
            f"the blob has {blob.size} bytes, its descriptor says {layer.size}", field=field
        )
    if digest != layer.digest:
        raise Invalid(f"the blob hashes to {digest}, not to its digest", field=field)
    diff_id = "sha256:" + tar_bytes.sha.hexdigest()
    if layer.diff_id is not None and diff_id != layer.diff_id:
        raise Invalid(
            f"the uncompressed tar hashes to {diff_id}, not {layer.diff_id} (diff_id)", field=field
        )


# --- extraction ------------------------------------------------------------------------------


def _extract(layer: OciLayer, root: Path, limit: int | None = None) -> None:
    directories: list[tuple[Path, tarfile.TarInfo]] = []
    with _tar_stream(layer) as (tar, tar_bytes):
        for member in tar:
            _extract_member(tar, member, root, layer.digest, directories)
            if limit is not None and tar_bytes.size > limit:
                raise _ScratchTooSmall()
    # Directory mtimes last: creating entries inside a directory changes its mtime.
    for path, member in reversed(directories):
        if path.is_dir() and not path.is_symlink():
            os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)


def _member_path(name: str, digest: str) -> PurePosixPath:
    field = f"layer {digest}"
    if "\0" in name:
        raise Invalid(f"member {shown(name)} has a NUL character", field=field)
    if name.startswith("/"):
        raise Invalid(f"member {shown(name)} is an absolute path", field=field)
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise Invalid(f"member {shown(name)} leaves the layer's root ('..')", field=field)
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _parent_inside(root: Path, relative: PurePosixPath, name: str, digest: str) -> Path:
    """The real parent directory of ``relative`` under ``root``, created as needed; never
    through a symbolic link."""
    current = root
    for part in relative.parent.parts:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            os.mkdir(current, 0o755)
            continue
        if stat.S_ISLNK(info.st_mode):
            link = shown(str(current.relative_to(root)))
            raise Invalid(
                f"member {shown(name)} goes through the symbolic link {link}",
                field=f"layer {digest}",
            )
        if not stat.S_ISDIR(info.st_mode):
            raise Invalid(
                f"member {shown(name)} is below {shown(str(current.relative_to(root)))}, "
                "which is not a directory",
                field=f"layer {digest}",
            )
    return current


def _remove(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _extract_member(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    root: Path,
    digest: str,
    directories: list[tuple[Path, tarfile.TarInfo]],
) -> None:
    relative = _member_path(member.name, digest)
    if relative == PurePosixPath("."):
        if member.isdir():  # the root itself: take its mode and owner
            _finish(root, member)
            directories.append((root, member))
        return
    for part in relative.parts[:-1]:
        if part.startswith(_WHITEOUT + _WHITEOUT):
            return  # inside aufs bookkeeping (.wh..wh.plnk/…): not content
        if part.startswith(_WHITEOUT):
            raise Invalid(
                f"member {shown(member.name)} is below the whiteout {shown(part)}",
                field=f"layer {digest}",
            )
    parent = _parent_inside(root, relative, member.name, digest)
    base = relative.name
    if base == _OPAQUE:
        os.setxattr(parent, OPAQUE_XATTR, b"y")
        return
    if base.startswith(_WHITEOUT + _WHITEOUT):
        return  # aufs bookkeeping (.wh..wh.plnk and the like): not content
    if base.startswith(_WHITEOUT):
        hidden = base[len(_WHITEOUT) :]
        if not hidden or hidden in (".", ".."):
            raise Invalid(f"whiteout {shown(member.name)} names nothing", field=f"layer {digest}")
        target = parent / hidden
        _remove(target)
        os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))
        return
    path = parent / base
    if member.isdir():
        existing = _lstat(path)
        if existing is not None and not stat.S_ISDIR(existing.st_mode):
            _remove(path)
            existing = None
        if existing is None:
            os.mkdir(path, 0o755)
        directories.append((path, member))
    elif member.isreg():
        _remove(path)
        source = tar.extractfile(member)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        with os.fdopen(fd, "wb") as out:
            if source is not None:
                shutil.copyfileobj(source, out, _CHUNK)
    elif member.issym():
        _remove(path)
        os.symlink(member.linkname, path)
    elif member.islnk():
        target_relative = _member_path(member.linkname, digest)
        target_parent = _parent_inside(root, target_relative, member.linkname, digest)
        target = target_parent / target_relative.name
        info = _lstat(target)
        if target_relative == PurePosixPath(".") or info is None or stat.S_ISDIR(info.st_mode):
            raise Invalid(
                f"hard link {shown(member.name)} points at {shown(member.linkname)}, "
                "which is not an earlier file of this layer",
                field=f"layer {digest}",
            )
        _remove(path)
        os.link(target, path, follow_symlinks=False)
        return  # a hard link shares its target's inode: mode and owner are the target's
    elif member.ischr() or member.isblk() or member.isfifo():
        _remove(path)
        kind = stat.S_IFCHR if member.ischr() else stat.S_IFBLK if member.isblk() else stat.S_IFIFO
        os.mknod(path, kind | 0o600, os.makedev(member.devmajor, member.devminor))
    else:
        raise Invalid(
            f"member {shown(member.name)} has an unsupported type {shown(member.type)}",
            field=f"layer {digest}",
        )
    _finish(path, member)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _finish(path: Path, member: tarfile.TarInfo) -> None:
    """Owner, mode, kept xattrs and (but for directories, done last) mtime."""
    os.chown(path, member.uid, member.gid, follow_symlinks=False)
    if not member.issym():
        os.chmod(path, member.mode & 0o7777)  # after chown, which clears setuid bits
    for key, value in member.pax_headers.items():
        if key.startswith(_PAX_XATTR):
            name = key[len(_PAX_XATTR) :]
            if name.startswith(_KEPT_XATTRS):
                raw = value.encode("utf-8", "surrogateescape")
                try:
                    os.setxattr(path, name, raw, follow_symlinks=False)
                except OSError as error:
                    if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EINVAL):
                        raise
    if not member.isdir():
        os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
