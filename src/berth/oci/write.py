"""Writing OCI image layouts: images built from directories or from tar members given in code.

This module owns :func:`write_layout` and the members a layer is made of (:func:`file`,
:func:`directory`, :func:`symlink`, :func:`hardlink`, :func:`whiteout`, :func:`opaque`).
Output is reproducible (fixed mtimes, gzip without a timestamp, sorted JSON): the same input
gives the same digests, so tests and benchmarks make their own images and nothing needs a
registry.  It reads back only the existing ``index.json`` (to keep its other names); reading
layouts is :mod:`berth.oci.read`'s.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from berth.errors import Invalid
from berth.oci.model import (
    MEDIA_CONFIG,
    MEDIA_INDEX,
    MEDIA_LAYER_GZIP,
    MEDIA_LAYER_TAR,
    MEDIA_MANIFEST,
    REF_ANNOTATION,
    LayerCompression,
)
from berth.platform import Platform
from berth.validation import shown

__all__ = [
    "ImageSpec",
    "LayerSource",
    "TarMember",
    "directory",
    "file",
    "hardlink",
    "opaque",
    "symlink",
    "whiteout",
    "write_layout",
]


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
