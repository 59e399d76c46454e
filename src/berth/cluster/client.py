"""The node client port: how a scheduler reaches a node's authoritative admission.

A scheduler that has ranked the candidates confirms on the chosen node.  Over a network it
cannot hand the node a live owner object, so confirmation is two steps: ``admit`` reserves
under a *lease* that expires unless it is ``bind``-ed to the workload (or ``release``-d) in
time; an unbound lease simply runs out and frees what it held.  ``try_run`` and ``stop`` (the
node agent's part) extend this port when agents exist.  Messages are plain serialisable data
(a ``Spec``, ids, reason codes), so a network driver can carry them unchanged.

:class:`LocalNodes` is the in-process driver: node name → that node's ``NodeBudget``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol

from berth.errors import Unavailable
from berth.model import Spec
from berth.node.budget import Lease, NodeBudget, Owner, Refused

__all__ = ["LocalNodes", "NodeClient"]


class NodeClient(Protocol):
    """Admission on a named node."""

    async def admit(self, node: str, spec: Spec, *, lease_ttl_s: float) -> str:
        """Reserve ``spec`` on ``node`` under a lease; the reservation id.

        Raises ``Refused`` (with the node's reason code) or ``Unavailable``.
        """
        ...

    async def bind(self, node: str, reservation_id: str, owner: Owner) -> None:
        """Tie the reservation's lease to ``owner``: it is released when ``owner`` ends."""
        ...

    async def release(self, node: str, reservation_id: str) -> bool:
        """Release a reservation; idempotent."""
        ...


class LocalNodes:
    """``NodeClient`` over budgets in this process."""

    def __init__(self, budgets: Mapping[str, NodeBudget] | None = None) -> None:
        self._budgets: dict[str, NodeBudget] = dict(budgets or {})
        self._leases: dict[tuple[str, str], Lease] = {}
        self._lock = threading.Lock()

    def add(self, node: str, budget: NodeBudget) -> None:
        self._budgets[node] = budget

    def discard(self, node: str) -> None:
        self._budgets.pop(node, None)

    def budget(self, node: str) -> NodeBudget:
        try:
            return self._budgets[node]
        except KeyError:
            raise Unavailable(f"node {node!r} is not reachable") from None

    async def admit(self, node: str, spec: Spec, *, lease_ttl_s: float) -> str:
        return self.admit_now(node, spec, lease_ttl_s=lease_ttl_s)

    def admit_now(self, node: str, spec: Spec, *, lease_ttl_s: float) -> str:
        """Synchronous ``admit`` for in-process callers (the simulator)."""
        budget = self.budget(node)
        lease = budget.lease(lease_ttl_s)
        try:
            reservation = budget.admit(spec, lease)
        except Refused as refused:
            lease.end()
            raise Refused(refused.reason, refused.detail, node=node) from None
        key = (node, reservation.id)
        with self._lock:
            self._leases[key] = lease
        lease.add_done_callback(lambda _: self._forget(key))
        return reservation.id

    async def bind(self, node: str, reservation_id: str, owner: Owner) -> None:
        with self._lock:
            lease = self._leases.get((node, reservation_id))
        if lease is None:
            raise Refused("lease_expired", f"reservation {reservation_id} is gone", node=node)
        lease.bind(owner)

    async def release(self, node: str, reservation_id: str) -> bool:
        return self.budget(node).release(reservation_id)

    def _forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._leases.pop(key, None)
