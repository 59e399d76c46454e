"""Placement policies: how the nodes that passed the filter are ordered, and which exist.

Following kube-scheduler's split, *filtering* ("can this node run it?") is the ranker's —
the table of checks (:data:`berth.checks.CHECKS`: the seed's ``fits`` and the platform) — and
never varies, or a :class:`berth.checks.Filter` the scheduler applies after it (a hard
spread); a *policy* only answers "how good is it?" by ordering the fitting nodes, and a
:class:`Tier` sets some of them back after it (a soft spread).  A new rule is a new
filter, scorer, tier or policy, not an edit inside a ranker or the scheduler's walk.
Every ranker (:class:`~berth.scheduler.engine.Engine`,
:class:`~berth.scheduler.reference.ReferenceRanker`) takes any policy:
``rank(spec, layers, platforms, policy)``.

* :mod:`~berth.scheduler.policy.base` — the extension point: the read-only
  :class:`ClusterView` and :class:`PlacementRequest` a policy sees, the :class:`Policy` and
  :class:`Scorer` protocols, :class:`Weighted` (Σ weight · score), and :class:`Tier`, the
  scorer over node names applied after the policy (a soft spread);
* :mod:`~berth.scheduler.policy.seed` — ``SEED``, the seed's ordering and every ranker's
  default, with the engine's fast path for it;
* :mod:`~berth.scheduler.policy.baselines` — ``random``, ``binpack``, ``spread``;
* :mod:`~berth.scheduler.policy.kube` — ``kube``: ImageLocality + LeastAllocated;
* :mod:`~berth.scheduler.policy.berth` — ``berth``: local bytes plus room priced by scarcity;
* :mod:`~berth.scheduler.policy.registry` — :data:`POLICIES` and :func:`policy` by name.

Nothing here imports a ranker, so the engine imports this package without a cycle.
"""

from berth.scheduler.policy.base import (
    ClusterView,
    LayerHolders,
    PlacementRequest,
    Policy,
    Scorer,
    SeedLike,
    Slots,
    Tier,
    Weighted,
)
from berth.scheduler.policy.baselines import (
    Allocated,
    BinpackPolicy,
    LeastAllocatedPolicy,
    RandomPolicy,
)
from berth.scheduler.policy.berth import BerthPolicy
from berth.scheduler.policy.kube import ImageLocality, KubePolicy, LeastAllocated
from berth.scheduler.policy.registry import POLICIES, PolicyFactory, policy
from berth.scheduler.policy.seed import SEED, SeedPolicy

__all__ = [
    "POLICIES",
    "SEED",
    "Allocated",
    "BerthPolicy",
    "BinpackPolicy",
    "ClusterView",
    "ImageLocality",
    "KubePolicy",
    "LayerHolders",
    "LeastAllocated",
    "LeastAllocatedPolicy",
    "PlacementRequest",
    "Policy",
    "PolicyFactory",
    "RandomPolicy",
    "Scorer",
    "SeedLike",
    "SeedPolicy",
    "Slots",
    "Tier",
    "Weighted",
    "policy",
]
