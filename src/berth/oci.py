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

Everything read here is untrusted input, checked where it enters and reported as
:class:`~berth.errors.Invalid` whose field names the file and the JSON path of the offending
value (``index.json manifests.0.digest: expected 'sha256:' and 64 hex digits, got 'md5:1'``):
a missing file, a file that is not JSON or too large to be one, a digest that is not
``sha256:<64 lowercase hex>``, a blob whose size differs from its descriptor, a blob path that
leaves the layout (a symlinked ``blobs`` directory pointing elsewhere), a media type berth does
not read (``tar+zstd`` layers, foreign-layer URLs).  Manifests, indexes and configs are small,
so their content is hashed and checked against their digest here; layer blobs can be
gigabytes, so their digest is checked by whoever streams them (the erofs conversion,
:mod:`berth.node.erofs`) — :func:`verify_blob` does it on demand.

:func:`write_layout` builds layouts from directories or from tar members given in code
(:func:`file`, :func:`directory`, :func:`symlink`, :func:`hardlink`, :func:`whiteout`,
:func:`opaque`), reproducibly (fixed mtimes, gzip without a timestamp): tests and benchmarks
make their own images with it, so nothing needs a registry.  It is not a registry client and
does not unpack layers; that is the node's job.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from berth.errors import Invalid
from berth.model import Layer
from berth.platform import Platform, host
from berth.validation import shown

__all__ = [
    "ImageSpec",
    "LayerCompression",
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
_CONTAINERD_NAME = "io.containerd.image.name"

LayerCompression = Literal["none", "gzip"]
_INDEX_TYPES = frozenset({MEDIA_INDEX, DOCKER_LIST})
_MANIFEST_TYPES = frozenset({MEDIA_MANIFEST, DOCKER_MANIFEST})
_CONFIG_TYPES = frozenset({MEDIA_CONFIG, DOCKER_CONFIG})
_LAYER_TYPES: Mapping[str, LayerCompression] = {
    MEDIA_LAYER_TAR: "none",
    MEDIA_LAYER_GZIP: "gzip",
    DOCKER_LAYER_GZIP: "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": "none",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MAX_JSON_BYTES = 4 * 1024 * 1024
"""The largest manifest, index or config read (containerd's limit for manifests)."""
MAX_LAYERS = 1024
MAX_INDEX_DEPTH = 4
"""Image indexes nest (an index naming an index); deeper than this is refused, not followed."""


# --- what a layout holds ---------------------------------------------------------------------


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


# --- reading ---------------------------------------------------------------------------------


def read_layout(
    path: Path | str,
    *,
    ref: str | None = None,
    platform: Platform | str | None = None,
) -> OciImage:
    """Resolve one image of the OCI layout at ``path``.

    ``ref`` selects an ``index.json`` entry by its ``org.opencontainers.image.ref.name`` (or
    ``io.containerd.image.name``) annotation; without it the layout must hold exactly one
    image.  An image index is resolved to the manifest for ``platform`` (default: this
    host's).  Raises ``Invalid`` naming the file and field for anything malformed or missing.
    """
    root = _layout_root(path)
    wanted = None if platform is None else Platform.parse(platform, field="platform")
    if ref is not None and (not isinstance(ref, str) or not ref):
        raise Invalid(f"expected a non-empty reference, got {shown(ref)}", field="ref")
    marker = _read_json(root, root / "oci-layout", "oci-layout")
    version = _get(marker, "imageLayoutVersion", str, "oci-layout")
    if not version.startswith("1."):
        raise Invalid(f"unsupported layout version {shown(version)} (berth reads 1.x)",
                      field="oci-layout imageLayoutVersion")  # fmt: skip
    index = _read_json(root, root / "index.json", "index.json")
    entries = _descriptors(index, "manifests", "index.json")
    chosen, chosen_field = _select_ref(entries, ref)
    if len(chosen) > 1:
        descriptor, where = _select_platform(chosen, wanted, "index.json")
    else:
        descriptor, where = chosen[0], chosen_field[0]
    return _resolve(root, descriptor, where, wanted, ref, depth=0)


def layout_refs(path: Path | str) -> tuple[str, ...]:
    """The names (``org.opencontainers.image.ref.name``) of the images in the layout at
    ``path``, in ``index.json`` order; unnamed entries are left out.  ``Invalid`` as
    :func:`read_layout` for a malformed layout."""
    root = _layout_root(path)
    marker = _read_json(root, root / "oci-layout", "oci-layout")
    _get(marker, "imageLayoutVersion", str, "oci-layout")
    index = _read_json(root, root / "index.json", "index.json")
    names = (
        d.annotations.get(REF_ANNOTATION) for d, _ in _descriptors(index, "manifests", "index.json")
    )
    return tuple(name for name in names if name)


def verify_blob(layer: OciLayer) -> None:
    """Hash ``layer``'s blob and check size and digest; ``Invalid`` naming the blob if not."""
    digest, size = _hash_file(layer.path)
    _check_content(layer.path.name, layer.digest, layer.size, digest, size)


def _layout_root(path: Path | str) -> Path:
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise Invalid(f"expected the path of an OCI layout directory, got {shown(path)}",
                      field="layout")  # fmt: skip
    root = Path(path)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise Invalid(f"{shown(str(root))} {what}", field="layout")
    return root.resolve()


@dataclass(frozen=True, slots=True)
class _Descriptor:
    media_type: str
    digest: str
    size: int
    annotations: Mapping[str, str]
    platform: Mapping[str, Any] | None
    urls: bool


def _descriptors(
    document: Mapping[str, Any], key: str, where: str
) -> list[tuple[_Descriptor, str]]:
    raw = _get(document, key, list, where)
    if not raw:
        raise Invalid("no entries", field=f"{where} {key}")
    if len(raw) > MAX_LAYERS:
        raise Invalid(f"at most {MAX_LAYERS} entries, got {len(raw)}", field=f"{where} {key}")
    return [(_descriptor(item, f"{where} {key}.{i}"), f"{where} {key}.{i}")
            for i, item in enumerate(raw)]  # fmt: skip


def _descriptor(item: Any, where: str) -> _Descriptor:
    if not isinstance(item, dict):
        raise Invalid(f"expected a descriptor (a JSON object), got {shown(item)}", field=where)
    media_type = _get(item, "mediaType", str, where)
    digest = _get(item, "digest", str, where)
    if not _DIGEST.fullmatch(digest):
        raise Invalid(f"expected 'sha256:' and 64 lowercase hex digits, got {shown(digest)}",
                      field=f"{where}.digest")  # fmt: skip
    size = item.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 2**63:
        raise Invalid(f"expected a whole number of bytes, got {shown(size)}", field=f"{where}.size")
    annotations = item.get("annotations", {})
    if not isinstance(annotations, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        raise Invalid(f"expected a table of strings, got {shown(annotations)}",
                      field=f"{where}.annotations")  # fmt: skip
    platform = item.get("platform")
    if platform is not None and not isinstance(platform, dict):
        raise Invalid(f"expected a JSON object, got {shown(platform)}", field=f"{where}.platform")
    return _Descriptor(media_type, digest, size, annotations, platform, bool(item.get("urls")))


def _select_ref(
    entries: list[tuple[_Descriptor, str]], ref: str | None
) -> tuple[list[_Descriptor], list[str]]:
    if ref is None:
        return [d for d, _ in entries], [w for _, w in entries]
    names = []
    for descriptor, where in entries:
        name = descriptor.annotations.get(REF_ANNOTATION)
        full = descriptor.annotations.get(_CONTAINERD_NAME)
        if ref in (name, full):
            return [descriptor], [where]
        names.append(name or full or descriptor.digest)
    raise Invalid(
        f"no image named {shown(ref)} in index.json; it names {', '.join(map(repr, names))}",
        field="ref",
    )


def _select_platform(
    descriptors: Sequence[_Descriptor], wanted: Platform | None, where: str
) -> tuple[_Descriptor, str]:
    target = wanted or host()
    offered: list[str] = []
    for i, descriptor in enumerate(descriptors):
        if descriptor.platform is None:
            if where == "index.json":  # several unnamed, unplatformed images: ambiguous
                names = [d.annotations.get(REF_ANNOTATION, d.digest) for d in descriptors]
                raise Invalid(
                    f"the layout holds {len(descriptors)} images; choose one by reference: "
                    + ", ".join(map(repr, names)),
                    field="ref",
                )
            continue
        candidate = _descriptor_platform(descriptor.platform)
        if candidate is None:  # attestations ("unknown/unknown") and the like are not images
            continue
        offered.append(str(candidate))
        if candidate == target:
            return descriptor, f"{where} manifests.{i}"
    raise Invalid(
        f"no image for platform {target} in {where}; it offers {', '.join(offered) or 'none'}",
        field="platform",
    )


def _descriptor_platform(raw: Mapping[str, Any]) -> Platform | None:
    os_name, arch, variant = raw.get("os"), raw.get("architecture"), raw.get("variant", "")
    if not isinstance(os_name, str) or not isinstance(arch, str) or not isinstance(variant, str):
        return None
    try:
        return Platform.parse(f"{os_name}/{arch}/{variant}" if variant else f"{os_name}/{arch}")
    except Invalid:
        return None


def _resolve(
    root: Path,
    descriptor: _Descriptor,
    where: str,
    wanted: Platform | None,
    ref: str | None,
    depth: int,
) -> OciImage:
    if descriptor.media_type in _INDEX_TYPES:
        if depth >= MAX_INDEX_DEPTH:
            raise Invalid(f"image indexes nested deeper than {MAX_INDEX_DEPTH}", field=where)
        name, document = _read_blob_json(root, descriptor, where)
        entries = _descriptors(document, "manifests", name)
        chosen, chosen_where = _select_platform([d for d, _ in entries], wanted, name)
        return _resolve(root, chosen, chosen_where, wanted, ref, depth + 1)
    if descriptor.media_type not in _MANIFEST_TYPES:
        raise Invalid(
            f"unsupported media type {shown(descriptor.media_type)} "
            "(berth reads OCI and Docker v2 manifests and indexes)",
            field=f"{where}.mediaType",
        )
    name, manifest = _read_blob_json(root, descriptor, where)
    config_descriptor = _descriptor(_get(manifest, "config", dict, name), f"{name} config")
    if config_descriptor.media_type not in _CONFIG_TYPES:
        raise Invalid(f"unsupported media type {shown(config_descriptor.media_type)}",
                      field=f"{name} config.mediaType")  # fmt: skip
    config_name, config = _read_blob_json(root, config_descriptor, f"{name} config")
    platform = _config_platform(config, config_name)
    if wanted is not None and platform != wanted:
        raise Invalid(f"the image is for {platform}, not {wanted}", field="platform")
    diff_ids = _diff_ids(config, config_name)
    layers: list[OciLayer] = []
    raw_layers = _get(manifest, "layers", list, name)
    if len(raw_layers) > MAX_LAYERS:
        raise Invalid(f"at most {MAX_LAYERS} layers, got {len(raw_layers)}", field=f"{name} layers")
    if diff_ids is not None and len(diff_ids) != len(raw_layers):
        raise Invalid(f"{len(diff_ids)} diff_ids for {len(raw_layers)} layers",
                      field=f"{config_name} rootfs.diff_ids")  # fmt: skip
    seen: set[str] = set()
    for i, item in enumerate(raw_layers):
        layer_where = f"{name} layers.{i}"
        layer = _descriptor(item, layer_where)
        compression = _LAYER_TYPES.get(layer.media_type)
        if compression is None:
            raise Invalid(
                f"unsupported layer media type {shown(layer.media_type)} "
                "(berth reads tar and tar+gzip layers)",
                field=f"{layer_where}.mediaType",
            )
        if layer.urls:
            raise Invalid("foreign layers fetched from URLs are not supported",
                          field=f"{layer_where}.urls")  # fmt: skip
        if layer.digest in seen:
            raise Invalid(f"layer {layer.digest} is listed twice", field=f"{layer_where}.digest")
        seen.add(layer.digest)
        blob = _blob_path(root, layer.digest, layer_where)
        _check_size(root, blob, layer.size, layer_where)
        layers.append(
            OciLayer(
                digest=layer.digest,
                size=layer.size,
                media_type=layer.media_type,
                compression=compression,
                path=blob,
                diff_id=None if diff_ids is None else diff_ids[i],
            )
        )
    return OciImage(
        layout=root,
        ref=ref if ref is not None else descriptor.annotations.get(REF_ANNOTATION),
        digest=descriptor.digest,
        platform=platform,
        layers=tuple(layers),
        config=_runtime_config(config, config_name),
        config_digest=config_descriptor.digest,
    )


def _config_platform(config: Mapping[str, Any], name: str) -> Platform:
    os_name = _get(config, "os", str, name)
    arch = _get(config, "architecture", str, name)
    variant = config.get("variant", "")
    if not isinstance(variant, str):
        raise Invalid(f"expected a string, got {shown(variant)}", field=f"{name} variant")
    text = f"{os_name}/{arch}/{variant}" if variant else f"{os_name}/{arch}"
    return Platform.parse(text, field=f"{name} os/architecture")


def _diff_ids(config: Mapping[str, Any], name: str) -> list[str] | None:
    rootfs = config.get("rootfs")
    if rootfs is None:
        return None
    if not isinstance(rootfs, dict):
        raise Invalid(f"expected a JSON object, got {shown(rootfs)}", field=f"{name} rootfs")
    diff_ids = _get(rootfs, "diff_ids", list, f"{name} rootfs")
    for i, diff_id in enumerate(diff_ids):
        if not isinstance(diff_id, str) or not _DIGEST.fullmatch(diff_id):
            raise Invalid(f"expected 'sha256:' and 64 lowercase hex digits, got {shown(diff_id)}",
                          field=f"{name} rootfs.diff_ids.{i}")  # fmt: skip
    return [str(diff_id) for diff_id in diff_ids]


def _runtime_config(config: Mapping[str, Any], name: str) -> OciConfig:
    inner = config.get("config") or {}
    if not isinstance(inner, dict):
        raise Invalid(f"expected a JSON object, got {shown(inner)}", field=f"{name} config")

    def strings(key: str) -> tuple[str, ...]:
        value = inner.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise Invalid(f"expected a list of strings, got {shown(value)}",
                          field=f"{name} config.{key}")  # fmt: skip
        return tuple(value)

    def text(key: str) -> str:
        value = inner.get(key) or ""
        if not isinstance(value, str):
            raise Invalid(f"expected a string, got {shown(value)}", field=f"{name} config.{key}")
        return value

    return OciConfig(
        entrypoint=strings("Entrypoint"),
        cmd=strings("Cmd"),
        env=strings("Env"),
        working_dir=text("WorkingDir"),
        user=text("User"),
    )


def _get(document: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in document:
        raise Invalid("required, but missing", field=f"{where} {key}")
    value = document[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        expected = {"str": "a string", "list": "a list", "dict": "a JSON object"}[kind.__name__]
        raise Invalid(f"expected {expected}, got {shown(value)}", field=f"{where} {key}")
    return value


def _blob_path(root: Path, digest: str, where: str) -> Path:
    blob = root / "blobs" / "sha256" / digest.removeprefix("sha256:")
    name = _relative(root, blob)
    if not blob.is_file():
        what = "is missing" if not blob.exists() else "is not a regular file"
        raise Invalid(f"the blob {name} {what}", field=f"{where}.digest")
    real = blob.resolve()
    if not real.is_relative_to(root):
        raise Invalid(f"the blob {name} leads outside the layout (to {shown(str(real))})",
                      field=f"{where}.digest")  # fmt: skip
    return real


def _check_size(root: Path, blob: Path, size: int, where: str) -> None:
    actual = blob.stat().st_size
    if actual != size:
        raise Invalid(f"the blob {_relative(root, blob)} has {actual} bytes, the descriptor says "
                      f"{size}", field=f"{where}.size")  # fmt: skip


def _relative(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _read_blob_json(root: Path, descriptor: _Descriptor, where: str) -> tuple[str, dict[str, Any]]:
    blob = _blob_path(root, descriptor.digest, where)
    _check_size(root, blob, descriptor.size, where)
    name = _relative(root, blob)
    if descriptor.size > MAX_JSON_BYTES:
        raise Invalid(f"{descriptor.size} bytes, more than {MAX_JSON_BYTES} for a JSON blob",
                      field=f"{where}.size")  # fmt: skip
    data = blob.read_bytes()
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    _check_content(name, descriptor.digest, descriptor.size, actual, len(data))
    return name, _parse_json(data, name)


def _check_content(name: str, digest: str, size: int, actual_digest: str, actual_size: int) -> None:
    if actual_size != size:
        raise Invalid(f"has {actual_size} bytes, its descriptor says {size}", field=name)
    if actual_digest != digest:
        raise Invalid(f"content hashes to {actual_digest}, not {digest}", field=name)


def _read_json(root: Path, path: Path, name: str) -> dict[str, Any]:
    if not path.is_file():
        what = "is missing" if not path.exists() else "is not a regular file"
        raise Invalid(f"{what}: not an OCI image layout", field=name)
    if not path.resolve().is_relative_to(root):
        raise Invalid("leads outside the layout", field=name)
    if path.stat().st_size > MAX_JSON_BYTES:
        raise Invalid(f"larger than {MAX_JSON_BYTES} bytes", field=name)
    return _parse_json(path.read_bytes(), name)


def _parse_json(data: bytes, name: str) -> dict[str, Any]:
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise Invalid(
            f"not UTF-8 text ({error.reason} at byte {error.start})", field=name
        ) from None
    except (json.JSONDecodeError, RecursionError) as error:
        detail = (
            f"{error.msg} at line {error.lineno}"
            if isinstance(error, json.JSONDecodeError)
            else "nested too deeply"
        )
        raise Invalid(f"not valid JSON ({detail})", field=name) from None
    if not isinstance(document, dict):
        raise Invalid(f"expected a JSON object, got {shown(document)}", field=name)
    return document


def _hash_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return "sha256:" + digest.hexdigest(), size


# --- writing ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TarMember:
    """One entry of a layer built in code (see :func:`file`, :func:`directory`, …)."""

    path: str
    kind: Literal["file", "dir", "symlink", "hardlink", "char"]
    data: bytes = b""
    mode: int = 0o644
    target: str = ""
    uid: int = 0
    gid: int = 0


def file(
    path: str, data: bytes | str = b"", mode: int = 0o644, *, uid: int = 0, gid: int = 0
) -> TarMember:
    """A regular file."""
    content = data.encode() if isinstance(data, str) else data
    return TarMember(path, "file", content, mode, uid=uid, gid=gid)


def directory(path: str, mode: int = 0o755) -> TarMember:
    """A directory."""
    return TarMember(path, "dir", mode=mode)


def symlink(path: str, target: str) -> TarMember:
    """A symbolic link to ``target``."""
    return TarMember(path, "symlink", mode=0o777, target=target)


def hardlink(path: str, target: str) -> TarMember:
    """A hard link to the earlier member ``target``."""
    return TarMember(path, "hardlink", target=target)


def whiteout(path: str) -> TarMember:
    """An OCI whiteout: ``path`` is deleted from the layers below (``dir/.wh.name``)."""
    parent, _, name = path.rstrip("/").rpartition("/")
    return file(f"{parent}/.wh.{name}" if parent else f".wh.{name}", b"")


def opaque(path: str) -> TarMember:
    """An OCI opaque marker: the directory ``path`` hides everything below it."""
    return file(f"{path.rstrip('/')}/.wh..wh..opq", b"")


LayerSource = Path | bytes | Sequence[TarMember]
"""A layer to write: a directory (tarred), an uncompressed tar stream, or members."""


@dataclass(frozen=True, slots=True)
class ImageSpec:
    """One image to write: its layers (base first), platform and default command."""

    layers: Sequence[LayerSource]
    platform: str = "linux/amd64"
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    working_dir: str = ""
    extra_config: Mapping[str, Any] = field(default_factory=dict)


def write_layout(
    dest: Path | str,
    images: ImageSpec | Sequence[ImageSpec],
    *,
    ref: str = "latest",
    compression: LayerCompression = "gzip",
) -> Path:
    """Write ``images`` into the OCI layout at ``dest`` under the name ``ref``; return ``dest``.

    One image gets a manifest; several (one per platform) get an image index naming their
    manifests.  ``dest`` is created if missing; an existing layout keeps its other names (a
    name written again is replaced).  Output is reproducible: the same input gives the same
    digests.
    """
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    if not (root / "oci-layout").exists():
        (root / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    specs = [images] if isinstance(images, ImageSpec) else list(images)
    if not specs:
        raise Invalid("at least one image is needed", field="images")
    manifests = [_write_image(root, spec, compression) for spec in specs]
    if len(manifests) == 1:
        top = manifests[0]
        top = {key: value for key, value in top.items() if key != "platform"}
    else:
        document = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": manifests}
        top = _write_json_blob(root, document, MEDIA_INDEX)
    top["annotations"] = {REF_ANNOTATION: ref}
    index_path = root / "index.json"
    entries: list[dict[str, Any]] = []
    if index_path.exists():
        entries = [
            entry
            for entry in json.loads(index_path.read_text()).get("manifests", [])
            if entry.get("annotations", {}).get(REF_ANNOTATION) != ref
        ]
    entries.append(top)
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": entries}
    _atomic_write(index_path, json.dumps(index, indent=2).encode())
    return root


def _write_image(root: Path, spec: ImageSpec, compression: LayerCompression) -> dict[str, Any]:
    platform = Platform.parse(spec.platform, field="platform")
    layer_descriptors: list[dict[str, Any]] = []
    diff_ids: list[str] = []
    for source in spec.layers:
        descriptor, diff_id = _write_layer(root, source, compression)
        layer_descriptors.append(descriptor)
        diff_ids.append(diff_id)
    config: dict[str, Any] = {
        "architecture": platform.arch,
        "os": platform.os,
        "config": {
            "Env": list(spec.env),
            "Entrypoint": list(spec.entrypoint) or None,
            "Cmd": list(spec.cmd) or None,
            "WorkingDir": spec.working_dir,
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        **spec.extra_config,
    }
    if platform.variant:
        config["variant"] = platform.variant
    config_descriptor = _write_json_blob(root, config, MEDIA_CONFIG)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config_descriptor,
        "layers": layer_descriptors,
    }
    descriptor = _write_json_blob(root, manifest, MEDIA_MANIFEST)
    descriptor["platform"] = {"os": platform.os, "architecture": platform.arch}
    if platform.variant:
        descriptor["platform"]["variant"] = platform.variant
    return descriptor


class _HashingWriter(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to ``target``."""

    def __init__(self, target: IO[bytes] | io.RawIOBase | gzip.GzipFile) -> None:
        self.target = target
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.size += len(view)
        self.target.write(view)
        return len(view)


def _write_layer(
    root: Path, source: LayerSource, compression: LayerCompression
) -> tuple[dict[str, Any], str]:
    blobs = root / "blobs" / "sha256"
    with tempfile.NamedTemporaryFile(dir=blobs, prefix=".layer-", delete=False) as raw:
        temp = Path(raw.name)
        try:
            compressed = _HashingWriter(raw)
            gz = (
                gzip.GzipFile(fileobj=compressed, mode="wb", compresslevel=6, mtime=0)
                if compression == "gzip"
                else None
            )
            uncompressed = _HashingWriter(gz if gz is not None else compressed)
            with tarfile.open(fileobj=uncompressed, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for info, data in _tar_entries(source):
                    tar.addfile(info, data)
            if gz is not None:
                gz.close()
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
    digest = "sha256:" + compressed.sha.hexdigest()
    os.replace(temp, blobs / digest.removeprefix("sha256:"))
    media_type = MEDIA_LAYER_GZIP if compression == "gzip" else MEDIA_LAYER_TAR
    descriptor = {"mediaType": media_type, "digest": digest, "size": compressed.size}
    return descriptor, "sha256:" + uncompressed.sha.hexdigest()


def _tar_entries(source: LayerSource) -> Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]]:
    if isinstance(source, bytes):
        with tarfile.open(fileobj=io.BytesIO(source), mode="r:") as tar:
            for info in tar:
                yield info, tar.extractfile(info) if info.isreg() else None
    elif isinstance(source, Path):
        yield from _directory_entries(source)
    else:
        for member in source:
            yield _member_info(member), io.BytesIO(member.data) if member.kind == "file" else None


_KINDS = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "char": tarfile.CHRTYPE,
}


def _member_info(member: TarMember) -> tarfile.TarInfo:
    info = tarfile.TarInfo(member.path)
    info.type = _KINDS[member.kind]
    info.mode = member.mode
    info.uid, info.gid = member.uid, member.gid
    info.mtime = 0
    info.linkname = member.target
    info.size = len(member.data) if member.kind == "file" else 0
    return info


def _directory_entries(top: Path) -> Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]]:
    if not top.is_dir():
        raise Invalid(f"{shown(str(top))} is not a directory", field="layers")
    seen_inodes: dict[tuple[int, int], str] = {}
    for path in _walk(top):
        name = path.relative_to(top).as_posix()
        stat = path.lstat()
        info = tarfile.TarInfo(name)
        info.mode = stat.st_mode & 0o7777
        info.uid, info.gid = stat.st_uid, stat.st_gid
        info.mtime = 0
        if path.is_symlink():
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
            yield info, None
        elif path.is_dir():
            info.type = tarfile.DIRTYPE
            yield info, None
        elif path.is_file():
            key = (stat.st_dev, stat.st_ino)
            if stat.st_nlink > 1 and key in seen_inodes:
                info.type, info.linkname = tarfile.LNKTYPE, seen_inodes[key]
                yield info, None
                continue
            seen_inodes[key] = name
            info.size = stat.st_size
            with path.open("rb") as stream:
                yield info, stream
        # sockets, fifos and devices in a source directory are skipped: images carry files


def _walk(top: Path) -> Iterable[Path]:
    for entry in sorted(top.iterdir(), key=lambda p: p.name):
        yield entry
        if entry.is_dir() and not entry.is_symlink():
            yield from _walk(entry)


def _write_json_blob(root: Path, document: Mapping[str, Any], media_type: str) -> dict[str, Any]:
    data = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(data).hexdigest()
    _atomic_write(root / "blobs" / "sha256" / digest, data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def _atomic_write(path: Path, data: bytes) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}-", delete=False) as out:
        out.write(data)
    os.replace(out.name, path)
