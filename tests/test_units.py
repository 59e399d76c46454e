"""Unit strings: examples, errors and format → parse round-trips."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from berth import Invalid, format_bandwidth, format_information, parse_bandwidth, parse_information


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("512", 512),
        ("1B", 1),
        ("1KiB", 1024),
        ("64GiB", 64 * 2**30),
        ("1.5GiB", 3 * 2**29),
        ("2TiB", 2 * 2**40),
        ("1KB", 1000),
        ("1.5 GB", 1_500_000_000),
        (" 7 MiB ", 7 * 2**20),
        ("0.1B", 1),  # a fractional byte rounds up: never ask for less than written
        (4096, 4096),
    ],
)
def test_parse_information(text: str | int, expected: int) -> None:
    assert parse_information(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiBps", 2 * 2**30),
        ("16MiBps", 16 * 2**20),
        ("64MiB/s", 64 * 2**20),
        ("100Mbps", 12_500_000),
        ("1Gbps", 125_000_000),
        ("10Mbit/s", 1_250_000),
        ("1MBps", 1_000_000),
        ("8bps", 1),
        ("300", 300),
    ],
)
def test_parse_bandwidth(text: str, expected: int) -> None:
    assert parse_bandwidth(text) == expected


@pytest.mark.parametrize(
    "text", ["", "   ", "abc", "-1GiB", "1 GiBs", "1XB", "GiB", "1..5GiB", "1e3"]
)
def test_bad_information_is_invalid_and_names_the_input(text: str) -> None:
    with pytest.raises(Invalid) as caught:
        parse_information(text, field="mem_max")
    assert caught.value.field == "mem_max"
    assert "mem_max" in str(caught.value)


@pytest.mark.parametrize("value", [-1, True, 1.5, None, [1]])
def test_non_string_non_int_values_are_invalid(value: object) -> None:
    with pytest.raises(Invalid):
        parse_information(value)  # type: ignore[arg-type]


def test_bits_and_bytes_are_not_confused() -> None:
    assert parse_bandwidth("8Mbps") * 8 == parse_bandwidth("8MBps")
    with pytest.raises(Invalid, match="unknown bandwidth unit"):
        parse_bandwidth("1GiB")  # an information unit where a rate was expected


def test_format_for_humans() -> None:
    assert format_information(0) == "0B"
    assert format_information(1536) == "1.5KiB"
    assert format_information(64 * 2**30) == "64GiB"
    assert format_information(123_456_789) == "117.74MiB"
    assert format_bandwidth(2 * 2**30) == "2GiBps"
    with pytest.raises(Invalid):
        format_information(-5)


sizes = st.integers(min_value=0, max_value=2**62)


@given(sizes)
def test_exact_information_round_trips(value: int) -> None:
    assert parse_information(format_information(value, exact=True)) == value


@given(sizes)
def test_exact_bandwidth_round_trips(value: int) -> None:
    assert parse_bandwidth(format_bandwidth(value, exact=True)) == value


@given(sizes)
def test_human_format_is_within_half_a_percent(value: int) -> None:
    parsed = parse_information(format_information(value))
    assert abs(parsed - value) <= max(1, value * 0.005)


@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["B", "KiB", "MiB", "GiB", "KB", "MB", "GB"]),
)
def test_integer_quantities_multiply_exactly(number: int, suffix: str) -> None:
    multiplier = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 10**3, "MB": 10**6,
                  "GB": 10**9}[suffix]  # fmt: skip
    assert parse_information(f"{number}{suffix}") == number * multiplier


@given(st.text(max_size=12))
def test_arbitrary_text_never_crashes(text: str) -> None:
    with contextlib.suppress(Invalid):
        assert parse_information(text) >= 0
