"""The placement policies berth compares in the simulator, and the registry that names them.

A policy answers one question — *how good is each node?* — by ordering the slots the engine's
filter (``fit_mask``, the seed's ``fits``) let through.  It never changes the filter: every
policy here returns exactly the fitting slots, in its own order.  Policies are vectorised over
the engine's struct-of-arrays columns and its layer → nodes indexes, so scoring a request costs
a few NumPy operations over all nodes, not a Python loop per node.

This module is deliberately *not* the default: :data:`berth.scheduler.policy.SEED` stays the
scheduler's ordering until a policy here is measured to beat it (``berth sim``).  It holds
the contenders and the baselines they are measured against:

* ``seed`` — the seed's ranking (colocated mounted bytes desc, ties by node name);
* ``random`` — a seeded uniform permutation (the "no information" baseline);
* ``binpack`` — most allocated first; ``spread`` — least allocated first;
* ``kube`` — Kubernetes' ImageLocality + NodeResourcesLeastAllocated, equal weights;
* ``berth`` — bytes already on the node (mounted *and* cached) plus room, priced by scarcity.

**Allocation** (``binpack``, ``spread``): the mean reserved fraction of the two
hard resources a snapshot advertises, ``allocation = ½·(1 − mem_free/mem_max) +
½·(1 − disk_free/disk_max)`` (a resource with a zero maximum counts as fully allocated).

**Tie-breaks** are deterministic: ``seed``, ``binpack``, ``spread`` and ``berth`` break
remaining ties by node name (code-point order); ``random`` and ``kube`` (whose real scheduler
picks uniformly among the best-scoring nodes) use a generator seeded at construction, so the
same seed and the same sequence of calls give the same orders.

Policies get no ``Spec``: the :class:`~berth.scheduler.policy.Policy` protocol passes the
fitting mask and the request's layer match (its layers, colocated bytes per slot) only.
Scores that Kubernetes computes *including* the pod's own request are therefore computed on
the node's current reservations.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from berth.errors import Invalid
from berth.model import Layer
from berth.scheduler.engine import Engine, LayerMatch, Slots
from berth.scheduler.policy import SEED, Policy, SeedPolicy

__all__ = [
    "KUBE_MAX_CONTAINER_THRESHOLD",
    "KUBE_MIN_THRESHOLD",
    "POLICIES",
    "SEED",
    "BerthPolicy",
    "BinpackPolicy",
    "KubePolicy",
    "RandomPolicy",
    "SeedPolicy",
    "SpreadPolicy",
    "allocation",
    "free_fraction",
    "kube_image_locality",
    "kube_least_allocated",
    "policy",
]

SeedLike = int | np.random.Generator | None
Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

_MiB = 1024 * 1024
KUBE_MIN_THRESHOLD = 23 * _MiB
"""kube-scheduler's ImageLocality ``minThreshold`` (``23 * mb``, with ``mb = 1024 * 1024``)."""
KUBE_MAX_CONTAINER_THRESHOLD = 1000 * _MiB
"""kube-scheduler's ImageLocality ``maxContainerThreshold`` (``1000 * mb``) per container."""
KUBE_MAX_NODE_SCORE = 100


def _generator(seed: SeedLike) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def free_fraction(engine: Engine, resource: str) -> Floats:
    """Per slot, ``<resource>_free / <resource>_max`` (0 when the maximum is 0)."""
    n = engine.size
    free = engine.columns[f"{resource}_free"][:n].astype(np.float64)
    total = engine.columns[f"{resource}_max"][:n].astype(np.float64)
    out = np.zeros(n, dtype=np.float64)
    np.divide(free, total, out=out, where=total > 0)
    return out


def allocation(engine: Engine) -> Floats:
    """Per slot, the mean reserved fraction of memory and disk (0 = empty, 1 = full)."""
    return 1.0 - 0.5 * (free_fraction(engine, "mem") + free_fraction(engine, "disk"))


def _by_keys(engine: Engine, fit: npt.NDArray[np.bool_], *keys: npt.NDArray[np.generic]) -> Slots:
    """The fitting slots sorted by ``keys`` (most significant first), then by node name."""
    slots = np.flatnonzero(fit)
    if not slots.size:
        return slots
    columns = [engine.name_rank()[slots], *(key[slots] for key in reversed(keys))]
    return slots[np.lexsort(columns)]


class RandomPolicy:
    """A uniform random order of the fitting nodes, from a generator seeded at construction.

    The permutation is drawn over the fitting slots taken in name order, so it depends only on
    the seed, the call sequence and the set of fitting nodes — not on slot numbering.
    """

    name = "random"

    def __init__(self, seed: SeedLike = 0) -> None:
        self._rng = _generator(seed)

    def order(self, engine: Engine, fit: npt.NDArray[np.bool_], match: LayerMatch) -> Slots:
        by_name = engine.name_order()
        return self._rng.permutation(by_name[fit[by_name]])


class BinpackPolicy:
    """Most allocated first (fill nodes up before opening new ones); ties by node name."""

    name = "binpack"

    def order(self, engine: Engine, fit: npt.NDArray[np.bool_], match: LayerMatch) -> Slots:
        return _by_keys(engine, fit, -allocation(engine))


class SpreadPolicy:
    """Least allocated first (keep nodes evenly filled); ties by node name."""

    name = "spread"

    def order(self, engine: Engine, fit: npt.NDArray[np.bool_], match: LayerMatch) -> Slots:
        return _by_keys(engine, fit, allocation(engine))


def kube_image_locality(engine: Engine, layers: Sequence[Layer], total_nodes: int) -> Ints:
    """Per slot, kube-scheduler's ImageLocality score (0..100) with layers as its images.

    For a one-container pod, with ``present(n)`` the request's layers on node ``n`` (mounted
    or cached: kubelet lists every image still on disk, in use or not) and ``holders(L)`` the
    number of nodes on which layer ``L`` is present::

        sum(n)   = Σ_{L ∈ present(n)} ⌊size(L) · holders(L) / total_nodes⌋
        clamped  = min(max(sum(n), 23 MiB), 1000 MiB)
        score(n) = ⌊100 · (clamped − 23 MiB) / (1000 MiB − 23 MiB)⌋

    The ``holders/total`` factor is kube's "spread": a layer present on few nodes earns little,
    so one node holding a rare image does not attract everything.
    """
    n = engine.size
    total = np.zeros(n, dtype=np.int64)
    if total_nodes <= 0:
        return total
    for layer in layers:
        present = np.union1d(engine.mounted.holders(layer.id), engine.cached.holders(layer.id))
        if present.size:
            total[present] += int(layer.size * (present.size / total_nodes))
    clamped = np.clip(total, KUBE_MIN_THRESHOLD, KUBE_MAX_CONTAINER_THRESHOLD)
    span = KUBE_MAX_CONTAINER_THRESHOLD - KUBE_MIN_THRESHOLD
    return (KUBE_MAX_NODE_SCORE * (clamped - KUBE_MIN_THRESHOLD)) // span


def kube_least_allocated(engine: Engine) -> Ints:
    """Per slot, kube-scheduler's NodeResourcesLeastAllocated score (0..100).

    Kubernetes scores each resource ``⌊(capacity − requested) · 100 / capacity⌋`` and takes
    the weighted mean (weights 1) over CPU and memory requests.  A berth snapshot carries
    requests (hard reservations) for memory and disk, so those two stand in::

        score(n) = ⌊(⌊100 · mem_free / mem_max⌋ + ⌊100 · disk_free / disk_max⌋) / 2⌋

    (a resource with a zero maximum is skipped, as kube skips zero allocatable).
    """
    n = engine.size
    scores = np.zeros(n, dtype=np.int64)
    weights = np.zeros(n, dtype=np.int64)
    for resource in ("mem", "disk"):
        free = engine.columns[f"{resource}_free"][:n]
        total = engine.columns[f"{resource}_max"][:n]
        known = total > 0
        per = np.zeros(n, dtype=np.int64)
        np.floor_divide(free * KUBE_MAX_NODE_SCORE, total, out=per, where=known)
        scores += np.where(known, per, 0)
        weights += known
    out = np.zeros(n, dtype=np.int64)
    np.floor_divide(scores, weights, out=out, where=weights > 0)
    return out


class KubePolicy:
    """Kubernetes-style: ImageLocality + NodeResourcesLeastAllocated, equal weights.

    ``score(n) = image_locality(n) + least_allocated(n)`` (each 0..100, see
    :func:`kube_image_locality` and :func:`kube_least_allocated`), highest first.  Like
    kube-scheduler's ``selectHost``, which picks uniformly among the nodes sharing the top
    score, ties are broken at random — by a generator seeded at construction.
    """

    name = "kube"

    def __init__(self, seed: SeedLike = 0) -> None:
        self._rng = _generator(seed)

    def scores(self, engine: Engine, layers: Sequence[Layer]) -> Ints:
        """Per slot, the combined score (0..200)."""
        return kube_image_locality(engine, layers, len(engine)) + kube_least_allocated(engine)

    def order(self, engine: Engine, fit: npt.NDArray[np.bool_], match: LayerMatch) -> Slots:
        by_name = engine.name_order()
        slots = self._rng.permutation(by_name[fit[by_name]])
        if not slots.size:
            return slots
        return slots[np.argsort(-self.scores(engine, match.layers)[slots], kind="stable")]


class BerthPolicy:
    """Bytes the node would not have to pull, plus the room it keeps, priced by scarcity.

    For each fitting node ``n``::

        local(n) = Σ size(L) over the request's layers mounted on n
                   + cached_weight · Σ size(L) over those in n's layer cache
        room(n)  = mem_free(n) · (1 − u_n),      u_n ~ U[0, jitter)   (u_n = 0 if jitter = 0)
        price    = room_price · U / (1 − U),     U = cluster memory utilisation (snapshot)
        score(n) = local(n) + price · room(n)                         (bytes)

    ordered by ``⌊score / tolerance_bytes⌋`` desc, then ``room`` desc, then node name.

    *Why each term* — measured with ``berth sim`` on Docker Hub layers, seeds 0–2: the default
    scenario (100 nodes, 2,000 requests, moderate load), an overload one (``--rate 20
    --requests 12000``, ~37 % refused) and a stale one (``--concurrency 4 --staleness 5``):

    * **Cached layers count like mounted ones** (``cached_weight = 1``): either way nothing is
      pulled, and pulling is what costs.  Ignoring them pulled 4–12 % more bytes.
    * **Room, in absolute bytes.**  The node that first receives an image is where its later
      replicas find it, so it should be the one with the most room for them — an empty 16 GiB
      node, not an empty 4 GiB one.  Breaking ties by *allocated fraction* instead pulled
      1.1–1.5× more; best fit (least room first) pulled ~4× more.
    * **Room has a price that rises with scarcity.**  At moderate load room is plentiful, the
      price is small and locality decides (``room_price = 0.025`` values 1 GiB of free memory
      at ~11 MB of pulls when U = 0.3); as the cluster fills, ``U / (1 − U)`` grows and
      keeping room open — for requests that would otherwise be refused — outweighs a pull
      (1 GiB ≈ 240 MB at U = 0.9).  Without the room term, or with a fixed price low enough
      for moderate load (0.01), the policy refused 0.5–6 % more requests than ``kube`` under
      overload; a fixed price high enough for overload (0.1) pulled 1.3–1.5× more at moderate
      load.  The scarcity price refused fewer than ``kube`` on every seed tried (0–5), for
      5–8 % more bytes at moderate load than the best fixed price.
    * ``tolerance_bytes`` (default 1 MiB) makes near-equal scores equal, so a few stray bytes
      (a 32-byte empty layer) do not beat a roomier node.
    * ``jitter`` (default 0.2) discounts each node's room by a pseudo-random share below 20 %:
      concurrent schedulers working from the same stale snapshot then spread over nodes of
      near-equal room instead of all confirming on the same one.  With 4 schedulers 5 s stale
      it cut refusals at confirmation from 16/11/16 to 6/3/6 and bytes by 5–10 %; with one
      scheduler it costs ≤ 4 % of bytes.  The share is a function of the policy's seed, the
      request's layer ids and the node's position in name order — not of a stream consumed
      per call — so asking :meth:`~berth.scheduler.multinode.ClusterScheduler.explain` about a
      request reproduces the ranking its placement used, and schedulers seeded differently
      draw differently.
    """

    name = "berth"

    def __init__(
        self,
        seed: SeedLike = 0,
        *,
        cached_weight: float = 1.0,
        room_price: float = 0.025,
        tolerance_bytes: int = _MiB,
        jitter: float = 0.2,
    ) -> None:
        if not 0 <= cached_weight <= 1:
            raise Invalid(f"must be between 0 and 1, got {cached_weight}", field="cached_weight")
        if not room_price >= 0:
            raise Invalid(f"must not be negative, got {room_price}", field="room_price")
        if tolerance_bytes < 1:
            raise Invalid(f"must be at least 1 byte, got {tolerance_bytes}", field="tolerance")
        if not 0 <= jitter < 1:
            raise Invalid(f"must be in [0, 1), got {jitter}", field="jitter")
        self.cached_weight = cached_weight
        self.room_price = room_price
        self.tolerance_bytes = tolerance_bytes
        self.jitter = jitter
        self._salt = int(_generator(seed).integers(2**63))

    def local_bytes(self, engine: Engine, match: LayerMatch) -> Floats:
        """Per slot, mounted bytes plus ``cached_weight`` × cached bytes of the request."""
        local = match.colocated.astype(np.float64)
        if self.cached_weight and match.layers:
            local += self.cached_weight * engine.cached.scores(match.layers, engine.size)
        return local

    def price(self, engine: Engine) -> float:
        """Layer bytes one byte of free memory is worth now: ``room_price · U / (1 − U)``."""
        n = engine.size
        alive = engine.alive[:n]
        total = float(engine.columns["mem_max"][:n][alive].sum())
        if not self.room_price or total <= 0:
            return 0.0
        used = 1.0 - float(engine.columns["mem_free"][:n][alive].sum()) / total
        used = min(max(used, 0.0), 0.999)  # a full cluster prices room high, not infinitely
        return self.room_price * used / (1.0 - used)

    def _noise(self, engine: Engine, layers: Sequence[Layer]) -> Floats:
        """Per slot, a uniform draw in [0, 1) fixed by (seed, layer ids, node's name rank)."""
        digest = zlib.crc32("\0".join(layer.id for layer in layers).encode())
        rng = np.random.default_rng([self._salt, digest])
        by_rank = rng.random(len(engine))
        rank = np.minimum(engine.name_rank()[: engine.size], len(engine) - 1)
        noise: Floats = by_rank[rank] if len(engine) else np.zeros(engine.size)
        return noise

    def order(self, engine: Engine, fit: npt.NDArray[np.bool_], match: LayerMatch) -> Slots:
        room = engine.columns["mem_free"][: engine.size].astype(np.float64)
        if self.jitter:
            room *= 1.0 - self.jitter * self._noise(engine, match.layers)
        score = self.local_bytes(engine, match) + self.price(engine) * room
        return _by_keys(engine, fit, -np.floor(score / self.tolerance_bytes), -room)


PolicyFactory = Callable[[SeedLike], Policy]


def _seed(_: SeedLike = None) -> Policy:
    return SEED


POLICIES: Mapping[str, PolicyFactory] = MappingProxyType(
    {
        "seed": _seed,
        "random": RandomPolicy,
        "binpack": lambda _: BinpackPolicy(),
        "spread": lambda _: SpreadPolicy(),
        "kube": KubePolicy,
        "berth": BerthPolicy,
    }
)
"""Policy name → factory taking a seed (an int, a ``Generator`` or ``None``)."""


def policy(name: str, seed: SeedLike = 0) -> Policy:
    """A fresh policy called ``name``; ``Invalid`` (field ``policy``) lists the valid names."""
    try:
        factory = POLICIES[name]
    except (KeyError, TypeError):
        raise Invalid(
            f"unknown policy {name!r}; valid policies: {', '.join(POLICIES)}", field="policy"
        ) from None
    return factory(seed)
