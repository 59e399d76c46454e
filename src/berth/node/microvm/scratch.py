"""One guest's files on the host: its scratch directory and what a boot puts in it.

Each guest gets a scratch directory of its own under the runtime's ``work_dir``
(:func:`make_scratch`), named with its workload's id and the pid of the process that made
it, so that a later process can tell a dead one's leftovers (:func:`leftovers`).  In it:

* **its initramfs** (:func:`make_initrd`): berth's, with this boot's configuration added —
  the command, the image's environment overlaid by the spec's ``env``, the image's
  ``WorkingDir`` (``/`` if none; made if missing) and ``User`` (root if none), the guest's
  hostname;
* **its disk budget as the writable upper layer** (:func:`upper_disk`): a sparse ext4 image
  of ``disk_limit`` bytes (none — the guest's init mounts a ``tmpfs`` of that size, in guest
  memory — when the budget is under :data:`MIN_UPPER_DISK` or absent);
* **its serial console** (:func:`console_of`): the socket QEMU serves it on and the log file
  QEMU writes all of it to (the socket in a private directory under the system's temporary
  one when the scratch path is too long for a socket's);
* QEMU's own messages, and :data:`GUEST_FILE`, the record that names the guest's workload, its
  boot's nonce and its supervisor (written when QEMU is launched).

All of it is removed when the guest ends (:func:`remove_scratch`).  This module only makes
and removes files: launching QEMU, and finding a guest again after a restart, is
:mod:`berth.node.microvm.machine`'s job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import re
import shutil
import tempfile
from pathlib import Path

from berth.node.microvm.initramfs import GuestConfig
from berth.node.microvm.qemu import GuestConsole, VmSize
from berth.node.microvm.vm import write_initrd
from berth.node.runtime.port import BootFailed, BootSpec, workload_hostname
from berth.node.runtime.supervisor import file_stem, pid_alive, read_record
from berth.oci import OciImage
from berth.units import MiB

__all__ = [
    "GUEST_FILE",
    "MAX_SOCKET_PATH",
    "MIN_UPPER_DISK",
    "console_of",
    "guest_user",
    "guest_workdir",
    "leftovers",
    "make_initrd",
    "make_scratch",
    "remove_scratch",
    "upper_disk",
]

MIN_UPPER_DISK = 16 * MiB
"""The smallest disk budget given an ext4 upper disk; below it the upper layer is a tmpfs."""
GUEST_FILE = "guest.json"
"""In a guest's scratch directory: its workload id, nonce and supervisor (pid, start time)."""
MAX_SOCKET_PATH = 100
"""A console socket's longest path (a Unix socket's is at most 107 bytes); a scratch directory
deeper than that gets its socket in a private directory under the system's temporary one."""

_SCRATCH = re.compile(r".+\.([0-9]{1,10})\.[^.]+")


def make_scratch(work_dir: Path, workload_id: str) -> Path:
    """A new scratch directory for one guest under ``work_dir``, named with this process's
    pid (see :func:`leftovers`)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"{file_stem(workload_id)[:40]}.{os.getpid()}."
    return Path(tempfile.mkdtemp(prefix=prefix, dir=work_dir))


def leftovers(work_dir: Path) -> list[tuple[Path, int]]:
    """The scratch directories under ``work_dir`` whose maker, a process that has died, left
    them; each with that process's pid."""
    try:
        entries = list(os.scandir(work_dir))
    except OSError:
        return []
    found: list[tuple[Path, int]] = []
    for entry in entries:
        match = _SCRATCH.fullmatch(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        pid = int(match.group(1))
        if not pid_alive(pid):
            found.append((Path(entry.path), pid))
    return found


def console_of(scratch: Path, nonce: str) -> GuestConsole:
    """Where a guest's console is: its socket and log in its scratch directory (the socket
    in a private temporary directory when the scratch path is too long for one)."""
    socket = scratch / "console.sock"
    if len(str(socket)) > MAX_SOCKET_PATH:
        private = Path(tempfile.gettempdir()) / f"berth-{os.getuid()}"
        private.mkdir(mode=0o700, exist_ok=True)
        socket = private / f"{nonce}.sock"
    return GuestConsole(socket, scratch / "console.log")


def _nonce_in(scratch: Path) -> str:
    record = read_record(scratch / GUEST_FILE) or {}
    nonce = record.get("nonce")
    return nonce if isinstance(nonce, str) else "none"


def remove_scratch(scratch: Path) -> None:
    """Remove a guest's scratch directory, and its console socket if that was kept outside."""
    socket = console_of(scratch, _nonce_in(scratch)).socket
    if socket.parent != scratch:  # a socket kept outside: its own file
        socket.unlink(missing_ok=True)
    shutil.rmtree(scratch, ignore_errors=True)


async def upper_disk(scratch: Path, disk_limit: int | None) -> Path | None:
    """The guest's writable upper disk: a fresh sparse ext4 image of ``disk_limit`` bytes in
    ``scratch``; ``None`` (a tmpfs upper layer) under :data:`MIN_UPPER_DISK` or without a
    budget.  ``BootFailed`` if ``mkfs.ext4`` is missing or fails; cancelled, it is killed."""
    if disk_limit is None or disk_limit < MIN_UPPER_DISK:
        return None
    mkfs = shutil.which("mkfs.ext4")
    if mkfs is None:
        raise BootFailed("mkfs.ext4 is not installed: apt-get install e2fsprogs")
    upper = scratch / "upper.img"
    with open(upper, "wb") as file:
        file.truncate(disk_limit)
    process = await asyncio.create_subprocess_exec(
        mkfs,
        "-q",
        "-F",
        "-O",
        "^has_journal",
        "-m",
        "0",
        "-E",
        "lazy_itable_init=1,nodiscard",
        str(upper),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        said, _ = await process.communicate()
    except BaseException:  # cancelled: the guest will not need it, nor its scratch
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        raise
    if process.returncode != 0:
        detail = said.decode("utf-8", "replace").strip().splitlines()
        raise BootFailed(f"cannot make the upper disk: {detail[-1] if detail else '?'}")
    return upper


async def make_initrd(
    base: Path,
    scratch: Path,
    nonce: str,
    workload_id: str,
    spec: BootSpec,
    image: OciImage,
    *,
    size: VmSize,
    layers: int,
    upper: Path | None,
) -> Path:
    """The guest's initramfs in ``scratch``: ``base`` (berth's), with this boot's
    configuration added."""
    config = GuestConfig(
        nonce=nonce,
        command=image.config.args(spec.command),
        env={**image.config.environment(), **spec.env},
        layers=layers,
        upper_disk=upper is not None,
        tmpfs_size=spec.disk_limit or (size.mem_mib * MiB) // 2,
        hostname=workload_hostname(workload_id),
        workdir=guest_workdir(image.config.working_dir),
        user=guest_user(image.config.user),
    )
    initrd = scratch / "initrd"
    await asyncio.to_thread(write_initrd, base, config, initrd)
    return initrd


def guest_workdir(working_dir: str) -> str:
    """Where the workload starts: the image's ``WorkingDir`` (OCI: absolute; a relative one is
    taken from ``/``), normalised lexically, so no ``..`` climbs out of the image."""
    return posixpath.normpath("/" + working_dir.lstrip("/"))


def guest_user(user: str) -> str:
    """Whom the workload runs as: the image's ``User``; an empty user part means root
    (``:100`` is root with group 100).  ``BootFailed`` for what cannot be one."""
    user = user.strip()
    if user.startswith(":"):
        user = "0" + user
    if not user.isprintable() or user.count(":") > 1 or " " in user:
        raise BootFailed(f"the image's user {user!r} is not a user, uid, user:group or uid:gid")
    return user
