"""A workload's output as its node keeps it, read a piece at a time.

The runtimes write each workload's stdout and stderr (a microVM's console) to
``<log_dir>/<id>.log`` when they have a log directory (:class:`~berth.node.runtime.port.
LoggingRuntime`); the file stays after the workload ends.  :func:`read_output` reads up to
``limit`` bytes from ``offset`` — what ``berth logs`` and the API's ``GET
/v1/workloads/{id}/logs`` show, and what ``--follow`` asks again from ``next_offset`` — and
never splits a UTF-8 character: an incomplete one at the end is left for the next read, and
a ``limit`` shorter than the first character reads on to its end (a reader always moves on;
bytes that are no character show as U+FFFD).

**Bounded.**  A node keeps each workload's last :data:`~berth.defaults.LOG_KEEP_BYTES` and,
in all, :data:`~berth.defaults.LOG_DIR_BYTES` (:func:`keep_output`, which the agent runs
every few seconds).  A long output is trimmed at its head by punching a hole in the file
(``fallocate(PUNCH_HOLE)``): the disk space is freed, the file keeps its length, and the
writer — a workload appending to it, or QEMU's console — neither notices nor loses a byte;
offsets stay what they were, so a follower simply goes on, and a read from an offset that
was dropped starts at the first byte still kept (its answer's ``offset`` says where).  Past
the directory's bound the output of ended workloads is removed, the longest-ended first;
the output of a running one is only ever trimmed.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import ctypes
import errno
import logging
import os
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from berth.boot import WorkloadLogs
from berth.defaults import LOG_DIR_BYTES, LOG_KEEP_BYTES, LOG_KEEP_PERIOD_S

__all__ = ["Kept", "OutputKeeper", "keep_output", "read_output", "trim_output"]

log = logging.getLogger("berth.node")

_BLOCK = 4096
"""Holes are punched in whole blocks of this size (the page size; a file system's block)."""
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


def read_output(path: Path | None, offset: int, limit: int) -> WorkloadLogs:
    """Up to ``limit`` bytes of the output kept at ``path`` from ``offset`` (an offset past
    the end reads nothing from the end); ``path`` ``None``: nothing is kept."""
    if path is None:
        return WorkloadLogs(text="", offset=offset, next_offset=offset, size=0, kept=False)
    try:
        with open(path, "rb") as file:
            size = file.seek(0, 2)
            start = min(offset, size)
            kept_from = _data_start(file.fileno(), size)
            if start < kept_from:  # trimmed: on from the first byte kept, a whole character
                start = _character_start(file, kept_from, size)
            file.seek(start)
            data = file.read(limit)
            text, pending = _decoded(data)
            if pending and pending == len(data):  # not one whole character: read on to one
                data += file.read(4 - len(data)) if len(data) < 4 else b""
                text, pending = _decoded(data)
    except FileNotFoundError:  # nothing written yet
        return WorkloadLogs(text="", offset=0, next_offset=0, size=0, kept=True)
    if pending and pending == len(data):  # still none: bytes no character starts with
        text, pending = data.decode("utf-8", errors="replace"), 0
    return WorkloadLogs(
        text=text, offset=start, next_offset=start + len(data) - pending, size=size, kept=True
    )


def _decoded(data: bytes) -> tuple[str, int]:
    """``data`` decoded as UTF-8 but for a character cut at its end; how many bytes that
    cut character holds."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=False)
    return text, len(decoder.getstate()[0])


def _data_start(descriptor: int, size: int) -> int:
    """The first byte of the file that is not a punched hole (``size``: none is)."""
    try:
        return os.lseek(descriptor, 0, os.SEEK_DATA)
    except OSError as error:
        if error.errno == errno.ENXIO:  # only a hole from 0 to the end
            return size
        return 0  # a file system that cannot tell: read it all


def _character_start(file: BinaryIO, offset: int, size: int) -> int:
    """``offset``, or past the (at most three) UTF-8 continuation bytes there: the cut a hole
    leaves may fall inside a character."""
    file.seek(offset)
    head = file.read(3)
    skip = 0
    while skip < len(head) and 0x80 <= head[skip] <= 0xBF:
        skip += 1
    return min(offset + skip, size)


_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = _libc.fallocate
_fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
_fallocate.restype = ctypes.c_int


def trim_output(path: Path, keep: int) -> int:
    """Drop all of ``path`` but (at least) its last ``keep`` bytes, in whole blocks, by
    punching a hole over its head (see the module docstring); the bytes freed on disk."""
    descriptor = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        before = os.fstat(descriptor)
        cut = (before.st_size - keep) // _BLOCK * _BLOCK
        if cut <= 0 or cut <= _data_start(descriptor, before.st_size):
            return 0
        mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        if _fallocate(descriptor, mode, 0, cut) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"cannot trim {path}: {os.strerror(code)}")
        # a hole is not output: the file's time stays that of its last write (the age by
        # which keep_output removes ended workloads' output)
        os.utime(descriptor, ns=(before.st_atime_ns, before.st_mtime_ns))
        return max(0, (before.st_blocks - os.fstat(descriptor).st_blocks) * 512)
    finally:
        os.close(descriptor)


@dataclass(frozen=True)
class Kept:
    """What one pass of :func:`keep_output` did: bytes freed by trimming, files removed, and
    the bytes on disk left in the directory."""

    trimmed: int = 0
    removed: tuple[Path, ...] = ()
    on_disk: int = 0


def keep_output(directory: Path, running: Collection[Path], keep: int, total: int) -> Kept:
    """Bound the output kept in ``directory`` (``*.log``): each file to its last ``keep``
    bytes, then — while the files take more than ``total`` bytes on disk — remove the output
    of ended workloads (any file not in ``running``), the one written longest ago first."""
    trimmed, files = 0, []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return Kept()
    for entry in entries:
        if not entry.name.endswith(".log") or not entry.is_file(follow_symlinks=False):
            continue
        path = Path(entry.path)
        try:
            if entry.stat(follow_symlinks=False).st_size > keep:
                trimmed += trim_output(path, keep)
            status = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:  # removed meanwhile
            continue
        files.append((status.st_mtime, path, status.st_blocks * 512))
    on_disk = sum(used for _, _, used in files)
    removed: list[Path] = []
    live = set(running)
    for _, path, used in sorted(files):
        if on_disk <= total:
            break
        if path in live:
            continue
        path.unlink(missing_ok=True)
        removed.append(path)
        on_disk -= used
    return Kept(trimmed, tuple(removed), on_disk)


class OutputKeeper:
    """Runs :func:`keep_output` over ``directory`` every ``period_s`` seconds while started:
    ``running()`` names the output files of the workloads that run now (never removed)."""

    def __init__(
        self,
        directory: Path,
        running: Callable[[], Iterable[Path]],
        *,
        keep: int = LOG_KEEP_BYTES,
        total: int = LOG_DIR_BYTES,
        period_s: float = LOG_KEEP_PERIOD_S,
    ) -> None:
        self.directory, self.running = directory, running
        self.keep, self.total, self.period_s = keep, total, period_s
        self.last = Kept()
        """What the latest pass did."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"keep output in {self.directory}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def once(self) -> Kept:
        """One pass now (off the event loop: it reads and punches files)."""
        running = frozenset(self.running())
        self.last = await asyncio.to_thread(
            keep_output, self.directory, running, self.keep, self.total
        )
        if self.last.removed:
            log.info(
                "removed the output of %d ended workloads from %s (over %d bytes)",
                len(self.last.removed),
                self.directory,
                self.total,
            )
        return self.last

    async def _loop(self) -> None:
        said = ""
        while True:
            await asyncio.sleep(self.period_s)
            try:
                await self.once()
                said = ""
            except OSError as error:  # a file system that cannot punch holes, a full disk
                if str(error) != said:  # once, not every pass
                    said = str(error)
                    log.warning("cannot bound the output in %s: %s", self.directory, error)
