"""The seeded workload generator: determinism, the statistics it promises, bad configs.

Statistical checks use fixed seeds (so they cannot flake) and tolerances several standard
errors wide (so they still hold if the drawing code changes how it consumes randomness).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from berth import INSTANCE_TYPES, Invalid, Platform, Request
from berth.dataset import Dataset, Image, load_dockerhub
from berth.sim.workload import (
    DEFAULT_INSTANCE_MIX,
    Arrival,
    WorkloadConfig,
    generate_workload,
    popularity,
)

N = 4000


@pytest.fixture(scope="module")
def poisson() -> list[Arrival]:
    return generate_workload(WorkloadConfig(requests=N, rate=4.0, seed=7))


@pytest.fixture(scope="module")
def bursty() -> list[Arrival]:
    config = WorkloadConfig(requests=N, rate=4.0, arrival="bursty", burst_length=5, seed=7)
    return generate_workload(config)


def _times(arrivals: list[Arrival]) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.array([arrival.at for arrival in arrivals])


def _dispersion(arrivals: list[Arrival], window: float) -> float:
    """Variance / mean of arrival counts per window: 1 for Poisson, larger when bursty."""
    counts = np.bincount((_times(arrivals) // window).astype(int))
    return float(counts.var() / counts.mean())


def test_same_seed_same_arrivals() -> None:
    config = WorkloadConfig(requests=200, arrival="bursty", lifetime="lognormal", seed=3)
    assert generate_workload(config) == generate_workload(
        WorkloadConfig.from_json(config.to_json())
    )


def test_different_seed_different_arrivals() -> None:
    first = generate_workload(WorkloadConfig(requests=200, seed=1))
    second = generate_workload(WorkloadConfig(requests=200, seed=2))
    assert [a.at for a in first] != [a.at for a in second]
    assert [a.image for a in first] != [a.image for a in second]


def test_arrival_process_does_not_disturb_the_other_draws(
    poisson: list[Arrival], bursty: list[Arrival]
) -> None:
    # Independent streams per quantity: experiments that change one knob share the rest.
    assert [a.image for a in poisson] == [a.image for a in bursty]
    assert [a.instance_type for a in poisson] == [a.instance_type for a in bursty]
    assert [a.lifetime for a in poisson] == [a.lifetime for a in bursty]
    assert [a.at for a in poisson] != [a.at for a in bursty]


def test_count_order_and_zero(poisson: list[Arrival], bursty: list[Arrival]) -> None:
    for arrivals in (poisson, bursty):
        times = _times(arrivals)
        assert len(arrivals) == N
        assert times[0] >= 0 and bool(np.all(np.diff(times) >= 0))
    assert generate_workload(WorkloadConfig(requests=0)) == []
    assert generate_workload(WorkloadConfig(requests=0, arrival="bursty")) == []


def test_requests_come_from_the_image(poisson: list[Arrival]) -> None:
    dataset = load_dockerhub()
    for arrival in poisson:
        image = dataset.by_name(arrival.image)
        request = arrival.request
        assert request.namespace == "sim" and request.name == image.name
        assert request.platforms == (image.platform,)
        assert request.layers == image.layers
        assert request.spec == INSTANCE_TYPES[arrival.instance_type]
        assert arrival.departs == arrival.at + arrival.lifetime


def test_replicas_count_per_image(poisson: list[Arrival]) -> None:
    seen: Counter[str] = Counter()
    for arrival in poisson:
        assert arrival.request.replica == seen[arrival.image]
        seen[arrival.image] += 1
    assert len({arrival.request.key for arrival in poisson}) == N


def test_popularity_is_proportional_to_pulls(poisson: list[Arrival]) -> None:
    images = load_dockerhub().images
    expected = popularity(images, 1.0) * N
    observed = Counter(arrival.image for arrival in poisson)
    checked = 0
    for image, mean in zip(images, expected, strict=True):
        if mean >= 50:  # the popular images, where a normal approximation is sound
            checked += 1
            assert abs(observed[image.name] - mean) < 5 * np.sqrt(mean), image.name
    assert checked >= 10
    top = max(images, key=lambda image: image.pull_count)
    assert observed.most_common(1)[0][0] == top.name


def test_flatten_zero_is_uniform() -> None:
    images = load_dockerhub().images
    assert np.allclose(popularity(images, 0.0), 1 / len(images))
    count = 30 * len(images)
    arrivals = generate_workload(WorkloadConfig(requests=count, flatten=0.0, seed=11))
    observed = np.array([Counter(a.image for a in arrivals)[image.name] for image in images])
    chi_square = float(((observed - 30) ** 2 / 30).sum())
    assert chi_square < 230  # 144 degrees of freedom: mean 144, sd 17


def test_flatten_softens_the_skew() -> None:
    images = load_dockerhub().images
    shares = [popularity(images, flatten).max() for flatten in (0.0, 0.5, 1.0)]
    assert shares[0] < shares[1] < shares[2]
    assert sum(popularity(images, 0.5)) == pytest.approx(1.0)


def test_popularity_errors() -> None:
    idle = Image(name="idle", pull_count=0, platform="linux/amd64", layers=(("x", 1),))
    assert popularity([idle], 0.0).tolist() == [1.0]
    with pytest.raises(Invalid) as caught:
        popularity([idle], 1.0)
    assert caught.value.field == "flatten"
    with pytest.raises(Invalid) as caught:
        popularity([idle], 1.5)
    assert caught.value.field == "flatten"


def test_mean_inter_arrival_is_one_over_rate(poisson: list[Arrival], bursty: list[Arrival]) -> None:
    assert _times(poisson)[-1] / N == pytest.approx(1 / 4.0, rel=0.1)
    assert _times(bursty)[-1] / N == pytest.approx(1 / 4.0, rel=0.3)  # fewer, longer cycles


def test_bursty_counts_vary_more_than_poisson(
    poisson: list[Arrival], bursty: list[Arrival]
) -> None:
    window = 10 / 4.0  # ten mean gaps
    assert 0.7 < _dispersion(poisson, window) < 1.4
    assert _dispersion(bursty, window) > 4


def test_burst_factor_one_is_poisson_like() -> None:
    config = WorkloadConfig(requests=N, rate=4.0, arrival="bursty", burst_factor=1, seed=5)
    assert 0.7 < _dispersion(generate_workload(config), 10 / 4.0) < 1.4


@pytest.mark.parametrize("lifetime", ["exponential", "lognormal"])
def test_lifetime_mean(lifetime: str) -> None:
    config = WorkloadConfig(requests=N, lifetime=lifetime, lifetime_mean=120.0, seed=9)
    lifetimes = np.array([arrival.lifetime for arrival in generate_workload(config)])
    assert lifetimes.min() >= 0
    assert lifetimes.mean() == pytest.approx(120.0, rel=0.1)
    if lifetime == "lognormal":  # median exp(μ) = mean · exp(−σ²/2) with σ = 1
        assert float(np.median(lifetimes)) == pytest.approx(120.0 * np.exp(-0.5), rel=0.1)


def test_instance_type_mix(poisson: list[Arrival]) -> None:
    observed = Counter(arrival.instance_type for arrival in poisson)
    assert set(observed) == set(DEFAULT_INSTANCE_MIX)
    total = sum(DEFAULT_INSTANCE_MIX.values())
    for name, weight in DEFAULT_INSTANCE_MIX.items():
        assert observed[name] / N == pytest.approx(weight / total, abs=0.03)
    only = generate_workload(WorkloadConfig(requests=50, instance_types={"kilo": 1, "micro": 0}))
    assert {arrival.instance_type for arrival in only} == {"kilo"}


def test_platform_restriction() -> None:
    config = WorkloadConfig(requests=100, platforms=("linux/arm64",), namespace="edge")
    arrivals = generate_workload(config)
    arm = Platform.parse("linux/arm64/v8")
    assert {arrival.request.platforms for arrival in arrivals} == {(arm,)}
    assert {arrival.request.namespace for arrival in arrivals} == {"edge"}
    with pytest.raises(Invalid) as caught:
        generate_workload(WorkloadConfig(requests=1, platforms=("linux/riscv64",)))
    assert caught.value.field == "platforms"


def test_custom_dataset() -> None:
    dataset = Dataset(
        source="test",
        images=(
            Image(name="a", pull_count=1, platform="linux/amd64", layers=(("base", 10),)),
            Image(name="b", pull_count=3, platform="linux/amd64", layers=(("base", 10),)),
        ),
    )
    arrivals = generate_workload(WorkloadConfig(requests=400, seed=1), dataset)
    share = Counter(arrival.image for arrival in arrivals)["b"] / 400
    assert share == pytest.approx(0.75, abs=0.1)


def test_empty_dataset_is_invalid() -> None:
    with pytest.raises(Invalid) as caught:
        generate_workload(WorkloadConfig(requests=1), Dataset(source="test", images=()))
    assert caught.value.field == "images"


def test_arrival_round_trips_through_json(poisson: list[Arrival]) -> None:
    assert Arrival.from_json(poisson[0].to_json()) == poisson[0]
    assert isinstance(poisson[0].request, Request)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"rate": -1.0}, "rate"),
        ({"rate": 0}, "rate"),
        ({"rate": float("inf")}, "rate"),
        ({"requests": -1}, "requests"),
        ({"requests": 1.5}, "requests"),
        ({"flatten": 1.5}, "flatten"),
        ({"flatten": -0.1}, "flatten"),
        ({"instance_types": {}}, "instance_types"),
        ({"instance_types": {"huge": 1.0}}, "instance_types"),
        ({"instance_types": {"micro": -1.0}}, "instance_types.micro"),
        ({"instance_types": {"micro": 0.0}}, "instance_types"),
        ({"arrival": "uniform"}, "arrival"),
        ({"burst_factor": 0.5}, "burst_factor"),
        ({"burst_fraction": 0.0}, "burst_fraction"),
        ({"burst_fraction": 1.0}, "burst_fraction"),
        ({"burst_length": 0.5}, "burst_length"),
        ({"lifetime": "gamma"}, "lifetime"),
        ({"lifetime_mean": 0.0}, "lifetime_mean"),
        ({"lifetime_sigma": -1.0}, "lifetime_sigma"),
        ({"platforms": ("linux/amd46",)}, "platforms.0"),
        ({"namespace": ""}, "namespace"),
        ({"seed": -1}, "seed"),
        ({"seeds": 1}, "seeds"),
    ],
)
def test_bad_config_names_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(Invalid) as caught:
        WorkloadConfig(**fields)
    assert caught.value.field == field


def test_unknown_instance_type_lists_valid_ones() -> None:
    with pytest.raises(Invalid, match="unknown instance type 'huge'; valid types: micro"):
        WorkloadConfig(instance_types={"huge": 1.0})
