"""Files only their owner may read — passwords, tokens, private keys — and their one writer.

A secret must be unreadable to others *from the moment its file exists*: a file created with
the process's umask (``0644`` by default) and narrowed with ``chmod`` afterwards can be read
in between, and one replaced in place can be read half-written.  :func:`write_private`
creates a temporary file ``0600`` beside the target (``O_EXCL``: never someone else's file
followed through a link), writes and fsyncs it, renames it over the target and fsyncs the
directory — a reader sees the old file or the new one, whole, and nobody else sees either.
Every secret berth writes (the nats-server configuration with every password, the
credentials files, the API's token files, the CA's and certificates' keys) goes through it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_private"]


def write_private(path: Path, data: bytes | str) -> None:
    """Write ``data`` (text as UTF-8) to ``path``, readable by its owner only, all at once
    (see the module docstring); the parent directory must exist."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
