"""Explanations: why each node can or cannot run a request, and the NoCapacity summary.

An operator looking at a failed placement needs the *why*, per node and in aggregate:
``0/50 nodes can run it: 20 insufficient memory, 5 platform linux/arm64 not offered,
25 refused at confirmation (cpu_saturated)``.  A verdict is the first failed check of the
one table the snapshot filter and node admission also walk (:data:`berth.checks.CHECKS`), so
the stages read alike: a node without the platform is ``platform_mismatch`` here and in a
refusal, and each check names its own group in the summary.

A request's rules beyond the table — its spread (:mod:`berth.scheduler.spread`) — are
judged too, after the checks, as the stages they are: a node that passes the checks but a
:class:`~berth.checks.Filter` leaves out has the filter's code as verdict (a hard spread's:
``spread``; the verdict's ``spread`` field says why: "zone='a' holds 3 replicas of
default/fn, …"), grouped in the summary as "excluded by <the rule>" ("… by hard spread (one
replica per node)"); a node a :class:`~berth.scheduler.policy.base.Tier` sets back (a soft
spread) still ``fits``, and its ``spread`` field says why it comes after the nodes that keep
the spread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from berth.checks import (
    CHECKS,
    Check,
    Demand,
    Filter,
    describe_reason,
    first_excluding,
    first_failed,
)
from berth.model import Layer, Spec
from berth.platform import Platform
from berth.scheduler.ranking import NO_STAGES, Stages
from berth.state import NodeState, colocation_score

__all__ = ["Explanation", "NodeVerdict", "summarise", "verdicts"]

FITS = "fits"


@dataclass(frozen=True)
class NodeVerdict:
    """One node's verdict: ``fits`` or the first failed check, its colocated bytes and rank.

    ``rank`` is the node's position in the candidate order (0 = tried first), ``None`` for
    nodes filtered out; ``refused`` holds the node's reason when it was tried and refused;
    ``spread`` why a filter of the request's spread excluded the node (the verdict is then
    the filter's code, ``spread``) or, for a node that fits, why its tier moved it after the
    nodes that keep the spread (a soft spread).
    """

    node: str
    verdict: str
    colocated_bytes: int
    rank: int | None = None
    refused: str | None = None
    spread: str | None = None
    detail: str | None = None
    """The failed check's figures, as a refusal would give them ("asks 2GiB, 1.5GiB free")."""

    @property
    def description(self) -> str:
        if self.refused:
            return f"refused at confirmation ({self.refused})"
        if self.verdict == FITS:
            if self.spread:
                return f"fits, tried after the nodes that keep the spread: {self.spread}"
            return "fits"
        if self.spread is not None:  # a filter's verdict: "excluded by the spread: …"
            return f"excluded by the {self.verdict}: {self.spread}"
        phrase = describe_reason(self.verdict)
        return phrase if self.detail is None else f"{phrase}: {self.detail}"


@dataclass(frozen=True)
class Explanation:
    """Every node's verdict for one request, best rank first, then by node name."""

    verdicts: tuple[NodeVerdict, ...]
    platforms: tuple[Platform, ...] = ()
    checks: Sequence[Check] = field(default=CHECKS, repr=False, compare=False)
    spread: str | None = None
    """The request's spread, described (``None``: it asked for none)."""
    filters: Sequence[Filter] = field(default=(), repr=False, compare=False)

    @property
    def fitting(self) -> int:
        return sum(1 for v in self.verdicts if v.verdict == FITS and v.refused is None)

    def summary(self) -> str:
        return summarise(self.verdicts, self.platforms, checks=self.checks, filters=self.filters)


def verdicts(
    states: Iterable[NodeState],
    spec: Spec | None,
    layers: Sequence[Layer],
    platforms: Sequence[Platform],
    ranks: Mapping[str, int],
    refusals: Mapping[str, str] | None = None,
    *,
    checks: Sequence[Check] = CHECKS,
    stages: Stages = NO_STAGES,
) -> Explanation:
    """Judge every snapshot against the request: its first failed check of ``checks``, then
    (for a node that passes them all) the request's ``stages``: its first excluding filter,
    else its first tier that sets it back.

    ``refusals`` are the nodes' answers at confirmation; a refused node no longer among
    ``states`` (it left during the walk) is listed with its refusal all the same.
    """
    refusals = refusals or {}
    demand = Demand.of(spec, platforms)
    out: list[NodeVerdict] = []
    for state in states:
        verdict, why, detail = _verdict(state, demand, checks, stages)
        out.append(
            NodeVerdict(
                node=state.node,
                verdict=verdict,
                colocated_bytes=colocation_score(state, layers),
                rank=ranks.get(state.node),
                refused=refusals.get(state.node),
                spread=why,
                detail=detail,
            )
        )
    # A node that refused and has left since (its refusal was ``Unavailable``, typically)
    # still counts: it was a candidate, and its answer is part of why the request failed.
    seen = {verdict.node for verdict in out}
    out.extend(
        NodeVerdict(node=node, verdict=FITS, colocated_bytes=0, refused=reason)
        for node, reason in refusals.items()
        if node not in seen
    )
    out.sort(key=lambda v: (v.rank is None, v.rank if v.rank is not None else 0, v.node))
    return Explanation(
        tuple(out), tuple(platforms), checks, stages.described(), filters=stages.filters
    )


def _verdict(
    state: NodeState, demand: Demand, checks: Sequence[Check], stages: Stages
) -> tuple[str, str | None, str | None]:
    """One node's verdict, why and its figures: the code of the first check it fails, with
    the check's detail; else the code of the first filter that excludes it, and why; else
    ``fits``, and why a tier sets it back (``None``: none does)."""
    failed = first_failed(state, demand, checks)
    if failed is not None:
        return failed.code, None, failed.detail(state, demand)
    excluded = first_excluding(state.node, stages.filters)
    if excluded is not None:
        return excluded[0].code, excluded[1], None
    return FITS, stages.demotion(state.node), None


def summarise(
    all_verdicts: Sequence[NodeVerdict],
    platforms: Sequence[Platform] = (),
    *,
    checks: Sequence[Check] = CHECKS,
    filters: Sequence[Filter] = (),
) -> str:
    """``"0/50 nodes can run it: 20 insufficient memory, …"`` (largest groups first); the
    nodes a filter of ``filters`` excluded are "excluded by" its rule, described."""
    total = len(all_verdicts)
    if total == 0:
        return "0/0 nodes can run it: the cluster has no live nodes"
    demand = Demand.of(None, platforms)
    by_code = {check.code: check for check in checks}
    by_filter = {each.code: each for each in filters}
    groups: Counter[str] = Counter()
    for verdict in all_verdicts:
        if verdict.refused:
            groups[f"refused at confirmation ({verdict.refused})"] += 1
        elif verdict.verdict == FITS:
            groups["can run it"] += 1
        elif verdict.verdict in by_filter:
            groups[f"excluded by {by_filter[verdict.verdict].described}"] += 1
        elif verdict.verdict in by_code:
            groups[by_code[verdict.verdict].summary(demand)] += 1
        else:
            groups[describe_reason(verdict.verdict, checks)] += 1
    able = groups.pop("can run it", 0)
    parts = ", ".join(f"{count} {what}" for what, count in groups.most_common())
    return f"{able}/{total} nodes can run it" + (f": {parts}" if parts else "")
