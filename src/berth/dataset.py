"""Real container-image layer data: the Docker Hub top-images dataset and its file format.

This module owns reading image datasets — images, their pull counts, platforms and layer
chains — into validated values, so the simulator and benchmarks place workloads whose layer
sharing is *measured*, not invented.  It is not a registry client (nothing is fetched from the
network) and it does not choose which images to run; that is :mod:`berth.sim.workload`.

The bundled file ``berth/data/dockerhub_top_images.json`` holds 145 popular Docker Hub images
with 1,068 layer entries and 858 distinct layer digests; its provenance line is kept as
:attr:`Dataset.source`.  The file format (also read by :meth:`Dataset.from_path`)::

    {"source": "<where the data comes from>",
     "images": [{"name": str, "pull_count": int >= 0, "platform": "os/arch[/variant]",
                 "layers": [{"digest": str, "size": int bytes}, ...]}, ...]}

Two rules are applied while reading, because the raw data needs them:

* **duplicate layers within one image are dropped, keeping the first occurrence.**  An image
  mounts a given layer once, and :class:`~berth.model.Request` requires unique layer ids.  In
  the bundled data only ``hipache`` is affected: it lists the 32-byte empty layer
  ``sha256:a3ed95ca…`` five times, so it keeps 11 of its 15 entries (1,064 entries remain).
* a digest must have **the same size in every image** that lists it; otherwise the file is
  rejected, since colocation scores would depend on which image was read first.

**Synthetic platform variants.**  Every image in the data is built for one platform, while a
multi-arch image's per-platform variants have *different* layer digests of similar sizes.
:func:`synthetic_variant` derives such a variant for a simulation: same name, same sizes,
each layer id rewritten to ``synthetic:<os>-<arch>[-<variant>]:<original id>`` — a new
digest per platform that says plainly it is not real data, and the same rewrite for the same
layer in every image, so base layers stay shared *within* a platform as they are in the data.

Image names must be unique.  Every problem raises :class:`~berth.errors.Invalid` whose message
names the image and whose ``field`` locates the value (``images.3.layers.0.size``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from functools import cache, cached_property
from importlib import resources
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictInt, field_validator

from berth.errors import Invalid
from berth.model import Layer, Name, unique_layers
from berth.platform import Platform
from berth.validation import BerthModel

__all__ = [
    "DOCKERHUB_RESOURCE",
    "SYNTHETIC_PREFIX",
    "Dataset",
    "Image",
    "load_dockerhub",
    "synthetic_layer_id",
    "synthetic_variant",
]

DOCKERHUB_RESOURCE = "data/dockerhub_top_images.json"
"""Where the bundled Docker Hub dataset lives inside the ``berth`` package."""
SYNTHETIC_PREFIX = "synthetic:"
"""Every synthetic layer id starts with this (see :func:`synthetic_variant`)."""


def _pair(value: Any) -> Any:
    """Accept a layer written as an ``(id, size)`` pair, as ``Request`` does."""
    if isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[0], str):
        return {"id": value[0], "size": value[1]}
    return value


class Image(BerthModel):
    """One container image: its popularity, the one platform it is built for, its layers.

    ``layers`` runs base first (``Layer`` or ``(id, size)`` pairs); ids are unique within the
    image and there is at least one.
    """

    name: Name
    pull_count: Annotated[StrictInt, Field(ge=0)]
    platform: Platform
    layers: Annotated[tuple[Annotated[Layer, BeforeValidator(_pair)], ...], Field(min_length=1)]

    _unique_layers = field_validator("layers")(unique_layers)

    @property
    def size(self) -> int:
        """Total bytes of the image's layers."""
        return sum(layer.size for layer in self.layers)


class Dataset(BerthModel):
    """A set of images with unique names and a provenance line (``source``)."""

    source: Annotated[str, Field(min_length=1)]
    images: tuple[Image, ...]

    @field_validator("images")
    @classmethod
    def _consistent(cls, images: tuple[Image, ...]) -> tuple[Image, ...]:
        names: set[str] = set()
        sizes: dict[str, tuple[int, str]] = {}
        for image in images:
            if image.name in names:
                raise Invalid(f"image {image.name!r} is listed more than once")
            names.add(image.name)
            for layer in image.layers:
                size, first = sizes.setdefault(layer.id, (layer.size, image.name))
                if size != layer.size:
                    raise Invalid(
                        f"layer {layer.id!r} is {size} bytes in image {first!r} "
                        f"but {layer.size} bytes in image {image.name!r}"
                    )
        return images

    @classmethod
    def from_document(cls, document: Any) -> Dataset:
        """Read the file format (see the module docstring) from decoded JSON."""
        if not isinstance(document, Mapping):
            raise Invalid(
                f"a dataset is a JSON object with 'source' and 'images', got "
                f"{type(document).__name__}",
                field="dataset",
            )
        unknown = sorted(set(document) - {"source", "images"})
        if unknown:
            raise Invalid(f"unknown keys {unknown}", field="dataset")
        records = document.get("images")
        if not isinstance(records, list):
            raise Invalid(f"must be a list of images, got {records!r:.60}", field="images")
        images = tuple(_image(index, record) for index, record in enumerate(records))
        present = {"source": document["source"]} if "source" in document else {}
        return cls(**present, images=images)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> Dataset:
        """Read a dataset file in the bundled file's format."""
        try:
            with open(path, encoding="utf-8") as file:
                document = json.load(file)
        except OSError as error:
            raise Invalid(
                f"cannot read {os.fspath(path)!r}: {error.strerror}", field="path"
            ) from None
        except ValueError as error:
            raise Invalid(f"{os.fspath(path)!r} is not valid JSON: {error}", field="path") from None
        return cls.from_document(document)

    @cached_property
    def _by_name(self) -> dict[str, Image]:
        return {image.name: image for image in self.images}

    def by_name(self, name: str) -> Image:
        """The image called ``name``; ``Invalid`` (field ``image``) when there is none."""
        try:
            return self._by_name[name]
        except KeyError:
            raise Invalid(f"no image {name!r} in the dataset", field="image") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self.images)

    @property
    def names(self) -> tuple[str, ...]:
        """Image names, in file order."""
        return tuple(image.name for image in self.images)

    @property
    def layers(self) -> tuple[Layer, ...]:
        """Every distinct layer, in order of first appearance."""
        distinct: dict[str, Layer] = {}
        for image in self.images:
            for layer in image.layers:
                distinct.setdefault(layer.id, layer)
        return tuple(distinct.values())

    @property
    def layer_entries(self) -> int:
        """Layer entries summed over images (a layer shared by k images counts k times)."""
        return sum(len(image.layers) for image in self.images)

    @property
    def distinct_bytes(self) -> int:
        """Bytes of all distinct layers: what one node holding every image would store."""
        return sum(layer.size for layer in self.layers)

    @property
    def total_bytes(self) -> int:
        """Sum of image sizes: what storing every image without layer sharing would take."""
        return sum(image.size for image in self.images)

    @property
    def platforms(self) -> frozenset[Platform]:
        """The platforms at least one image is built for."""
        return frozenset(image.platform for image in self.images)

    def on_platforms(self, platforms: Iterable[str | Platform]) -> Dataset:
        """The images built for one of ``platforms`` (empty means any), same ``source``.

        ``Invalid`` (field ``platforms``) when no image is left, because an empty dataset can
        drive no workload.
        """
        wanted = frozenset(Platform.parse(p, field="platforms") for p in platforms)
        if not wanted:
            return self
        kept = tuple(image for image in self.images if image.platform in wanted)
        if not kept:
            offered = ", ".join(sorted(str(p) for p in self.platforms))
            raise Invalid(
                f"no image is built for {', '.join(sorted(str(p) for p in wanted))}; "
                f"the dataset offers {offered}",
                field="platforms",
            )
        return Dataset(source=self.source, images=kept)


def _image(index: int, record: Any) -> Image:
    """Build image ``index`` from its file record, dropping repeated layer digests."""
    if not isinstance(record, Mapping):
        raise Invalid(
            f"image #{index} must be an object, got {record!r:.60}", field=f"images.{index}"
        )
    name = record.get("name")
    label = f"image {name!r} (#{index})" if isinstance(name, str) else f"image #{index}"
    data = dict(record)
    positions: list[int] = []  # file position of each kept layer, for error locations
    raw_layers = record.get("layers")
    if isinstance(raw_layers, list):
        layers: list[dict[str, Any]] = []
        seen: set[Any] = set()
        for position, raw in enumerate(raw_layers):
            where = f"images.{index}.layers.{position}"
            if not isinstance(raw, Mapping):
                raise Invalid(
                    f"{label}: a layer is an object with digest and size, got {raw!r:.60}",
                    field=where,
                )
            unknown = sorted(set(raw) - {"digest", "size"})
            if unknown:
                raise Invalid(f"{label}: unknown layer keys {unknown}", field=where)
            if "digest" not in raw:
                raise Invalid(f"{label}: the layer has no digest", field=f"{where}.digest")
            digest = raw["digest"]
            if isinstance(digest, str):
                if digest in seen:
                    continue
                seen.add(digest)
            positions.append(position)
            layers.append({"id": digest} | ({"size": raw["size"]} if "size" in raw else {}))
        data["layers"] = layers
    try:
        return Image.from_dict(data)
    except Invalid as error:
        field = _file_field(error.field, positions)
        raise Invalid(
            f"{label}: {error.message}",
            field=f"images.{index}.{field}" if field else f"images.{index}",
        ) from None


def _file_field(field: str | None, positions: list[int]) -> str | None:
    """Translate an ``Image`` field (``layers.3.id``) back to the file's (``layers.5.digest``)."""
    match = re.fullmatch(r"layers\.(\d+)(\.id|\.size)?", field or "")
    if match is None:
        return field
    position = int(match.group(1))
    position = positions[position] if position < len(positions) else position
    suffix = {".id": ".digest", ".size": ".size", None: ""}[match.group(2)]
    return f"layers.{position}{suffix}"


def synthetic_layer_id(layer_id: str, platform: Platform) -> str:
    """The id of ``layer_id``'s synthetic variant for ``platform`` (module docstring)."""
    tag = "-".join(part for part in (platform.os, platform.arch, platform.variant) if part)
    return f"{SYNTHETIC_PREFIX}{tag}:{layer_id}"


def synthetic_variant(image: Image, platform: Platform) -> Image:
    """``image`` as if also built for ``platform``: new layer ids, the same sizes.

    The image's own platform returns it unchanged (its real digests).
    """
    if image.platform == platform:
        return image
    layers = tuple(
        Layer(id=synthetic_layer_id(layer.id, platform), size=layer.size) for layer in image.layers
    )
    return Image(name=image.name, pull_count=image.pull_count, platform=platform, layers=layers)


@cache
def load_dockerhub() -> Dataset:
    """The bundled Docker Hub top-images dataset (read once, then cached)."""
    text = resources.files("berth").joinpath(DOCKERHUB_RESOURCE).read_text(encoding="utf-8")
    return Dataset.from_document(json.loads(text))
