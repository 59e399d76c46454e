"""Reading one image out of an OCI image layout on disk.

This module owns resolving a reference to an :class:`~berth.oci.model.OciImage`
(:func:`read_layout`): the ``oci-layout`` marker, ``index.json``, the entry chosen by name,
image indexes followed (at most :data:`~berth.oci.model.MAX_INDEX_DEPTH` deep) to the manifest
for a platform, the manifest's config and layers.  Each file is checked on the way in and a
failure is an :class:`~berth.errors.Invalid` naming the file and field: a missing file, a file
that is not JSON or too large to be one, a blob whose size differs from its descriptor, a blob
path that leaves the layout (a symlinked ``blobs`` directory pointing elsewhere), a media type
berth does not read (``tar+zstd`` layers, foreign-layer URLs).  Manifests, indexes and configs
are small, so their content is hashed and checked against their digest here; layer blobs can be
gigabytes, so their digest is checked by whoever streams them (the erofs conversion,
:mod:`berth.node.erofs`) — :func:`verify_blob` does it on demand.  What the JSON documents may
say is :mod:`berth.oci.documents`'.  The path is the caller's, so whatever the system says
about it is an answer too: an ``OSError`` anywhere in the reading (a component over 255 bytes
or a path over 4 KiB — ``ENAMETOOLONG`` — a file that cannot be read, an I/O error) is an
``Invalid`` naming ``layout`` with the system's reason, never a crash of the caller.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from berth.errors import Invalid
from berth.oci.documents import (
    Descriptor,
    config_platform,
    descriptor_platform,
    parse_descriptor,
    parse_descriptors,
    parse_diff_ids,
    parse_json,
    required,
    runtime_config,
)
from berth.oci.model import (
    CONFIG_TYPES,
    CONTAINERD_NAME,
    INDEX_TYPES,
    LAYER_TYPES,
    MANIFEST_TYPES,
    MAX_INDEX_DEPTH,
    MAX_JSON_BYTES,
    MAX_LAYERS,
    REF_ANNOTATION,
    OciImage,
    OciLayer,
)
from berth.platform import Platform, host
from berth.validation import shown

__all__ = ["layout_refs", "read_layout", "verify_blob"]


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
    host's).  Raises ``Invalid`` naming the file and field for anything malformed or missing,
    and naming ``layout`` for anything the system refuses (see the module docstring).
    """
    with _system_refusals(path):
        return _read_layout(path, ref, platform)


def _read_layout(path: Path | str, ref: str | None, platform: Platform | str | None) -> OciImage:
    root = _layout_root(path)
    wanted = None if platform is None else Platform.parse(platform, field="platform")
    if ref is not None and (not isinstance(ref, str) or not ref):
        raise Invalid(f"expected a non-empty reference, got {shown(ref)}", field="ref")
    marker = _read_json(root, root / "oci-layout", "oci-layout")
    version = required(marker, "imageLayoutVersion", str, "oci-layout")
    if not version.startswith("1."):
        raise Invalid(
            f"unsupported layout version {shown(version)} (berth reads 1.x)",
            field="oci-layout imageLayoutVersion",
        )
    index = _read_json(root, root / "index.json", "index.json")
    entries = parse_descriptors(index, "manifests", "index.json")
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
    with _system_refusals(path):
        return _layout_refs(path)


def _layout_refs(path: Path | str) -> tuple[str, ...]:
    root = _layout_root(path)
    marker = _read_json(root, root / "oci-layout", "oci-layout")
    required(marker, "imageLayoutVersion", str, "oci-layout")
    index = _read_json(root, root / "index.json", "index.json")
    names = (
        d.annotations.get(REF_ANNOTATION)
        for d, _ in parse_descriptors(index, "manifests", "index.json")
    )
    return tuple(name for name in names if name)


def verify_blob(layer: OciLayer) -> None:
    """Hash ``layer``'s blob and check size and digest; ``Invalid`` naming the blob if not."""
    with _system_refusals(layer.path):
        digest, size = _hash_file(layer.path)
    _check_content(layer.path.name, layer.digest, layer.size, digest, size)


@contextlib.contextmanager
def _system_refusals(path: object) -> Iterator[None]:
    """An ``OSError`` while reading the layout at ``path`` as ``Invalid`` naming ``layout``."""
    try:
        yield
    except OSError as error:
        raise Invalid(_refusal(path, error), field="layout") from None


def _refusal(path: object, error: OSError) -> str:
    where = error.filename if error.filename is not None else path
    reason = error.strerror or type(error).__name__
    if error.errno == errno.ENAMETOOLONG:
        reason += f" (at most {_NAME_MAX} bytes a component, {_PATH_MAX} bytes a path)"
    return f"{shown(os.fsdecode(where) if isinstance(where, bytes) else str(where))}: {reason}"


_NAME_MAX = 255  # Linux's limits, named in the refusal of a path that passes them
_PATH_MAX = 4096


def _layout_root(path: Path | str) -> Path:
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise Invalid(
            f"expected the path of an OCI layout directory, got {shown(path)}", field="layout"
        )
    root = Path(path)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise Invalid(f"{shown(str(root))} {what}", field="layout")
    return root.resolve()


def _select_ref(
    entries: list[tuple[Descriptor, str]], ref: str | None
) -> tuple[list[Descriptor], list[str]]:
    if ref is None:
        return [d for d, _ in entries], [w for _, w in entries]
    names = []
    for descriptor, where in entries:
        name = descriptor.annotations.get(REF_ANNOTATION)
        full = descriptor.annotations.get(CONTAINERD_NAME)
        if ref in (name, full):
            return [descriptor], [where]
        names.append(name or full or descriptor.digest)
    raise Invalid(
        f"no image named {shown(ref)} in index.json; it names {', '.join(map(repr, names))}",
        field="ref",
    )


def _select_platform(
    descriptors: Sequence[Descriptor], wanted: Platform | None, where: str
) -> tuple[Descriptor, str]:
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
        candidate = descriptor_platform(descriptor.platform)
        if candidate is None:  # attestations ("unknown/unknown") and the like are not images
            continue
        offered.append(str(candidate))
        if candidate == target:
            return descriptor, f"{where} manifests.{i}"
    raise Invalid(
        f"no image for platform {target} in {where}; it offers {', '.join(offered) or 'none'}",
        field="platform",
    )


def _resolve(
    root: Path,
    descriptor: Descriptor,
    where: str,
    wanted: Platform | None,
    ref: str | None,
    depth: int,
) -> OciImage:
    if descriptor.media_type in INDEX_TYPES:
        if depth >= MAX_INDEX_DEPTH:
            raise Invalid(f"image indexes nested deeper than {MAX_INDEX_DEPTH}", field=where)
        name, document = _read_blob_json(root, descriptor, where)
        entries = parse_descriptors(document, "manifests", name)
        chosen, chosen_where = _select_platform([d for d, _ in entries], wanted, name)
        return _resolve(root, chosen, chosen_where, wanted, ref, depth + 1)
    if descriptor.media_type not in MANIFEST_TYPES:
        raise Invalid(
            f"unsupported media type {shown(descriptor.media_type)} "
            "(berth reads OCI and Docker v2 manifests and indexes)",
            field=f"{where}.mediaType",
        )
    name, manifest = _read_blob_json(root, descriptor, where)
    config_descriptor = parse_descriptor(required(manifest, "config", dict, name), f"{name} config")
    if config_descriptor.media_type not in CONFIG_TYPES:
        raise Invalid(
            f"unsupported media type {shown(config_descriptor.media_type)}",
            field=f"{name} config.mediaType",
        )
    config_name, config = _read_blob_json(root, config_descriptor, f"{name} config")
    platform = config_platform(config, config_name)
    if wanted is not None and platform != wanted:
        raise Invalid(f"the image is for {platform}, not {wanted}", field="platform")
    diff_ids = parse_diff_ids(config, config_name)
    layers: list[OciLayer] = []
    raw_layers = required(manifest, "layers", list, name)
    if len(raw_layers) > MAX_LAYERS:
        raise Invalid(f"at most {MAX_LAYERS} layers, got {len(raw_layers)}", field=f"{name} layers")
    if diff_ids is not None and len(diff_ids) != len(raw_layers):
        raise Invalid(
            f"{len(diff_ids)} diff_ids for {len(raw_layers)} layers",
            field=f"{config_name} rootfs.diff_ids",
        )
    seen: set[str] = set()
    for i, item in enumerate(raw_layers):
        layer_where = f"{name} layers.{i}"
        layer = parse_descriptor(item, layer_where)
        compression = LAYER_TYPES.get(layer.media_type)
        if compression is None:
            raise Invalid(
                f"unsupported layer media type {shown(layer.media_type)} "
                "(berth reads tar and tar+gzip layers)",
                field=f"{layer_where}.mediaType",
            )
        if layer.urls:
            raise Invalid(
                "foreign layers fetched from URLs are not supported", field=f"{layer_where}.urls"
            )
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
        config=runtime_config(config, config_name),
        config_digest=config_descriptor.digest,
    )


def _blob_path(root: Path, digest: str, where: str) -> Path:
    blob = root / "blobs" / "sha256" / digest.removeprefix("sha256:")
    name = _relative(root, blob)
    if not blob.is_file():
        what = "is missing" if not blob.exists() else "is not a regular file"
        raise Invalid(f"the blob {name} {what}", field=f"{where}.digest")
    real = blob.resolve()
    if not real.is_relative_to(root):
        raise Invalid(
            f"the blob {name} leads outside the layout (to {shown(str(real))})",
            field=f"{where}.digest",
        )
    return real


def _check_size(root: Path, blob: Path, size: int, where: str) -> None:
    actual = blob.stat().st_size
    if actual != size:
        raise Invalid(
            f"the blob {_relative(root, blob)} has {actual} bytes, the descriptor says {size}",
            field=f"{where}.size",
        )


def _relative(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _read_blob_json(root: Path, descriptor: Descriptor, where: str) -> tuple[str, dict[str, Any]]:
    blob = _blob_path(root, descriptor.digest, where)
    _check_size(root, blob, descriptor.size, where)
    name = _relative(root, blob)
    if descriptor.size > MAX_JSON_BYTES:
        raise Invalid(
            f"{descriptor.size} bytes, more than {MAX_JSON_BYTES} for a JSON blob",
            field=f"{where}.size",
        )
    data = blob.read_bytes()
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    _check_content(name, descriptor.digest, descriptor.size, actual, len(data))
    return name, parse_json(data, name)


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
    return parse_json(path.read_bytes(), name)


def _hash_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return "sha256:" + digest.hexdigest(), size
