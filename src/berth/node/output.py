"""A workload's output as its node keeps it, read a piece at a time.

The runtimes write each workload's stdout and stderr (a microVM's console) to
``<log_dir>/<id>.log`` when they have a log directory (:class:`~berth.node.runtime.port.
LoggingRuntime`); the file stays after the workload ends.  :func:`read_output` reads up to
``limit`` bytes from ``offset`` — what ``berth logs`` and the API's ``GET
/v1/workloads/{id}/logs`` show, and what ``--follow`` asks again from ``next_offset`` — and
never splits a UTF-8 character: an incomplete one at the end is left for the next read, and
a ``limit`` shorter than the first character reads on to its end (a reader always moves on;
bytes that are no character show as U+FFFD).
"""

from __future__ import annotations

import codecs
from pathlib import Path

from berth.boot import WorkloadLogs

__all__ = ["read_output"]


def read_output(path: Path | None, offset: int, limit: int) -> WorkloadLogs:
    """Up to ``limit`` bytes of the output kept at ``path`` from ``offset`` (an offset past
    the end reads nothing from the end); ``path`` ``None``: nothing is kept."""
    if path is None:
        return WorkloadLogs(text="", offset=offset, next_offset=offset, size=0, kept=False)
    try:
        with open(path, "rb") as file:
            size = file.seek(0, 2)
            start = min(offset, size)
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
