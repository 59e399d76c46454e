"""The image registry port: named images as layer chains with sizes.

:class:`ImageRegistry` — named images as layer chains with sizes (:class:`Image`), so a
request can name one; values are checked before they reach it
(:func:`berth.registry.images.image_of`).

Its drivers: :class:`~berth.registry.memory.MemoryImages`, :class:`~berth.registry.nats.NatsImages`;
values are checked before they reach it (:mod:`berth.registry.images`).
"""

from __future__ import annotations

import builtins
from typing import Protocol

from pydantic import BaseModel

__all__ = ["Image", "ImageLayer", "ImageRegistry"]


class ImageLayer(BaseModel):
    id: str
    size: int


class Image(BaseModel):
    """A registered image: its layers (base first), their total size, platform and command."""

    name: str
    platform: str | None = None
    layers: list[ImageLayer]
    size: int
    command: list[str] = []
    created_at: float


class ImageRegistry(Protocol):
    """The API's images, by name."""

    async def add(self, image: Image) -> None:
        """Register ``image`` (replacing one of the same name)."""
        ...

    async def get(self, name: str) -> Image | None: ...

    async def list(self) -> builtins.list[Image]:
        """Every image, by name."""
        ...
