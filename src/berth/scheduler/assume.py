"""The assume cache: a scheduler sees its own confirmed placements at once.

A scheduler learns about a node from the node's snapshots, which arrive late (a heartbeat, a
replication delay).  Without help it would keep ranking a node it has just filled as if it
were empty, and a burst of requests would all pile onto it and be refused at confirmation.
kube-scheduler "assumes" a pod on its node before binding for exactly this reason; berth does
the same with a confirmed reservation:

* **assume** — after a node admits, the scheduler applies the reservation to its own replica
  of that node: free memory and disk go down by the spec, its vCPUs and bandwidths are added
  to the β_max reserved sums when the node runs that stage, and the request's layers count as
  mounted, because they are on their way there.  The *load* readings stay as the snapshot
  says: the node's soft checks read live load, which a workload that has just been admitted
  has not raised yet, so adding its declared use would predict refusals the node would not
  make (a 1-vCPU spec on a 2-core node would block the next one for a heartbeat);
* **covered** — every snapshot of the node carries ``admitted``, the number of reservations
  the node had taken when it published; once a snapshot has ``admitted >= seq`` of an
  assumption, the node's own numbers include that reservation (or its end) and the
  assumption is dropped.  Snapshots that are still older get the assumptions re-applied;
* **forget** — a release or a failed bind undoes the assumption at once;
* **expire** — an assumption no snapshot covers within ``ttl_s`` (the node went silent, or
  restarted and counts from zero again) is dropped, so a lost node cannot pin capacity in a
  scheduler's view forever.

The cache holds assumptions only; :class:`~berth.scheduler.multinode.ClusterScheduler` keeps
the latest real snapshot per node and feeds its ranker :func:`apply` of the two.  The node's
admission stays the only authority: an assumption can make a scheduler more cautious for a
few seconds, never over-fill a node.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from berth.defaults import LEASE_TTL_S
from berth.errors import Invalid
from berth.model import Layer, Spec
from berth.ownership import Admission, Clock
from berth.state import NodeState

__all__ = ["AssumeCache", "Assumption", "apply"]


@dataclass(frozen=True)
class Assumption:
    """One confirmed reservation the node's snapshots may not show yet."""

    node: str
    reservation_id: str
    seq: int
    spec: Spec
    layers: frozenset[str]
    expires_at: float


def apply(state: NodeState, assumptions: Iterable[Assumption]) -> NodeState:
    """``state`` with ``assumptions`` applied (see the module docstring); ``state`` if none.

    The result keeps the snapshot's generation, so the node's next snapshot replaces it.
    """
    pending = list(assumptions)
    if not pending:
        return state
    mem = sum(a.spec.mem for a in pending)
    disk = sum(a.spec.disk for a in pending)
    layers = state.layers.union(*(a.layers for a in pending))
    update: dict[str, object] = {
        "mem_free": max(state.mem_free - mem, 0),
        "disk_free": max(state.disk_free - disk, 0),
        "layers": layers,
        "cached_layers": state.cached_layers - layers,
    }
    if state.overcommit is not None:
        vcpus = sum(a.spec.vcpus for a in pending)
        disk_bw = sum(a.spec.disk_bw for a in pending)
        net_bw = sum(a.spec.net_bw for a in pending)
        over = state.overcommit
        update["overcommit"] = over.model_copy(
            update={
                "vcpus_reserved": over.vcpus_reserved + vcpus,
                "disk_bw_reserved": over.disk_bw_reserved + disk_bw,
                "net_bw_reserved": over.net_bw_reserved + net_bw,
            }
        )
    return state.model_copy(update=update)


class AssumeCache:
    """Assumed reservations per node, until covered, forgotten or expired.  Not thread-safe:
    a scheduler calls it from its own event loop."""

    def __init__(self, ttl_s: float = LEASE_TTL_S, *, clock: Clock = time.monotonic) -> None:
        if not ttl_s > 0:
            raise Invalid(f"must be positive, got {ttl_s!r}", field="assume_ttl_s")
        self.ttl_s = float(ttl_s)
        self._clock = clock
        self._by_node: dict[str, dict[str, Assumption]] = {}
        # Expiry order: the ttl is constant, so insertion order is deadline order.  Entries
        # already covered or forgotten are skipped when they reach the front.
        self._deadlines: deque[tuple[float, str, str]] = deque()

    def assume(
        self, node: str, admission: Admission, spec: Spec, layers: Sequence[Layer]
    ) -> Assumption:
        """Record a reservation ``node`` confirmed; it shows in :meth:`pending` from now on."""
        assumption = Assumption(
            node=node,
            reservation_id=admission.reservation_id,
            seq=admission.seq,
            spec=spec,
            layers=frozenset(layer.id for layer in layers),
            expires_at=self._clock() + self.ttl_s,
        )
        self._by_node.setdefault(node, {})[assumption.reservation_id] = assumption
        self._deadlines.append((assumption.expires_at, node, assumption.reservation_id))
        return assumption

    def forget(self, node: str, reservation_id: str) -> bool:
        """Undo an assumption (the reservation was released or never bound)."""
        pending = self._by_node.get(node)
        if pending is None or pending.pop(reservation_id, None) is None:
            return False
        if not pending:
            del self._by_node[node]
        return True

    def covered(self, state: NodeState) -> bool:
        """Drop ``state.node``'s assumptions that ``state`` accounts for; True if any went."""
        pending = self._by_node.get(state.node)
        if pending is None:
            return False
        gone = [rid for rid, a in pending.items() if a.seq <= state.admitted]
        for rid in gone:
            del pending[rid]
        if not pending:
            del self._by_node[state.node]
        return bool(gone)

    def drop_node(self, node: str) -> None:
        """Forget every assumption about a node that left."""
        self._by_node.pop(node, None)

    def expire(self) -> set[str]:
        """Drop assumptions past their deadline; the nodes whose view changed."""
        deadlines = self._deadlines
        if not deadlines:
            return set()
        now = self._clock()
        changed: set[str] = set()
        while deadlines and deadlines[0][0] <= now:
            _, node, rid = deadlines.popleft()
            # The entry may be stale: its assumption covered or forgotten, and the id assumed
            # again since (a restarted node counts r1, r2 … anew) with a later deadline.
            assumption = self._by_node.get(node, {}).get(rid)
            if assumption is not None and assumption.expires_at <= now:
                self.forget(node, rid)
                changed.add(node)
        return changed

    def pending(self, node: str) -> tuple[Assumption, ...]:
        """The node's assumptions not yet covered, oldest first."""
        return tuple(self._by_node.get(node, {}).values())

    def __len__(self) -> int:
        return sum(len(pending) for pending in self._by_node.values())
