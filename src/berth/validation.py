"""The immutable, validated base every berth value type derives from, and the one error path.

berth's values (platforms, specs, requests, node snapshots) cross boundaries — CLI flags,
config files, the network — so each is a frozen pydantic model: validated once at
construction, JSON round-trippable, hashable.  This module owns one thing: turning pydantic's
``ValidationError`` into berth's :class:`~berth.errors.Invalid`, whose ``field`` names the
offending field (``spec.mem``, ``layers.2.size``), so callers catch one error type whatever
the entry point (constructor, :meth:`BerthModel.from_json`, :meth:`BerthModel.from_dict`, a
plain function's argument checked with a :class:`Rule`).

Messages are for people, so they never carry pydantic's internals ("Input should be a valid
dictionary or instance of AgentSection" reads "expected a table of keys and values"), and
the offending value is quoted through :func:`shown` — short, one line, and safe for any
value (an integer with thousands of digits, a megabyte of text, a self-referencing list).
:func:`fields_as` renames fields on the way out, so a command line names the flag the user
typed (``--layer``) rather than the model's field (``layers.0.size``).

It also owns the one rule every string obeys, whatever its other bounds: **it is text that
UTF-8 can encode** (:func:`utf8_text`, :data:`Text`, :func:`check_text`).  Python's ``str``
can hold a lone surrogate (``"\\ud800"``: JSON's ``\\ud800`` escape decodes to one, a
non-UTF-8 byte of ``argv`` becomes one), and such a string cannot be written anywhere berth
writes — a journal, a registry record, a NATS message, an answer — so it is refused where it
enters, naming the field, before anything is reserved or booted.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Annotated, Any, Generic, Self, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic._internal._model_construction import ModelMetaclass

from berth.errors import Invalid

__all__ = [
    "BerthModel",
    "Rule",
    "Text",
    "check_text",
    "fields_as",
    "invalid_from",
    "one_line",
    "shown",
    "utf8_text",
]

T = TypeVar("T")


class _ShortRepr(reprlib.Repr):
    """``reprlib`` that never raises: huge integers are described, not printed."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = 60
        self.maxother = 60
        self.maxlong = 40
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdict = 6

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:  # str() of a 4,300-digit int raises; nobody reads 40 digits
            return f"<an integer of about {int(x.bit_length() * 0.30103) + 1} digits>"
        return super().repr_int(x, level)


_SHORT = _ShortRepr()


def shown(value: object) -> str:
    """``value`` quoted for an error message: ``repr``, one line, at most ~60 characters."""
    try:
        text = _SHORT.repr(value)
    except Exception:  # a broken __repr__ must not hide the error being reported
        text = f"<a {type(value).__name__}>"
    if len(text) > 100:
        text = text[:99] + "…"
    return one_line(text)


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters replaced by spaces."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else " " for ch in text)


# pydantic's error types → what a person is told (pydantic's own text otherwise, reworded).
_EXPECTED = {
    "model_type": "expected a table of keys and values",
    "model_attributes_type": "expected a table of keys and values",
    "dict_type": "expected a table of keys and values",
    "dataclass_type": "expected a table of keys and values",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "set_type": "expected a list",
    "frozen_set_type": "expected a list",
    "iterable_type": "expected a list",
    "string_type": "expected a string",
    "int_type": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "finite_number": "expected a finite number",
    "missing": "required, but missing",
    "extra_forbidden": "unknown key (not one this table takes)",
    "json_invalid": "not valid JSON",
    "json_type": "not a JSON document",
}
_KINDS = (
    (bool, "a boolean"),
    (str, "a string"),
    (bytes, "bytes"),
    (int, "a number"),
    (float, "a number"),
    (dict, "a table"),
    (list, "a list"),
    (tuple, "a list"),
)


def _kind(value: object) -> str:
    for kind, name in _KINDS:
        if isinstance(value, kind):
            return name
    return f"a {type(value).__name__}"


def _message(item: Any) -> str:
    kind = item["type"]
    cause = item.get("ctx", {}).get("error")
    if isinstance(cause, Invalid):
        return cause.message
    if kind in _EXPECTED:
        message = _EXPECTED[kind]
    else:
        message = str(item["msg"])
        for prefix in ("Value error, ", "Assertion failed, "):
            message = message.removeprefix(prefix)
        message = message.replace("Input should be", "must be").replace("Input", "value")
    if kind in ("missing", "extra_forbidden") or "input" not in item:
        return message
    value = item["input"]
    if kind.endswith("_type") or kind in ("finite_number", "int_from_float"):
        return f"{message}, got {_kind(value)} {shown(value)}"
    return f"{message} (got {shown(value)})"


def _location(loc: tuple[int | str, ...], prefix: str | None) -> str:
    # Drop pydantic's validator tags ("function-after[_name(), str]"): not a place in the input.
    parts = [_part(part) for part in loc if not (isinstance(part, str) and part.endswith("]"))]
    if prefix:
        parts.insert(0, prefix)
    return ".".join(parts)


def _part(part: int | str) -> str:
    # A key from the input (a label, a platform in a mix) is quoted when it would not read
    # as a name: empty, spaced, a dot in it, control characters.
    text = str(part)
    if text and text.isprintable() and not any(ch.isspace() or ch == "." for ch in text):
        return text
    return shown(text)


def invalid_from(error: ValidationError, *, field: str | None = None) -> Invalid:
    """The ``Invalid`` that says what ``error`` says, field first (under ``field``, if given)."""
    problems: list[tuple[str, str]] = []
    for item in error.errors():
        loc = _location(item["loc"], field)
        cause = item.get("ctx", {}).get("error")
        if isinstance(cause, Invalid) and cause.field and not item["loc"] and not field:
            loc = cause.field  # a model-level validator that named its own field
        problems.append((loc, one_line(_message(item))))
    where, message = problems[0]
    rest = "; ".join(f"{loc or 'value'}: {msg}" for loc, msg in problems[1:4])
    if len(problems) > 4:
        rest += f"; and {len(problems) - 4} more"
    return Invalid(f"{message}; {rest}" if rest else message, field=where or None)


def _validated(model: str, validate: Callable[[], T]) -> T:
    """``validate()`` of a ``model``, its failures as ``Invalid``: pydantic's by field, and a
    value nested past Python's recursion limit as one line naming the model."""
    try:
        return validate()
    except ValidationError as error:
        raise invalid_from(error) from None
    except RecursionError:
        raise Invalid(f"nested too deeply to be a {model}") from None


class _InvalidOnCall(ModelMetaclass):
    # Converting at the metaclass (``Spec(...)``) rather than in ``__init__`` matters:
    # pydantic calls an overridden ``__init__`` for nested models too, which would turn a
    # nested field error into an opaque error at the parent and lose its location.
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return _validated(
            cls.__name__, lambda: super(_InvalidOnCall, cls).__call__(*args, **kwargs)
        )


class BerthModel(BaseModel, metaclass=_InvalidOnCall):
    """Frozen pydantic model whose validation failures are ``Invalid`` errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        """Validate plain data (as decoded from JSON or TOML)."""
        return _validated(cls.__name__, lambda: cls.model_validate(data))

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        """Validate a JSON document."""
        return _validated(cls.__name__, lambda: cls.model_validate_json(text))

    def to_json(self) -> str:
        """The JSON document :meth:`from_json` reads back into an equal value."""
        return self.model_dump_json()


class Rule(Generic[T]):
    """A type with its bounds, to check one argument of a plain function at a boundary.

    ``Rule(Annotated[float, Field(gt=0)])(value, "lease_ttl_s")`` returns the validated value
    or raises ``Invalid`` whose field is the parameter's name — the same messages a model's
    field gets, for functions that take scalars rather than models.
    """

    def __init__(self, annotation: Any) -> None:
        self._adapter: TypeAdapter[T] = TypeAdapter(annotation)

    def __call__(self, value: object, field: str) -> T:
        try:
            return self._adapter.validate_python(value)
        except ValidationError as error:
            raise invalid_from(error, field=field) from None
        except RecursionError:
            raise Invalid("nested too deeply", field=field) from None


@contextmanager
def fields_as(names: Mapping[str, str]) -> Iterator[None]:
    """Re-raise an ``Invalid`` whose field starts with a key of ``names`` under that name.

    ``names`` maps a field's first part to what the user typed (``{"layers": "--layer"}``):
    ``layers.2.size`` is reported as ``--layer``.  Other errors pass through unchanged.
    """
    try:
        yield
    except Invalid as error:
        head = (error.field or "").split(".", 1)[0]
        if head not in names:
            raise
        raise Invalid(error.message, field=names[head]) from None


# -- text ------------------------------------------------------------------------------------
def _unencodable(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _not_text(text: str, what: str = "text") -> str:
    return f"not {what} UTF-8 can encode: {shown(text)} holds a lone surrogate"


def utf8_text(value: str) -> str:
    """``value`` if UTF-8 can encode it, else ``Invalid`` (see the module docstring)."""
    if _unencodable(value):
        raise Invalid(_not_text(value))
    return value


Text = Annotated[str, AfterValidator(utf8_text)]
"""A string UTF-8 can encode (a model field's type)."""


def _all_text(value: object) -> bool:
    """Whether ``value`` certainly holds no string UTF-8 cannot encode: its JSON text (C code,
    the fast path for a whole body) encodes.  ``False`` also when it is not plain data."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, TypeError, ValueError, RecursionError):
        return False
    return True


def check_text(value: object, field: str | None = None) -> None:
    """Refuse plain data (strings, lists, tables, as decoded from JSON) holding a string —
    a value or a key, at any depth — that UTF-8 cannot encode: ``Invalid`` whose ``field``
    is where the first one is (``command.1``, ``env.KEY``; under ``field``, if given)."""
    if _all_text(value):
        return
    # (item, where it is, whether it is a table's key), walked in document order
    stack: list[tuple[object, tuple[int | str, ...], bool]] = [(value, (), False)]
    seen: set[int] = set()  # containers walked already: a cycle is walked once
    while stack:
        item, where, is_key = stack.pop()
        if isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, str):
            if _unencodable(item):
                place = ".".join([*([field] if field else []), *map(_part, where)])
                raise Invalid(_not_text(item, "a key" if is_key else "text"), field=place or None)
        elif isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                stack.append((inner, (*where, str(key)), False))
                stack.append((key, where, True))
        elif isinstance(item, list | tuple):
            stack.extend(
                (inner, (*where, i), False) for i, inner in reversed(list(enumerate(item)))
            )
