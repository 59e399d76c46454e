"""The immutable, validated base every berth value type derives from.

berth's values (platforms, specs, requests, node snapshots) cross boundaries — CLI flags,
config files, the network — so each is a frozen pydantic model: validated once at
construction, JSON round-trippable, hashable.  This module owns one thing: turning pydantic's
``ValidationError`` into berth's :class:`~berth.errors.Invalid`, whose ``field`` names the
offending field (``spec.mem``, ``layers.2.size``), so callers catch one error type whatever
the entry point (constructor, :meth:`BerthModel.from_json`, :meth:`BerthModel.from_dict`).
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic._internal._model_construction import ModelMetaclass

from berth.errors import Invalid

__all__ = ["BerthModel", "invalid_from"]


def invalid_from(error: ValidationError) -> Invalid:
    """The ``Invalid`` that says what ``error`` says, field first."""
    problems: list[tuple[str, str]] = []
    for item in error.errors():
        loc = ".".join(str(part) for part in item["loc"])
        cause = item.get("ctx", {}).get("error")
        if isinstance(cause, Invalid):
            message = cause.message
            loc = loc or cause.field or ""
        else:
            message = item["msg"]
            if item["type"] not in ("missing", "extra_forbidden") and "input" in item:
                message = f"{message} (got {item['input']!r})"
        problems.append((loc, message))
    field, message = problems[0]
    rest = "; ".join(f"{loc or 'value'}: {msg}" for loc, msg in problems[1:])
    return Invalid(f"{message}; {rest}" if rest else message, field=field or None)


class _InvalidOnCall(ModelMetaclass):
    # Converting at the metaclass (``Spec(...)``) rather than in ``__init__`` matters:
    # pydantic calls an overridden ``__init__`` for nested models too, which would turn a
    # nested field error into an opaque error at the parent and lose its location.
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except ValidationError as error:
            raise invalid_from(error) from None


class BerthModel(BaseModel, metaclass=_InvalidOnCall):
    """Frozen pydantic model whose validation failures are ``Invalid`` errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        """Validate plain data (as decoded from JSON or TOML)."""
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise invalid_from(error) from None

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        """Validate a JSON document."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as error:
            raise invalid_from(error) from None

    def to_json(self) -> str:
        """The JSON document :meth:`from_json` reads back into an equal value."""
        return self.model_dump_json()
