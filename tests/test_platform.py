"""Platforms: parsing, aliases, matching and their properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from berth import Invalid, Platform
from berth.platform import KNOWN_ARCHITECTURES, KNOWN_OPERATING_SYSTEMS, host, matches_any


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("linux/amd64", "linux/amd64"),
        ("linux/x86_64", "linux/amd64"),
        ("Linux/X86-64", "linux/amd64"),
        ("linux/amd64/v1", "linux/amd64"),
        ("linux/aarch64", "linux/arm64/v8"),
        ("linux/arm64", "linux/arm64/v8"),
        ("linux/arm64/v8", "linux/arm64/v8"),
        ("linux/armhf", "linux/arm/v7"),
        ("linux/arm", "linux/arm/v7"),
        ("linux/armel", "linux/arm/v6"),
        ("linux/arm/v6", "linux/arm/v6"),
        ("linux/i386", "linux/386"),
        ("windows/amd64", "windows/amd64"),
    ],
)
def test_normalisation(text: str, normal: str) -> None:
    assert str(Platform.parse(text)) == normal
    assert Platform.parse(text) == Platform.parse(normal)


@pytest.mark.parametrize(
    "text", ["", "linux", "linux/", "/amd64", "linux/amd64/v8/x", "linux/amd46", "lunix/amd64",
             "linux/am d64", "linux/arm64/v 8"],
)  # fmt: skip
def test_malformed_platforms_are_invalid(text: str) -> None:
    with pytest.raises(Invalid) as caught:
        Platform.parse(text, field="node.platform")
    assert caught.value.field == "node.platform"


def test_constructor_errors_name_the_part() -> None:
    with pytest.raises(Invalid) as caught:
        Platform(os="linux", arch="amd46")
    assert caught.value.field == "arch"


def test_matching_and_empty_means_any() -> None:
    node = Platform.parse("linux/arm64")
    assert matches_any(node, [])
    assert matches_any(node, [Platform.parse("linux/aarch64")])
    assert not matches_any(node, [Platform.parse("linux/amd64"), Platform.parse("linux/arm/v7")])
    assert node.matches(Platform.parse("linux/arm64/v8"))


def test_json_form_is_the_string() -> None:
    platform = Platform.parse("linux/aarch64")
    assert platform.to_json() == '"linux/arm64/v8"'
    assert Platform.from_json(platform.to_json()) == platform


def test_host_platform_parses() -> None:
    assert host().os in KNOWN_OPERATING_SYSTEMS


platforms = st.builds(
    lambda os, arch, variant: f"{os}/{arch}" + (f"/{variant}" if variant else ""),
    st.sampled_from(sorted(KNOWN_OPERATING_SYSTEMS)),
    st.sampled_from([*sorted(KNOWN_ARCHITECTURES), "x86_64", "aarch64", "armhf", "i386"]),
    st.sampled_from(["", "v5", "v6", "v7", "v8"]),
)


@given(platforms)
def test_parse_is_idempotent_and_round_trips(text: str) -> None:
    parsed = Platform.parse(text)
    assert Platform.parse(str(parsed)) == parsed
    assert Platform.parse(text.upper()) == parsed
    assert Platform.from_json(parsed.to_json()) == parsed
    assert hash(Platform.parse(str(parsed))) == hash(parsed)


@given(st.text(max_size=20))
def test_arbitrary_text_is_parsed_or_invalid(text: str) -> None:
    try:
        parsed = Platform.parse(text)
    except Invalid:
        return
    assert parsed.os in KNOWN_OPERATING_SYSTEMS and parsed.arch in KNOWN_ARCHITECTURES
