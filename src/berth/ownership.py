"""Owners, leases and refusals: the vocabulary of node admission that the ports share.

A node's budget (:mod:`berth.node.budget`) holds every reservation for an *owner*, the
node-client port (:mod:`berth.nodeclient.port`) carries leases and refusals between a
scheduler and a node, and the scheduler reads refusals' reason codes.  The words live here,
below all three, so none of them has to import another to speak about admission:

* :class:`Owner` — anything that reports its end to a callback (``add_done_callback``): an
  asyncio task or future, a ``concurrent.futures.Future``, a runtime workload, an OS process
  through :func:`process_owner`;
* :class:`Lease` — an explicit owner with a deadline, for confirming over a network before
  the workload exists; bound to the workload later, or left to expire;
* :class:`Refused` — a node's "no", with a reason code shared with the snapshot filter
  (``mem_exhausted``, ``platform_mismatch``, ``boot_failed`` …) and the node's name.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import psutil

from berth.checks import describe_reason
from berth.errors import BerthError, Invalid
from berth.model import MAX_DURATION_S, MIN_INTERVAL_S
from berth.validation import shown

__all__ = [
    "Admission",
    "Clock",
    "Lease",
    "Owner",
    "ProcessHandle",
    "Refused",
    "has_ended",
    "process_owner",
    "refused_by",
]

Clock = Callable[[], float]


@dataclass(frozen=True)
class Admission:
    """A node's "yes": the reservation it took, and its admission count after taking it.

    ``seq`` numbers the node's admissions (1, 2, …); a snapshot whose ``admitted`` is at
    least ``seq`` was taken after this reservation, so it accounts for it (or for its end).
    A scheduler's assume cache (:mod:`berth.scheduler.assume`) uses it to know when its own
    view of the reservation can give way to the node's.
    """

    reservation_id: str
    seq: int


class Owner(Protocol):
    """What a reservation is held for: anything that reports its end to a callback."""

    def add_done_callback(self, fn: Callable[[Any], object], /) -> object: ...


ProcessHandle = asyncio.subprocess.Process | subprocess.Popen[Any] | psutil.Process


def process_owner(process: ProcessHandle) -> Owner:
    """An owner that ends when an OS process ends.

    * ``asyncio.subprocess.Process`` — a task awaiting ``wait()`` (needs a running loop);
    * ``subprocess.Popen`` or ``psutil.Process`` — a future completed by a daemon thread
      blocked in ``wait()``; a process that is already gone ends the owner at once.
    """
    if isinstance(process, asyncio.subprocess.Process):
        return asyncio.ensure_future(process.wait())
    ended: concurrent.futures.Future[None] = concurrent.futures.Future()

    def watch() -> None:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError, ChildProcessError):
            process.wait()
        ended.set_result(None)

    threading.Thread(target=watch, name=f"owner-{process.pid}", daemon=True).start()
    return ended


class Refused(BerthError):
    """The node refused: ``reason`` is a code such as ``mem_exhausted`` or ``boot_failed``."""

    def __init__(self, reason: str, detail: str = "", *, node: str | None = None) -> None:
        self.reason = reason
        self.detail = detail
        self.node = node
        where = f"node {node} refused" if node else "refused"
        text = f"{where}: {reason} ({describe_reason(reason)})"
        super().__init__(f"{text}: {detail}" if detail else text)

    @classmethod
    def lease_expired(cls, reservation_id: str) -> Refused:
        """The refusal of a call on a reservation the node no longer holds (released, expired,
        or never taken): ``lease_expired``, whoever notices it."""
        return cls("lease_expired", f"reservation {reservation_id} is gone")


@contextlib.contextmanager
def refused_by(node: str) -> Iterator[None]:
    """Re-raise a node's ``Refused`` with the node named (budgets do not know their name)."""
    try:
        yield
    except Refused as refused:
        if refused.node is not None:
            raise
        raise Refused(refused.reason, refused.detail, node=node) from None


class Lease:
    """An explicit owner that ends when released, when it expires, or when its bound owner ends.

    A scheduler confirming over the network cannot hand the node a live owner, so the node
    reserves under a lease with a deadline (``ttl`` seconds, positive and finite).  The caller
    later ``bind``s it to the workload (the lease then lives exactly as long as that owner) or
    ``end``s it.  Expiry is judged on the budget's clock, so tests use a fake one.

    A lease is *due* once ``clock() >= deadline`` (exactly at its deadline it is over).  A due
    lease is ended by whoever looks first: :meth:`NodeBudget.reap` (through
    :meth:`expire_if_due`), or a :meth:`bind` (refused with ``lease_expired``) or
    :meth:`renew` (reports ``False``) that comes before the reaper.

    Every decision — expire, bind, renew — compares the deadline with the time and changes
    the lease under the lease's one lock, so they are totally ordered: a ``bind`` or ``renew``
    that reported success is never followed by an end by expiry.  (The expirer used to read
    the deadline outside the lock, then the clock, then end the lease; a bind landing in
    between succeeded and the lease was ended anyway, releasing the reservation of a running
    workload.)  The clock is read just *before* taking the lock — a time read a little early
    only makes a decision more conservative on a monotonic clock, and no caller's code runs
    under the lock — and callbacks run after it is released, so a callback may take the
    budget's lock without ordering the two locks.
    """

    def __init__(self, ttl_s: float, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.deadline: float | None = clock() + _checked_ttl(ttl_s)
        self._callbacks: list[Callable[[Any], object]] = []
        self._done = False
        self.bound_to: object | None = None

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None:
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def renew(self, ttl_s: float) -> bool:
        """Push an unbound lease's deadline to ``ttl_s`` from now; whether the lease lives on.

        ``True`` for a live lease (a bound one has no deadline and keeps none); ``False`` once
        it has ended, or when its deadline has already come — it is then ended now, as a reap
        would have.
        """
        ttl_s = _checked_ttl(ttl_s)
        now = self._clock()
        with self._lock:
            if self._done:
                return False
            if self.bound_to is not None:
                return True
            if self._due_at(now):
                callbacks = self._end_locked()
            else:
                self.deadline = now + ttl_s
                return True
        self._run(callbacks)
        return False

    def bind(self, owner: Owner) -> None:
        """Tie the lease to ``owner``: no more expiry; it ends when ``owner`` ends.

        Refused with ``lease_expired`` when the lease has ended or its deadline has come
        (even if no reap has run yet: the lease is then ended now).
        """
        now = self._clock()
        with self._lock:
            if self._done:
                raise Refused("lease_expired", "the reservation ended before it was bound")
            if self._due_at(now):
                callbacks = self._end_locked()
            else:
                self.bound_to = owner
                self.deadline = None
                callbacks = None
        if callbacks is not None:
            self._run(callbacks)
            raise Refused("lease_expired", "the lease's deadline passed before it was bound")
        owner.add_done_callback(lambda _: self.end())

    def end(self) -> None:
        """End the lease now (idempotent); its reservation is released."""
        with self._lock:
            if self._done:
                return
            callbacks = self._end_locked()
        self._run(callbacks)

    def expire_if_due(self) -> bool:
        """End the lease if its deadline has come; True if it ended now.

        Decided and done under the lease's lock: a concurrent ``bind`` or ``renew`` either
        completes first (and this sees no deadline, or the new one) or finds the lease ended.
        """
        now = self._clock()
        with self._lock:
            if self._done or not self._due_at(now):
                return False
            callbacks = self._end_locked()
        self._run(callbacks)
        return True

    def _due_at(self, now: float) -> bool:
        """Whether an unbound lease is past its deadline at ``now`` (call under the lock)."""
        return self.deadline is not None and now >= self.deadline

    def _end_locked(self) -> list[Callable[[Any], object]]:
        """Mark the lease ended and hand back the callbacks to run (call under the lock)."""
        self._done = True
        callbacks, self._callbacks = self._callbacks, []
        return callbacks

    def _run(self, callbacks: list[Callable[[Any], object]]) -> None:
        for callback in callbacks:
            callback(self)


def _checked_ttl(ttl_s: float) -> float:
    """A lease's time to live in seconds: a positive, finite number (NaN and inf are not),
    from ``MIN_INTERVAL_S`` (1 ms: shorter expires before any reply) to ``MAX_DURATION_S``."""
    if (
        isinstance(ttl_s, bool)
        or not isinstance(ttl_s, int | float)
        or not MIN_INTERVAL_S <= ttl_s <= MAX_DURATION_S
    ):
        raise Invalid(
            f"must be a positive, finite number of seconds from {MIN_INTERVAL_S:g} to "
            f"{MAX_DURATION_S:g}, got {shown(ttl_s)}",
            field="lease_ttl_s",
        )
    return float(ttl_s)


def has_ended(owner: object) -> bool:
    """Whether ``owner`` has already ended (futures have ``done()``, workloads a property)."""
    done = getattr(owner, "done", None)
    return bool(done() if callable(done) else done)
