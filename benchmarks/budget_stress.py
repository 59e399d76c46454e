"""Adversarial stress of one node budget: threads and an event loop racing every operation.

Worker threads admit (owned and leased), bind, renew, release and end owners at random; a
reaper thread reaps; an auditor thread reads the budget; an asyncio event loop runs tasks
that hold reservations as owners (admitted directly, or leased and then bound); and the clock
— a shared fake, advanced in small steps by the workers — yields the GIL on every
``yield_every``-th read (``time.sleep(0)``), forcing thread switches where the lease race of
issue 15 lived (the expirer read the deadline, then the clock, then ended the lease; a bind in
between was lost).  The budget must keep every promise, each a *violation* when broken:

* **hard limits** — reserved memory and disk never exceed ``mem_max``/``disk_max``
  (headroom never negative), and β_max sums never exceed their ceilings;
* **a bound or owned reservation lives as long as its owner** — it is never gone while its
  owner lives and nobody released it, its ``release()`` returns ``True``, and the owner's
  death releases it at once;
* **a renewal keeps its promise** — a lease renewed (or admitted) to deadline ``D`` is not
  ended by expiry while the clock is before ``D``, and a bind or renew is refused only once
  ``D`` has come;
* **nothing leaks** — once every owner has ended, every reservation has been released and
  the clock has passed every deadline, nothing is reserved (``leaked_bytes`` counts memory
  and disk still held).

Each worker owns the reservations it made (only it binds, renews, releases them or ends
their owners), so whatever else ends one of them is the budget's doing: expiry, or a bug.

    python benchmarks/budget_stress.py                # 10^6 operations (about a minute)
    python benchmarks/budget_stress.py --quick --json # CI: seconds, one JSON line

The JSON line has ``ops``, ``violations``, ``leaked_bytes``, ``seconds``, ``ops_per_s``, the
counts of each outcome and the first violations' descriptions.  Exit status 1 on any
violation or leak.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from berth.model import Spec
from berth.node.budget import BudgetLimits, NodeBudget
from berth.ownership import Lease, Refused

LIMITS = BudgetLimits(
    mem_max=4096,
    disk_max=8192,
    cpu_capacity=4.0,
    cpu_max_load=1.0,
    disk_bw_cap=1000,
    net_bw_cap=1000,
    cpu_overcommit=2.0,  # 8 vcpus reserved at most
    disk_bw_overcommit=1.5,  # 1500 B/s
    net_bw_overcommit=1.0,  # 1000 B/s
)
TTLS = (0.5, 1.0, 2.0, 4.0)


class StressClock:
    """A shared fake clock: ``advance`` moves it forward; some reads yield the GIL first."""

    def __init__(self, yield_every: int) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()
        self._reads = 0
        self._yield_every = yield_every

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds

    def __call__(self) -> float:
        self._reads += 1  # racy on purpose: only spreads the yields around
        if self._yield_every and self._reads % self._yield_every == 0:
            time.sleep(0)  # let another thread run between reading the clock and acting on it
        return self.now


class Owned:
    """A workload whose end the harness decides (callbacks run in the ending thread)."""

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None:
        self.future.add_done_callback(lambda _: fn(self))

    def end(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


@dataclass
class Held:
    """A reservation one worker made: owned, leased (with its promised deadline) or bound."""

    rid: str
    owner: Owned | None = None
    lease: Lease | None = None
    deadline: float = 0.0  # the latest deadline the budget promised an unbound lease


@dataclass
class Tally:
    """Outcomes and violations, merged from every thread at the end."""

    ops: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1

    def violation(self, text: str) -> None:
        self.violations.append(text)

    def merge(self, other: Tally) -> None:
        self.ops += other.ops
        for key, value in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + value
        self.violations.extend(other.violations)


def random_spec(rng: random.Random) -> Spec:
    return Spec(
        vcpus=rng.choice((0.25, 0.5, 1.0, 2.0)),
        mem=rng.choice((1, 64, 256, 512, 1024)),
        disk=rng.choice((0, 128, 1024, 2048)),
        disk_bw=rng.choice((0, 0, 100, 250)),
        net_bw=rng.choice((0, 0, 100, 250)),
    )


class Worker:
    """One thread's random walk over the reservations it owns (see the module docstring)."""

    def __init__(self, budget: NodeBudget, clock: StressClock, seed: int) -> None:
        self.budget, self.clock = budget, clock
        self.rng = random.Random(seed)
        self.held: dict[str, Held] = {}
        self.tally = Tally()

    def run(self, ops: int) -> None:
        actions = (
            (self.admit, 20),
            (self.admit_leased, 20),
            (self.bind, 15),
            (self.renew, 10),
            (self.release, 10),
            (self.owner_dies, 15),
            (self.tick, 8),
            (self.reap, 2),
        )
        choices = [action for action, _ in actions]
        weights = [weight for _, weight in actions]
        for _ in range(ops):
            self.rng.choices(choices, weights)[0]()
            self.tally.ops += 1

    # -- the operations ------------------------------------------------------------------------
    def admit(self) -> None:
        owner = Owned()
        try:
            reservation = self.budget.admit(random_spec(self.rng), owner)
        except Refused as refused:
            self.tally.count(f"refused:{refused.reason}")
            return
        self.tally.count("admitted")
        self.held[reservation.id] = Held(reservation.id, owner=owner)

    def admit_leased(self) -> None:
        try:
            reservation = self.budget.admit_leased(random_spec(self.rng), self.rng.choice(TTLS))
        except Refused as refused:
            self.tally.count(f"refused:{refused.reason}")
            return
        lease = reservation.owner
        assert isinstance(lease, Lease) and lease.deadline is not None
        self.tally.count("leased")
        self.held[reservation.id] = Held(reservation.id, lease=lease, deadline=lease.deadline)

    def bind(self) -> None:
        held = self._pick(leased=True)
        if held is None:
            return
        owner = Owned()
        try:
            self.budget.bind(held.rid, owner)
        except Refused:
            self._refused_lease(held, "bind")
            return
        self.tally.count("bound")
        held.owner = owner

    def renew(self) -> None:
        held = self._pick(leased=True)
        if held is None or held.lease is None:
            return
        if held.lease.renew(self.rng.choice(TTLS)):
            deadline = held.lease.deadline
            if deadline is None:
                self.tally.violation(f"renew of {held.rid} reported success without a deadline")
                return
            held.deadline = deadline  # may be sooner than before: renew sets now + ttl
            self.tally.count("renewed")
        else:
            self._refused_lease(held, "renew")

    def release(self) -> None:
        held = self._pick()
        if held is None:
            return
        released = self.budget.release(held.rid)
        del self.held[held.rid]
        if released:
            self.tally.count("released")
        elif held.owner is not None:
            self.tally.violation(f"release of {held.rid}, held by a live owner, returned False")
        else:  # an unbound lease: only expiry may have taken it first
            self._expired(held)
        if held.lease is not None and not held.lease.done():
            self.tally.violation(f"released {held.rid} but its lease lives on")

    def owner_dies(self) -> None:
        held = self._pick(owned=True)
        if held is None or held.owner is None:
            return
        held.owner.end()
        del self.held[held.rid]
        self.tally.count("owner_died")
        if self.budget.get(held.rid) is not None:
            self.tally.violation(f"{held.rid} still reserved after its owner ended")

    def tick(self) -> None:
        self.clock.advance(self.rng.choice((0.05, 0.1, 0.25)))

    def reap(self) -> None:
        if self.budget.reap():
            self.tally.count("reaped_by_worker")

    # -- checking ------------------------------------------------------------------------------
    def _pick(self, *, leased: bool = False, owned: bool = False) -> Held | None:
        if not self.held:
            return None
        held = self.held[self.rng.choice(list(self.held))]
        if held.owner is not None:
            if not self._check_held(held):
                held.owner.end()
                del self.held[held.rid]
                return None
            return None if leased else held
        if held.lease is not None and held.lease.done():
            self._expired(held)
            del self.held[held.rid]
            return None
        return None if owned else held

    def _check_held(self, held: Held) -> bool:
        """An owned or bound reservation whose owner lives must still be reserved."""
        if self.budget.get(held.rid) is not None:
            return True
        what = "bound lease" if held.lease is not None else "owned reservation"
        self.tally.violation(f"{what} {held.rid} vanished while its owner lives")
        return False

    def _expired(self, held: Held) -> None:
        """An unbound lease ended without this worker: only due expiry may have done it."""
        now = self.clock()  # read after seeing it ended: the expiry's reading was no later
        if now < held.deadline:
            self.tally.violation(
                f"lease {held.rid} ended at {now:.2f}, before its deadline {held.deadline:.2f}"
            )
        self.tally.count("expired")

    def _refused_lease(self, held: Held, operation: str) -> None:
        """A bind or renew refused: fair only once the promised deadline has come."""
        now = self.clock()
        if now < held.deadline:
            self.tally.violation(
                f"{operation} of {held.rid} refused at {now:.2f}, before {held.deadline:.2f}"
            )
        self.tally.count(f"{operation}_refused")
        del self.held[held.rid]

    def finish(self) -> None:
        """End every owner this worker still holds, checking each was still reserved."""
        for held in list(self.held.values()):
            if held.owner is not None:
                self._check_held(held)
                held.owner.end()
            elif held.lease is not None and held.lease.done():
                self._expired(held)
            else:
                self.budget.release(held.rid)
        self.held.clear()


def audit(budget: NodeBudget, tally: Tally) -> None:
    """The hard limits and β_max ceilings, read while everything else runs."""
    reservations = budget.reservations()
    mem = sum(r.spec.mem for r in reservations)
    disk = sum(r.spec.disk for r in reservations)
    if mem > budget.limits.mem_max or disk > budget.limits.disk_max:
        tally.violation(f"over-committed: {mem} B memory, {disk} B disk reserved")
    headroom = budget.headroom()
    if headroom.mem_free < 0 or headroom.disk_free < 0:
        tally.violation(f"negative headroom {headroom}")
    over = budget.overcommit()
    if over is not None:
        for name in ("vcpus", "disk_bw", "net_bw"):
            reserved, ceiling = getattr(over, f"{name}_reserved"), getattr(over, f"{name}_ceiling")
            if ceiling is not None and reserved > ceiling:
                tally.violation(f"{name} over-committed: {reserved} > {ceiling}")


async def async_workloads(budget: NodeBudget, ops: int, seed: int, tally: Tally) -> None:
    """Tasks as owners on an event loop (admitted directly, or leased and then bound), eight
    at a time, until ``ops`` budget calls have been made."""
    rng = random.Random(seed)
    holders: list[str] = []

    async def workload(leased: bool, steps: int) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            tally.ops += 1
            if leased:
                reservation = budget.admit_leased(random_spec(rng), rng.choice(TTLS))
                tally.ops += 1
                budget.bind(reservation.id, task)
            else:
                reservation = budget.admit(random_spec(rng), task)
        except Refused as refused:
            tally.count(f"async_refused:{refused.reason}")
            return
        tally.count("async_held")
        for _ in range(steps):
            await asyncio.sleep(0)
            if budget.get(reservation.id) is None:
                tally.violation(f"{reservation.id} vanished while its task runs")
                return
        holders.append(reservation.id)

    while tally.ops < ops:
        tasks = [
            asyncio.ensure_future(workload(rng.random() < 0.5, rng.randrange(1, 4)))
            for _ in range(8)
        ]
        await asyncio.gather(*tasks)
        for _ in range(2):  # the tasks' done callbacks run on the next iterations
            await asyncio.sleep(0)
        for rid in holders:
            if budget.get(rid) is not None:
                tally.violation(f"{rid} still reserved after its task ended")
        holders.clear()


def stress(
    ops: int = 1_000_000,
    *,
    workers: int = 4,
    yield_every: int = 3,
    seed: int = 15,
    budget_factory: Callable[[StressClock], NodeBudget] | None = None,
) -> dict[str, Any]:
    """Run the whole stress; a JSON-ready summary (see the module docstring)."""
    clock = StressClock(yield_every)
    budget = (budget_factory or (lambda c: NodeBudget(LIMITS, clock=c)))(clock)
    tally = Tally()
    share = -(-ops // (workers + 1))  # the event loop's share is one worker's
    crew = [Worker(budget, clock, seed * 1000 + index) for index in range(workers)]
    running = threading.Event()
    running.set()
    side = Tally()
    side_lock = threading.Lock()

    def reaper() -> None:
        local = Tally()
        while running.is_set():
            local.count("reaper_reaps")
            if budget.reap():
                local.count("reaper_expired")
            time.sleep(0)
        with side_lock:
            side.merge(local)

    def auditor() -> None:
        local = Tally()
        while running.is_set():
            local.count("audits")
            audit(budget, local)
            time.sleep(0)
        with side_lock:
            side.merge(local)

    def event_loop() -> None:
        local = Tally()
        asyncio.run(async_workloads(budget, share, seed, local))
        with side_lock:
            side.merge(local)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker.run, args=(share,)) for worker in crew]
    threads.append(threading.Thread(target=event_loop))
    helpers = [threading.Thread(target=reaper), threading.Thread(target=auditor)]
    for thread in (*threads, *helpers):
        thread.start()
    for thread in threads:
        thread.join()
    running.clear()
    for thread in helpers:
        thread.join()
    seconds = time.perf_counter() - started

    for worker in crew:
        worker.finish()
        tally.merge(worker.tally)
    tally.merge(side)
    clock.advance(max(TTLS) + 1)  # past every deadline: what is left is a leak
    budget.reap()
    headroom = budget.headroom()
    leaked = (LIMITS.mem_max - headroom.mem_free) + (LIMITS.disk_max - headroom.disk_free)
    if budget.reservations():
        tally.violation(f"{len(budget.reservations())} reservations left at the end")
    over = budget.overcommit()
    if over is not None and (over.vcpus_reserved, over.disk_bw_reserved, over.net_bw_reserved) != (
        0,
        0,
        0,
    ):
        tally.violation(f"β_max sums left at the end: {over}")
    return {
        "ops": tally.ops,
        "violations": len(tally.violations),
        "leaked_bytes": leaked,
        "seconds": round(seconds, 2),
        "ops_per_s": round(tally.ops / seconds),
        "workers": workers,
        "yield_every": yield_every,
        "seed": seed,
        "counts": dict(sorted(tally.counts.items())),
        "first_violations": tally.violations[:10],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=1_000_000, help="worker and loop operations")
    parser.add_argument("--workers", type=int, default=4, help="worker threads")
    parser.add_argument("--yield-every", type=int, default=3, help="yield on every Nth read")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="40,000 operations (CI)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)
    ops = 40_000 if args.quick else args.ops
    result = stress(ops, workers=args.workers, yield_every=args.yield_every, seed=args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['ops']:,} operations in {result['seconds']} s "
            f"({result['ops_per_s']:,}/s): {result['violations']} violations, "
            f"{result['leaked_bytes']} bytes leaked"
        )
        for key, value in result["counts"].items():
            print(f"  {key:<28} {value:>9,}")
        for text in result["first_violations"]:
            print(f"  VIOLATION {text}")
    return 1 if result["violations"] or result["leaked_bytes"] else 0


if __name__ == "__main__":
    sys.exit(main())
