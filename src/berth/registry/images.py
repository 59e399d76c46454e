"""Images from untrusted values: what the image registry stores, checked at the edge.

An image is its layers in order (base first), each ``(id, size)`` — the pairs berth places by
(colocation is measured in bytes of layers a node already holds) — an optional platform and
the command its config names.  Images are registered through the API: given as layers
(``POST /v1/images``), or read from a local OCI image layout directory with
:func:`berth.oci.read_layout` (``POST /v1/images/oci``: the layers' digests and descriptor
sizes, the image's platform and command).  They are kept by an
:class:`~berth.registry.port.ImageRegistry` (in the API's KV bucket on NATS,
:class:`~berth.registry.nats.NatsImages`).

Every value is checked with berth's own types before anything is stored: the name is a
``Name``, each layer a :class:`~berth.model.Layer` (ids unique, sizes bounded), the platform a
:class:`~berth.platform.Platform` — a refusal is ``Invalid`` naming the field, and stores
nothing.  It is not a registry client and pulls nothing: layers are fetched by nodes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from berth.errors import Invalid
from berth.model import NAME_RULE, checked_layers
from berth.oci import read_layout
from berth.platform import Platform
from berth.registry.port import Image, ImageLayer

__all__ = ["image_from_layout", "image_of"]


def image_of(name: Any, layers: Any, platform: Any = None, command: tuple[str, ...] = ()) -> Image:
    """An image from untrusted values, each checked by berth's types (``Invalid`` naming
    ``name``, ``layers.<i>…`` or ``platform``)."""
    name = NAME_RULE(name, "name")
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
    chosen = name or image.ref or image.layout.name  # the layout resolved: no second lookup
    return image_of(chosen, image.berth_layers(), image.platform, image.config.command)
