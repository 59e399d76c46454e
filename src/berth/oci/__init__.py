"""OCI image layouts on local disk: reading one image out of a layout, and writing layouts.

An *OCI image layout* is a directory holding images without a registry: an ``oci-layout``
marker file, an ``index.json`` naming the images (by the ``org.opencontainers.image.ref.name``
annotation), and every manifest, image index, config and layer as a content-addressed blob
under ``blobs/sha256/<hex>`` (``skopeo copy docker://busybox oci:DIR:latest``, ``docker
buildx build --output type=oci`` and ``crane`` write them).  berth boots microVMs from such a
directory: :func:`read_layout` resolves one reference (through an image index, by platform, for
multi-platform images) to an :class:`OciImage` — its layers in order (base first), each an
:class:`OciLayer` with the path of its blob, and the parts of its config a runtime needs (the
command, the environment).  ``OciLayer.as_layer()`` is the ``(id, size)`` pair berth places
by: the layer's digest and its descriptor size, the bytes a node without it would fetch.

The package holds four modules, one per responsibility:

* :mod:`~berth.oci.model` — what a layout holds: the media types, the limits on what is read,
  and the resolved values (:class:`OciImage`, :class:`OciLayer`, :class:`OciConfig`);
* :mod:`~berth.oci.documents` — the layout's JSON documents validated into typed values
  (descriptors, an image config's platform, diff_ids and runtime settings);
* :mod:`~berth.oci.read` — resolving a reference to an image: the marker, ``index.json``,
  nested indexes, blobs checked against their descriptors (:func:`read_layout`,
  :func:`layout_refs`, :func:`verify_blob`);
* :mod:`~berth.oci.write` — writing layouts reproducibly from directories or tar members given
  in code (:func:`write_layout`, :func:`file`, :func:`directory`, …), so tests and benchmarks
  need no registry.

It is not a registry client and does not unpack layers; that is the node's job
(:mod:`berth.node.erofs`).  The names callers use are re-exported here.
"""

from __future__ import annotations

from berth.oci.model import (
    DOCKER_CONFIG,
    DOCKER_LAYER_GZIP,
    DOCKER_LIST,
    DOCKER_MANIFEST,
    MAX_INDEX_DEPTH,
    MAX_JSON_BYTES,
    MAX_LAYERS,
    MEDIA_CONFIG,
    MEDIA_INDEX,
    MEDIA_LAYER_GZIP,
    MEDIA_LAYER_TAR,
    MEDIA_MANIFEST,
    REF_ANNOTATION,
    LayerCompression,
    OciConfig,
    OciImage,
    OciLayer,
)
from berth.oci.read import layout_refs, read_layout, verify_blob
from berth.oci.write import (
    ImageSpec,
    LayerSource,
    TarMember,
    directory,
    file,
    hardlink,
    opaque,
    symlink,
    whiteout,
    write_layout,
)

__all__ = [
    "DOCKER_CONFIG",
    "DOCKER_LAYER_GZIP",
    "DOCKER_LIST",
    "DOCKER_MANIFEST",
    "MAX_INDEX_DEPTH",
    "MAX_JSON_BYTES",
    "MAX_LAYERS",
    "MEDIA_CONFIG",
    "MEDIA_INDEX",
    "MEDIA_LAYER_GZIP",
    "MEDIA_LAYER_TAR",
    "MEDIA_MANIFEST",
    "REF_ANNOTATION",
    "ImageSpec",
    "LayerCompression",
    "LayerSource",
    "OciConfig",
    "OciImage",
    "OciLayer",
    "TarMember",
    "directory",
    "file",
    "hardlink",
    "layout_refs",
    "opaque",
    "read_layout",
    "symlink",
    "verify_blob",
    "whiteout",
    "write_layout",
]
