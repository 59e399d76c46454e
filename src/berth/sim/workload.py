"""Seeded, reproducible workloads: which image arrives when, at what size, for how long.

This module owns turning a :class:`WorkloadConfig` and an image :class:`~berth.dataset.Dataset`
into a list of :class:`Arrival` values — the input of the simulator.  It does not place,
admit or time anything; it only draws.  Workloads are synthetic on purpose (a real arrival
trace with matching layer data does not exist publicly), but every image, layer and size in
them is real Docker Hub data, so layer sharing between requests is measured, not invented.

**Reproducibility.**  ``np.random.default_rng(seed)`` is spawned into four independent
streams — arrival times, images, instance types, lifetimes — so the same seed gives the same
arrivals, and changing one knob (say ``arrival="bursty"``) leaves the other draws untouched:
two runs compared in an experiment share their image sequence (common random numbers).

**Arrival processes** (``rate`` = λ, the long-run mean arrivals per second):

* ``poisson`` — inter-arrival gaps are i.i.d. ``Exp(mean 1/λ)``.
* ``bursty`` — a two-state Markov-modulated Poisson process (on/off MMPP).  A hidden state
  alternates between *calm* and *burst*; within a state arrivals are Poisson.  With burst
  factor ``k`` (``burst_factor``) and burst fraction ``f`` (``burst_fraction``, the long-run
  share of *time* spent bursting)::

      λ_calm  = λ / (1 − f + f·k)        λ_burst = k · λ_calm     (so the mean rate is λ)
      burst duration ~ Exp(mean D_b),    D_b = burst_length / λ
      calm duration  ~ Exp(mean D_c),    D_c = D_b · (1 − f) / f

  ``burst_length`` is measured in mean inter-arrival times, so the shape of the workload does
  not change with its rate.  The first state is drawn from the stationary distribution
  (burst with probability ``f``).  With the defaults (k = 10, f = 0.1) bursts take 10 % of the
  time and carry ``f·k / (1 − f + f·k)`` ≈ 53 % of the arrivals; ``k = 1`` is plain Poisson.

**Popularity.**  Image ``i`` is drawn with probability ∝ ``pull_count_i ** flatten``:
``flatten = 1`` is proportional to Docker Hub pulls (heavy-tailed: the top five images take
≈ 37 %), ``flatten = 0`` is uniform over images, values between soften the skew.

**Sizes and lifetimes.**  Each arrival's instance type is drawn from the ``instance_types``
mix (name → relative weight; default mostly small types).  Lifetimes are ``exponential`` with
mean ``lifetime_mean`` seconds, or ``lognormal`` with the same mean and shape ``σ`` =
``lifetime_sigma`` (underlying normal ``N(μ, σ²)`` with ``μ = ln(mean) − σ²/2``).

Each arrival's :class:`~berth.model.Request` is ``namespace/<image name>/<replica>``, where
``replica`` counts earlier arrivals of the same image (0, 1, 2, …), ``platforms`` is the
image's one platform, ``spec`` the instance type's and ``layers`` the image's layers.

**Multi-platform requests.**  With ``multi_platform`` (say ``linux/amd64, linux/arm64/v8``)
and ``multi_platform_share`` = s, each image built for one of those platforms is, with
probability s (drawn once per image from a fifth stream, so the other draws do not move),
treated as a multi-arch image: its request lists every platform of ``multi_platform``, and
for each platform other than the image's own, a **synthetic** variant with new layer ids
and the same sizes (:func:`berth.dataset.synthetic_variant`; ids start ``synthetic:``) —
the data has one platform per image, and a real multi-arch image's variants do not share
digests.  The request's ``layers`` list every variant's layers (a node of one platform only
ever holds that platform's, so colocation on it counts exactly its variant's bytes);
:meth:`Arrival.layers_on` says which layers a node of a given platform mounts.

**Bounds.**  At most :data:`MAX_REQUESTS` arrivals, a rate from :data:`MIN_RATE` to
:data:`MAX_RATE` per second, lifetimes from 1 ms to a year, finite numbers everywhere and no
booleans where numbers belong: a config that would take hours or all memory to draw, or
yield infinite times, is ``Invalid`` when built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, Strict, StrictInt, field_validator

from berth.dataset import Dataset, Image, load_dockerhub, synthetic_variant
from berth.errors import Invalid
from berth.model import INSTANCE_TYPES, Fraction, Interval, Layer, Name, Request
from berth.platform import Platform
from berth.validation import BerthModel, shown

__all__ = [
    "DEFAULT_INSTANCE_MIX",
    "MAX_RATE",
    "MAX_REQUESTS",
    "MIN_RATE",
    "Arrival",
    "WorkloadConfig",
    "generate_workload",
    "popularity",
]

DEFAULT_INSTANCE_MIX: Mapping[str, float] = MappingProxyType(
    {"micro": 0.30, "milli": 0.30, "centi": 0.20, "deci": 0.15, "base": 0.05}
)
"""The default instance-type mix: mostly small microVMs and function replicas."""

MAX_REQUESTS = 1_000_000
"""The most arrivals one workload draws."""
MIN_RATE = 1e-6
"""The lowest arrival rate, per second (one a fortnight)."""
MAX_RATE = 1e6
"""The highest arrival rate, per second."""

Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Weight = Annotated[float, Strict(), Field(ge=0, le=1e6, allow_inf_nan=False)]


class WorkloadConfig(BerthModel):
    """Everything that decides a workload; the same config always yields the same arrivals.

    See the module docstring for the arrival, popularity and lifetime models.
    ``platforms`` restricts the images to those built for one of them (empty means any).
    """

    requests: Annotated[StrictInt, Field(ge=0, le=MAX_REQUESTS)] = 1000
    rate: Annotated[float, Strict(), Field(ge=MIN_RATE, le=MAX_RATE, allow_inf_nan=False)] = 1.0
    arrival: Literal["poisson", "bursty"] = "poisson"
    burst_factor: Annotated[float, Strict(), Field(ge=1, le=1e3, allow_inf_nan=False)] = 10.0
    burst_fraction: Annotated[float, Strict(), Field(gt=0, lt=1, allow_inf_nan=False)] = 0.1
    burst_length: Annotated[float, Strict(), Field(ge=1, le=1e6, allow_inf_nan=False)] = 50.0
    flatten: Fraction = 1.0
    instance_types: dict[str, Weight] = Field(default_factory=lambda: dict(DEFAULT_INSTANCE_MIX))
    lifetime: Literal["exponential", "lognormal"] = "exponential"
    lifetime_mean: Interval = 300.0
    lifetime_sigma: Annotated[float, Strict(), Field(gt=0, le=5, allow_inf_nan=False)] = 1.0
    platforms: tuple[Platform, ...] = ()
    multi_platform: Annotated[tuple[Platform, ...], Field(max_length=8)] = ()
    multi_platform_share: Fraction = 0.0
    namespace: Name = "sim"
    seed: Annotated[StrictInt, Field(ge=0, le=2**64 - 1)] = 0

    @field_validator("instance_types")
    @classmethod
    def _known_types(cls, mix: dict[str, float]) -> dict[str, float]:
        if not mix:
            raise Invalid("must name at least one instance type")
        for name in mix:
            if name not in INSTANCE_TYPES:
                raise Invalid(
                    f"unknown instance type {shown(name)}; valid types: "
                    + ", ".join(INSTANCE_TYPES)
                )
        if not sum(mix.values()) > 0:
            raise Invalid(f"at least one weight must be positive, got {mix}")
        return mix


class Arrival(BerthModel):
    """One request arriving at simulated time ``at`` (seconds) and living ``lifetime`` seconds.

    ``image`` and ``instance_type`` name what was drawn; ``request`` is what a scheduler sees.
    ``variants`` (multi-platform requests only, module docstring) maps each platform to the
    layers a node of that platform mounts; empty means ``request.layers`` everywhere.
    """

    at: Seconds
    request: Request
    lifetime: Seconds
    image: Name
    instance_type: Name
    variants: tuple[tuple[Platform, tuple[Layer, ...]], ...] = ()

    def layers_on(self, platform: Platform | str) -> tuple[Layer, ...]:
        """The layers a node running ``platform`` mounts for this request."""
        if not self.variants:
            return self.request.layers
        wanted = platform if isinstance(platform, Platform) else Platform.parse(platform)
        for variant, layers in self.variants:
            if variant.matches(wanted) or wanted.matches(variant):
                return layers
        return self.variants[0][1]

    @property
    def departs(self) -> float:
        """When the workload ends: ``at + lifetime``."""
        return self.at + self.lifetime


def popularity(images: Sequence[Image], flatten: float = 1.0) -> npt.NDArray[np.float64]:
    """Each image's draw probability, ∝ ``pull_count ** flatten`` (``0 ** 0`` counts as 1).

    ``Invalid`` (field ``flatten``) when ``flatten`` is outside [0, 1] or every weight is 0.
    """
    if not 0 <= flatten <= 1:
        raise Invalid(f"must be between 0 and 1, got {flatten!r}", field="flatten")
    if not images:
        raise Invalid("there are no images to draw from", field="images")
    pulls = np.array([image.pull_count for image in images], dtype=np.float64)
    weights = np.power(pulls, flatten)
    total = weights.sum()
    if not total > 0:
        raise Invalid("every image has pull_count 0; only flatten=0 can draw", field="flatten")
    return np.asarray(weights / total, dtype=np.float64)


def generate_workload(
    config: WorkloadConfig | None = None, dataset: Dataset | None = None
) -> list[Arrival]:
    """Draw ``config.requests`` arrivals, in time order, from ``dataset`` (default: Docker Hub).

    Deterministic: equal configs and datasets give equal lists.  ``Invalid`` when no image is
    left to draw from (field ``platforms`` after the platform restriction, ``images`` for an
    empty dataset) or no image has a positive weight (field ``flatten``).
    """
    config = WorkloadConfig() if config is None else config
    dataset = (load_dockerhub() if dataset is None else dataset).on_platforms(config.platforms)
    images = dataset.images
    probabilities = popularity(images, config.flatten)
    type_names = list(config.instance_types)
    type_weights = np.array([config.instance_types[name] for name in type_names])
    streams = np.random.default_rng(config.seed).spawn(5)
    times_rng, images_rng, types_rng, lifetimes_rng, multi_rng = streams
    multi = _multi_platform_variants(config, images, multi_rng)

    count = config.requests
    times = _arrival_times(config, times_rng)
    image_indices = images_rng.choice(len(images), size=count, p=probabilities)
    type_indices = types_rng.choice(
        len(type_names), size=count, p=type_weights / type_weights.sum()
    )
    lifetimes = _lifetimes(config, lifetimes_rng)

    replicas: dict[str, int] = {}
    arrivals: list[Arrival] = []
    for at, image_index, type_index, lifetime in zip(
        times.tolist(),
        image_indices.tolist(),
        type_indices.tolist(),
        lifetimes.tolist(),
        strict=True,
    ):
        image = images[image_index]
        type_name = type_names[type_index]
        replica = replicas.get(image.name, 0)
        replicas[image.name] = replica + 1
        variants = multi.get(image_index, ())
        request = Request(
            namespace=config.namespace,
            name=image.name,
            replica=replica,
            platforms=tuple(p for p, _ in variants) or (image.platform,),
            spec=INSTANCE_TYPES[type_name],
            layers=tuple(layer for _, layers in variants for layer in layers) or image.layers,
        )
        arrivals.append(
            Arrival(
                at=at,
                request=request,
                lifetime=lifetime,
                image=image.name,
                instance_type=type_name,
                variants=variants,
            )
        )
    return arrivals


def _multi_platform_variants(
    config: WorkloadConfig, images: Sequence[Image], rng: np.random.Generator
) -> dict[int, tuple[tuple[Platform, tuple[Layer, ...]], ...]]:
    """Image index → its per-platform layers, for the images drawn as multi-arch."""
    platforms = tuple(dict.fromkeys(config.multi_platform))
    if len(platforms) < 2 or not config.multi_platform_share:
        return {}
    chosen = rng.random(len(images)) < config.multi_platform_share
    return {
        index: tuple((p, synthetic_variant(image, p).layers) for p in platforms)
        for index, image in enumerate(images)
        if chosen[index] and image.platform in platforms
    }


def _arrival_times(config: WorkloadConfig, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """``config.requests`` increasing arrival times in seconds (see the module docstring)."""
    count = config.requests
    if config.arrival == "poisson":
        return np.cumsum(rng.exponential(1 / config.rate, size=count))
    k, f = config.burst_factor, config.burst_fraction
    calm_rate = config.rate / (1 - f + f * k)
    burst_seconds = config.burst_length / config.rate
    calm_seconds = burst_seconds * (1 - f) / f
    chunks: list[npt.NDArray[np.float64]] = []
    drawn, start = 0, 0.0
    bursting = bool(rng.random() < f)
    while drawn < count:
        duration = rng.exponential(burst_seconds if bursting else calm_seconds)
        # Given N ~ Poisson(λ·T) arrivals in a sojourn of length T, their times are N sorted
        # uniforms on it: exact for a Poisson process, and one NumPy call per sojourn.
        arrivals = rng.poisson((calm_rate * k if bursting else calm_rate) * duration)
        chunks.append(start + np.sort(rng.uniform(0.0, duration, size=arrivals)))
        drawn += arrivals
        start += duration
        bursting = not bursting
    return np.concatenate(chunks)[:count] if chunks else np.zeros(0)


def _lifetimes(config: WorkloadConfig, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """``config.requests`` lifetimes in seconds with mean ``config.lifetime_mean``."""
    if config.lifetime == "exponential":
        return rng.exponential(config.lifetime_mean, size=config.requests)
    sigma = config.lifetime_sigma
    mu = math.log(config.lifetime_mean) - sigma**2 / 2
    return rng.lognormal(mu, sigma, size=config.requests)
