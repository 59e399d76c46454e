"""The registry of named policies: what ``berth sim --policy NAME`` and configuration accept.

Each name maps to a factory taking a seed (an int, a ``Generator`` or ``None``), because a
simulation gives every scheduler its own seeded instance; deterministic policies ignore it.
The order of :data:`POLICIES` is the order ``berth sim`` reports them in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from berth.errors import Invalid
from berth.scheduler.policy.base import Policy, SeedLike
from berth.scheduler.policy.baselines import BinpackPolicy, LeastAllocatedPolicy, RandomPolicy
from berth.scheduler.policy.berth import BerthPolicy
from berth.scheduler.policy.kube import KubePolicy
from berth.scheduler.policy.seed import SEED

__all__ = ["POLICIES", "PolicyFactory", "policy", "policy_name"]

PolicyFactory = Callable[[SeedLike], Policy]


def _seed(_: SeedLike = None) -> Policy:
    return SEED


POLICIES: Mapping[str, PolicyFactory] = MappingProxyType(
    {
        "seed": _seed,
        "random": RandomPolicy,
        "binpack": lambda _: BinpackPolicy(),
        "spread": lambda _: LeastAllocatedPolicy(),
        "kube": KubePolicy,
        "berth": BerthPolicy,
    }
)
"""Policy name → factory taking a seed (an int, a ``Generator`` or ``None``)."""


def policy_name(name: str, *, field: str = "policy") -> str:
    """``name`` when a policy is registered under it; ``Invalid`` (naming ``field``) lists the
    valid names."""
    if not isinstance(name, str) or name not in POLICIES:
        raise Invalid(
            f"unknown policy {name!r}; valid policies: {', '.join(POLICIES)}", field=field
        )
    return name


def policy(name: str, seed: SeedLike = 0) -> Policy:
    """A fresh policy called ``name``; ``Invalid`` (field ``policy``) lists the valid names."""
    return POLICIES[policy_name(name)](seed)
