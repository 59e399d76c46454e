"""A workload's end on a node: restarted under its policy, or recorded, and what it held let go.

This module owns what the node core does when a run of a workload ends (:class:`Ends`),
whatever ended it — an exit, a kill, a stop, a failed restart:

* **a restart**, when the workload's boot has a :class:`~berth.model.RestartPolicy` and its
  end calls for one: the same id, reservation and layers, after a backoff of
  ``min(delay · 2^k, max_delay)`` (``k`` the restarts within the policy's interval), until
  the policy's attempts within that interval are exhausted.  A restartable workload's
  reservation is owned by its :class:`~berth.node.workloads.Life` across all its runs, so it
  is never free between two runs for another admission to take;
* otherwise **the end** (:meth:`Ends.finish`): the workload is forgotten as running and
  remembered as ended with its status, its end is written down (:mod:`berth.node.ledger`:
  the journal entry, the event), its layer mounts go into the cache, and its life ends — its
  reservation with it (the budget follows its owner, or the lease bound to it).

**A stop is never followed by a restart** (:meth:`Ends.stop`): one waiting for its backoff
is cancelled, and the workload ends ``stopped``.

Each workload the node starts or adopts is given to :meth:`Ends.watch` (after
:meth:`Ends.restartable`, when its boot asks for restarts): so **a workload's end releases
what it held**, however it began.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from berth.boot import BootFailed, BootSpec, WorkloadStatus
from berth.errors import BerthError
from berth.model import RestartPolicy
from berth.node.journal import JournalEntry
from berth.node.layers import LayerRegistry
from berth.node.ledger import Ledger
from berth.node.runtime.port import Runtime, WorkloadHandle
from berth.node.workloads import ENDED_MEMORY, Booted, Ended, Life, Running, Workloads

__all__ = ["Ends", "NodeParts", "unmount"]

log = logging.getLogger("berth.node")


@dataclass(eq=False, repr=False)
class NodeParts:
    """The base of the node core's collaborators — its ends (:class:`Ends`), its boots
    (:class:`~berth.node.lifecycle.Boots`): the parts of the node each works on, kept once
    for all of them (and private to them; a collaborator passes them on positionally)."""

    _name: str
    _runtime: Runtime
    _layers: LayerRegistry
    _workloads: Workloads
    _ledger: Ledger


class Ends(NodeParts):
    """The ends and restarts of one node's workloads (see the module docstring).

    ``clock`` and ``sleep`` time a restart's backoff and its policy's attempt window;
    ``end_errors`` is the node's list of bookkeeping errors met at an end.
    """

    def __init__(
        self,
        name: str,
        runtime: Runtime,
        layers: LayerRegistry,
        workloads: Workloads,
        ledger: Ledger,
        end_errors: list[str],
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        super().__init__(name, runtime, layers, workloads, ledger)
        self._end_errors = end_errors
        self._clock, self._sleep = clock, sleep

    def restartable(
        self, workload: WorkloadHandle, boot: BootSpec, entry: JournalEntry | None
    ) -> None:
        """Give a started workload whose boot asks for restarts what it needs for them."""
        running = self._workloads.running.get(workload.id)
        if running is None or boot.restart is None or boot.restart.mode == "never":
            return
        running.life, running.boot, running.entry = Life(), boot, entry

    def watch(self, workload: WorkloadHandle, layer_ids: tuple[str, ...]) -> None:
        """Handle the end of this run of ``workload``, which holds ``layer_ids`` mounted."""
        workload.add_done_callback(lambda ended: self._ended(ended, layer_ids))

    async def stop(self, workload_id: str, grace_s: float | None) -> None:
        """Stop a workload (see :meth:`~berth.node.core.NodeCore.stop`), cancelling a restart
        it waits for; ``grace_s`` is already checked."""
        running = self._workloads.running.get(workload_id)
        if running is not None:
            running.stopping = True
            restarting = running.restarting
            if restarting is not None and not restarting.done():
                restarting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await restarting
                if self._workloads.running.get(workload_id) is not running:
                    return
        await self._runtime.stop(workload_id, grace_s=grace_s)

    def _ended(self, workload: WorkloadHandle, layer_ids: tuple[str, ...]) -> None:
        # The reservation is released by the budget itself (it follows its owner); the layers
        # are ours to unmount.  A run its restart policy restarts ends nothing of that.
        running = self._workloads.running.get(workload.id)
        exhausted = False
        if running is not None and running.workload is workload and running.boot is not None:
            if self._restart_later(running, workload):
                return
            exhausted = running.restarting is None and self._exhausted(running, workload)
        ended = workload.exit
        reason = None if ended is None else ended.reason
        if exhausted and running is not None and running.boot is not None:
            policy = running.boot.restart
            assert policy is not None
            reason = f"restarts exhausted ({policy.attempts} in {policy.interval_s:g}s): {reason}"
        status = WorkloadStatus(
            "ended",
            None if ended is None else ended.code,
            reason,
            ended is not None and ended.stopped,
            0 if running is None else running.restarts,
            exhausted,
        )
        self.finish(workload.id, status, layer_ids)

    def finish(self, workload_id: str, status: WorkloadStatus, layer_ids: tuple[str, ...]) -> None:
        """Record a workload's last end: forget it as running, remember ``status``, remove its
        journal entry, unmount its layers, end its life (its reservation with it)."""
        workloads = self._workloads
        running = workloads.running.pop(workload_id, None)
        if running is None:
            self._end_errors.append(f"unknown workload {workload_id} ended")
        workloads.ended[workload_id] = Ended(status, None if running is None else running.booted)
        while len(workloads.ended) > ENDED_MEMORY:
            workloads.ended.popitem(last=False)
        self._ledger.end(workload_id, status)
        self._ledger.emit(workload_id, status)
        try:
            unmount(self._layers, layer_ids)
        except BerthError as error:
            self._end_errors.append(f"workload {workload_id}: {error}")
            log.error("node %s: unmounting after %s ended: %s", self._name, workload_id, error)
        if running is not None and running.life is not None:
            running.life.end()
        log.info("workload %s on %s ended: %s", workload_id, self._name, status.reason)

    # -- restarts: the same id, reservation and layers, after a backoff ----------------------
    def _window(self, running: Running, policy: RestartPolicy) -> list[float]:
        """The times of ``running``'s restarts within the policy's interval, up to now."""
        now = self._clock()
        running.restarted_at = [at for at in running.restarted_at if now - at < policy.interval_s]
        return running.restarted_at

    def _exhausted(self, running: Running, workload: WorkloadHandle) -> bool:
        """Whether the end of ``workload`` called for a restart its policy had no attempt
        left for."""
        policy, ended = None if running.boot is None else running.boot.restart, workload.exit
        if policy is None or ended is None or running.stopping:
            return False
        if not policy.restarts_after(ended.code, ended.stopped):
            return False
        return len(self._window(running, policy)) >= policy.attempts

    def _restart_later(self, running: Running, workload: WorkloadHandle) -> bool:
        """Schedule the restart of ``workload``'s id if its end and its policy call for one
        (after ``min(delay · 2^k, max_delay)``, ``k`` the restarts within the interval).
        Whether one is scheduled."""
        policy, ended = None if running.boot is None else running.boot.restart, workload.exit
        if policy is None or ended is None or running.stopping:
            return False
        if not policy.restarts_after(ended.code, ended.stopped):
            return False
        window = self._window(running, policy)
        if len(window) >= policy.attempts:
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # ended outside any event loop: nothing can restart it
            return False
        delay = policy.delay(len(window))
        window.append(self._clock() + delay)
        running.last_exit = ended
        running.restarting = loop.create_task(
            self._restart(running, delay), name=f"berth-restart-{workload.id}"
        )
        log.info(
            "node %s: %s %s; restart %d in %.3gs",
            self._name,
            workload.id,
            ended.reason,
            running.restarts + 1,
            delay,
        )
        return True

    def _gave_up(self, running: Running, reason: str, *, stopped: bool) -> None:
        """``running`` ends for good before its restart ran: ``reason``, its last run's code,
        ``stopped`` when a stop ended it."""
        assert running.last_exit is not None
        status = WorkloadStatus("ended", running.last_exit.code, reason, stopped, running.restarts)
        self.finish(running.workload.id, status, running.layer_ids)

    async def _restart(self, running: Running, delay: float) -> None:
        """Wait ``delay``, then start the workload again under its id; a stop meanwhile
        (the task cancelled) or a failed start ends it for good."""
        workload_id, last = running.workload.id, running.last_exit
        assert running.boot is not None and last is not None
        journal = self._ledger.journal
        try:
            await self._sleep(delay)
            if journal is not None:
                journal.forget_exit(workload_id)  # the last run's: not the next one's
            workload = await self._runtime.start(running.boot, workload_id=workload_id)
        except asyncio.CancelledError:
            self._gave_up(
                running, f"stopped while waiting to restart (last run {last.reason})", stopped=True
            )
            raise
        except Exception as error:
            why = error.reason if isinstance(error, BootFailed) else str(error)
            self._gave_up(running, f"restart failed: {why} (last run {last.reason})", stopped=False)
            return
        running.workload, running.restarting = workload, None
        running.restarts += 1
        if running.booted is not None:
            running.booted = Booted(workload, running.booted.admission, running.booted.mounts)
        self.watch(workload, running.layer_ids)
        if running.entry is not None and running.booted is not None and journal is not None:
            entry = running.entry.model_copy(update={"restarts": running.restarts})
            self._ledger.started(entry, workload, running.booted.admission)
        log.info("node %s restarted %s (restart %d)", self._name, workload_id, running.restarts)
        self._ledger.emit(workload_id, self._workloads.status(workload_id))
        if running.stopping:  # a stop came while it was starting
            await self._runtime.stop(workload_id)


def unmount(layers: LayerRegistry, layer_ids: Sequence[str]) -> None:
    """Unmount each of ``layer_ids`` from ``layers`` (into its cache)."""
    for layer_id in layer_ids:
        layers.unmount(layer_id)
