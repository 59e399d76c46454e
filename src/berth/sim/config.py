"""The knobs of one simulation: the cluster it builds, its network and disks, its schedulers.

This module owns :class:`SimConfig` — everything that decides a simulation besides the policy
— and the defaults a run gets when it does not say: the node size classes
(:data:`DEFAULT_NODE_CLASSES`), the platform mix (:data:`DEFAULT_NODE_PLATFORMS`) and the
workload (:data:`DEFAULT_WORKLOAD`), with the ceilings on what one simulation may build.  The
values are validated once, here; what they mean is modelled elsewhere: the nodes in
:mod:`berth.sim.cluster`, the pulls in :mod:`berth.sim.pulls`, schedulers and events in
:mod:`berth.sim.simulator`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import Field, Strict, StrictBool, StrictInt, field_validator, model_validator

from berth.errors import Invalid
from berth.model import Bytes, BytesPerSecond
from berth.model import Seconds as Delay
from berth.node.classes import SIMULATED_CLASSES, NodeClass
from berth.platform import Platform
from berth.sim.workload import WorkloadConfig
from berth.validation import BerthModel

__all__ = [
    "DEFAULT_NODE_CLASSES",
    "DEFAULT_NODE_PLATFORMS",
    "DEFAULT_WORKLOAD",
    "MAX_CONCURRENCY",
    "MAX_SAMPLES",
    "MAX_SIM_NODES",
    "SimConfig",
]

MAX_SIM_NODES = 10_000
"""The most nodes one simulation builds."""
MAX_CONCURRENCY = 64
"""The most concurrent schedulers one simulation runs."""
MAX_SAMPLES = 10_000
"""The most utilisation samples one simulation records."""


DEFAULT_NODE_CLASSES: tuple[NodeClass, ...] = SIMULATED_CLASSES
"""Three sizes, half of them small, memory what fills first
(:data:`berth.node.classes.SIMULATED_CLASSES`, beside every other cluster's table)."""

DEFAULT_NODE_PLATFORMS: Mapping[str, float] = {
    "linux/amd64": 0.92,
    "linux/arm64/v8": 0.04,
    "windows/amd64": 0.04,
}
"""Mostly linux/amd64, as the dataset's pulls are; images for platforms no node runs
(linux/ppc64le, linux/mips64le, linux/s390x, linux/386 in the Docker Hub data: ~0.2 % of
pulls) end in ``NoMatchingPlatform`` and are counted as such."""

DEFAULT_WORKLOAD = WorkloadConfig(requests=2000, rate=2.0, lifetime_mean=300.0)
"""2,000 requests at 2 a second, each living 5 minutes on average."""


class SimConfig(BerthModel):
    """Everything that decides a simulation besides the policy; see the module docstring.

    ``cache_fraction`` of each node's disk is its layer cache (``cache_bytes``, when set: the
    same size on every node), charged against the disk workloads may reserve;
    ``pull_bandwidth`` a node's link, shared by its concurrent pulls; ``registry_bandwidth``
    the registry's, shared by every node; ``layer_latency`` the round trip before a layer's
    transfer; ``unpack_bandwidth`` the rate a node unpacks at; ``preseed_layers`` how many of
    the most used layers every node starts with in its cache; ``refusal_rtt`` what a refusal
    at confirmation costs and ``max_refusals`` after how many a placement gives up;
    ``boot_seconds`` a fixed boot time added to every start; ``samples`` how many evenly
    spaced utilisation samples cover the arrival window; ``seed`` draws the node layout and
    seeds the policies (the workload has its own seed); ``zones`` > 0 labels node ``i``
    ``zone=z<i mod zones>`` (for requests that spread over zones; 0: no label).
    """

    nodes: Annotated[StrictInt, Field(ge=1, le=MAX_SIM_NODES)] = 100
    node_classes: Annotated[tuple[NodeClass, ...], Field(min_length=1, max_length=64)] = (
        DEFAULT_NODE_CLASSES
    )
    node_platforms: Annotated[
        dict[str, Annotated[float, Strict(), Field(ge=0, le=1e6, allow_inf_nan=False)]],
        Field(max_length=64),
    ] = Field(default_factory=lambda: dict(DEFAULT_NODE_PLATFORMS))
    cache_bytes: Bytes | None = None
    cache_fraction: Annotated[float, Strict(), Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0625
    pull_bandwidth: Annotated[BytesPerSecond, Field(gt=0)] = 125_000_000
    registry_bandwidth: Annotated[BytesPerSecond, Field(gt=0)] = 2_500_000_000
    layer_latency: Delay = 0.02
    unpack_bandwidth: Annotated[BytesPerSecond, Field(gt=0)] = 500_000_000
    preseed_layers: Annotated[StrictInt, Field(ge=0, le=1024)] = 0
    refusal_rtt: Delay = 0.002
    max_refusals: Annotated[StrictInt, Field(ge=1, le=MAX_SIM_NODES)] = 8
    boot_seconds: Delay = 0.125
    concurrency: Annotated[StrictInt, Field(ge=1, le=MAX_CONCURRENCY)] = 1
    staleness: Delay = 0.0
    assume: StrictBool = True
    samples: Annotated[StrictInt, Field(ge=1, le=MAX_SAMPLES)] = 200
    seed: Annotated[StrictInt, Field(ge=0, le=2**64 - 1)] = 0
    zones: Annotated[StrictInt, Field(ge=0, le=MAX_SIM_NODES)] = 0
    workload: WorkloadConfig = DEFAULT_WORKLOAD

    @field_validator("node_platforms")
    @classmethod
    def _platforms(cls, mix: dict[str, float]) -> dict[str, float]:
        if not mix:
            raise Invalid("must name at least one platform")
        normal: dict[str, float] = {}
        for text, weight in mix.items():
            if not weight >= 0:
                raise Invalid(f"weights must not be negative, got {weight!r} for {text!r}")
            key = str(Platform.parse(text, field="node_platforms"))
            normal[key] = normal.get(key, 0.0) + float(weight)
        if not sum(normal.values()) > 0:
            raise Invalid(f"at least one weight must be positive, got {mix}")
        return normal

    @field_validator("node_classes")
    @classmethod
    def _classes(cls, classes: tuple[NodeClass, ...]) -> tuple[NodeClass, ...]:
        if not sum(node_class.weight for node_class in classes) > 0:
            raise Invalid("at least one node class must have a positive weight")
        if len({node_class.name for node_class in classes}) != len(classes):
            raise Invalid("node class names must be unique")
        return classes

    @model_validator(mode="after")
    def _cache_fits(self) -> SimConfig:
        if self.cache_bytes is not None:
            smallest = min(self.node_classes, key=lambda node_class: node_class.disk)
            if self.cache_bytes >= smallest.disk:
                raise Invalid(
                    f"must be smaller than every node's disk; class {smallest.name!r} has "
                    f"{smallest.disk} bytes, got {self.cache_bytes}",
                    field="cache_bytes",
                )
        return self

    def cache_of(self, node_class: NodeClass) -> int:
        """The layer cache of a node of ``node_class``, in bytes (class docstring)."""
        if self.cache_bytes is not None:
            return min(self.cache_bytes, node_class.disk)
        return int(self.cache_fraction * node_class.disk)
