"""The reference ranker: the seed's ``candidates/2``, literally, in plain Python.

It exists to be obviously right, not fast: filter the snapshots with ``fits`` (the table of
checks, platform included), compute ``colocation_score`` for each survivor, and stable-sort
by colocated bytes descending over nodes taken in name order (berth's documented tie-break).
Property tests use it as the oracle for the NumPy engine, and benchmarks as the baseline.

Any other policy is applied to a :class:`~berth.scheduler.policy.base.ClusterView` built
here, node by node, from the snapshots (slot ``i`` is the ``i``-th node by name) — slowly, by
design: it is the same policy object the engine runs, on a view made without the engine, so
property tests can hold the two rankers' orders equal for every policy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from berth.checks import CHECKS, Check
from berth.model import Layer, Spec
from berth.platform import Platform
from berth.scheduler.policy.base import ClusterView, PlacementRequest, Policy
from berth.scheduler.policy.seed import SeedPolicy
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
        self,
        spec: Spec | None,
        layers: Sequence[Layer],
        platforms: Sequence[Platform] = (),
        policy: Policy | None = None,
    ) -> Ranking:
        """Fitting nodes ordered by ``policy``; the seed's is the literal sort below."""
        in_name_order = sorted(self._states.values(), key=lambda state: state.node)
        fitting = [
            state for state in in_name_order if fits(state, spec, platforms, checks=self.checks)
        ]
        if policy is not None and type(policy) is not SeedPolicy:
            return _ranked_by(policy, in_name_order, fitting, spec, layers, platforms)
        scored = [(state.node, colocation_score(state, layers)) for state in fitting]
        scored.sort(key=lambda pair: pair[1], reverse=True)  # stable: ties keep name order
        return Ranking([node for node, _ in scored], [score for _, score in scored])

    def platforms(self) -> dict[Platform, int]:
        return dict(Counter(state.platform for state in self._states.values()))

    def __len__(self) -> int:
        return len(self._states)


def _ranked_by(
    policy: Policy,
    in_name_order: Sequence[NodeState],
    fitting: Sequence[NodeState],
    spec: Spec | None,
    layers: Sequence[Layer],
    platforms: Sequence[Platform],
) -> Ranking:
    """``policy``'s order of ``fitting``, on a view whose slot ``i`` is ``in_name_order[i]``."""
    fit_names = {state.node for state in fitting}
    fit = np.array([state.node in fit_names for state in in_name_order], dtype=bool)
    colocated = np.array([colocation_score(state, layers) for state in in_name_order], np.int64)
    request = PlacementRequest(spec, layers, platforms, fit, colocated)
    slots = policy.order(_view(in_name_order), request)
    return Ranking(
        [in_name_order[slot].node for slot in slots], [int(colocated[slot]) for slot in slots]
    )


def _view(in_name_order: Sequence[NodeState]) -> ClusterView:
    """The snapshots as a view: slot ``i`` holds the ``i``-th node by name."""
    count = len(in_name_order)

    def ints(field: str) -> npt.NDArray[np.int64]:
        return np.array([getattr(state, field) for state in in_name_order], dtype=np.int64)

    def floats(field: str) -> npt.NDArray[np.float64]:
        return np.array([getattr(state, field) for state in in_name_order], dtype=np.float64)

    return ClusterView(
        size=count,
        count=count,
        alive=np.ones(count, dtype=bool),
        name_order=np.arange(count, dtype=np.intp),
        name_rank=np.arange(count, dtype=np.int64),
        mem_free=ints("mem_free"),
        mem_max=ints("mem_total"),
        disk_free=ints("disk_free"),
        disk_max=ints("disk_total"),
        cpu_load=floats("cpu_load"),
        cpu_capacity=floats("cpu_capacity"),
        cpu_max_load=floats("cpu_max_load"),
        disk_bw_load=floats("disk_bw_load"),
        disk_bw_ceiling=floats("disk_bw_ceiling"),
        net_bw_load=floats("net_bw_load"),
        net_bw_ceiling=floats("net_bw_ceiling"),
        mounted=_Holders(state.layers for state in in_name_order),
        cached=_Holders(state.cached_layers for state in in_name_order),
        names=tuple(state.node for state in in_name_order),
    )


class _Holders:
    """Layer id → slots holding it, built by walking every node's layer set."""

    def __init__(self, layer_sets: Iterable[frozenset[str]]) -> None:
        slots: dict[str, list[int]] = {}
        for slot, layer_ids in enumerate(layer_sets):
            for layer_id in layer_ids:
                slots.setdefault(layer_id, []).append(slot)
        self._slots = {layer_id: np.array(held, dtype=np.intp) for layer_id, held in slots.items()}

    def holders(self, layer_id: str) -> npt.NDArray[np.intp]:
        return self._slots.get(layer_id, np.zeros(0, dtype=np.intp))
