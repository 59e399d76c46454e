"""Reservation ids name the budget's incarnation: a node that restarts counts from r1 again,
and a stale release or bind of the old ``r1`` must not reach the new incarnation's ``r1``."""

from __future__ import annotations

import pytest

from berth import Invalid, Spec
from berth.node.budget import BudgetLimits, NodeBudget
from berth.ownership import Refused
from berth.testing.clock import FakeClock
from berth.units import GiB

LIMITS = BudgetLimits(mem_max=GiB, disk_max=GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB)
SPEC = Spec(vcpus=0.25, mem=2**20, disk=2**20)


def test_a_restarted_node_does_not_answer_for_its_old_reservations() -> None:
    before = NodeBudget(LIMITS)
    old = before.admit_leased(SPEC, 30.0)
    after = NodeBudget(LIMITS)  # the node restarted: a new budget, counting from 1 again
    new = after.admit_leased(SPEC, 30.0)
    assert (old.seq, new.seq) == (1, 1)
    assert old.id != new.id and before.incarnation != after.incarnation
    assert after.release(old.id) is False  # the stale release frees nothing
    with pytest.raises(Refused) as refused:
        after.bind(old.id, before.lease(30.0))
    assert refused.value.reason == "lease_expired"
    assert after.get(new.id) is not None  # the new reservation is untouched


def test_ids_are_sequence_dot_incarnation() -> None:
    budget = NodeBudget(LIMITS, incarnation="node7")
    assert budget.admit_leased(SPEC, 30.0).id == "r1.node7"
    assert budget.admit_leased(SPEC, 30.0).id == "r2.node7"


@pytest.mark.parametrize("bad", ["", "a b", "x" * 33])
def test_the_incarnation_is_a_short_name(bad: str) -> None:
    with pytest.raises(Invalid) as invalid:
        NodeBudget(LIMITS, incarnation=bad)
    assert invalid.value.field == "incarnation"


def test_a_generated_incarnation_is_eight_hex_digits() -> None:
    incarnation = NodeBudget(LIMITS).incarnation
    assert len(incarnation) == 8 and int(incarnation, 16) >= 0


def test_a_lease_past_its_deadline_is_gone_for_release_and_holds_without_a_reap() -> None:
    # Reaping is lazy; a call about one reservation ends its lease if the deadline has come.
    clock = FakeClock(0.0)
    budget = NodeBudget(LIMITS, clock=clock)
    first, second = budget.admit_leased(SPEC, 5.0), budget.admit_leased(SPEC, 5.0)
    assert budget.holds(first.id) and budget.holds(second.id)
    clock.now = 5.0  # exactly at the deadline; nothing has reaped
    assert budget.release(first.id) is False  # expiry ended it, not this call
    assert budget.holds(second.id) is False
    assert budget.get(first.id) is None and budget.get(second.id) is None
    assert budget.headroom().mem_free == GiB
