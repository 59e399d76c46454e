"""One placement decision and its walk: rank, ask the nodes in order, rank again, explain.

:class:`~berth.scheduler.multinode.ClusterScheduler` places a request by a *walk*: rank the
nodes, ask them in turn (``attempt(node)``, the node's authoritative confirmation) until one
confirms, and rank again when a pass ran out while the view changed.  Everything a walk
needs and learns is one :class:`Decision`: the request (spec, layers, platforms, preferred
node), how a node confirms it, the request's rules beyond the table of checks, and what the
walk found so far — each refused node's reason (the nodes tried, never asked twice) and the
rules of the current pass.  And the walk is the decision's own, start to end
(:meth:`Decision.walk`): the scheduler hands it only how to rank its view now and how to
say why nothing fits (its :class:`~berth.errors.NoCapacity`, every node's verdict), so one
place holds the whole order of a placement — the passes, the asking, the refusals — and its
one observer, the probe (:mod:`berth.observability.probe`: metrics and spans), hears every
stage from there: each ranking, each node asked, each refusal, the node that confirmed, and
the outcome.

**Rules beyond the table.**  The checks (:data:`berth.checks.CHECKS`) judge a node's own
figures; a rule that needs what only the scheduler knows — a spread needs where the
function's other replicas are — is one request's :class:`RequestRules`.  Each pass takes
:meth:`RequestRules.for_pass`, a :class:`PassRules`: its :class:`~berth.scheduler.ranking.Stages`
(filters that leave nodes out, tiers that set nodes back) against
the state at that moment — applied to the ranker's ranking (:meth:`Decision.judged`) and
named in explanations and ``NoCapacity`` — and a live re-check of each node just before it is
asked (:meth:`PassRules.recheck`).  The walk applies them without knowing what they are;
:class:`~berth.scheduler.spread.SpreadRules` is the one berth has.  A request with none has
:data:`NO_RULES`.

**The order.**  :meth:`Decision.order` yields the nodes of a pass's ranking to ask: the
preferred node first — a soft hint, ignored when it does not fit, and when a filter leaves
it out or a tier sets it back (it then keeps its place in the ranking) — then the rest in
rank order, each with its rank; a node already refused is skipped, as is one the re-check
now excludes (logged).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from berth.errors import NoCapacity, Unavailable
from berth.model import Layer, Spec
from berth.observability.probe import SILENT, Probe
from berth.ownership import Refused
from berth.platform import Platform
from berth.scheduler.ranking import NO_STAGES, Ranking, Stages

__all__ = ["MAX_PASSES", "NO_RULES", "Confirmed", "Decision", "PassRules", "RequestRules"]

log = logging.getLogger("berth.scheduler")

T = TypeVar("T")

MAX_PASSES = 3
"""Rankings one walk takes at most: the first, and re-rankings that found untried nodes
after the previous pass was exhausted (the view changed during the walk)."""


@dataclass(frozen=True)
class Confirmed(Generic[T]):
    """A confirmed placement: the node, what ``attempt`` returned, rank and colocated bytes."""

    node: str
    result: T
    rank: int
    colocated_bytes: int
    refusals: tuple[tuple[str, str], ...] = ()


def _reason(error: BaseException) -> str:
    reason = getattr(error, "reason", None)
    if isinstance(reason, str) and reason:
        return reason
    return f"{type(error).__name__.lower()}: {error}"


class PassRules(Protocol):
    """A request's rules beyond the table for one pass of a walk (module docstring)."""

    def stages(self) -> Stages:
        """The filters and tiers against the state now (values: a ranking they make stays
        one, whatever is placed after it is made)."""
        ...

    def recheck(self, node: str) -> str | None:
        """Why ``node`` is left out now, just before it is asked; ``None`` if it is not."""
        ...


class RequestRules(Protocol):
    """A request's rules beyond the table, as one scheduler judges them pass by pass."""

    def for_pass(self) -> PassRules:
        """The rules of a pass starting now."""
        ...


class _NoRules:
    """No rule beyond the table: no stage, no re-check."""

    def for_pass(self) -> _NoRules:
        return self

    def stages(self) -> Stages:
        return NO_STAGES

    def recheck(self, node: str) -> str | None:
        return None


NO_RULES = _NoRules()
"""The rules of a request without any beyond the table (no spread)."""


@dataclass(eq=False)
class Decision(Generic[T]):
    """One placement decision as its walk sees it (see the module docstring).

    ``attempt(node)`` confirms on the node (its ``Refused`` or ``Unavailable`` is that node's
    refusal); ``refusals`` maps every node that said no to its reason, in the order asked;
    ``current`` and ``stages`` are the rules of the pass under way and the stages its ranking
    was judged by.
    """

    spec: Spec | None
    layers: Sequence[Layer]
    platforms: tuple[Platform, ...]
    attempt: Callable[[str], Awaitable[T]]
    preferred_node: str | None = None
    rules: RequestRules = NO_RULES
    avoid_nodes: frozenset[str] = frozenset()
    probe: Probe = SILENT
    refusals: dict[str, str] = field(default_factory=dict)
    current: PassRules = field(default=NO_RULES, init=False)
    stages: Stages = field(default=NO_STAGES, init=False)

    @property
    def what(self) -> str:
        """The request in a log line or a ``NoCapacity``: its spec, or that it has none."""
        return f"({self.spec})" if self.spec is not None else "(no resources declared)"

    async def walk(
        self,
        rank: Callable[[], Ranking],
        no_capacity: Callable[[Decision[T]], NoCapacity],
        probe: Probe = SILENT,
    ) -> Confirmed[T]:
        """Place: passes of ``rank()`` (the scheduler's ranking of its view now, judged by the
        pass's rules) asked in :meth:`order` until a node confirms — at most
        :data:`MAX_PASSES`, a further one only while the last found nodes to ask — else
        ``no_capacity(self)`` is raised.  ``probe`` hears every stage and the outcome."""
        with probe:
            self.probe = probe
            for _ in range(MAX_PASSES):
                self.begin_pass()
                with probe.ranking():
                    ranking = self.judged(rank())
                asked = False
                for index, node in self.order(ranking):
                    asked = True
                    confirmed = await self._ask(ranking, index, node)
                    if confirmed is not None:
                        return confirmed
                if not asked:
                    break
            raise no_capacity(self)

    async def _ask(self, ranking: Ranking, index: int, node: str) -> Confirmed[T] | None:
        """Ask ``node`` to confirm: the confirmed placement, or ``None`` when it refused."""
        probe = self.probe
        try:
            with probe.confirming(node):
                result = await self.attempt(node)
        except (Refused, Unavailable) as error:
            reason = _reason(error)
            log.info("node %s refused %s: %s", node, self.what, reason)
            self.refused(node, reason)
            probe.refused(node, error)
            return None
        colocated = ranking.colocated(index)
        probe.placed(node, index, colocated)
        return Confirmed(node, result, index, colocated, tuple(self.refusals.items()))

    def begin_pass(self) -> None:
        """A pass starts: take the rules as they are now."""
        self.current = self.rules.for_pass()

    def judged(self, ranking: Ranking) -> Ranking:
        """The ranker's ``ranking`` with this pass's stages applied (a value)."""
        self.stages = self.current.stages()
        return self.stages.apply(ranking)

    def refused(self, node: str, reason: str) -> None:
        """``node`` said no: it is not asked again in this decision."""
        self.refusals[node] = reason

    def order(self, ranking: Ranking) -> Iterator[tuple[int, str]]:
        """``(rank, node)`` for each node of ``ranking`` to ask, in the order to ask them."""
        refusals, recheck = self.refusals, self.current.recheck
        for index, node in self._preferred_first(ranking):
            if node in refusals:
                continue
            why = recheck(node)
            if why is not None:
                log.info("node %s skipped for %s: %s", node, self.what, why)
                continue
            yield index, node

    def _preferred_first(self, ranking: Ranking) -> Iterator[tuple[int, str]]:
        """The preferred node first (if it ranks), the avoided ones last, each in rank order."""
        avoided = self.avoid_nodes
        if not avoided:
            yield from self._preferred_then_ranked(ranking)
            return
        later: list[tuple[int, str]] = []
        for index, node in self._preferred_then_ranked(ranking):
            if node in avoided:
                later.append((index, node))
            else:
                yield index, node
        yield from later

    def _preferred_then_ranked(self, ranking: Ranking) -> Iterator[tuple[int, str]]:
        preferred = self.preferred_node
        if preferred is not None and self.stages.sets_back(preferred):
            preferred = None  # a tier demoted it (a filter left it out): no preference
        if preferred is not None:
            for index, node in enumerate(ranking):
                if node == preferred:
                    yield index, node
                    break
            else:
                preferred = None
        for index, node in enumerate(ranking):
            if node != preferred:
                yield index, node
