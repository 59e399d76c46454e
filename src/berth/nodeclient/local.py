"""The in-process node-client driver over bare budgets: node name → that node's ``NodeBudget``.

For tests, benchmarks and the simulator, where nodes are budgets and nothing boots.  A
budget-only node runs no workloads, so ``bind`` takes owner objects only; a workload id is
refused as ``unknown_workload`` (after the likelier ``lease_expired``, as an agent would).
``cordon``/``uncordon`` set the budget's cordon, which its admission judges.
"""

from __future__ import annotations

from collections.abc import Mapping

from berth.boot import AdmitOrder
from berth.errors import Unavailable
from berth.node.budget import NodeBudget
from berth.ownership import Admission, Owner, Refused, refused_by

__all__ = ["LocalNodes"]


class LocalNodes:
    """``NodeClient`` over budgets in this process."""

    def __init__(self, budgets: Mapping[str, NodeBudget] | None = None) -> None:
        self._budgets: dict[str, NodeBudget] = dict(budgets or {})

    def add(self, node: str, budget: NodeBudget) -> None:
        self._budgets[node] = budget

    def discard(self, node: str) -> None:
        self._budgets.pop(node, None)

    def budget(self, node: str) -> NodeBudget:
        try:
            return self._budgets[node]
        except KeyError:
            raise Unavailable(f"node {node!r} is not reachable") from None

    async def admit(self, node: str, order: AdmitOrder) -> Admission:
        return self.admit_now(node, order)

    def admit_now(self, node: str, order: AdmitOrder) -> Admission:
        """Synchronous ``admit`` for in-process callers (the simulator)."""
        budget = self.budget(node)
        with refused_by(node):
            # the order was checked when it was made: the budget's typed entry checks nothing again
            return budget._admit_leased(order.spec, order.lease_ttl_s, order.platforms).admission

    async def bind(self, node: str, reservation_id: str, owner: Owner | str) -> None:
        budget = self.budget(node)
        with refused_by(node):
            if isinstance(owner, str):
                if not budget.holds(reservation_id):
                    raise Refused.lease_expired(reservation_id)
                raise Refused("unknown_workload", "budget-only nodes run no workloads")
            budget.bind(reservation_id, owner)

    async def release(self, node: str, reservation_id: str) -> bool:
        return self.budget(node).release(reservation_id)

    async def cordon(self, node: str) -> bool:
        return self.budget(node).set_cordoned(True)

    async def uncordon(self, node: str) -> bool:
        return self.budget(node).set_cordoned(False)
