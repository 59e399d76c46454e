"""What a ranker answers, and the interface both rankers implement.

A *ranker* holds a scheduler's replica of the cluster (the latest ``NodeState`` per node)
and answers ``rank(spec, layers, platforms, policy)``: the nodes that fit, best first by the
policy (:mod:`berth.scheduler.policy`; default the seed's), each with the bytes of the
request's layers it already has mounted.  Two rankers implement it —
:mod:`~berth.scheduler.reference` (the seed, literally, in plain Python: the oracle) and
:mod:`~berth.scheduler.engine` (NumPy, for speed) — and property tests hold them equal for
every registered policy.  A ranker owns the filter and the view of the cluster; the policy
owns only the order, so every ranker takes every policy.

**Stages after the ranker.**  Rules the ranker's view cannot hold — one request's filters
(:class:`~berth.checks.Filter`: a hard spread) and tiers
(:class:`~berth.scheduler.policy.base.Tier`: a soft spread), judged by node name on what
the scheduler knows — are :class:`Stages`, applied to a ranking as a
:class:`StagedRanking`: the nodes a filter excludes left out, the nodes a tier sets back
moved after the others, each group in the ranker's order.

**Tie-break** of the seed's ordering (the seed leaves it open; berth fixes it so every
scheduler and every run agrees): among nodes with equal colocated bytes, node names in
ascending code-point order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, overload

import numpy as np
import numpy.typing as npt

from berth.checks import Filter, first_excluding
from berth.model import Layer, Spec
from berth.platform import Platform
from berth.scheduler.policy.base import Policy, Tier
from berth.state import NodeState

__all__ = ["NO_STAGES", "Ranker", "Ranking", "StagedRanking", "Stages"]


class Ranking(Sequence[str]):
    """Fitting nodes, best first, with their colocated bytes (``colocated[i]`` for ``self[i]``).

    A plain-list ranking; the engine returns a subclass that is lazy twice over: under the
    seed's policy it orders nodes only as far as they are read (the first is one ``argmax``),
    and it maps slots to names only when asked, so a caller that stops at the first confirming
    node neither sorts nor names thousands of nodes.  Either way, what is read is exactly the
    full order: laziness changes the cost, never the answer.
    """

    def __init__(
        self, nodes: Sequence[str], colocated: Sequence[int] | npt.NDArray[np.int64]
    ) -> None:
        self._nodes = nodes
        self._colocated = colocated

    def __len__(self) -> int:
        return len(self._nodes)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._nodes[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def colocated(self, index: int) -> int:
        """Colocated bytes of the node at ``index``."""
        return int(self._colocated[index])

    def ordered(self) -> int:
        """How many nodes are ordered so far (a lazy ranking: those read, and a few more)."""
        return len(self)

    def pairs(self) -> list[tuple[str, int]]:
        """``[(node, colocated_bytes), …]`` best first (for tests and explanations)."""
        return [(self[i], self.colocated(i)) for i in range(len(self))]


class Ranker(Protocol):
    """A scheduler's replica of the cluster, able to rank it for a request."""

    def upsert(self, state: NodeState) -> None:
        """Take ``state`` as the node's latest snapshot (an older generation is ignored)."""
        ...

    def remove(self, node: str) -> None:
        """Forget a node that left; idempotent."""
        ...

    def rank(
        self,
        spec: Spec | None,
        layers: Sequence[Layer],
        platforms: Sequence[Platform] = (),
        policy: Policy | None = None,
    ) -> Ranking:
        """Fitting nodes ordered by ``policy``; ``None`` is the seed's: most colocated bytes
        first, ties by node name.

        ``spec=None`` skips the resource checks; empty ``platforms`` matches any node.
        """
        ...

    def platforms(self) -> dict[Platform, int]:
        """How many live nodes run each platform."""
        ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class Stages:
    """One request's filters and tiers at one moment: what a ranking becomes after the ranker.

    Values (each filter and tier judges by what it was made with), so a ranking they are
    applied to stays a value too.  Two tiers: the nodes no tier sets back, then the others.
    """

    filters: tuple[Filter, ...] = ()
    tiers: tuple[Tier, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.filters or self.tiers)

    def apply(self, ranking: Ranking) -> Ranking:
        """``ranking`` with the stages applied (itself when there are none)."""
        return StagedRanking(ranking, self) if self else ranking

    def exclusion(self, node: str) -> str | None:
        """Why the first filter that excludes ``node`` does; ``None`` if none does."""
        excluded = first_excluding(node, self.filters)
        return None if excluded is None else excluded[1]

    def demotion(self, node: str) -> str | None:
        """Why the first tier that sets ``node`` back does; ``None`` if none does."""
        for tier in self.tiers:
            why = tier.demotion(node)
            if why is not None:
                return why
        return None

    def sets_back(self, node: str) -> bool:
        """Whether a filter leaves ``node`` out or a tier sets it back."""
        return self.exclusion(node) is not None or self.demotion(node) is not None

    def described(self) -> str | None:
        """The rules in words, each once (``None``: no stage)."""
        words = dict.fromkeys(
            [each.described for each in self.filters] + [each.described for each in self.tiers]
        )
        return "; ".join(words) or None


NO_STAGES = Stages()
"""No filter, no tier: a ranking stays as the ranker made it."""


class StagedRanking(Ranking):
    """A ranking with :class:`Stages` applied: excluded nodes left out, set-back ones last.

    Lazy like the engine's: it reads the ranking it wraps only as far as it is itself read,
    so a walk that stops at the first node that confirms judges few nodes.  It is a value:
    the stages judge by what they were made with.  ``excluded`` and ``demoted`` map the nodes
    judged so far to why a filter left them out or a tier set them back.
    """

    def __init__(self, base: Ranking, stages: Stages) -> None:
        super().__init__([], [])
        self._base = base
        self.stages = stages
        self._order: list[str] = []
        self._bytes: list[int] = []
        self._next = 0
        self._total = len(base)
        self._deferred: list[int] = []
        self._done = False
        self.excluded: dict[str, str] = {}
        self.demoted: dict[str, str] = {}

    def _fill(self, upto: int | None) -> None:
        """Judge the wrapped ranking until ``upto`` is read (``None``: all of it)."""
        base, filters, tiers = self._base, self.stages.filters, self.stages.tiers
        while not self._done and (upto is None or len(self._order) <= upto):
            if self._next < self._total:
                index = self._next
                self._next += 1
                node = base[index]
                # Stages.exclusion and .demotion, inlined: this runs once per node read.
                why = None
                for each in filters:
                    why = each.exclusion(node)
                    if why is not None:
                        break
                if why is not None:
                    self.excluded[node] = why
                    continue
                for tier in tiers:
                    why = tier.demotion(node)
                    if why is not None:
                        break
                if why is None:
                    self._order.append(node)
                    self._bytes.append(base.colocated(index))
                else:
                    self.demoted[node] = why
                    self._deferred.append(index)
            else:
                for index in self._deferred:
                    self._order.append(base[index])
                    self._bytes.append(base.colocated(index))
                self._deferred.clear()
                self._done = True

    def __len__(self) -> int:
        self._fill(None)
        return len(self._order)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice) or index < 0:
            self._fill(None)
        else:
            self._fill(index)
        return self._order[index]

    def __iter__(self) -> Iterator[str]:
        for index in itertools.count():
            self._fill(index)
            if index >= len(self._order):
                return
            yield self._order[index]

    def colocated(self, index: int) -> int:
        self._fill(None if index < 0 else index)
        return self._bytes[index]

    def ordered(self) -> int:
        return len(self._order)
