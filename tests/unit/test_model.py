"""The domain model: instance types, specs, layers, requests and placements."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from berth import INSTANCE_TYPES, Invalid, Layer, Placement, Platform, Request, Spec, instance_type
from berth.units import GiB, MiB


def test_instance_table_is_hypers() -> None:
    expected = {
        "micro": (0.25, 128 * MiB, 2 * GiB, 16 * MiB, 8 * MiB),
        "milli": (0.5, 256 * MiB, 4 * GiB, 32 * MiB, 16 * MiB),
        "centi": (1, 512 * MiB, 8 * GiB, 64 * MiB, 32 * MiB),
        "deci": (2, 1 * GiB, 16 * GiB, 128 * MiB, 64 * MiB),
        "base": (4, 2 * GiB, 32 * GiB, 256 * MiB, 128 * MiB),
        "deca": (8, 4 * GiB, 64 * GiB, 512 * MiB, 256 * MiB),
        "hecto": (16, 8 * GiB, 128 * GiB, 1 * GiB, 512 * MiB),
        "kilo": (32, 16 * GiB, 256 * GiB, 2 * GiB, 1 * GiB),
        "mega": (64, 32 * GiB, 512 * GiB, 4 * GiB, 2 * GiB),
        "giga": (128, 64 * GiB, 1024 * GiB, 8 * GiB, 4 * GiB),
        "tera": (256, 128 * GiB, 2048 * GiB, 16 * GiB, 8 * GiB),
    }
    assert list(INSTANCE_TYPES) == list(expected)
    for name, (vcpus, mem, disk, disk_bw, net_bw) in expected.items():
        assert instance_type(name) == Spec(
            vcpus=vcpus, mem=mem, disk=disk, disk_bw=disk_bw, net_bw=net_bw
        )


def test_unknown_instance_type_lists_valid_ones() -> None:
    with pytest.raises(Invalid, match="micro, milli") as caught:
        instance_type("huge")
    assert caught.value.field == "instance_type"


def test_spec_accepts_unit_strings() -> None:
    spec = Spec(vcpus=1, mem="512MiB", disk="8GiB", disk_bw="64MiBps", net_bw="256Mbps")
    assert (spec.mem, spec.disk, spec.disk_bw, spec.net_bw) == (
        512 * MiB,
        8 * GiB,
        64 * MiB,
        32_000_000,
    )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"vcpus": 0, "mem": 1, "disk": 1}, "vcpus"),
        ({"vcpus": -1, "mem": 1, "disk": 1}, "vcpus"),
        ({"vcpus": float("nan"), "mem": 1, "disk": 1}, "vcpus"),
        ({"vcpus": 1, "mem": -1, "disk": 1}, "mem"),
        ({"vcpus": 1, "mem": "-1GiB", "disk": 1}, "mem"),
        ({"vcpus": 1, "mem": 1, "disk": "lots"}, "disk"),
        ({"vcpus": 1, "mem": 1, "disk": 1, "net_bw": "1GiB"}, "net_bw"),
        ({"vcpus": 1, "mem": 1.5, "disk": 1}, "mem"),
        ({"vcpus": 1, "mem": 1}, "disk"),
        ({"vcpus": 1, "mem": 1, "disk": 1, "gpus": 1}, "gpus"),
    ],
)
def test_bad_specs_name_the_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(Invalid) as caught:
        Spec(**fields)
    assert caught.value.field == field
    assert str(caught.value).startswith(field)


def test_request_accepts_friendly_forms() -> None:
    request = Request(
        namespace="default",
        name="web",
        replica=2,
        platforms=("linux/x86_64",),
        spec="micro",
        layers=(("sha256:a", "2MiB"), Layer(id="sha256:b", size=10)),
        preferred_node="n1",
    )
    assert request.platforms == (Platform.parse("linux/amd64"),)
    assert request.spec == instance_type("micro")
    assert request.layers == (Layer(id="sha256:a", size=2 * MiB), Layer(id="sha256:b", size=10))
    assert request.key == "default/web/2"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"namespace": "", "name": "x"}, "namespace"),
        ({"namespace": "a", "name": "has space"}, "name"),
        ({"namespace": "a", "name": "x", "replica": -1}, "replica"),
        ({"namespace": "a", "name": "x", "replica": True}, "replica"),
        ({"namespace": "a", "name": "x", "replica": "1"}, "replica"),
        ({"namespace": "a", "name": "x", "platforms": ["linux"]}, "platforms.0"),
        ({"namespace": "a", "name": "x", "spec": "huge"}, "spec"),
        ({"namespace": "a", "name": "x", "layers": [("l", -1)]}, "layers.0.size"),
        ({"namespace": "a", "name": "x", "layers": [("", 1)]}, "layers.0.id"),
        ({"namespace": "a", "name": "x", "layers": [("l", 1), ("l", 2)]}, "layers"),
        ({"namespace": "a", "name": "x", "preferred_node": ""}, "preferred_node"),
    ],
)
def test_bad_requests_name_the_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(Invalid) as caught:
        Request(**fields)
    assert caught.value.field == field


def test_models_are_immutable() -> None:
    request = Request(namespace="a", name="b")
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        request.name = "c"  # type: ignore[misc]
    assert hash(request) == hash(Request(namespace="a", name="b"))


def test_layer_of_accepts_pairs_and_rejects_junk() -> None:
    assert Layer.of(("x", 3)) == Layer(id="x", size=3)
    assert Layer.of({"id": "x", "size": "1KiB"}) == Layer(id="x", size=1024)
    with pytest.raises(Invalid):
        Layer.of(("x", 1, 2))  # type: ignore[arg-type]


def test_from_json_errors_are_invalid() -> None:
    with pytest.raises(Invalid):
        Request.from_json("{not json")
    with pytest.raises(Invalid) as caught:
        Placement.from_json('{"worker_node": ""}')
    assert caught.value.field == "worker_node"


names = st.text(
    alphabet=st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters="-._"),
    min_size=1,
    max_size=30,
)
specs = st.builds(
    Spec,
    vcpus=st.floats(min_value=0.01, max_value=512, allow_nan=False),
    mem=st.integers(0, 2**44),
    disk=st.integers(0, 2**46),
    disk_bw=st.integers(0, 2**36),
    net_bw=st.integers(0, 2**36),
)
requests = st.builds(
    Request,
    namespace=names,
    name=names,
    replica=st.integers(0, 10_000),
    platforms=st.lists(
        st.sampled_from(["linux/amd64", "linux/arm64", "windows/amd64"]), unique=True
    ).map(tuple),
    spec=st.none() | specs,
    layers=st.lists(
        st.tuples(names, st.integers(0, 2**34)), unique_by=lambda x: x[0], max_size=8
    ).map(tuple),
    preferred_node=st.none() | names,
)


@given(requests)
def test_requests_round_trip_through_json(request: Request) -> None:
    assert Request.from_json(request.to_json()) == request


@given(
    st.builds(
        Placement,
        worker_node=names,
        reservation_id=st.none() | names,
        colocated_bytes=st.integers(0, 2**40),
        rank=st.integers(0, 10**5),
    )
)
def test_placements_round_trip_through_json(placement: Placement) -> None:
    assert Placement.from_json(placement.to_json()) == placement


# -- bounds and strictness (issue 9) ----------------------------------------------------------
def test_a_request_refuses_layers_that_could_overflow_a_sum() -> None:
    from berth.model import MAX_BYTES

    Request(namespace="a", name="b", layers=(("x", MAX_BYTES - 1), ("y", 1)))
    with pytest.raises(Invalid) as caught:
        Request(namespace="a", name="b", layers=(("x", MAX_BYTES), ("y", 1)))
    assert caught.value.field == "layers" and "2^63 - 1" in caught.value.message


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"platforms": "linux/amd64"}, "platforms", "expected a list, got a string"),
        ({"layers": "sha256:ab"}, "layers", "expected a list, got a string"),
        ({"replica": 2**31}, "replica", "less than or equal to"),
        ({"namespace": b"team"}, "namespace", "expected a string, got bytes"),
        ({"spec": {"vcpus": True, "mem": 1, "disk": 1}}, "spec.vcpus", "expected a number"),
    ],
)
def test_request_fields_are_strict(fields: dict[str, object], field: str, message: str) -> None:
    with pytest.raises(Invalid) as caught:
        Request(**{"namespace": "a", "name": "web", **fields})
    assert caught.value.field == field and message in caught.value.message


def test_function_arguments_are_checked_like_fields() -> None:
    from berth.model import checked_layers, checked_platforms, checked_spec

    assert checked_spec("micro") == instance_type("micro") and checked_spec(None) is None
    assert checked_layers([("a", "1KiB")]) == (Layer(id="a", size=1024),)
    assert checked_platforms(["linux/x86_64"]) == (Platform.parse("linux/amd64"),)
    for call, field in (
        (lambda: checked_spec("huge"), "spec"),
        (lambda: checked_layers("ab"), "layers"),
        (lambda: checked_layers([("a", 1), ("a", 1)]), "layers"),
        (lambda: checked_layers([("a", -1)]), "layers.0.size"),
        (lambda: checked_platforms("linux/amd64"), "platforms"),
    ):
        with pytest.raises(Invalid) as caught:
            call()
        assert caught.value.field == field
