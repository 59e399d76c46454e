"""The reference ranker: the seed's ``candidates/2``, literally, in plain Python.

It exists to be obviously right, not fast: filter the snapshots with ``fits`` (the table of
checks, platform included), compute ``colocation_score`` for each survivor, and stable-sort
by colocated bytes descending over nodes taken in name order (berth's documented tie-break).
Property tests use it as the oracle for the NumPy engine, and benchmarks as the baseline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from berth.checks import CHECKS, Check
from berth.model import Layer, Spec
from berth.platform import Platform
from berth.scheduler.ranking import Ranking
from berth.state import NodeState, colocation_score, fits

__all__ = ["ReferenceRanker"]


class ReferenceRanker:
    """The seed's ranking over a dictionary of snapshots."""

    def __init__(self, checks: Sequence[Check] = CHECKS) -> None:
        self._states: dict[str, NodeState] = {}
        self.checks = tuple(checks)

    def upsert(self, state: NodeState) -> None:
        current = self._states.get(state.node)
        if current is None or current.generation <= state.generation:
            self._states[state.node] = state

    def remove(self, node: str) -> None:
        self._states.pop(node, None)

    def rank(
        self, spec: Spec | None, layers: Sequence[Layer], platforms: Sequence[Platform] = ()
    ) -> Ranking:
        in_name_order = sorted(self._states.values(), key=lambda state: state.node)
        fitting = [
            state for state in in_name_order if fits(state, spec, platforms, checks=self.checks)
        ]
        scored = [(state.node, colocation_score(state, layers)) for state in fitting]
        scored.sort(key=lambda pair: pair[1], reverse=True)  # stable: ties keep name order
        return Ranking([node for node, _ in scored], [score for _, score in scored])

    def platforms(self) -> dict[Platform, int]:
        return dict(Counter(state.platform for state in self._states.values()))

    def __len__(self) -> int:
        return len(self._states)
