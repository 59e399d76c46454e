"""What a ranker answers, and the interface both rankers implement.

A *ranker* holds a scheduler's replica of the cluster (the latest ``NodeState`` per node)
and answers ``rank(spec, layers, platforms, policy)``: the nodes that fit, best first by the
policy (:mod:`berth.scheduler.policy`; default the seed's), each with the bytes of the
request's layers it already has mounted.  Two rankers implement it —
:mod:`~berth.scheduler.reference` (the seed, literally, in plain Python: the oracle) and
:mod:`~berth.scheduler.engine` (NumPy, for speed) — and property tests hold them equal for
every registered policy.  A ranker owns the filter and the view of the cluster; the policy
owns only the order, so every ranker takes every policy.

**Tie-break** of the seed's ordering (the seed leaves it open; berth fixes it so every
scheduler and every run agrees): among nodes with equal colocated bytes, node names in
ascending code-point order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, overload

import numpy as np
import numpy.typing as npt

from berth.model import Layer, Spec
from berth.platform import Platform
from berth.scheduler.policy.base import Policy
from berth.state import NodeState

__all__ = ["Ranker", "Ranking"]


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
