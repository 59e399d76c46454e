"""The policy extension point: what a policy sees, and the two shapes a policy can take.

A ranker (the NumPy engine, the reference) first *filters* — "can this node run it?", the
seed's ``fits`` plus the platform, never varied by a policy — and then asks a policy to
*order* the nodes that passed, best first.  Following kube-scheduler's framework, a rule for
"how good is this node?" is written either as

* a :class:`Scorer` — ``score(view, request)``: one float64 per slot, higher is better — and
  combined with others by :class:`Weighted` (Σ weight · score, highest first, ties by node
  name or, on request, at random); or
* a whole :class:`Policy` — ``order(view, request)``: the fitting slots, best first — when
  the rule is not a sum of per-node scores (a random permutation, a score whose tie-break
  is itself a score).

A rule the ranker's view cannot hold — one that needs what only the scheduler knows, such
as where a function's other replicas are (a soft spread) — is a :class:`Tier`: a score of
two values over node names, ``demotion(node)``, applied to the ranking the policy made.
The nodes no tier sets back come first, then the others, each group in the policy's order
(kube-scheduler's ``ScheduleAnyway`` topology spread, as a tier: the spread outweighs any
score, colocation still orders within it).  It runs after the ranker, lazily, on the nodes
a walk reads (:class:`~berth.scheduler.ranking.Stages`), so the seed's fast path keeps its
cost; its counterpart for "can this node run it?" is :class:`berth.checks.Filter`.

What a policy gets:

* :class:`ClusterView` — the ranker's replica of the cluster as per-slot NumPy arrays with
  named attributes (``mem_free``, ``disk_max``, ``cpu_load``, ``alive``, ``name_rank`` …) and
  layer lookups (``mounted_bytes(layers)``, ``cached_bytes(layers)``, ``holding(layer_id)``).
  Every array is a **read-only** window (``flags.writeable = False``) on the ranker's own
  columns: a policy cannot corrupt the engine by accident, and the view costs no copy even
  at 100,000 nodes.  Because they are windows, not copies, a view is valid only during the
  ``order``/``score`` call that receives it (the ranker holds its lock meanwhile): a policy
  that wants to remember something copies it.
* :class:`PlacementRequest` — the request as placed: its ``spec`` (``None``: no resources
  declared), ``layers`` and ``platforms``, plus what the filter and the layer match found —
  ``fit`` (the slots a policy must order, all of them and nothing else) and ``colocated``
  (per slot, the bytes of the request's layers mounted there, the seed's
  ``colocation_score``), also read-only.

A *slot* is a ranker's index for a node; slot numbers mean nothing across rankers or across
calls.  Policies that must agree between rankers (every registered one does: property tests
hold the engine and the reference to identical orders) depend on node names only through
``name_rank``/``name_order`` and never on slot numbering.

This module imports no ranker: rankers build views and call policies, so the engine can
import the policy package without a cycle.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from berth.errors import Invalid
from berth.model import Layer, Spec
from berth.platform import Platform

__all__ = [
    "ClusterView",
    "Floats",
    "LayerHolders",
    "PlacementRequest",
    "Policy",
    "Scorer",
    "SeedLike",
    "Slots",
    "Tier",
    "Weighted",
    "fitting_in_name_order",
    "generator",
    "held_bytes",
    "order_fitting",
]

Slots = npt.NDArray[np.intp]
Floats = npt.NDArray[np.float64]
SeedLike = int | np.random.Generator | None
"""What seeds a policy's randomness: an int, a ``Generator`` (used as is) or ``None``."""


def generator(seed: SeedLike) -> np.random.Generator:
    """``seed`` itself if it is a ``Generator``, else a fresh one seeded with it."""
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _read_only(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A view of ``array`` that refuses writes (the caller's array stays writable)."""
    view = array.view()
    view.flags.writeable = False
    return view


class LayerHolders(Protocol):
    """A ranker's layer → slots index (the engine's ``LayerIndex`` is one)."""

    def holders(self, layer_id: str) -> npt.NDArray[np.integer[Any]]:
        """The slots holding ``layer_id``, each once (empty when none does)."""
        ...


@dataclass(frozen=True, slots=True, eq=False)
class ClusterView:
    """A ranker's cluster, read-only, slot by slot (see the module docstring).

    Every array has ``size`` entries, one per slot; a slot with ``alive[slot]`` false is
    free (no node) and its values mean nothing.  Sizes are bytes, bandwidths bytes/s,
    ``cpu_load`` the smoothed busy fraction of the machine, ``cpu_capacity`` cores — the
    fields of :class:`~berth.state.NodeState`, with ``mem_max``/``disk_max`` its
    ``mem_total``/``disk_total``.
    """

    size: int
    """Slots the arrays span (live and free)."""
    count: int
    """Live nodes."""
    alive: npt.NDArray[np.bool_]
    name_order: Slots
    """The ``count`` live slots sorted by node name (code-point order)."""
    name_rank: npt.NDArray[np.int64]
    """Per slot, its position in ``name_order`` (free slots: a number above every live one)."""
    mem_free: npt.NDArray[np.int64]
    mem_max: npt.NDArray[np.int64]
    disk_free: npt.NDArray[np.int64]
    disk_max: npt.NDArray[np.int64]
    cpu_load: Floats
    cpu_capacity: Floats
    cpu_max_load: Floats
    disk_bw_load: Floats
    disk_bw_ceiling: Floats
    net_bw_load: Floats
    net_bw_ceiling: Floats
    mounted: LayerHolders = field(repr=False)
    cached: LayerHolders = field(repr=False)
    names: Sequence[str | None] = field(repr=False)
    """Slot → node name (``None`` for a free slot); see :meth:`name`."""

    def __post_init__(self) -> None:
        for name in _VIEW_ARRAYS:
            object.__setattr__(self, name, _read_only(getattr(self, name)))

    def name(self, slot: int) -> str:
        """The node at ``slot`` (``ValueError`` for a free slot)."""
        name = self.names[slot]
        if name is None:
            raise ValueError(f"slot {slot} is free")
        return name

    def mounted_bytes(self, layers: Sequence[Layer]) -> npt.NDArray[np.int64]:
        """Per slot, the bytes of ``layers`` mounted there (the seed's colocation score)."""
        return held_bytes(self.mounted, layers, self.size)

    def cached_bytes(self, layers: Sequence[Layer]) -> npt.NDArray[np.int64]:
        """Per slot, the bytes of ``layers`` in the node's cache of recently unmounted layers.

        A layer both mounted and cached (a snapshot may list it in both) counts here too.
        """
        return held_bytes(self.cached, layers, self.size)

    def holding(self, layer_id: str) -> Slots:
        """The slots where ``layer_id`` is present — mounted or cached — sorted, each once."""
        present = np.union1d(self.mounted.holders(layer_id), self.cached.holders(layer_id))
        slots: Slots = present.astype(np.intp, copy=False)
        return slots

    def holder_count(self, layer_id: str) -> int:
        """How many live nodes have ``layer_id`` present (mounted or cached)."""
        return int(self.holding(layer_id).size)


_VIEW_ARRAYS = tuple(
    each.name
    for each in fields(ClusterView)
    if each.name not in ("size", "count", "mounted", "cached", "names")
)


def held_bytes(index: LayerHolders, layers: Sequence[Layer], size: int) -> npt.NDArray[np.int64]:
    """Per slot of ``size``, the bytes of ``layers`` that ``index`` says the slot holds."""
    held = np.zeros(size, dtype=np.int64)
    for layer in layers:
        slots = index.holders(layer.id)
        if slots.size:
            held[slots] += layer.size
    return held


class PlacementRequest:
    """One request as a policy sees it: what was asked, and what the filter found.

    ``fit`` and ``colocated`` have one entry per slot of the :class:`ClusterView` they come
    with; both are read-only.  ``colocated`` may be handed in as a function and is then
    computed on first use — a full-width pass a policy that ignores layers never pays for.
    """

    __slots__ = ("_colocated", "_fit", "_layers", "_platforms", "_spec")

    def __init__(
        self,
        spec: Spec | None,
        layers: Sequence[Layer],
        platforms: Sequence[Platform],
        fit: npt.NDArray[np.bool_],
        colocated: npt.NDArray[np.int64] | Callable[[], npt.NDArray[np.int64]],
    ) -> None:
        self._spec = spec
        self._layers = tuple(layers)
        self._platforms = tuple(platforms)
        self._fit = _read_only(fit)
        self._colocated = colocated if callable(colocated) else _read_only(colocated)

    @property
    def spec(self) -> Spec | None:
        """The resources asked for; ``None`` when the workload declared none."""
        return self._spec

    @property
    def layers(self) -> tuple[Layer, ...]:
        return self._layers

    @property
    def platforms(self) -> tuple[Platform, ...]:
        """Platforms the artifact runs on; empty means any."""
        return self._platforms

    @property
    def fit(self) -> npt.NDArray[np.bool_]:
        """Per slot, whether the node passed the filter: exactly the slots a policy orders."""
        return self._fit

    @property
    def colocated(self) -> npt.NDArray[np.int64]:
        """Per slot, the bytes of ``layers`` mounted on the node."""
        if callable(self._colocated):
            self._colocated = _read_only(self._colocated())
        return self._colocated


class Policy(Protocol):
    """Orders the fitting nodes of a view for one request."""

    name: str

    def order(self, view: ClusterView, request: PlacementRequest) -> Slots:
        """The slots where ``request.fit`` is true, each once, best first."""
        ...


class Scorer(Protocol):
    """How good each node is for a request: one float64 per slot, higher is better.

    Scores of slots outside ``request.fit`` are ignored; a scorer may compute them anyway
    (a vectorised pass over every slot is usually cheaper than selecting first).
    """

    name: str

    def score(self, view: ClusterView, request: PlacementRequest) -> Floats: ...


class Tier(Protocol):
    """A score of two values over node names: the nodes it sets back come after the others.

    One request's rule at one moment, a value (see the module docstring).  ``demotion(node)``
    is why ``node`` is set back (tried only after every node that keeps the rule), ``None``
    if it is not; ``described`` is the rule in words ("soft spread (one replica per node)").
    """

    @property
    def described(self) -> str: ...

    def demotion(self, node: str) -> str | None: ...


def fitting_in_name_order(view: ClusterView, request: PlacementRequest) -> Slots:
    """The fitting slots, in node-name order."""
    by_name = view.name_order
    fitting: Slots = by_name[request.fit[by_name]]
    return fitting


def order_fitting(
    view: ClusterView, request: PlacementRequest, *keys: npt.NDArray[np.generic]
) -> Slots:
    """The fitting slots sorted ascending by ``keys`` (most significant first), then by name."""
    slots = np.flatnonzero(request.fit)
    if not slots.size:
        return slots
    columns = [view.name_rank[slots], *(key[slots] for key in reversed(keys))]
    ordered: Slots = slots[np.lexsort(columns)]
    return ordered


class Weighted:
    """A policy that sums weighted scores: ``total(n) = Σ weight_i · score_i(n)``, highest first.

    Equal totals are ordered by node name — or, when ``random_ties`` is a generator, uniformly
    at random from it, as kube-scheduler's ``selectHost`` picks among the top-scoring nodes
    (the draw is a permutation of the fitting nodes in name order, so it depends on the
    generator's state and the set of fitting nodes, not on slot numbering).  A negative
    weight turns "more is better" into "less is better".
    """

    def __init__(
        self,
        terms: Sequence[tuple[Scorer, float]],
        *,
        name: str,
        random_ties: np.random.Generator | None = None,
    ) -> None:
        for _, weight in terms:
            if isinstance(weight, bool) or not math.isfinite(weight):
                raise Invalid(f"must be a finite number, got {weight!r}", field="weight")
        self.terms = tuple((scorer, float(weight)) for scorer, weight in terms)
        self.name = name
        self.random_ties = random_ties

    def scores(self, view: ClusterView, request: PlacementRequest) -> Floats:
        """Per slot, the weighted total."""
        total = np.zeros(view.size, dtype=np.float64)
        for scorer, weight in self.terms:
            score = scorer.score(view, request)
            if score.shape != (view.size,):
                raise ValueError(
                    f"scorer {scorer.name!r} returned shape {score.shape}, expected ({view.size},)"
                )
            total += weight * score
        return total

    def order(self, view: ClusterView, request: PlacementRequest) -> Slots:
        total = self.scores(view, request)
        if self.random_ties is None:
            return order_fitting(view, request, -total)
        slots = self.random_ties.permutation(fitting_in_name_order(view, request))
        if not slots.size:
            return slots
        ordered: Slots = slots[np.argsort(-total[slots], kind="stable")]
        return ordered

    def __repr__(self) -> str:
        terms = ", ".join(f"({scorer.name}, {weight:g})" for scorer, weight in self.terms)
        return f"Weighted([{terms}], name={self.name!r})"
