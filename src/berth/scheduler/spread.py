"""Replica spreading: where a function's replicas are, and which nodes a new one may take.

A request may ask (``Request.spread``, a :class:`~berth.model.Spread`) that the replicas of
its function — every request with the same ``namespace`` and ``name`` — spread out, as
Kubernetes' ``topologySpreadConstraints`` / pod anti-affinity and Nomad's ``spread`` stanza
do.  This module is the rule, in one place, at the two phases of the policy framework: a
hard spread is a :class:`~berth.checks.Filter` (code ``spread``) and a soft one a
:class:`~berth.scheduler.policy.base.Tier` — both a :class:`Judge`, which
:meth:`SpreadRule.stages` places.  A request's :class:`SpreadRules` hand them to the cluster
scheduler's walk pass by pass (:mod:`berth.scheduler.decision`), which applies them to its
ranking, its re-checks and its explanations without knowing that they are a spread.

**The rule.**  ``counts[n]`` is the number of the function's replicas on node ``n``.

* *Per node* (``label=None``): a node violates when it already holds a replica
  (``counts[n] >= 1``) — at most one replica per node.
* *Per label value* (``label="zone"``, ``max_skew = S``): the *domains* are the values of the
  label on the live nodes that run one of the request's platforms (the nodes it could ever
  run on — Kubernetes counts the domains of the nodes its node affinity admits, whatever
  their free capacity; berth's analogue is the platform).  ``c[d]`` is the function's
  replicas on the nodes of domain ``d``, ``least = min c[d]`` over the domains (0 while some
  domain has none).  A node of domain ``d`` violates when ``c[d] + 1 - least > S``: placing
  there would leave its domain more than ``S`` ahead of the least-loaded one.  A node that
  lacks the label belongs to no domain and always violates (Kubernetes does not place on
  such nodes either).  A domain whose nodes are all full still counts: with a hard spread,
  its replicas' siblings wait for it rather than pile up elsewhere (``DoNotSchedule``).
  The placements this admits keep ``max c - min c <= S`` over a fixed set of domains; a
  domain that appears later (a new zone) starts at 0 and is filled first.
* *Hard* (``hard=True``), a filter: a violating node is not eligible — the ranking leaves it
  out, the walk re-checks each node just before asking it (another replica may have landed
  there meanwhile: :meth:`SpreadPass.recheck`), and ``NoCapacity`` names ``spread`` as that
  node's reason.
* *Soft* (``hard=False``), a tier: two tiers — every node that does not violate, in the
  policy's order, then every node that does, in the policy's order — so colocation still
  orders each tier, and a violating node is used only when no other fits
  (``ScheduleAnyway``).

**Where the replicas are: scheduler-side.**  A node's admission cannot know where the other
replicas of a function run — it sees only its own node — so the spread is the scheduler's
rule, decided on what *this scheduler* knows: :class:`Replicas`, the replicas it placed
itself.  A placement counts from the moment its node is asked (so concurrent requests of one
function see each other) until its lease ends: released (``ClusterScheduler.release`` or a
failed bind), its workload ended (``ClusterScheduler.ended``, or the owner object it was
bound to reported its end), its node left the cluster, or
— for a lease never bound — the lease's time to live ran out, as on the node.  Replicas
placed by *other* schedulers are invisible unless fed in (:meth:`Replicas.add`): the NATS
scheduler service feeds every route of the routing registry in
(:class:`~berth.scheduler.nats.RouteReplicas`, keyed by node and reservation like its own
placements, so its own come back as the same entry) and settles a hard per-node spread's
races after the fact; schedulers fed nothing each follow only their own placements, and two
of them can put two replicas of one function on the same node.  A placement without a
reservation (a request with no ``spec``) holds nothing on the node and has no lifetime to
follow, so it is not counted.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass
from types import MappingProxyType

from berth.defaults import LEASE_TTL_S
from berth.model import Spread
from berth.ownership import Clock
from berth.platform import Platform, matches_any
from berth.scheduler.ranking import Stages
from berth.state import NodeState

__all__ = [
    "SPREAD",
    "Function",
    "Judge",
    "LabelIndex",
    "Replicas",
    "SpreadPass",
    "SpreadRule",
    "SpreadRules",
]

SPREAD = "spread"
"""The reason code of a node a hard spread excludes (in ``NoCapacity`` and explanations)."""

Function = tuple[str, str]
"""A function's identity: ``(namespace, name)``; its replicas share it."""


class SpreadRule:
    """One request's spread over one view of the cluster (see the module docstring).

    ``values`` maps each node to its value of the spread's label (nodes without it absent),
    ``domains`` are the values counted (those of nodes running one of the request's
    platforms); both are fixed for the rule's life.  Built once per ranking
    (:meth:`LabelIndex.rule`); :meth:`judge` binds it to
    replica counts (a copy of them for a ranking, the live ones for a walk's re-check).
    """

    def __init__(
        self,
        spread: Spread,
        function: Function,
        values: Mapping[str, str] | None = None,
        domains: frozenset[str] = frozenset(),
    ) -> None:
        self.spread = spread
        self.function = function
        self.values: Mapping[str, str] = _EMPTY_VALUES if values is None else values
        self.domains = domains

    def judge(self, counts: Mapping[str, int]) -> Judge:
        """The rule against ``counts`` (node → this function's replicas there)."""
        return Judge(self, counts)

    def stages(self, counts: Mapping[str, int]) -> Stages:
        """The rule against ``counts`` as the stage it is: a hard spread's filter, a soft
        spread's tier."""
        judge = self.judge(counts)
        return Stages(filters=(judge,)) if self.hard else Stages(tiers=(judge,))

    @property
    def hard(self) -> bool:
        return self.spread.hard

    def describe(self) -> str:
        return str(self.spread)


class Judge:
    """A :class:`SpreadRule` against fixed replica counts: which nodes would violate it.

    A judge is the spread's stage: a :class:`~berth.checks.Filter` named ``spread`` when the
    spread is hard, a :class:`~berth.scheduler.policy.base.Tier` when it is soft (where
    :meth:`SpreadRule.stages` puts it); both judge by :meth:`violation`.
    """

    def __init__(self, rule: SpreadRule, counts: Mapping[str, int]) -> None:
        self.rule = rule
        self.counts = counts
        self.by_domain: Counter[str] = Counter()
        self.least = 0
        if rule.spread.label is not None:
            for node, count in counts.items():
                value = rule.values.get(node)
                if value is not None and value in rule.domains:
                    self.by_domain[value] += count
            self.least = min((self.by_domain[d] for d in rule.domains), default=0)

    @property
    def code(self) -> str:
        """The reason code of a node the hard spread excludes."""
        return SPREAD

    @property
    def described(self) -> str:
        return self.rule.describe()

    def violation(self, node: str) -> str | None:
        """Why placing one more replica on ``node`` breaks the spread; ``None`` if it does not."""
        rule = self.rule
        namespace, name = rule.function
        label = rule.spread.label
        if label is None:
            held = self.counts.get(node, 0)
            if held >= 1:
                return (
                    f"{held} replica{'s' if held != 1 else ''} of {namespace}/{name} already "
                    f"on the node (one per node)"
                )
            return None
        value = rule.values.get(node)
        if value is None:
            return f"the node has no label {label!r} to spread {namespace}/{name} over"
        if value not in rule.domains:  # a node of none of the request's platforms
            return f"{label}={value!r} runs none of the request's platforms"
        here = self.by_domain[value]
        skew = here + 1 - self.least
        if skew > rule.spread.max_skew:
            return (
                f"{label}={value!r} holds {here} replica{'s' if here != 1 else ''} of "
                f"{namespace}/{name}, the least-loaded value {self.least}: one more makes "
                f"a skew of {skew} > max skew {rule.spread.max_skew}"
            )
        return None

    exclusion = violation  # as a hard spread's filter
    demotion = violation  # as a soft spread's tier


@dataclass(eq=False, repr=False)
class SpreadRules:
    """One request's spread as a scheduler's walk applies it, over that scheduler's labels
    and replicas: each pass takes the rule over the labels as they are then."""

    spread: Spread
    function: Function
    platforms: Sequence[Platform]
    labels: InitVar[LabelIndex]
    replicas: InitVar[Replicas]

    def __post_init__(self, labels: LabelIndex, replicas: Replicas) -> None:
        self._labels = labels
        self._replicas = replicas

    def for_pass(self) -> SpreadPass:
        """The rule of a pass starting now."""
        return SpreadPass(
            self._labels.rule(self.spread, self.function, self.platforms), self._replicas
        )


class SpreadPass:
    """The rule of one pass, judged on the scheduler's replicas: a copy of their counts for
    a ranking and an explanation (:meth:`stages`: the ranking is a value, whatever is placed
    after it is made), the live counts for the walk's re-check of a node just before it is
    asked (:meth:`recheck`)."""

    def __init__(self, rule: SpreadRule, replicas: Replicas) -> None:
        self.rule = rule
        self._replicas = replicas

    def stages(self) -> Stages:
        """The spread's filter or tier against the replica counts now."""
        return self.rule.stages(self._replicas.where(self.rule.function))

    def recheck(self, node: str) -> str | None:
        """Why a hard spread now excludes ``node`` — another replica of the function may have
        landed there since the ranking was made; ``None`` if it does not (or is soft)."""
        if not self.rule.hard:
            return None
        return self.rule.judge(self._replicas.counts(self.rule.function)).violation(node)


class LabelIndex:
    """Every live node's platform and labels, kept as its snapshots arrive, so that a label
    spread reads a label's values without a pass over every node per request.

    Labels change rarely (a node joins, leaves or is relabelled) and placements never change
    them, so each label's values are frozen into an immutable copy on first use after a
    change and shared by every rule until the next one (rules are values: a later change
    never reaches one already made).
    """

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[Platform, dict[str, str]]] = {}
        self._frozen: dict[str, tuple[Mapping[str, str], Mapping[str, frozenset[Platform]]]] = {}
        self._domains: dict[tuple[str, tuple[Platform, ...]], frozenset[str]] = {}

    def update(self, state: NodeState) -> None:
        """Take ``state``'s platform and labels as its node's (a no-op if unchanged)."""
        known = self._nodes.get(state.node)
        if known is not None and known[0] == state.platform and known[1] == state.labels:
            return
        self._nodes[state.node] = (state.platform, dict(state.labels))
        self._changed()

    def remove(self, node: str) -> None:
        """Forget a node that left."""
        if self._nodes.pop(node, None) is not None:
            self._changed()

    def _changed(self) -> None:
        if self._frozen or self._domains:
            self._frozen.clear()
            self._domains.clear()

    def _label(self, label: str) -> tuple[Mapping[str, str], Mapping[str, frozenset[Platform]]]:
        frozen = self._frozen.get(label)
        if frozen is None:
            values: dict[str, str] = {}
            offered: dict[str, set[Platform]] = {}
            for node, (platform, labels) in self._nodes.items():
                value = labels.get(label)
                if value is not None:
                    values[node] = value
                    offered.setdefault(value, set()).add(platform)
            frozen = (
                MappingProxyType(values),
                MappingProxyType(
                    {value: frozenset(platforms) for value, platforms in offered.items()}
                ),
            )
            self._frozen[label] = frozen
        return frozen

    def rule(
        self, spread: Spread, function: Function, platforms: Sequence[Platform] = ()
    ) -> SpreadRule:
        """The rule of ``spread`` for a request of ``function`` on ``platforms``."""
        label = spread.label
        if label is None:
            return SpreadRule(spread, function)
        values, offered = self._label(label)
        key = (label, tuple(platforms))
        domains = self._domains.get(key)
        if domains is None:
            domains = self._domains[key] = frozenset(
                value
                for value, on in offered.items()
                if any(matches_any(platform, platforms) for platform in on)
            )
        return SpreadRule(spread, function, values, domains)


@dataclass
class _Entry:
    function: Function
    expires_at: float | None  # None once bound: the lease lives as long as its workload


class Replicas:
    """The replicas of each function this scheduler knows of, per node (module docstring).

    A placement is *held* while its node is asked, *confirmed* with its reservation id (an
    unbound lease, dropped after ``lease_ttl_s`` unless :meth:`bound`), and gone when
    :meth:`ended` or its node is dropped.  Not thread-safe: a scheduler calls it from its own
    event loop.
    """

    def __init__(self, lease_ttl_s: float = LEASE_TTL_S, *, clock: Clock = time.monotonic) -> None:
        self.lease_ttl_s = float(lease_ttl_s)
        self._clock = clock
        self._counts: dict[Function, Counter[str]] = {}
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._holds: dict[int, tuple[Function, str]] = {}
        self._tokens = itertools.count(1)
        self._deadlines: deque[tuple[float, str, str]] = deque()

    # -- reading -----------------------------------------------------------------------------
    def counts(self, function: Function) -> Mapping[str, int]:
        """Node → replicas of ``function`` (live: copy it to keep it)."""
        self.expire()
        return self._counts.get(function, _EMPTY)

    def where(self, function: Function) -> dict[str, int]:
        """A copy of :meth:`counts`."""
        return dict(self.counts(function))

    def __len__(self) -> int:
        """Replicas known: confirmed placements plus those being confirmed."""
        return len(self._entries) + len(self._holds)

    # -- a placement's life ------------------------------------------------------------------
    def hold(self, function: Function, node: str) -> int:
        """Count one replica of ``function`` on ``node`` while the node is asked; a token."""
        token = next(self._tokens)
        self._holds[token] = (function, node)
        self._bump(function, node, 1)
        return token

    def drop(self, token: int) -> None:
        """The node refused (or the placement holds nothing): forget the hold."""
        held = self._holds.pop(token, None)
        if held is not None:
            self._bump(*held, -1)

    def confirm(self, token: int, reservation_id: str) -> None:
        """The node admitted under ``reservation_id``: the hold becomes an unbound lease."""
        held = self._holds.pop(token, None)
        if held is None:
            return
        function, node = held
        self._bump(function, node, -1)
        self.add(function, node, reservation_id, bound=False)

    def add(self, function: Function, node: str, reservation_id: str, *, bound: bool) -> None:
        """Record a replica under its reservation (idempotent; also for replicas learned
        elsewhere, such as the routing registry)."""
        key = (node, reservation_id)
        entry = self._entries.get(key)
        if entry is not None:
            if bound:
                entry.expires_at = None
            return
        expires_at = None if bound else self._clock() + self.lease_ttl_s
        self._entries[key] = _Entry(function, expires_at)
        self._bump(function, node, 1)
        if expires_at is not None:
            self._deadlines.append((expires_at, node, reservation_id))

    def bound(self, node: str, reservation_id: str) -> bool:
        """The lease was bound to its workload: the replica lives until :meth:`ended`."""
        entry = self._entries.get((node, reservation_id))
        if entry is None:
            return False
        entry.expires_at = None
        return True

    def ended(self, node: str, reservation_id: str) -> bool:
        """The replica's reservation was released or its workload ended; True if known."""
        entry = self._entries.pop((node, reservation_id), None)
        if entry is None:
            return False
        self._bump(entry.function, node, -1)
        return True

    def drop_node(self, node: str) -> None:
        """Forget every replica on a node that left the cluster."""
        for key in [key for key in self._entries if key[0] == node]:
            self.ended(*key)

    def expire(self) -> None:
        """Drop unbound leases past their time to live (the node has freed them too)."""
        deadlines = self._deadlines
        if not deadlines:
            return
        now = self._clock()
        while deadlines and deadlines[0][0] <= now:
            _, node, reservation_id = deadlines.popleft()
            entry = self._entries.get((node, reservation_id))
            if entry is not None and entry.expires_at is not None and entry.expires_at <= now:
                self.ended(node, reservation_id)

    def _bump(self, function: Function, node: str, delta: int) -> None:
        counts = self._counts.setdefault(function, Counter())
        counts[node] += delta
        if counts[node] <= 0:
            del counts[node]
            if not counts:
                del self._counts[function]


_EMPTY: Mapping[str, int] = MappingProxyType({})
_EMPTY_VALUES: Mapping[str, str] = MappingProxyType({})
