"""Information and bandwidth quantities: parsing unit strings, formatting for humans.

berth carries every size as an ``int`` of bytes and every rate as an ``int`` of bytes per
second; strings such as ``"1.5GiB"`` or ``"2GiBps"`` exist only at the boundary (config files,
CLI flags, JSON written by people).  This module is that boundary and nothing else, beside
the binary sizes ``KiB MiB GiB TiB`` every module and test imports from here.

Accepted suffixes (case-sensitive, because ``Mbps`` bits and ``MBps`` bytes differ by 8×):

* information: ``B``, binary ``KiB MiB GiB TiB``, decimal ``KB MB GB TB``; a bare number
  is bytes;
* bandwidth: ``Bps``/``B/s``, binary ``KiBps … TiBps`` (or ``KiB/s`` …), decimal
  ``KBps … TBps``, and bit rates ``bps Kbps Mbps Gbps Tbps`` (or ``Mbit/s`` …).

A decimal value (``1.5GiB``) is allowed; a result with a fractional byte is rounded up, as
Kubernetes does for quantities, so a request never asks for less than it wrote.  Negative
values, unknown suffixes and garbage raise :class:`~berth.errors.Invalid` naming the input.

Every quantity is at most :data:`MAX_BYTES` = 2^63 − 1 (8 EiB, or 8 EiB/s): the engine keeps
sizes in int64 columns, and a value it cannot represent must be refused here, as ``Invalid``,
rather than wrap around there.  Unit strings longer than :data:`MAX_TEXT` characters are
refused too (no real quantity needs them).  Formatting is total: any non-negative integer
formats, however large.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation, localcontext

from berth.errors import Invalid
from berth.validation import shown

__all__ = [
    "BANDWIDTH_UNITS",
    "INFORMATION_UNITS",
    "MAX_BYTES",
    "MAX_TEXT",
    "GiB",
    "KiB",
    "MiB",
    "TiB",
    "format_bandwidth",
    "format_information",
    "parse_bandwidth",
    "parse_information",
]

KiB = 1024
"""Bytes in a kibibyte; with :data:`MiB`, :data:`GiB` and :data:`TiB` the one definition of
the binary sizes (``from berth.units import GiB``), for code and tests alike."""
MiB = KiB * 1024
GiB = MiB * 1024
TiB = GiB * 1024

MAX_BYTES = 2**63 - 1
"""The largest size (bytes) or rate (bytes/s) berth accepts: int64's maximum, 8 EiB."""
MAX_TEXT = 64
"""The longest unit string parsed, in characters."""

INFORMATION_UNITS: dict[str, int] = {
    "B": 1,
    "KiB": KiB,
    "MiB": MiB,
    "GiB": GiB,
    "TiB": TiB,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
}

# Bandwidth multipliers are in bytes/s, kept as Decimal so bit rates (1/8 byte) stay exact.
BANDWIDTH_UNITS: dict[str, Decimal] = {
    **{f"{name}ps": Decimal(mult) for name, mult in INFORMATION_UNITS.items()},
    **{f"{name}/s": Decimal(mult) for name, mult in INFORMATION_UNITS.items()},
    "bps": Decimal(1) / 8,
    "Kbps": Decimal(1000) / 8,
    "Mbps": Decimal(1000**2) / 8,
    "Gbps": Decimal(1000**3) / 8,
    "Tbps": Decimal(1000**4) / 8,
    "bit/s": Decimal(1) / 8,
    "Kbit/s": Decimal(1000) / 8,
    "Mbit/s": Decimal(1000**2) / 8,
    "Gbit/s": Decimal(1000**3) / 8,
    "Tbit/s": Decimal(1000**4) / 8,
}

_QUANTITY = re.compile(r"^\s*([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z/]*)\s*$")
_BINARY_STEPS = ("TiB", "GiB", "MiB", "KiB")


def _parse(text: str | int, units: dict[str, Decimal], kind: str, default: str, field: str) -> int:
    if isinstance(text, bool):
        raise Invalid(f"expected a {kind} such as '512MiB', got a boolean", field=field)
    if isinstance(text, int):
        if text < 0:
            raise Invalid(f"{kind} must not be negative, got {shown(text)}", field=field)
        return _bounded(text, text, kind, field)
    if not isinstance(text, str):
        raise Invalid(f"expected a {kind} string such as '512MiB', got {shown(text)}", field=field)
    if len(text) > MAX_TEXT:
        raise Invalid(
            f"not a {kind}: {shown(text)} is longer than {MAX_TEXT} characters", field=field
        )
    match = _QUANTITY.match(text)
    if match is None:
        raise Invalid(f"not a {kind}: {shown(text)} (expected e.g. '512MiB')", field=field)
    sign, number, suffix = match.groups()
    suffix = suffix or default
    if suffix not in units:
        raise Invalid(
            f"unknown {kind} unit {suffix!r} in {text!r}; known units: {', '.join(units)}",
            field=field,
        )
    try:
        value = Decimal(number) * units[suffix]
    except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
        raise Invalid(f"not a {kind}: {text!r}", field=field) from None
    if sign == "-" and value != 0:
        raise Invalid(f"{kind} must not be negative, got {text!r}", field=field)
    return _bounded(math.ceil(value), text, kind, field)


def _bounded(value: int, text: str | int, kind: str, field: str) -> int:
    if value > MAX_BYTES:
        raise Invalid(
            f"{kind} must be at most 2^63 - 1 = {MAX_BYTES} {'B' if kind == 'size' else 'Bps'}"
            f", got {shown(text)}",
            field=field,
        )
    return value


def parse_information(text: str | int, *, field: str = "size") -> int:
    """Bytes in ``text`` (``"64GiB"``, ``"1.5 GB"``, ``"512"``); an int passes through."""
    units = {name: Decimal(mult) for name, mult in INFORMATION_UNITS.items()}
    return _parse(text, units, "size", "B", field)


def parse_bandwidth(text: str | int, *, field: str = "bandwidth") -> int:
    """Bytes per second in ``text`` (``"2GiBps"``, ``"100Mbps"``, ``"64MiB/s"``)."""
    return _parse(text, BANDWIDTH_UNITS, "bandwidth", "Bps", field)


def _format(value: int, suffix: str, exact: bool) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"cannot format {shown(value)}: not a whole number", field="value")
    if value < 0:
        raise Invalid(f"cannot format a negative quantity {shown(value)}", field="value")
    with localcontext() as context:  # enough digits for any value: quantize never overflows
        context.prec = max(28, value.bit_length() // 3 + 8)
        return _format_in_context(value, suffix, exact)


def _format_in_context(value: int, suffix: str, exact: bool) -> str:
    for unit in _BINARY_STEPS:
        mult = INFORMATION_UNITS[unit]
        if value < mult:
            continue
        if exact:
            # Powers of two have finite decimal expansions, so this is lossless; keep it
            # short by only using a unit when at most three decimals are needed.
            quotient = Decimal(value) / Decimal(mult)
            if quotient == quotient.quantize(Decimal("0.001")):
                return f"{_trim(quotient)}{unit}{suffix}"
            continue
        return f"{_trim(Decimal(value) / Decimal(mult), places=2)}{unit}{suffix}"
    return f"{value}B{suffix}"


def _trim(quotient: Decimal, places: int | None = None) -> str:
    if places is not None:
        quotient = quotient.quantize(Decimal(1).scaleb(-places))
    text = format(quotient, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def format_information(value: int, *, exact: bool = False) -> str:
    """``1536`` → ``"1.5KiB"``.  ``exact=True`` guarantees ``parse_information`` round-trips."""
    return _format(value, "", exact)


def format_bandwidth(value: int, *, exact: bool = False) -> str:
    """``2147483648`` → ``"2GiBps"``.  ``exact=True`` guarantees ``parse_bandwidth`` round-trips."""
    return _format(value, "ps", exact)
