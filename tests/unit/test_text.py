"""The one rule every string obeys (:mod:`berth.validation`): text UTF-8 can encode.

:func:`~berth.validation.check_text` over plain data refuses exactly the data holding a
string (a value or a key) UTF-8 cannot encode, and names where the first one is; the types
that carry the rule (``Text``, ``BootSpec``'s command and environment) refuse it naming the
field.  Property-tested on JSON-like data with and without lone surrogates.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from berth.boot import BootSpec
from berth.errors import Invalid
from berth.validation import check_text, utf8_text

# any code point, lone surrogates (which Hypothesis' characters() leaves out) among them
SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
ANY_TEXT = st.text(st.characters() | SURROGATES, max_size=8)


def plain(keys: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """JSON-like data: strings of ``ANY_TEXT``, tables keyed by ``keys``."""
    return st.recursive(
        st.none() | st.booleans() | st.integers() | ANY_TEXT,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
        max_leaves=12,
    )


PLAIN = plain(ANY_TEXT)
NAMED = plain(st.text("abcXYZ_-09", min_size=1, max_size=4))  # keys a field names as they are


def encodes(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def at(value: Any, field: str | None) -> Any:
    """The value ``field`` (a dotted path as check_text names it) points into."""
    for part in [] if field is None else field.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


@given(PLAIN)
def test_check_text_refuses_exactly_what_utf8_cannot_encode(value: Any) -> None:
    try:
        check_text(value)
    except Invalid as error:
        assert not encodes(value) and "surrogate" in error.message
    else:
        assert encodes(value)


@given(NAMED)
def test_the_field_leads_to_the_string_refused(value: Any) -> None:
    try:
        check_text(value)
    except Invalid as error:
        found = at(value, error.field)
        assert isinstance(found, str) and not encodes(found)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"command": ["sleep", "\ud800"]}, "command.1"),
        ({"env": {"KEY": "a\udcff"}}, "env.KEY"),
        ({"env": {"\ud800": "v"}}, "env"),
        ({"a": "\ud800", "b": "\udfff"}, "a"),  # the first, in document order
        ("\ud800", None),
    ],
)
def test_the_first_unencodable_string_is_named(value: Any, field: str | None) -> None:
    with pytest.raises(Invalid) as caught:
        check_text(value)
    assert caught.value.field == field


def test_text_beyond_ascii_and_cycles_are_fine() -> None:
    check_text({"command": ["é", "😀", "\U0010ffff"], "env": {"ü": "ß"}})
    cyclic: list[Any] = ["x"]
    cyclic.append(cyclic)
    check_text(cyclic)  # walked once, not forever
    assert utf8_text("😀") == "😀"
    with pytest.raises(Invalid):
        utf8_text("\ud800")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"command": ("sleep", "\ud800")}, "command.1"),
        ({"command": ("true",), "env": {"KEY": "\ud800"}}, "env.KEY"),
    ],
)
def test_a_boot_spec_refuses_a_lone_surrogate_naming_the_field(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(Invalid) as caught:
        BootSpec(name="w", **fields)
    assert caught.value.field == field
