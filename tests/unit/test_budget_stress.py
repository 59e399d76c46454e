"""The threaded stress of ``benchmarks/budget_stress.py``, bounded to seconds for CI.

The same harness the benchmark runs for a million operations: worker threads, a reaper, an
auditor and an event loop racing one budget on a clock that yields at reads.  It must find
nothing wrong with the budget — and must find something wrong with a budget that breaks its
promises, or it would prove nothing.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from berth.node.budget import NodeBudget
from berth.ownership import Lease
from tests.helpers import load_benchmark


def _harness() -> ModuleType:
    return load_benchmark("budget_stress")


stress_harness = _harness()


def test_the_budget_survives_threads_an_event_loop_and_yielding_clock_reads() -> None:
    result = stress_harness.stress(20_000, workers=3, seed=1)
    assert result["violations"] == 0, result["first_violations"]
    assert result["leaked_bytes"] == 0
    assert result["ops"] >= 20_000
    counts = result["counts"]
    for outcome in (
        "admitted",
        "leased",
        "bound",
        "renewed",
        "released",
        "owner_died",
        "expired",
        "async_held",
    ):
        assert counts.get(outcome, 0) > 0, f"the stress never saw {outcome}: {counts}"


class ReapsBoundLeases(NodeBudget):
    """A broken budget: its reaper ends every lease past a deadline it read *before* the
    lease was bound — the interleaving the old ``Lease.expire_if_due`` allowed, made certain."""

    def reap(self) -> int:
        ended = 0
        for reservation in self.reservations():
            lease = reservation.owner
            if isinstance(lease, Lease) and lease.bound_to is not None:
                lease.end()
                ended += 1
        return ended + super().reap()


class LeakyRelease(NodeBudget):
    """A broken budget: releasing a leased reservation leaves its lease alive."""

    def release(self, reservation_id: str) -> bool:
        with self._lock:
            self._leases.pop(reservation_id, None)  # forgotten: the release cannot end it
        return super().release(reservation_id)


@pytest.mark.parametrize(
    ("broken", "symptom"),
    [
        (ReapsBoundLeases, "vanished while its owner lives"),
        (LeakyRelease, "but its lease lives on"),
    ],
)
def test_the_stress_notices_a_broken_budget(broken: type[NodeBudget], symptom: str) -> None:
    def factory(clock: Any) -> NodeBudget:
        return broken(stress_harness.LIMITS, clock=clock)

    result = stress_harness.stress(8_000, workers=2, seed=2, budget_factory=factory)
    assert result["violations"] > 0
    assert any(symptom in text for text in result["first_violations"]), result
