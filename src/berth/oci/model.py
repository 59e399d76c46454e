"""What an OCI image layout holds, as berth reads and writes it.

This module owns the vocabulary of the :mod:`berth.oci` package: the media types berth reads
(OCI and Docker v2 manifests, indexes, configs; ``tar`` and ``tar+gzip`` layers) and writes,
the limits on what is read from an untrusted layout (JSON sizes, layer counts, index
nesting), and the values a resolved image is handed on as — :class:`OciImage`, its
:class:`OciLayer` list (base first) and its :class:`OciConfig`.  It reads nothing itself:
:mod:`berth.oci.read` builds these values from a layout on disk, after
:mod:`berth.oci.documents` has validated each JSON document.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from berth.model import Layer
from berth.platform import Platform
from berth.units import MiB

__all__ = [
    "CONFIG_TYPES",
    "CONTAINERD_NAME",
    "DIGEST",
    "DOCKER_CONFIG",
    "DOCKER_LAYER_GZIP",
    "DOCKER_LIST",
    "DOCKER_MANIFEST",
    "INDEX_TYPES",
    "LAYER_TYPES",
    "MANIFEST_TYPES",
    "MAX_INDEX_DEPTH",
    "MAX_JSON_BYTES",
    "MAX_LAYERS",
    "MEDIA_CONFIG",
    "MEDIA_INDEX",
    "MEDIA_LAYER_GZIP",
    "MEDIA_LAYER_TAR",
    "MEDIA_MANIFEST",
    "REF_ANNOTATION",
    "LayerCompression",
    "OciConfig",
    "OciImage",
    "OciLayer",
]

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
REF_ANNOTATION = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"

LayerCompression = Literal["none", "gzip"]
INDEX_TYPES = frozenset({MEDIA_INDEX, DOCKER_LIST})
MANIFEST_TYPES = frozenset({MEDIA_MANIFEST, DOCKER_MANIFEST})
CONFIG_TYPES = frozenset({MEDIA_CONFIG, DOCKER_CONFIG})
LAYER_TYPES: Mapping[str, LayerCompression] = {
    MEDIA_LAYER_TAR: "none",
    MEDIA_LAYER_GZIP: "gzip",
    DOCKER_LAYER_GZIP: "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": "none",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MAX_JSON_BYTES = 4 * MiB
"""The largest manifest, index or config read (containerd's limit for manifests)."""
MAX_LAYERS = 1024
MAX_INDEX_DEPTH = 4
"""Image indexes nest (an index naming an index); deeper than this is refused, not followed."""


@dataclass(frozen=True, slots=True)
class OciLayer:
    """One layer of an image: its ``digest`` (``sha256:…``), the ``size`` of its blob in
    bytes, its ``media_type``, how the tar is ``compression``-ed, the ``path`` of its blob,
    and its ``diff_id`` (the digest of the uncompressed tar, from the config) when known."""

    digest: str
    size: int
    media_type: str
    compression: LayerCompression
    path: Path
    diff_id: str | None = None

    def as_layer(self) -> Layer:
        """The ``(id, size)`` pair berth ranks nodes by: digest and descriptor size."""
        return Layer(id=self.digest, size=self.size)


@dataclass(frozen=True, slots=True)
class OciConfig:
    """The parts of an image config a runtime uses (``config`` of the OCI image config)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    """``KEY=value`` strings, in the image's order."""
    working_dir: str = ""
    user: str = ""

    @property
    def command(self) -> tuple[str, ...]:
        """What the image runs by default: ``entrypoint`` followed by ``cmd``."""
        return self.entrypoint + self.cmd

    def args(self, command: tuple[str, ...] = ()) -> tuple[str, ...]:
        """What a container of this image runs given ``command``, as Docker does:
        ``entrypoint`` followed by ``command``, which replaces ``cmd`` when given."""
        return self.entrypoint + (command or self.cmd)

    def environment(self) -> dict[str, str]:
        """``env`` as a mapping (a later repeat of a name wins, as in a shell)."""
        pairs = (item.partition("=") for item in self.env)
        return {name: value for name, _, value in pairs}


@dataclass(frozen=True, slots=True)
class OciImage:
    """One image resolved from a layout: ``layers`` base first, ready to stack.

    ``ref`` is the reference it was selected by (``None`` when the layout held one image
    without a name); ``digest`` is its manifest's digest (the image's id); ``platform`` comes
    from its config.
    """

    layout: Path
    ref: str | None
    digest: str
    platform: Platform
    layers: tuple[OciLayer, ...]
    config: OciConfig
    config_digest: str

    def berth_layers(self) -> tuple[Layer, ...]:
        """The ``(id, size)`` pairs of a ``Request``'s ``layers``, base first."""
        return tuple(layer.as_layer() for layer in self.layers)

    @property
    def size(self) -> int:
        """The layers' blob bytes together."""
        return sum(layer.size for layer in self.layers)
