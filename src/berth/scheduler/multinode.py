"""The multi-node driver: rank nodes by layer colocation, confirm through the node's admission.

This is the seed's ``Hyper.Cluster.Scheduler`` behind berth's placement port:

* ``candidates(spec, layers)`` — from this scheduler's view of the node snapshots (fed by
  the state store), the nodes that fit, most colocated bytes first (ties by node name);
* ``place(spec, layers, attempt)`` — walk the candidates in rank order calling
  ``attempt(node)`` — the authoritative confirmation — until one succeeds.  A node's
  ``Refused`` or ``Unavailable`` moves the walk on, logged with its node and *real* reason
  (a boot failure on the only candidate is not reported as lack of capacity) and kept in the
  ``NoCapacity`` raised when all say no; anything else (an ``Invalid`` call) propagates;
* ``run(spec, layers, start, stop)`` — place and boot: on each candidate ``start`` the
  workload, admit with the started workload as owner, and ``stop`` it if admission loses a
  race (the node filled up since its snapshot);
* ``schedule(request)`` — the port: confirm by admitting under a lease that the caller later
  binds to the workload (:meth:`ClusterScheduler.bind`) or releases
  (:meth:`ClusterScheduler.release`); an unbound lease expires on the node.

**A ranking is a value.**  The walk awaits each node's answer; meanwhile nodes may leave,
join, or the engine may renumber its slots.  The ranking the walk follows was fixed when it
was made (names and colocated bytes), so the walk visits exactly the nodes it was given; a
node that left answers ``Unavailable``.  Admission re-checks everything the ranking assumed —
capacity *and* platform (``platform_mismatch``) — so a stale ranking costs a retry, never a
wrong placement.

**Assume.**  After a node admits, the scheduler applies the reservation to its own view of
that node at once (:mod:`berth.scheduler.assume`): free memory and disk down, the request's
layers counted as arriving, until a snapshot from the node covers it (``admitted >= seq``),
a release or failed bind undoes it, or it expires.  A scheduler thus never collides with its
own recent placements, however stale its snapshots (``assume=False`` turns this off, for
comparison).

**Arguments are validated at the door.**  The constructor and every public method check their
arguments before doing anything — ``ranker`` is ``"engine"``, ``"reference"`` or a ranker,
``spec`` a ``Spec``, an instance-type name or ``None``, ``layers`` and ``platforms`` lists
(never a bare string), callbacks callable — and raise ``Invalid`` naming the parameter.

**One decision, one walk.**  Each placement is a :class:`~berth.scheduler.decision.Decision`
(request, confirmation, refusals so far, the request's rules beyond the table of checks)
that walks itself (:meth:`~berth.scheduler.decision.Decision.walk`): rank, apply the pass's
stages, ask the nodes in the decision's order, rank again, and tell its probe each stage.
The scheduler gives it only its ranking of the view and its account of why nothing fits.

**Spread.**  A request with a ``spread`` (:mod:`berth.scheduler.spread`, the rule) brings
such rules (:class:`~berth.scheduler.spread.SpreadRules`): a filter (hard) or a tier (soft)
judged on the replicas of its function this scheduler knows of
(:attr:`ClusterScheduler.replicas`: its own placements, counted from the moment a node is
asked until the lease is released, its workload :meth:`ended`, its node leaves, or an unbound
lease runs out).  A hard spread is re-checked on each node just before it is asked, so
concurrent requests of one function cannot both take the same slot.

**Measured.**  Each decision reports to a probe (:mod:`berth.observability.probe`): with
``metrics`` it is counted by outcome and timed, its rankings, attempts and refusals too; with
tracing on it is a ``berth.scheduler.place`` span.  Without either the probe is a shared no-op.

Snapshots are approximate; the only authority is the node, which refuses what no longer fits.
A ``preferred_node`` in the request is a soft hint: if that node fits it is tried first
(unless a soft spread moved it to the second tier: then it keeps its place there); nodes in
its ``avoid_nodes`` are asked only after every other candidate of a pass, in ranked order.
``NoMatchingPlatform`` when no live node runs any requested platform; ``NoCapacity`` (with
every node's reason) when some does but none fits or all refuse, or the cluster is empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Literal, TypeVar

from berth.boot import AdmitOrder, BootFailed
from berth.defaults import LEASE_TTL_S
from berth.errors import Invalid, NoCapacity, NoMatchingPlatform, Unavailable
from berth.loops import call_on
from berth.model import (
    INTERVAL_RULE,
    MAX_BYTES,
    MAX_LAYERS,
    NAME_RULE,
    Layer,
    Placement,
    Request,
    Spec,
    checked_layers,
    checked_platforms,
    checked_spec,
    required_spec,
)
from berth.nodeclient.port import NodeClient
from berth.observability.probe import placement_probe
from berth.ownership import Admission, Clock, Owner, Refused
from berth.platform import Platform
from berth.scheduler.assume import AssumeCache, apply
from berth.scheduler.decision import NO_RULES, Confirmed, Decision, RequestRules
from berth.scheduler.engine import Engine
from berth.scheduler.explain import Explanation, verdicts
from berth.scheduler.policy import Policy
from berth.scheduler.ranking import Ranker, Ranking
from berth.scheduler.reference import ReferenceRanker
from berth.scheduler.spread import LabelIndex, Replicas, SpreadRules
from berth.state import NodeState, colocation_score
from berth.store.port import StateEvent, StateStore
from berth.validation import shown

if TYPE_CHECKING:  # prometheus-client loads only where metrics are made
    from berth.observability.metrics import Metrics

__all__ = ["ClusterScheduler"]

log = logging.getLogger("berth.scheduler")

T = TypeVar("T")
W = TypeVar("W", bound=Owner)


class ClusterScheduler:
    """The multi-node driver of the placement port (see the module docstring)."""

    def __init__(
        self,
        store: StateStore,
        nodes: NodeClient,
        *,
        ranker: Literal["engine", "reference"] | Ranker = "engine",
        policy: Policy | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
        assume: bool = True,
        assume_ttl_s: float | None = None,
        clock: Clock = time.monotonic,
        metrics: Metrics | None = None,
    ) -> None:
        _needs(store, "store", "subscribe")
        _needs(nodes, "nodes", "admit", "bind", "release")
        if policy is not None:
            _needs(policy, "policy", "order")
        lease_ttl_s = INTERVAL_RULE(lease_ttl_s, "lease_ttl_s")
        if assume_ttl_s is not None:
            assume_ttl_s = INTERVAL_RULE(assume_ttl_s, "assume_ttl_s")
        if not isinstance(assume, bool):
            raise Invalid(f"expected true or false, got {shown(assume)}", field="assume")
        if not callable(clock):
            raise Invalid(
                f"expected a function returning seconds, got {shown(clock)}", field="clock"
            )
        if metrics is not None:
            from berth.observability.metrics import Metrics

            if not isinstance(metrics, Metrics):
                raise Invalid(f"expected berth Metrics, got {shown(metrics)}", field="metrics")
        self.nodes = nodes
        self.policy = policy
        self.metrics = metrics
        """Where placement decisions are counted and timed (``None``: not measured)."""
        self.lease_ttl_s = float(lease_ttl_s)
        self.ranker = _ranker(ranker)
        self.assumed: AssumeCache | None = (
            AssumeCache(assume_ttl_s or self.lease_ttl_s, clock=clock) if assume else None
        )
        self.replicas = Replicas(self.lease_ttl_s, clock=clock)
        self._labels = LabelIndex()  # the nodes' labels, for label spreads
        self._base: dict[str, NodeState] = {}  # the nodes' own latest snapshots
        self._states: dict[str, NodeState] = {}  # the view ranked: snapshots + assumptions
        self._unsubscribe = store.subscribe(self._on_event)

    def close(self) -> None:
        """Stop following the state store."""
        self._unsubscribe()

    def _on_event(self, event: StateEvent) -> None:
        if event.kind == "put" and event.state is not None:
            current = self._base.get(event.node)
            if current is not None and current.generation > event.state.generation:
                return
            self._base[event.node] = event.state
            self._labels.update(event.state)
            if self.assumed is not None:
                self.assumed.covered(event.state)
            self._refresh(event.node)
        elif event.kind == "delete":
            self._base.pop(event.node, None)
            self._states.pop(event.node, None)
            if self.assumed is not None:
                self.assumed.drop_node(event.node)
            self.replicas.drop_node(event.node)
            self._labels.remove(event.node)
            self.ranker.remove(event.node)

    def _refresh(self, node: str) -> None:
        """Feed the ranker the node's snapshot with its pending assumptions applied."""
        base = self._base.get(node)
        if base is None:
            return
        view = base if self.assumed is None else apply(base, self.assumed.pending(node))
        self._states[node] = view
        self.ranker.upsert(view)

    def _expire(self) -> None:
        """Drop assumptions and unbound replica leases past their time (O(1) unless something
        is due) — on every ranking, so neither grows in a scheduler that no spread reads."""
        if self.assumed is not None:
            for node in self.assumed.expire():
                self._refresh(node)
        self.replicas.expire()

    # -- the assume cache --------------------------------------------------------------------
    def assume(self, node: str, admission: Admission, spec: Spec, layers: Sequence[Layer]) -> None:
        """Count a reservation ``node`` confirmed in this scheduler's view until the node's
        own snapshot does (see :mod:`berth.scheduler.assume`); a no-op with ``assume=False``."""
        base = self._base.get(node)
        if self.assumed is None or base is None:
            return
        if base.admitted >= admission.seq:
            # The node's snapshot already counts it: over a network the snapshot can arrive
            # before the reply to the admission it reflects.  Assuming it again would count
            # the reservation twice until the next snapshot.
            return
        self.assumed.assume(node, admission, spec, _checked_layers(layers))
        self._refresh(node)

    def forget(self, node: str, reservation_id: str) -> None:
        """Undo an assumption: the reservation was released or its bind failed."""
        if self.assumed is not None and self.assumed.forget(node, reservation_id):
            self._refresh(node)

    async def bind(self, placement: Placement, owner: Owner | str) -> None:
        """Bind ``placement``'s lease to the workload (``NodeClient.bind``); the replica
        then counts (for spreading) until released, or until an owner object ends.

        A bind that fails leaves nothing behind: the reservation is released on the node
        (best effort — it would expire anyway) and the assumption undone, so node and view
        agree; then the error propagates.
        """
        placement = _placement(placement)
        if not isinstance(owner, str):
            _needs(owner, "owner", "add_done_callback")
        if placement.reservation_id is None:
            return
        node, reservation_id = placement.worker_node, placement.reservation_id
        # Counted as bound from now: the lease must not run out of this view while the node
        # is asked (its answer may come after the deadline); a failed bind ends it below.
        counted = self.replicas.bound(node, reservation_id)
        try:
            await self.nodes.bind(node, reservation_id, owner)
        except BaseException:
            self.forget(node, reservation_id)
            self.replicas.ended(node, reservation_id)
            with contextlib.suppress(Refused, Unavailable):
                await self.nodes.release(node, reservation_id)
            raise
        if counted and not isinstance(owner, str):
            # The node releases the reservation when its owner ends; so does this view.  The
            # callback may come from another thread (a process watcher): hop to this loop.
            loop = asyncio.get_running_loop()

            def owner_ended(_: object) -> None:
                call_on(loop, self.replicas.ended, node, reservation_id)

            owner.add_done_callback(owner_ended)

    async def release(self, placement: Placement, *, workload: str | None = None) -> bool:
        """Release ``placement``'s reservation on its node and undo the assumption
        (:class:`~berth.scheduler.port.ReleasingScheduler`; no route is kept in process, so
        ``workload`` changes nothing)."""
        placement = _placement(placement)
        if placement.reservation_id is None:
            return False
        self.forget(placement.worker_node, placement.reservation_id)
        self.replicas.ended(placement.worker_node, placement.reservation_id)
        return await self.nodes.release(placement.worker_node, placement.reservation_id)

    def ended(self, placement: Placement) -> bool:
        """The workload behind ``placement`` ended and its node released the reservation
        (a lease bound on the node itself): stop counting it as a replica, without calling
        the node.  True if this scheduler was counting it."""
        placement = _placement(placement)
        if placement.reservation_id is None:
            return False
        self.forget(placement.worker_node, placement.reservation_id)
        return self.replicas.ended(placement.worker_node, placement.reservation_id)

    # -- the seed's API ----------------------------------------------------------------------
    def snapshots(self) -> dict[str, NodeState]:
        """The nodes' own latest snapshots, without this scheduler's assumptions."""
        return dict(self._base)

    def states(self) -> dict[str, NodeState]:
        """This scheduler's view: the latest snapshot per live node, with its own confirmed
        reservations applied until a snapshot covers them."""
        return dict(self._states)

    @staticmethod
    def colocation_score(state: NodeState, layers: Sequence[Layer]) -> int:
        """Bytes of ``layers`` already mounted on ``state``'s node."""
        return colocation_score(state, layers)

    def candidates(
        self, spec: Spec | str | None, layers: Sequence[Layer], platforms: Sequence[Platform] = ()
    ) -> list[str]:
        """Fitting nodes, most colocated bytes first (ties by node name).

        ``spec`` may be an instance-type name (``"micro"``), as in a ``Request``."""
        return list(self.rank(spec, layers, platforms))

    def rank(
        self, spec: Spec | str | None, layers: Sequence[Layer], platforms: Sequence[Platform] = ()
    ) -> Ranking:
        """The candidate ranking with colocated bytes; ``NoMatchingPlatform`` first.

        ``layers`` may be ``Layer``s or ``(id, size)`` pairs and ``platforms`` strings; a
        duplicate layer id, a negative size or a malformed platform raises ``Invalid``.
        The ranking is an immutable value: node names and colocated bytes are those of the
        moment it was made, whatever joins, leaves or compacts afterwards.
        """
        return self._rank(checked_spec(spec), *_checked(layers, platforms))

    def _rank(
        self, spec: Spec | None, layers: Sequence[Layer], platforms: Sequence[Platform]
    ) -> Ranking:
        self._expire()
        self._check_platforms(platforms)
        return self.ranker.rank(spec, layers, platforms, self.policy)

    def _rules(self, request: Request) -> RequestRules:
        """The request's rules beyond the table of checks: its spread, if it has one."""
        if request.spread is None:
            return NO_RULES
        function = (request.namespace, request.name)
        return SpreadRules(request.spread, function, request.platforms, self._labels, self.replicas)

    async def place(
        self,
        spec: Spec | str | None,
        layers: Sequence[Layer],
        attempt: Callable[[str], Awaitable[T]],
        platforms: Sequence[Platform] = (),
        preferred_node: str | None = None,
        avoid_nodes: Sequence[str] = (),
    ) -> Confirmed[T]:
        """Walk the candidates calling ``attempt(node)`` until one confirms.

        A node's ``Refused`` or ``Unavailable`` moves the walk on (and is reported in
        ``NoCapacity`` if every node says no); any other error — an ``Invalid`` call, a bug —
        propagates at once.  Each pass follows a ranking made before its first ``await``:
        nodes that leave meanwhile answer ``Unavailable``.  When a pass is exhausted, the view
        is ranked again; nodes that fit now and were not yet tried (they joined, or their
        snapshot changed, during the walk) get a further pass, up to ``MAX_PASSES`` in all.
        """
        spec = checked_spec(spec)
        layers, platforms = _checked(layers, platforms)
        _callable(attempt, "attempt")
        if preferred_node is not None:
            preferred_node = NAME_RULE(preferred_node, "preferred_node")
        if isinstance(avoid_nodes, str) or not isinstance(avoid_nodes, Sequence):
            raise Invalid(
                f"expected a list of node names, got {shown(avoid_nodes)}", field="avoid_nodes"
            )
        avoided = frozenset(NAME_RULE(node, "avoid_nodes") for node in avoid_nodes)
        return await self._place(
            Decision(spec, layers, platforms, attempt, preferred_node, avoid_nodes=avoided)
        )

    async def _place(self, decision: Decision[T]) -> Confirmed[T]:
        """Walk ``decision`` over this scheduler's view, measured (metrics, spans) by its
        probe (:mod:`berth.observability.probe`)."""
        spec, layers, platforms = decision.spec, decision.layers, decision.platforms
        return await decision.walk(
            lambda: self._rank(spec, layers, platforms),
            self._no_capacity,
            placement_probe(self.metrics, spec, layers, platforms),
        )

    async def run(
        self,
        spec: Spec | str,
        layers: Sequence[Layer],
        start: Callable[[str], Awaitable[W]],
        stop: Callable[[W], Awaitable[object]],
        platforms: Sequence[Platform] = (),
    ) -> Confirmed[W]:
        """Place and boot: on each candidate start, admit owned by the workload, else stop.

        A start that fails with ``BootFailed`` or an ``OSError`` is that node's refusal
        (``boot_failed``), so the walk moves on with the real reason logged.
        """
        spec = required_spec(spec, "running a workload")
        layers, platforms = _checked(layers, platforms)
        _callable(start, "start")
        _callable(stop, "stop")

        order = AdmitOrder(spec, self.lease_ttl_s, platforms)

        async def try_run(node: str) -> W:
            try:
                workload = await start(node)
            except (BootFailed, OSError) as error:
                raise Refused("boot_failed", str(error), node=node) from None
            try:
                admission = await self.nodes.admit(node, order)
                await self.nodes.bind(node, admission.reservation_id, workload)
            except BaseException:
                await stop(workload)
                raise
            self.assume(node, admission, spec, layers)
            return workload

        return await self.place(spec, layers, try_run, platforms)

    # -- the port ----------------------------------------------------------------------------
    async def schedule(self, request: Request) -> Placement:
        """Place ``request``; with a spec, the chosen node holds a lease-owned reservation.

        The caller binds the lease to its workload (:meth:`bind`) or releases it
        (:meth:`release`) within ``lease_ttl_s``; an unbound lease expires on the node.
        """
        request = _request(request)
        spec = request.spec
        layers, platforms = request.layers, request.platforms
        function = (request.namespace, request.name)
        order = None if spec is None else AdmitOrder(spec, self.lease_ttl_s, platforms)

        async def confirm(node: str) -> Admission | None:
            if order is None:
                return None
            # Counted from now (before the first await), so a concurrent request of the same
            # function sees this replica while the node is being asked.
            token = self.replicas.hold(function, node)
            try:
                admission = await self.nodes.admit(node, order)
            except BaseException:
                self.replicas.drop(token)
                raise
            self.replicas.confirm(token, admission.reservation_id)
            self.assume(node, admission, order.spec, layers)
            return admission

        placed = await self._place(
            Decision(
                spec,
                layers,
                platforms,
                confirm,
                request.preferred_node,
                self._rules(request),
                avoid_nodes=frozenset(request.avoid_nodes),
            )
        )
        return Placement(
            worker_node=placed.node,
            reservation_id=None if placed.result is None else placed.result.reservation_id,
            colocated_bytes=placed.colocated_bytes,
            rank=placed.rank,
            refusals=placed.refusals,
        )

    def explain(self, request: Request, refusals: dict[str, str] | None = None) -> Explanation:
        """Every node's verdict for ``request``: first failed check or fits, bytes, rank."""
        request = _request(request)
        rules = self._rules(request).for_pass()
        try:
            base = self._rank(request.spec, request.layers, request.platforms)
            ranking = rules.stages().apply(base)
            ranks = {node: index for index, node in enumerate(ranking)}
        except NoMatchingPlatform:
            ranks = {}
        return verdicts(
            self._states.values(),
            request.spec,
            request.layers,
            request.platforms,
            ranks,
            refusals,
            stages=rules.stages(),
        )

    # -- internals ---------------------------------------------------------------------------
    def _check_platforms(self, platforms: Sequence[Platform]) -> None:
        if not platforms:
            return
        offered = self.ranker.platforms()
        if not offered or any(platform in offered for platform in platforms):
            return  # an empty cluster is a capacity problem, not the artifact's
        raise NoMatchingPlatform(
            tuple(str(platform) for platform in platforms),
            ", ".join(
                f"{platform} on {count} node{'s' if count != 1 else ''}"
                for platform, count in sorted(offered.items(), key=lambda item: str(item[0]))
            ),
        )

    def _no_capacity(self, decision: Decision[T]) -> NoCapacity:
        """Every node's reason, judged now by the last pass's rules (and its refusal)."""
        explanation = verdicts(
            self._states.values(),
            decision.spec,
            decision.layers,
            decision.platforms,
            {},
            decision.refusals,
            stages=decision.current.stages(),
        )
        reasons = {v.node: v.refused or v.verdict for v in explanation.verdicts}
        message = f"cannot place {decision.what}: {explanation.summary()}"
        return NoCapacity(message, reasons)


def _ranker(ranker: Literal["engine", "reference"] | Ranker) -> Ranker:
    """The ranker ``ClusterScheduler(ranker=…)`` names or is given."""
    if not isinstance(ranker, str):
        return _needs(ranker, "ranker", "rank", "upsert", "remove", "platforms")
    if ranker == "engine":
        return Engine()
    if ranker == "reference":
        return ReferenceRanker()
    raise Invalid(f"must be 'engine', 'reference' or a Ranker, got {shown(ranker)}", field="ranker")


def _needs(value: T, field: str, *methods: str) -> T:
    """``value`` if it has every one of ``methods``, else ``Invalid`` naming ``field``."""
    missing = [name for name in methods if not callable(getattr(value, name, None))]
    if missing:
        raise Invalid(f"{shown(value)} has no {', '.join(missing)}() method", field=field)
    return value


def _callable(value: object, field: str) -> None:
    if not callable(value):
        raise Invalid(f"expected a function, got {shown(value)}", field=field)


def _request(request: object) -> Request:
    if not isinstance(request, Request):
        raise Invalid(f"expected a Request, got {shown(request)}", field="request")
    return request


def _placement(placement: object) -> Placement:
    if not isinstance(placement, Placement):
        raise Invalid(f"expected a Placement, got {shown(placement)}", field="placement")
    return placement


def _checked(
    layers: Sequence[Layer], platforms: Sequence[Platform]
) -> tuple[Sequence[Layer], tuple[Platform, ...]]:
    """Layers as ``Layer`` (pairs accepted, ids unique, sizes summing to at most 2^63 - 1)
    and platforms parsed; a bare string for either is ``Invalid``, not a list of characters."""
    return _checked_layers(layers), checked_platforms(platforms)


def _checked_layers(layers: Sequence[Layer]) -> Sequence[Layer]:
    # The common case — a request's own tuple of layers — costs one pass and a sum.
    if (
        isinstance(layers, tuple | list)
        and len(layers) <= MAX_LAYERS
        and all(type(layer) is Layer for layer in layers)
        and len({layer.id for layer in layers}) == len(layers)
        and sum(layer.size for layer in layers) <= MAX_BYTES
    ):
        return layers
    return checked_layers(layers)
