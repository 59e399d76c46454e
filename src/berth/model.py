"""The domain values of placement: resources, layers, requests and placements.

One ``Request`` serves both founding seeds: the placement port's identity fields
(``namespace``, ``name``, ``replica``, ``platforms``) plus the cluster scheduler's resource
``spec`` and image ``layers``, and an optional soft hint (``preferred_node``).  ``spec=None``
means the workload declared no resources — the single-node driver needs none, and the cluster
driver then checks only the platform.

Sizes are ``int`` bytes and rates ``int`` bytes/s; unit strings (``"512MiB"``, ``"64MiBps"``)
are accepted at construction and converted once.  Every value is frozen, validated when built
(``Invalid`` names the field) and JSON round-trippable, because requests and placements travel
between schedulers and nodes.

``INSTANCE_TYPES`` is Hyper's instance-type table (DESIGN.md §1.4), verbatim.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, StrictInt, field_validator

from berth.errors import Invalid
from berth.platform import Platform
from berth.units import format_bandwidth, format_information, parse_bandwidth, parse_information
from berth.validation import BerthModel

__all__ = [
    "INSTANCE_TYPES",
    "Bytes",
    "BytesPerSecond",
    "Layer",
    "Name",
    "Placement",
    "Request",
    "Spec",
    "instance_type",
    "unique_layers",
]


def _information(value: Any) -> Any:
    return parse_information(value) if isinstance(value, str) else value


def _bandwidth(value: Any) -> Any:
    return parse_bandwidth(value) if isinstance(value, str) else value


def _name(value: str) -> str:
    if not value:
        raise Invalid("must not be empty")
    if len(value) > 253:
        raise Invalid(f"must be at most 253 characters, got {len(value)}")
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise Invalid(f"must not contain whitespace or control characters, got {value!r}")
    return value


Bytes = Annotated[StrictInt, BeforeValidator(_information), Field(ge=0)]
BytesPerSecond = Annotated[StrictInt, BeforeValidator(_bandwidth), Field(ge=0)]
Name = Annotated[str, AfterValidator(_name)]


class Spec(BerthModel):
    """The resources one workload needs.

    Hard budget (never over-committed): ``mem``, ``disk`` in bytes.
    Soft budget (over-commit only slows things down): ``vcpus`` in cores, ``disk_bw`` and
    ``net_bw`` in bytes/s.
    """

    vcpus: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    mem: Bytes
    disk: Bytes
    disk_bw: BytesPerSecond = 0
    net_bw: BytesPerSecond = 0

    def __str__(self) -> str:
        return (
            f"{self.vcpus:g} vCPU, {format_information(self.mem)} mem, "
            f"{format_information(self.disk)} disk, {format_bandwidth(self.disk_bw)} disk bw, "
            f"{format_bandwidth(self.net_bw)} net bw"
        )


def _table() -> Mapping[str, Spec]:
    rows = [
        ("micro", 0.25, "128MiB", "2GiB", "16MiBps", "8MiBps"),
        ("milli", 0.5, "256MiB", "4GiB", "32MiBps", "16MiBps"),
        ("centi", 1, "512MiB", "8GiB", "64MiBps", "32MiBps"),
        ("deci", 2, "1GiB", "16GiB", "128MiBps", "64MiBps"),
        ("base", 4, "2GiB", "32GiB", "256MiBps", "128MiBps"),
        ("deca", 8, "4GiB", "64GiB", "512MiBps", "256MiBps"),
        ("hecto", 16, "8GiB", "128GiB", "1GiBps", "512MiBps"),
        ("kilo", 32, "16GiB", "256GiB", "2GiBps", "1GiBps"),
        ("mega", 64, "32GiB", "512GiB", "4GiBps", "2GiBps"),
        ("giga", 128, "64GiB", "1TiB", "8GiBps", "4GiBps"),
        ("tera", 256, "128GiB", "2TiB", "16GiBps", "8GiBps"),
    ]
    return MappingProxyType(
        {
            name: Spec(vcpus=vcpus, mem=mem, disk=disk, disk_bw=disk_bw, net_bw=net_bw)
            for name, vcpus, mem, disk, disk_bw, net_bw in rows
        }
    )


INSTANCE_TYPES: Mapping[str, Spec] = _table()
"""Hyper's instance types, smallest first (DESIGN.md §1.4)."""


def instance_type(name: str) -> Spec:
    """The ``Spec`` of instance type ``name``; ``Invalid`` lists the valid names otherwise."""
    try:
        return INSTANCE_TYPES[name]
    except (KeyError, TypeError):
        raise Invalid(
            f"unknown instance type {name!r}; valid types: {', '.join(INSTANCE_TYPES)}",
            field="instance_type",
        ) from None


class Layer(BerthModel):
    """One image layer: its content id (a digest) and its size in bytes."""

    id: Name
    size: Bytes

    @classmethod
    def of(cls, value: Layer | tuple[str, int | str] | Mapping[str, Any]) -> Layer:
        """Accept ``Layer``, ``(id, size)`` or ``{"id": …, "size": …}``."""
        if isinstance(value, Layer):
            return value
        if isinstance(value, tuple | list):
            if len(value) != 2:
                raise Invalid(f"a layer is an (id, size) pair, got {value!r}", field="layer")
            return cls(id=value[0], size=value[1])
        return cls.from_dict(value)


def _layer_input(value: Any) -> Any:
    if isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[0], str):
        return {"id": value[0], "size": value[1]}
    return value


def unique_layers(cls: type, layers: tuple[Layer, ...]) -> tuple[Layer, ...]:
    """Validator: layer ids of one image are unique (a repeat would count its bytes twice)."""
    seen: set[str] = set()
    for layer in layers:
        if layer.id in seen:
            raise Invalid(f"layer {layer.id!r} is listed more than once")
        seen.add(layer.id)
    return layers


def _spec_input(value: Any) -> Any:
    return instance_type(value) if isinstance(value, str) else value


class Request(BerthModel):
    """One replica to place.

    ``platforms`` — the OCI platforms the artifact provides; empty means any.
    ``spec`` — resources (a ``Spec`` or an instance-type name); ``None`` declares none.
    ``layers`` — the image's layers as ``Layer`` or ``(id, size)`` pairs; ids are unique.
    ``preferred_node`` — a soft hint (e.g. where a forked VM's parent runs), never a rule.
    """

    namespace: Name
    name: Name
    replica: Annotated[StrictInt, Field(ge=0)] = 0
    platforms: tuple[Platform, ...] = ()
    spec: Annotated[Spec | None, BeforeValidator(_spec_input)] = None
    layers: tuple[Annotated[Layer, BeforeValidator(_layer_input)], ...] = ()
    preferred_node: Name | None = None

    _unique_layers = field_validator("layers")(unique_layers)

    @property
    def key(self) -> str:
        """``namespace/name/replica``: the replica's identity."""
        return f"{self.namespace}/{self.name}/{self.replica}"


class Placement(BerthModel):
    """The scheduler's decision: which worker node runs the replica.

    ``reservation_id`` identifies the hard reservation the node made at confirmation (the
    cluster driver; ``None`` for drivers that reserve nothing); ``colocated_bytes`` is how many
    of the request's layer bytes the node already had mounted; ``rank`` is the node's position
    in the candidate order (0 = best); ``refusals`` lists the ``(node, reason)`` of better-ranked
    nodes that refused at confirmation on the way (their snapshot was stale, or a boot failed).
    """

    worker_node: Name
    reservation_id: str | None = None
    colocated_bytes: Annotated[StrictInt, Field(ge=0)] = 0
    rank: Annotated[StrictInt, Field(ge=0)] = 0
    refusals: tuple[tuple[str, str], ...] = ()
