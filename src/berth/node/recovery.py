"""A restarted node's journal reconciled with the host: each workload adopted, or its end recorded.

This module owns what the node core does when its agent restarts
(:meth:`~berth.node.core.NodeCore.recover`, before the node admits anything): it reads the
journal (:mod:`berth.node.journal`) and, for each entry,

* **adopts** the workload if it still runs: the runtime watches it again
  (:class:`~berth.node.runtime.port.AdoptingRuntime`), its layers are mounted, its spec is
  re-reserved under its old reservation id — unchecked, even past limits that shrank
  (:meth:`~berth.node.budget.NodeBudget.readopt`) — and its start is pushed again (its boot's
  event may be lost);
* else **records its end**: the supervisor's exit status when it wrote one, else "ended
  while the agent was down, status unknown".  A runtime that cannot adopt — microVM, fake —
  has its workloads killed (by the pids their journal entry's locator names, each only if it
  is still the process that was started then) and ended as "not adoptable";
* and for an entry already marked ended (its end not yet reported stored), remembers how it
  ended and pushes the end again (:mod:`berth.node.ledger`).

What it found is a :class:`Recovery`.  Workload ids a previous agent generated are not handed
out again.  Without a journal there is nothing to do.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from dataclasses import dataclass, field

from berth.boot import WorkloadStatus
from berth.errors import Invalid
from berth.node.budget import NodeBudget
from berth.node.ends import Ends
from berth.node.journal import JournalEntry
from berth.node.layers import LayerRegistry
from berth.node.ledger import Ledger, runtime_kind
from berth.node.runtime.port import AdoptingRuntime, Runtime, WorkloadExit
from berth.node.runtime.supervisor import alive
from berth.node.workloads import Booted, Ended, Running, Workloads

__all__ = ["Recovery", "recover"]

log = logging.getLogger("berth.node")


@dataclass
class Recovery:
    """What :meth:`~berth.node.core.NodeCore.recover` found: the workloads adopted, those
    whose end it recorded, the journal files it could not read, and the over-commit, if any."""

    adopted: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    unreadable: tuple[str, ...] = ()
    overcommitted: str | None = None

    def __str__(self) -> str:
        text = f"{len(self.adopted)} adopted, {len(self.ended)} ended"
        if self.unreadable:
            text += f", {len(self.unreadable)} unreadable"
        return text + (f", over-committed: {self.overcommitted}" if self.overcommitted else "")


def recover(
    name: str,
    budget: NodeBudget,
    runtime: Runtime,
    layers: LayerRegistry,
    workloads: Workloads,
    ledger: Ledger,
    ends: Ends,
) -> Recovery:
    """Reconcile ``ledger``'s journal with the host (see the module docstring)."""
    if ledger.journal is None:
        return Recovery()
    entries, unreadable = ledger.journal.read()
    recovery = Recovery(unreadable=tuple(str(problem) for problem in unreadable))
    node = _Node(name, budget, runtime, layers, workloads, ledger, ends)
    for entry in entries:
        if entry.ended is not None:  # it ended before: its end not yet reported stored
            node.ended_before(entry)
            recovery.ended.append(entry.workload_id)
        elif node.readopt(entry):
            recovery.adopted.append(entry.workload_id)
        else:
            recovery.ended.append(entry.workload_id)
    ledger.ids.skip_past(entry.workload_id for entry in entries)
    over = budget.overcommitted()
    if over is not None:
        recovery.overcommitted = over
        log.warning("node %s is over-committed after its restart: %s", name, over)
    log.info("node %s recovered its journal: %s", name, recovery)
    return recovery


@dataclass(frozen=True)
class _Node:
    """The parts of the node a recovery works on."""

    name: str
    budget: NodeBudget
    runtime: Runtime
    layers: LayerRegistry
    workloads: Workloads
    ledger: Ledger
    ends: Ends

    def ended_before(self, entry: JournalEntry) -> None:
        """An entry marked ended: remember how, and push its end again (or forget it)."""
        try:
            status = WorkloadStatus.from_dict(entry.ended)
        except Invalid as error:
            status = WorkloadStatus(
                "ended", None, f"ended; its recorded status is unreadable: {error}"
            )
        self.workloads.ended[entry.workload_id] = Ended(status, None)
        if self.ledger.pushes_events:
            self.ledger.emit(entry.workload_id, status)
        else:
            self.ledger.unjournal(entry.workload_id)

    def readopt(self, entry: JournalEntry) -> bool:
        """Adopt ``entry``'s workload if it runs; else record its end.  Whether adopted."""
        runtime, workload_id = self.runtime, entry.workload_id
        adoptable = isinstance(runtime, AdoptingRuntime) and entry.runtime == runtime_kind(runtime)
        handle = None
        if adoptable and isinstance(runtime, AdoptingRuntime):
            handle = runtime.adopt(workload_id, entry.boot, entry.locator)
        if handle is None:
            self._record_lost(entry, adoptable)
            return False
        mounts = tuple(self.layers.mount(layer.id, layer.size) for layer in entry.layers)
        layer_ids = tuple(mount.layer_id for mount in mounts)
        running = self.workloads.running[workload_id] = Running(handle, layer_ids)
        self.ends.restartable(handle, entry.boot, entry)
        running.restarts = entry.restarts
        self.ends.watch(handle, layer_ids)
        held = self.budget.readopt(entry.spec, self.workloads.owner(handle), entry.reservation)
        running.booted = Booted(handle, held.admission, mounts)
        if not handle.done:
            self.ledger.started(entry, handle, held.admission)
            status = self.workloads.status(workload_id)
            self.ledger.emit(workload_id, status, "started")  # its boot's may be lost
        log.info("node %s adopted %s (reservation %s)", self.name, workload_id, held.id)
        return True

    def _record_lost(self, entry: JournalEntry, adoptable: bool) -> None:
        """Record how a journaled workload that is not adopted ended, and forget its entry."""
        runtime, workload_id = self.runtime, entry.workload_id
        if adoptable and isinstance(runtime, AdoptingRuntime):
            record = runtime.ended(workload_id, entry.locator)
            status = _lost_status(record)
        else:
            status = WorkloadStatus(
                "ended",
                None,
                f"not adoptable: the {entry.runtime} runtime does not outlive "
                "its agent; it was killed at the agent's restart",
            )
            if isinstance(runtime, AdoptingRuntime):
                runtime.abandon(workload_id, entry.locator)
            _kill_by_locator(entry.locator)
        self.workloads.ended[workload_id] = Ended(status, None)
        self.ledger.end(workload_id, status)
        self.ledger.emit(workload_id, status)
        log.info(
            "node %s: %s ended while its agent was down: %s", self.name, workload_id, status.reason
        )


def _lost_status(record: dict[str, object] | None) -> WorkloadStatus:
    """The status of a workload that ended while its agent was down, from its supervisor's
    exit record when there is one."""
    unknown = "ended while the agent was down, status unknown"
    if record is None:
        return WorkloadStatus("ended", None, unknown)
    code, signum = record.get("code"), record.get("signal")
    ended = WorkloadExit(
        code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        signal=signum if isinstance(signum, int) and not isinstance(signum, bool) else None,
    )
    reason = ended.reason if ended.reason != "ended" else unknown
    why = record.get("orphaned") or record.get("lost")
    if isinstance(why, str):
        reason = f"{reason}: {why}"
    return WorkloadStatus("ended", ended.code, f"{reason} (while the agent was down)")


def _kill_by_locator(locator: dict[str, object] | None) -> None:
    """End what a locator of a workload that will not be adopted names, each process only if
    it is still the one that was started then (``[pid, start ticks]``): a process runtime's
    ``supervisor`` is asked to kill its workload's tree (``SIGUSR1``: killing the supervisor
    itself would leave the tree to init); anything else (``qemu``) is killed."""
    found = {
        key: value
        for key, value in (locator or {}).items()
        if isinstance(value, list)
        and len(value) == 2
        and all(isinstance(part, int) and not isinstance(part, bool) for part in value)
    }
    if "supervisor" in found:
        found = {"supervisor": found["supervisor"]}
    for key, (pid, ticks) in found.items():
        if alive(pid, ticks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGUSR1 if key == "supervisor" else signal.SIGKILL)
