"""Placement policies: how the nodes that passed the filter are ordered, and which exist.

Following kube-scheduler's split, *filtering* ("can this node run it?") is the ranker's —
the seed's ``fits`` and the platform — and never varies; a *policy* only answers "how good
is it?" by ordering the fitting nodes.  A new rule is a new scorer or policy, not an edit
inside a ranker.  Every ranker (:class:`~berth.scheduler.engine.Engine`,
:class:`~berth.scheduler.reference.ReferenceRanker`) takes any policy:
``rank(spec, layers, platforms, policy)``.

* :mod:`~berth.scheduler.policy.base` — the extension point: the read-only
  :class:`ClusterView` and :class:`PlacementRequest` a policy sees, the :class:`Policy` and
  :class:`Scorer` protocols, and :class:`Weighted` (Σ weight · score);
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
    "Weighted",
    "policy",
]
