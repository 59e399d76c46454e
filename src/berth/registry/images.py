"""The image registry: named images as layer chains with sizes, so a request can name one.

An image is its layers in order (base first), each ``(id, size)`` — the pairs berth places by
(colocation is measured in bytes of layers a node already holds) — an optional platform and
the command its config names.  Images are registered through the API: given as layers
(``POST /v1/images``), or read from a local OCI image layout directory with
:func:`berth.oci.read_layout` (``POST /v1/images/oci``: the layers' digests and descriptor
sizes, the image's platform and command).  They are kept under the key ``i.<name>`` of the
API's KV bucket (:data:`~berth.registry.workloads.API_BUCKET`).

Every value is checked with berth's own types before anything is stored: the name is a
``Name``, each layer a :class:`~berth.model.Layer` (ids unique, sizes bounded), the platform a
:class:`~berth.platform.Platform` — a refusal is ``Invalid`` naming the field, and stores
nothing.  It is not a registry client and pulls nothing: layers are fetched by nodes.
"""

from __future__ import annotations

import builtins
import time
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from pydantic import BaseModel

from berth.errors import Invalid
from berth.model import Name, checked_layers
from berth.nats.names import API_BUCKET
from berth.oci import read_layout
from berth.platform import Platform
from berth.registry.workloads import JsonBucket
from berth.validation import Rule

__all__ = ["Image", "ImageLayer", "ImageRegistry", "image_from_layout", "image_of"]

_NAME: Rule[str] = Rule(Name)


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


def image_of(name: Any, layers: Any, platform: Any = None, command: tuple[str, ...] = ()) -> Image:
    """An image from untrusted values, each checked by berth's types (``Invalid`` naming
    ``name``, ``layers.<i>…`` or ``platform``)."""
    name = _NAME(name, "name")
    checked = checked_layers(layers)
    parsed = None if platform is None else str(Platform.parse(platform, field="platform"))
    return Image(
        name=name,
        platform=parsed,
        layers=[ImageLayer(id=layer.id, size=layer.size) for layer in checked],
        size=sum(layer.size for layer in checked),
        command=list(command),
        created_at=time.time(),
    )


def image_from_layout(
    path: str, *, name: str | None = None, ref: str | None = None, platform: str | None = None
) -> Image:
    """The image of the OCI layout at ``path`` (``ref``/``platform`` choose one of several);
    named ``name``, else by its reference, else by the layout directory's name."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise Invalid(f"expected a directory path, got {path!r}", field="path")
    try:
        image = read_layout(Path(path), ref=ref, platform=platform)
    except Invalid as error:
        if error.field in ("ref", "platform"):  # the request's own fields, not the layout's
            raise
        # the reader names what inside the layout is wrong (a file, a field of it, or the
        # directory itself); the field is the request's ``path``, the detail says the rest
        where = "" if error.field in (None, "", "layout") else f"{error.field}: "
        raise Invalid(f"the OCI layout: {where}{error.message}", field="path") from None
    chosen = name or image.ref or Path(path).resolve().name
    return image_of(chosen, image.berth_layers(), image.platform, image.config.command)


class ImageRegistry:
    """The API's images (see the module docstring)."""

    def __init__(self, client: Client, *, bucket: str = API_BUCKET) -> None:
        self._documents = JsonBucket(client, Image, prefix="i", bucket=bucket)

    async def start(self) -> ImageRegistry:
        await self._documents.start()
        return self

    async def add(self, image: Image) -> None:
        """Register ``image`` (replacing one of the same name)."""
        await self._documents.put(image.name, image)

    async def get(self, name: str) -> Image | None:
        return await self._documents.get(name)

    async def list(self) -> builtins.list[Image]:
        return sorted(await self._documents.all(), key=lambda image: image.name)
