"""The JSON documents of an OCI image layout, validated into typed values.

This module owns parsing what a layout's files say: JSON text into an object
(:func:`parse_json`), descriptors (:class:`Descriptor`: media type, ``sha256:`` digest, size,
annotations, platform), and the parts of an image config berth uses — its platform, its
layers' ``diff_ids`` and the runtime settings (:class:`~berth.oci.model.OciConfig`).
Everything here is untrusted input, checked where it enters and reported as
:class:`~berth.errors.Invalid` whose field names the file and the JSON path of the offending
value (``index.json manifests.0.digest: expected 'sha256:' and 64 hex digits, got 'md5:1'``).
It does not touch the disk: finding, sizing and hashing the files is
:mod:`berth.oci.read`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from berth.errors import Invalid
from berth.oci.model import DIGEST, MAX_LAYERS, OciConfig
from berth.platform import Platform
from berth.validation import shown

__all__ = [
    "Descriptor",
    "config_platform",
    "descriptor_platform",
    "parse_descriptor",
    "parse_descriptors",
    "parse_diff_ids",
    "parse_json",
    "required",
    "runtime_config",
]


@dataclass(frozen=True, slots=True)
class Descriptor:
    """One descriptor (a reference to a blob) of an index or manifest, validated."""

    media_type: str
    digest: str
    size: int
    annotations: Mapping[str, str]
    platform: Mapping[str, Any] | None
    urls: bool


def parse_descriptors(
    document: Mapping[str, Any], key: str, where: str
) -> list[tuple[Descriptor, str]]:
    """The descriptors listed under ``key`` (at least one, at most ``MAX_LAYERS``), each with
    the JSON path it was read from."""
    raw = required(document, key, list, where)
    if not raw:
        raise Invalid("no entries", field=f"{where} {key}")
    if len(raw) > MAX_LAYERS:
        raise Invalid(f"at most {MAX_LAYERS} entries, got {len(raw)}", field=f"{where} {key}")
    return [
        (parse_descriptor(item, f"{where} {key}.{i}"), f"{where} {key}.{i}")
        for i, item in enumerate(raw)
    ]


def parse_descriptor(item: Any, where: str) -> Descriptor:
    """One descriptor, read from the JSON path ``where``."""
    if not isinstance(item, dict):
        raise Invalid(f"expected a descriptor (a JSON object), got {shown(item)}", field=where)
    media_type = required(item, "mediaType", str, where)
    digest = required(item, "digest", str, where)
    if not DIGEST.fullmatch(digest):
        raise Invalid(
            f"expected 'sha256:' and 64 lowercase hex digits, got {shown(digest)}",
            field=f"{where}.digest",
        )
    size = item.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 2**63:
        raise Invalid(f"expected a whole number of bytes, got {shown(size)}", field=f"{where}.size")
    annotations = item.get("annotations", {})
    if not isinstance(annotations, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        raise Invalid(
            f"expected a table of strings, got {shown(annotations)}", field=f"{where}.annotations"
        )
    platform = item.get("platform")
    if platform is not None and not isinstance(platform, dict):
        raise Invalid(f"expected a JSON object, got {shown(platform)}", field=f"{where}.platform")
    return Descriptor(media_type, digest, size, annotations, platform, bool(item.get("urls")))


def descriptor_platform(raw: Mapping[str, Any]) -> Platform | None:
    """The platform a descriptor names, or ``None`` when it names none berth knows (an
    attestation's ``unknown/unknown``, a malformed entry): such entries are skipped, not refused."""
    os_name, arch, variant = raw.get("os"), raw.get("architecture"), raw.get("variant", "")
    if not isinstance(os_name, str) or not isinstance(arch, str) or not isinstance(variant, str):
        return None
    try:
        return Platform.parse(f"{os_name}/{arch}/{variant}" if variant else f"{os_name}/{arch}")
    except Invalid:
        return None


def config_platform(config: Mapping[str, Any], name: str) -> Platform:
    """The platform an image config states (``os``, ``architecture``, ``variant``)."""
    os_name = required(config, "os", str, name)
    arch = required(config, "architecture", str, name)
    variant = config.get("variant", "")
    if not isinstance(variant, str):
        raise Invalid(f"expected a string, got {shown(variant)}", field=f"{name} variant")
    text = f"{os_name}/{arch}/{variant}" if variant else f"{os_name}/{arch}"
    return Platform.parse(text, field=f"{name} os/architecture")


def parse_diff_ids(config: Mapping[str, Any], name: str) -> list[str] | None:
    """The config's ``rootfs.diff_ids`` (the layers' uncompressed digests), if it has any."""
    rootfs = config.get("rootfs")
    if rootfs is None:
        return None
    if not isinstance(rootfs, dict):
        raise Invalid(f"expected a JSON object, got {shown(rootfs)}", field=f"{name} rootfs")
    diff_ids = required(rootfs, "diff_ids", list, f"{name} rootfs")
    for i, diff_id in enumerate(diff_ids):
        if not isinstance(diff_id, str) or not DIGEST.fullmatch(diff_id):
            raise Invalid(
                f"expected 'sha256:' and 64 lowercase hex digits, got {shown(diff_id)}",
                field=f"{name} rootfs.diff_ids.{i}",
            )
    return [str(diff_id) for diff_id in diff_ids]


def runtime_config(config: Mapping[str, Any], name: str) -> OciConfig:
    """The parts of the config's ``config`` object a runtime uses."""
    inner = config.get("config") or {}
    if not isinstance(inner, dict):
        raise Invalid(f"expected a JSON object, got {shown(inner)}", field=f"{name} config")

    def strings(key: str) -> tuple[str, ...]:
        value = inner.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise Invalid(
                f"expected a list of strings, got {shown(value)}", field=f"{name} config.{key}"
            )
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


def required(document: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    """``document[key]``, which must be there and of ``kind`` (``str``, ``list`` or ``dict``)."""
    if key not in document:
        raise Invalid("required, but missing", field=f"{where} {key}")
    value = document[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        expected = {"str": "a string", "list": "a list", "dict": "a JSON object"}[kind.__name__]
        raise Invalid(f"expected {expected}, got {shown(value)}", field=f"{where} {key}")
    return value


def parse_json(data: bytes, name: str) -> dict[str, Any]:
    """``data`` as a JSON object (UTF-8 text); ``Invalid`` on field ``name`` otherwise."""
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
