"""Explanations: why each node can or cannot run a request, and the NoCapacity summary.

An operator looking at a failed placement needs the *why*, per node and in aggregate:
``0/50 nodes can run it: 20 insufficient memory, 5 platform linux/arm64 not offered,
25 refused at confirmation (cpu_saturated)``.  Verdicts come from the same reason codes as
the snapshot filter (:func:`berth.state.first_failed_check`) and node admission
(:class:`berth.node.budget.Refused`), so the two stages read alike.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from berth.model import Layer, Spec
from berth.platform import Platform, matches_any
from berth.state import NodeState, colocation_score, describe_reason, first_failed_check

__all__ = ["Explanation", "NodeVerdict", "summarise", "verdicts"]

FITS = "fits"
PLATFORM = "platform_not_offered"


@dataclass(frozen=True)
class NodeVerdict:
    """One node's verdict: ``fits`` or the first failed check, its colocated bytes and rank.

    ``rank`` is the node's position in the candidate order (0 = tried first), ``None`` for
    nodes filtered out; ``refused`` holds the node's reason when it was tried and refused.
    """

    node: str
    verdict: str
    colocated_bytes: int
    rank: int | None = None
    refused: str | None = None

    @property
    def description(self) -> str:
        if self.refused:
            return f"refused at confirmation ({self.refused})"
        if self.verdict == FITS:
            return "fits"
        return describe_reason(self.verdict)


@dataclass(frozen=True)
class Explanation:
    """Every node's verdict for one request, best rank first, then by node name."""

    verdicts: tuple[NodeVerdict, ...]
    platforms: tuple[Platform, ...] = ()

    @property
    def fitting(self) -> int:
        return sum(1 for v in self.verdicts if v.verdict == FITS and v.refused is None)

    def summary(self) -> str:
        return summarise(self.verdicts, self.platforms)


def verdicts(
    states: Iterable[NodeState],
    spec: Spec | None,
    layers: Sequence[Layer],
    platforms: Sequence[Platform],
    ranks: Mapping[str, int],
    refusals: Mapping[str, str] | None = None,
) -> Explanation:
    """Judge every snapshot against the request (the reference formulas, node by node)."""
    refusals = refusals or {}
    out: list[NodeVerdict] = []
    for state in states:
        if not matches_any(state.platform, platforms):
            verdict = PLATFORM
        elif spec is None:
            verdict = FITS
        else:
            verdict = first_failed_check(state, spec) or FITS
        out.append(
            NodeVerdict(
                node=state.node,
                verdict=verdict,
                colocated_bytes=colocation_score(state, layers),
                rank=ranks.get(state.node),
                refused=refusals.get(state.node),
            )
        )
    out.sort(key=lambda v: (v.rank is None, v.rank if v.rank is not None else 0, v.node))
    return Explanation(tuple(out), tuple(platforms))


def summarise(all_verdicts: Sequence[NodeVerdict], platforms: Sequence[Platform] = ()) -> str:
    """``"0/50 nodes can run it: 20 insufficient memory, …"`` (largest groups first)."""
    total = len(all_verdicts)
    if total == 0:
        return "0/0 nodes can run it: the cluster has no live nodes"
    groups: Counter[str] = Counter()
    for verdict in all_verdicts:
        if verdict.refused:
            groups[f"refused at confirmation ({verdict.refused})"] += 1
        elif verdict.verdict == PLATFORM:
            wanted = ", ".join(str(p) for p in platforms)
            groups[f"platform {wanted} not offered"] += 1
        elif verdict.verdict != FITS:
            groups[describe_reason(verdict.verdict)] += 1
        else:
            groups["can run it"] += 1
    able = groups.pop("can run it", 0)
    parts = ", ".join(f"{count} {what}" for what, count in groups.most_common())
    return f"{able}/{total} nodes can run it" + (f": {parts}" if parts else "")
