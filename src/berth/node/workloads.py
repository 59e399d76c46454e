"""What a node runs and remembers having run: its workloads' records, by id.

This module owns the node core's table of workloads (:class:`Workloads`): those running (a
workload waiting to restart counts: it holds its place), the boots in progress under a
caller's id, and the last :data:`ENDED_MEMORY` ended ones with how each ended — what a status
query, a repeated boot of the same id and a new workload's id are answered from.  It owns
the records in that table too: a :class:`Booted` boot, a :class:`Running` workload, an
:class:`Ended` one, and the :class:`Life` that owns a restartable workload's reservation
across its runs.

It is the bottom of the node core's parts (:mod:`berth.node.core`): it holds the records and
answers questions about them; the parts above it — the ledger, the ends, the boots, the
recovery — decide when a record is added, changed or dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from berth.boot import BootSpec, WorkloadStatus
from berth.node.journal import JournalEntry
from berth.node.layers import MountResult
from berth.node.runtime.port import WorkloadExit, WorkloadHandle
from berth.ownership import Admission, Owner

__all__ = ["ENDED_MEMORY", "Booted", "Ended", "Life", "Running", "Workloads"]

log = logging.getLogger("berth.node")

ENDED_MEMORY = 4096
"""How many ended workloads a node remembers (with how each ended) for status queries."""


@dataclass(frozen=True)
class Booted:
    """A booted workload: the workload, the reservation it owns, and what each mount did.

    ``mounts`` are in the order of the request's layers; a layer with outcome ``PULLED`` was
    on this node neither mounted nor cached.
    """

    workload: WorkloadHandle
    admission: Admission
    mounts: tuple[MountResult, ...]

    @property
    def pulled_bytes(self) -> int:
        """Bytes of the layers that had to be pulled."""
        return sum(mount.pulled_bytes for mount in self.mounts)


class Life:
    """The owner of a restartable workload's reservation, across all its runs: it ends once,
    when the workload's last run has ended (a stop, ``never``, restarts exhausted) — so the
    reservation is never free between two runs, for another admission to take."""

    def __init__(self) -> None:
        self.done = False
        self._callbacks: list[Callable[[Life], object]] = []

    def add_done_callback(self, fn: Callable[[Life], object], /) -> None:
        if self.done:
            fn(self)
        else:
            self._callbacks.append(fn)

    def end(self) -> None:
        if self.done:
            return
        self.done = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("a done callback of a workload's life failed")


@dataclass
class Running:
    """A workload this node runs: its handle (its current run's), the layers it holds, its
    completed boot (set once it owns its reservation); with a restart policy, the owner of
    its reservation across runs (``life``), its boot spec and journal entry (to start it
    again), the times of its restarts within the policy's interval, the end of its last run
    and the pending restart."""

    workload: WorkloadHandle
    layer_ids: tuple[str, ...]
    booted: Booted | None = None
    life: Life | None = None
    boot: BootSpec | None = None
    entry: JournalEntry | None = None
    restarts: int = 0
    restarted_at: list[float] = field(default_factory=list)
    last_exit: WorkloadExit | None = None
    restarting: asyncio.Task[None] | None = None
    stopping: bool = False


@dataclass
class Ended:
    """How a workload ended, and its boot if it completed (a repeat of its id returns it)."""

    status: WorkloadStatus
    booted: Booted | None


class Workloads:
    """A node's workloads by id: ``running``, ``booting`` (a boot in progress under the
    caller's id, as the future of its outcome) and ``ended`` (the most recent last)."""

    def __init__(self) -> None:
        self.running: dict[str, Running] = {}
        self.booting: dict[str, asyncio.Future[Booted]] = {}
        self.ended: OrderedDict[str, Ended] = OrderedDict()

    def status(self, workload_id: str) -> WorkloadStatus:
        """Whether ``workload_id`` runs here, ended (and how), or is unknown to this node."""
        running = self.running.get(workload_id)
        if running is not None:  # waiting to restart counts as running: it holds its place
            last = running.last_exit
            if last is None:
                return WorkloadStatus("running", restarts=running.restarts)
            return WorkloadStatus("running", last.code, last.reason, False, running.restarts)
        ended = self.ended.get(workload_id)
        return WorkloadStatus("unknown") if ended is None else ended.status

    def booted(self, workload_id: str) -> Booted | None:
        """The completed boot of ``workload_id``, running or ended, if this node knows one."""
        running = self.running.get(workload_id)
        if running is not None:
            return running.booted
        ended = self.ended.get(workload_id)
        return None if ended is None else ended.booted

    def known_ids(self) -> set[str]:
        """Every id a new workload must not take: running, booting, remembered as ended."""
        return self.running.keys() | self.booting.keys() | self.ended.keys()

    def owner(self, workload: WorkloadHandle) -> Owner:
        """What owns ``workload``'s reservation: its life when it may restart, else itself."""
        running = self.running.get(workload.id)
        if running is not None and running.life is not None:
            return running.life
        return workload
