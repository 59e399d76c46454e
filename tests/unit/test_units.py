"""Unit strings: examples, errors and format → parse round-trips."""

from __future__ import annotations

import contextlib
from typing import Protocol

import pytest
from hypothesis import given
from hypothesis import strategies as st

from berth import Invalid, format_bandwidth, format_information, parse_bandwidth, parse_information


class Parse(Protocol):
    """``parse_information`` or ``parse_bandwidth``."""

    def __call__(self, text: str | int, *, field: str = ...) -> int: ...


class Format(Protocol):
    """``format_information`` or ``format_bandwidth``."""

    def __call__(self, value: int, *, exact: bool = ...) -> str: ...


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
    multiplier = {
        "B": 1,
        "KiB": 2**10,
        "MiB": 2**20,
        "GiB": 2**30,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
    }[suffix]
    assert parse_information(f"{number}{suffix}") == number * multiplier


@given(st.text(max_size=12))
def test_arbitrary_text_never_crashes(text: str) -> None:
    with contextlib.suppress(Invalid):
        assert parse_information(text) >= 0


# -- the edges mutation testing found unguarded ------------------------------------------------
@pytest.mark.parametrize("parse", [parse_information, parse_bandwidth])
def test_integer_zero_and_one_are_quantities(parse: Parse) -> None:
    assert parse(0) == 0
    assert parse(1) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [("-0", 0), ("-0.0GiB", 0), ("+1", 1), ("+2KiB", 2048), ("1.", 1), (".5KiB", 512)],
)
def test_signs_and_bare_decimal_points(text: str, expected: int) -> None:
    assert parse_information(text) == expected


@pytest.mark.parametrize("text", ["-1", "-1B", "-0.5", "- 1KiB", "-0.001B"])
def test_a_negative_string_is_invalid_never_its_absolute_value(text: str) -> None:
    with pytest.raises(Invalid) as caught:
        parse_information(text, field="disk_max")
    assert caught.value.field == "disk_max"
    assert caught.value.message == f"size must not be negative, got {text!r}"


@pytest.mark.parametrize(
    ("value", "field", "message"),
    [
        (-1, "size", "size must not be negative, got -1"),
        (True, "size", "expected a size such as '512MiB', got a boolean"),
        (1.5, "size", "expected a size string such as '512MiB', got 1.5"),
        ("abc", "size", "not a size: 'abc' (expected e.g. '512MiB')"),
    ],
)
def test_information_errors_say_what_and_where(value: object, field: str, message: str) -> None:
    with pytest.raises(Invalid) as caught:
        parse_information(value)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.message) == (field, message)
    with pytest.raises(Invalid) as caught:
        parse_information(value, field="mem_max")  # type: ignore[arg-type]
    assert caught.value.field == "mem_max"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-3, "bandwidth must not be negative, got -3"),
        (False, "expected a bandwidth such as '512MiB', got a boolean"),
        (None, "expected a bandwidth string such as '512MiB', got None"),
        ("-8Mbps", "bandwidth must not be negative, got '-8Mbps'"),
    ],
)
def test_bandwidth_errors_say_what_and_where(value: object, message: str) -> None:
    with pytest.raises(Invalid) as caught:
        parse_bandwidth(value)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.message) == ("bandwidth", message)
    with pytest.raises(Invalid) as caught:
        parse_bandwidth(value, field="net_bw_cap")  # type: ignore[arg-type]
    assert caught.value.field == "net_bw_cap"


def test_an_unknown_unit_lists_the_known_ones() -> None:
    with pytest.raises(Invalid) as caught:
        parse_information("3 GiBs", field="mem_max")
    assert caught.value.message == (
        "unknown size unit 'GiBs' in '3 GiBs'; known units: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB"
    )
    with pytest.raises(Invalid) as caught:
        parse_bandwidth("1 GiB")
    assert caught.value.message.startswith(
        "unknown bandwidth unit 'GiB' in '1 GiB'; known units: Bps, KiBps, MiBps"
    )


def test_formatting_at_unit_boundaries() -> None:
    assert format_information(1023) == "1023B"
    assert format_information(1024) == "1KiB"  # exactly one unit uses the unit
    assert format_information(2**20) == "1MiB"
    assert format_information(2**20 - 1) == "1024KiB"  # 1023.999 KiB rounds to two places
    assert format_information(1536, exact=True) == "1.5KiB"
    # exact: a unit is skipped when it needs more than three decimals, for the next smaller one
    assert format_information(2**20 + 1, exact=True) == "1048577B"
    assert format_information(2**30 + 2**27, exact=True) == "1.125GiB"
    assert format_information(2**30 + 2**20, exact=True) == "1025MiB"
    assert format_information(2**30 + 2**10, exact=True) == "1048577KiB"
    assert format_information(10 * 2**40) == "10TiB"
    assert format_information(1000) == "1000B"
    assert format_information(1100) == "1.07KiB"
    assert format_information(1126) == "1.1KiB"  # 1.0996… → 1.10 → trailing zero trimmed
    assert format_information(1025) == "1KiB"  # 1.0009… → 1.00 → "1"
    assert format_information(10240) == "10KiB"  # an integer keeps its zeros


def test_bandwidth_formatting_is_for_humans_unless_asked_to_be_exact() -> None:
    assert format_bandwidth(123_456_789) == "117.74MiBps"
    assert format_bandwidth(123_456_789, exact=True) == "123456789Bps"
    assert format_bandwidth(0) == "0Bps"
    with pytest.raises(Invalid) as caught:
        format_bandwidth(-1)
    assert caught.value.field == "value"
    assert caught.value.message == "cannot format a negative quantity -1"


# -- bounds (issue 9): every quantity fits the engine's int64 ---------------------------------
def test_quantities_are_bounded_by_int64() -> None:
    from berth.units import MAX_BYTES

    assert parse_information(MAX_BYTES) == MAX_BYTES == parse_information(str(MAX_BYTES))
    for value in (MAX_BYTES + 1, str(MAX_BYTES + 1), "8388608TiB", "9223372036854775808B"):
        with pytest.raises(Invalid, match="at most 2\\^63 - 1"):
            parse_information(value)
    with pytest.raises(Invalid, match="at most 2\\^63 - 1"):
        parse_bandwidth("100000000Tbps")
    with pytest.raises(Invalid, match="longer than 64 characters"):
        parse_information("1" * 65)
    with pytest.raises(Invalid) as caught:
        parse_information(10**5000)  # its str() would raise: the message describes it
    assert "digits" in caught.value.message


@given(st.integers(min_value=0, max_value=2**300))
def test_formatting_is_total(value: int) -> None:
    assert format_information(value) and format_bandwidth(value)
    if value < 2**63:
        assert parse_bandwidth(format_bandwidth(value, exact=True)) == value


# --- exact messages, fields and limits (issue 9; pins scripts/mutation.py) -----------

from berth.units import MAX_BYTES, MAX_TEXT  # noqa: E402

GiB = 2**30  # written out, not berth.units.GiB: the module under test is not its own oracle

# --- units: the upper bound ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("parse", "kind", "field", "unit"),
    [
        (parse_information, "size", "size", "B"),
        (parse_bandwidth, "bandwidth", "bandwidth", "Bps"),
    ],
)
def test_too_large_integer_names_kind_unit_and_field(
    parse: Parse, kind: str, field: str, unit: str
) -> None:
    assert parse(MAX_BYTES) == MAX_BYTES
    with pytest.raises(Invalid) as caught:
        parse(MAX_BYTES + 1)
    assert caught.value.field == field
    assert caught.value.message == (
        f"{kind} must be at most 2^63 - 1 = {MAX_BYTES} {unit}, got {MAX_BYTES + 1}"
    )


def test_too_large_integer_keeps_a_custom_field() -> None:
    with pytest.raises(Invalid) as caught:
        parse_information(MAX_BYTES + 1, field="mem")
    assert caught.value.field == "mem"
    with pytest.raises(Invalid) as caught:
        parse_bandwidth(MAX_BYTES + 1, field="net_bw")
    assert caught.value.field == "net_bw"


@pytest.mark.parametrize(
    ("parse", "kind", "suffix", "unit"),
    [
        (parse_information, "size", "", "B"),
        (parse_bandwidth, "bandwidth", "Bps", "Bps"),
    ],
)
def test_too_large_string_names_the_text_kind_and_field(
    parse: Parse, kind: str, suffix: str, unit: str
) -> None:
    assert parse(f"{MAX_BYTES}{suffix}") == MAX_BYTES
    text = f"{MAX_BYTES + 1}{suffix}"
    with pytest.raises(Invalid) as caught:
        parse(text, field="limit")
    assert caught.value.field == "limit"
    assert caught.value.message == (
        f"{kind} must be at most 2^63 - 1 = {MAX_BYTES} {unit}, got {text!r}"
    )


# --- units: the length limit ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("parse", "kind"), [(parse_information, "size"), (parse_bandwidth, "bandwidth")]
)
def test_unit_string_at_the_length_limit_parses_one_more_is_refused(
    parse: Parse, kind: str
) -> None:
    at_limit = "1".rjust(MAX_TEXT, "0")
    assert len(at_limit) == MAX_TEXT
    assert parse(at_limit) == 1
    padded = " " * (MAX_TEXT - 1) + "7"
    assert parse(padded) == 7
    too_long = "0" + at_limit
    with pytest.raises(Invalid) as caught:
        parse(too_long, field="quota")
    assert caught.value.field == "quota"
    assert caught.value.message.startswith(f"not a {kind}: '0000")
    assert caught.value.message.endswith(f" is longer than {MAX_TEXT} characters")
    with pytest.raises(Invalid) as caught:
        parse(too_long)
    assert caught.value.field == kind


def test_length_limit_is_64_characters() -> None:
    assert MAX_TEXT == 64


# --- units: formatting ---------------------------------------------------------------------


@pytest.mark.parametrize("value", [1.5, "12", None, 2.0])
@pytest.mark.parametrize("format_", [format_information, format_bandwidth])
def test_format_refuses_non_integers_with_message_and_field(format_: Format, value: object) -> None:
    with pytest.raises(Invalid) as caught:
        format_(value)  # type: ignore[arg-type]
    assert caught.value.field == "value"
    assert caught.value.message == f"cannot format {value!r}: not a whole number"


@pytest.mark.parametrize("format_", [format_information, format_bandwidth])
def test_format_refuses_booleans(format_: Format) -> None:
    with pytest.raises(Invalid) as caught:
        format_(True)
    assert caught.value.field == "value"
    assert caught.value.message == "cannot format True: not a whole number"


def test_format_output_is_plain_decimal_without_exponent() -> None:
    assert format_information(3 * 2**40) == "3TiB"
    assert format_information(1536) == "1.5KiB"
    assert format_information(1024 * 1000) == "1000KiB"
    assert format_information(10 * 2**40) == "10TiB"
    assert format_information(100 * 2**40, exact=True) == "100TiB"
    assert format_information(1000 * 2**40) == "1000TiB"
    assert format_bandwidth(2 * GiB) == "2GiBps"
    assert format_information(MAX_BYTES) == "8388608TiB"
    assert format_information(2**40 + 10 * 2**30) == "1.01TiB"
    assert format_information(2**40 + 2**30 // 200) == "1TiB"
    assert format_information(1025) == "1KiB"
    assert format_information(1024 + 5) == "1KiB"
    assert format_information(1024 + 6) == "1.01KiB"
    assert format_information(1024 + 1024 * 3 // 400) == "1.01KiB"


def test_format_rounds_to_two_places() -> None:
    # 1.0049 KiB → "1KiB", 1.015 KiB → "1.02KiB" (half-even on exact halves is fine here)
    assert format_information(1024 + 1024 * 49 // 10000) == "1KiB"
    assert format_information(1024 + 1024 * 2 // 100 + 1) == "1.02KiB"
    assert format_information(int(1024 * 1.999)) == "2KiB"


@pytest.mark.parametrize("exponent", [63, 80, 100, 200, 400, 1000])
def test_format_of_huge_values_is_exact(exponent: int) -> None:
    value = 2**exponent + 2**40
    expected_units = value // 2**40
    text = format_information(value)
    assert text.endswith("TiB")
    assert text == f"{expected_units}TiB"
    exact = format_information(value, exact=True)
    assert exact == f"{expected_units}TiB"
    odd = 3**exponent
    assert format_information(odd, exact=True) == f"{odd}B"
    rounded = format_information(odd)
    assert rounded.endswith("TiB")
    whole, _, fraction = rounded.removesuffix("TiB").partition(".")
    assert int(whole) == odd // 2**40
    assert len(fraction) <= 2
