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
    "text",
    [
        "",
        "linux",
        "linux/",
        "/amd64",
        "linux/amd64/v8/x",
        "linux/amd46",
        "lunix/amd64",
        "linux/am d64",
        "linux/arm64/v 8",
    ],
)
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


# -- the edges mutation testing found unguarded ------------------------------------------------
@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("linux", "platform", "'linux' is not a platform of the form <os>/<arch>[/<variant>]"),
        ("lin ux/amd64", "os", "platform os 'lin ux' is empty or has invalid characters"),
        ("linux/am*64", "arch", "platform arch 'am*64' is empty or has invalid characters"),
        ("linux/arm64/v 8", "variant", "platform variant 'v 8' has invalid characters"),
        (
            "lunix/amd64",
            "os",
            "unknown operating system 'lunix'; known: aix, android, darwin, dragonfly, freebsd, "
            "illumos, ios, js, linux, netbsd, openbsd, plan9, solaris, wasip1, windows",
        ),
        (
            "linux/amd46",
            "arch",
            "unknown architecture 'amd46'; known: 386, amd64, arm, arm64, loong64, mips, mips64, "
            "mips64le, mipsle, ppc64, ppc64le, riscv64, s390x, wasm",
        ),
    ],
)
def test_errors_name_the_part_and_say_what_is_wrong(text: str, field: str, message: str) -> None:
    with pytest.raises(Invalid) as caught:
        Platform.from_json(f'"{text}"')  # the model's own validation names the part
    assert caught.value.field == field
    assert message in str(caught.value)
    with pytest.raises(Invalid) as caught:
        Platform.parse(text)  # parse names its field and keeps the message
    assert (caught.value.field, caught.value.message) == ("platform", message)
    with pytest.raises(Invalid) as caught:
        Platform.parse(text, field="node.platform")
    assert (caught.value.field, caught.value.message) == ("node.platform", message)


def test_parse_refuses_what_is_not_a_string() -> None:
    with pytest.raises(Invalid) as caught:
        Platform.parse(64)  # type: ignore[arg-type]
    assert caught.value.field == "platform"
    assert caught.value.message == "expected a platform string such as 'linux/amd64', got 64"
    with pytest.raises(Invalid) as caught:
        Platform.parse(None, field="node.platform")  # type: ignore[arg-type]
    assert caught.value.field == "node.platform"
    amd64 = Platform.parse("linux/amd64")
    assert Platform.parse(amd64) is amd64


def test_only_amd64_drops_a_v1_variant() -> None:
    assert str(Platform.parse("linux/amd64/v1")) == "linux/amd64"
    assert str(Platform.parse("linux/amd64/v3")) == "linux/amd64/v3"
    assert str(Platform.parse("linux/386/v1")) == "linux/386/v1"
    assert str(Platform.parse("linux/arm/v1")) == "linux/arm/v1"
    assert str(Platform(os=" Linux ", arch="X86_64")) == "linux/amd64"


@pytest.mark.parametrize(
    ("system", "machine", "expected"),
    [
        ("Linux", "x86_64", "linux/amd64"),
        ("Darwin", "arm64", "darwin/arm64/v8"),
        ("", "", "linux/amd64"),  # Python could not tell: assume the common case
        ("Linux", "", "linux/amd64"),
        ("", "aarch64", "linux/arm64/v8"),
    ],
)
def test_host_platform_from_what_python_reports(
    monkeypatch: pytest.MonkeyPatch, system: str, machine: str, expected: str
) -> None:
    monkeypatch.setattr("berth.platform.host_platform.system", lambda: system)
    monkeypatch.setattr("berth.platform.host_platform.machine", lambda: machine)
    assert str(host()) == expected


def test_an_unknown_host_is_invalid_naming_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("berth.platform.host_platform.system", lambda: "Linux")
    monkeypatch.setattr("berth.platform.host_platform.machine", lambda: "sparc64")
    with pytest.raises(Invalid) as caught:
        host()
    assert caught.value.field == "host"


# --- exact messages and variant lists (issue 9; pins scripts/mutation.py) --------------

from berth.platform import KNOWN_VARIANTS, _normalise  # noqa: E402

# --- platform ------------------------------------------------------------------------------


def test_normalise_defaults_to_no_variant() -> None:
    assert _normalise("linux", "amd64") == ("linux", "amd64", "")
    assert _normalise("linux", "arm64") == ("linux", "arm64", "v8")


def test_unknown_variant_lists_the_known_ones() -> None:
    named = sorted(v for v in KNOWN_VARIANTS if not v.startswith("v"))
    assert named == [
        "hardfloat",
        "power10",
        "power8",
        "power9",
        "rva20u64",
        "rva22u64",
        "softfloat",
        "sse2",
    ]
    with pytest.raises(Invalid) as caught:
        _normalise("linux", "arm64", "v10")
    assert caught.value.field == "variant"
    assert caught.value.message == (
        "unknown platform variant 'v10'; known: v1-v9, v8.0-v8.9, v9.0-v9.5, "
        "hardfloat, power10, power8, power9, rva20u64, rva22u64, softfloat, sse2"
    )


def test_unknown_variant_through_parse_names_the_callers_field() -> None:
    with pytest.raises(Invalid) as caught:
        Platform.parse("linux/arm/v99", field="node.platform")
    assert caught.value.field == "node.platform"
    assert caught.value.message.startswith("unknown platform variant 'v99'; known: v1-v9, ")
    assert caught.value.message.endswith(", sse2")


@pytest.mark.parametrize("variant", ["v1", "v9", "v8.0", "v8.9", "v9.0", "v9.5", "sse2"])
def test_known_variants_at_the_edges(variant: str) -> None:
    assert variant in KNOWN_VARIANTS


@pytest.mark.parametrize("variant", ["v0", "v10", "v8.10", "v9.6"])
def test_variants_one_past_the_edges_are_unknown(variant: str) -> None:
    assert variant not in KNOWN_VARIANTS
    with pytest.raises(Invalid):
        Platform.parse(f"linux/arm64/{variant}")


def test_amd64_v1_is_plain_amd64() -> None:
    assert str(Platform.parse("linux/amd64/v1")) == "linux/amd64"
    assert Platform.parse("linux/amd64/v1").variant == ""


def test_host_falls_back_to_linux_amd64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("berth.platform.host_platform.system", lambda: "")
    monkeypatch.setattr("berth.platform.host_platform.machine", lambda: "")
    assert str(host()) == "linux/amd64"
    monkeypatch.setattr("berth.platform.host_platform.system", lambda: "Linux")
    monkeypatch.setattr("berth.platform.host_platform.machine", lambda: "aarch64")
    assert str(host()) == "linux/arm64/v8"
