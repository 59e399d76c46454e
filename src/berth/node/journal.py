"""The node's journal: one file per workload, so a restarted agent knows what it was running.

A node with a state directory keeps ``<state_dir>/workloads/<id>.json`` for each workload
(``<id>`` made a safe file name by :func:`~berth.node.runtime.supervisor.file_stem`):

* **written before the workload starts** — its id, its spec, its layers, its boot spec, the
  runtime that runs it and the reservation it is to own if one is leased already — so a crash
  at any later moment leaves a record of a workload that may run;
* **updated once it owns its reservation** with how to find it again (the runtime's
  ``locator``: for the process runtime, its supervisor's and its own pid and start time) and
  the reservation's id (a restarted node re-reserves under the same id, so the routes and
  records that name it stay true);
* **removed after the node has recorded its end** (its status answers ``status(id)``) — or,
  when the node pushes its ends as events, **marked ended** with the end's status then and
  removed only once the event is stored (:meth:`Journal.mark_ended`), so a restart between
  the two publishes the end again.

Every write is atomic (:func:`~berth.node.runtime.supervisor.atomic_write`: a temporary
file, fsync, rename, fsync of the directory), so a reader sees a whole entry or none.  Beside
each entry the process runtime's supervisor keeps ``<id>.run`` and ``<id>.exit``
(:class:`~berth.node.runtime.supervisor.WorkloadFiles`); :meth:`Journal.remove` removes all
three.

:meth:`Journal.read` returns the entries and, separately, what it could not read: a file that
is not JSON, not an entry, or names another workload than its file name says is *reported and
skipped* (it is left in place for an operator to look at, and never crashes the agent);
temporary files a crash left behind are removed.

The journal is deliberately only a record: what a restart does with each entry (adopt it,
record its end, kill it) is the node core's (:meth:`~berth.node.core.NodeCore.recover`).
Without a state directory there is no journal, and nothing here runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from berth.boot import BootSpec
from berth.errors import BerthError
from berth.model import Layer, Name, Spec
from berth.node.runtime.supervisor import WORKLOADS_DIR, WorkloadFiles, atomic_write, read_record
from berth.validation import BerthModel

__all__ = ["ENTRY_VERSION", "Journal", "JournalEntry", "Unreadable"]

log = logging.getLogger("berth.node.journal")

ENTRY_VERSION = 1
"""The version of the entry format this module writes and reads."""


class JournalEntry(BerthModel):
    """One workload as the journal records it (see the module docstring)."""

    version: Literal[1] = 1
    workload_id: Name
    spec: Spec
    layers: tuple[Layer, ...] = ()
    boot: BootSpec
    runtime: Name
    reservation: Name | None = None
    locator: dict[str, Any] | None = None
    restarts: int = Field(default=0, ge=0)
    ended: dict[str, Any] | None = None
    """How it ended (a :class:`~berth.boot.WorkloadStatus` as data) once it has, while its
    end's event is not yet stored."""
    recorded_at: float = Field(default=0.0, allow_inf_nan=False)


@dataclass(frozen=True)
class Unreadable:
    """A file of the journal directory that is not an entry: where, and why."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


class Journal:
    """The journal in ``<state_dir>/workloads`` (made when first written)."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / WORKLOADS_DIR

    def files(self, workload_id: str) -> WorkloadFiles:
        return WorkloadFiles.of(self.directory, workload_id)

    def record(self, entry: JournalEntry) -> None:
        """Write (or rewrite) ``entry``, atomically; ``OSError`` if the disk refuses."""
        self.directory.mkdir(parents=True, exist_ok=True)
        stamped = entry.model_copy(update={"recorded_at": time.time()})
        atomic_write(self.files(entry.workload_id).entry, stamped.model_dump_json())

    def remove(self, workload_id: str) -> None:
        """Remove a workload's entry and its supervisor's records (absent ones are fine)."""
        files = self.files(workload_id)
        for path in (files.entry, files.run, files.exit):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        with contextlib.suppress(OSError):
            directory = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    def mark_ended(self, workload_id: str, status: dict[str, Any]) -> None:
        """Mark ``workload_id``'s entry ended with ``status`` (atomically; an absent or
        unreadable entry is left as it is).  ``OSError`` if the disk refuses."""
        entry = self._entry(self.files(workload_id).entry)
        if isinstance(entry, JournalEntry):
            self.record(entry.model_copy(update={"ended": status}))

    def forget_exit(self, workload_id: str) -> None:
        """Remove a workload's supervisor records before it is restarted under its id (they
        are its last run's); its entry stays."""
        files = self.files(workload_id)
        for path in (files.run, files.exit):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def exit_record(self, workload_id: str) -> dict[str, Any] | None:
        """How the supervisor says ``workload_id`` ended, if it wrote it."""
        return read_record(self.files(workload_id).exit)

    def read(self) -> tuple[list[JournalEntry], list[Unreadable]]:
        """Every entry, oldest first, and the files that are not entries (reported, skipped)."""
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return [], []
        entries: list[JournalEntry] = []
        unreadable: list[Unreadable] = []
        for name in names:
            path = self.directory / name
            if name.startswith(".") and name.endswith(".tmp"):  # a write a crash interrupted
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            if name.endswith((".run", ".exit")):
                continue  # a supervisor's record: read with its entry
            if not name.endswith(".json"):
                unreadable.append(Unreadable(path, "not a journal entry (no .json)"))
                continue
            entry = self._entry(path)
            if isinstance(entry, Unreadable):
                unreadable.append(entry)
            else:
                entries.append(entry)
        for problem in unreadable:
            log.warning("journal: skipping %s", problem)
        entries.sort(key=lambda entry: entry.recorded_at)
        return entries, unreadable

    def _entry(self, path: Path) -> JournalEntry | Unreadable:
        try:
            data = json.loads(path.read_bytes())
        except OSError as error:
            return Unreadable(path, f"cannot read it: {error.strerror or error}")
        except (ValueError, UnicodeDecodeError) as error:
            return Unreadable(path, f"not JSON: {error}")
        if not isinstance(data, dict) or data.get("version") != ENTRY_VERSION:
            return Unreadable(path, f"not a version {ENTRY_VERSION} journal entry")
        try:
            entry = JournalEntry.from_dict(data)
        except BerthError as error:
            return Unreadable(path, f"not a journal entry: {error}")
        if self.files(entry.workload_id).entry != path:
            return Unreadable(path, f"names workload {entry.workload_id!r}, not its own")
        return entry
