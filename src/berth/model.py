"""The domain values of placement: resources, layers, requests and placements.

One ``Request`` serves both founding seeds: the placement port's identity fields
(``namespace``, ``name``, ``replica``, ``platforms``) plus the cluster scheduler's resource
``spec`` and image ``layers``, an optional soft hint (``preferred_node``) and an optional
``spread`` of the function's replicas over nodes or a node label (:class:`Spread`; the rule
itself lives in :mod:`berth.scheduler.spread`).  ``spec=None`` means the workload declared no
resources — the single-node driver needs none, and the cluster driver then checks only the
platform.

Sizes are ``int`` bytes and rates ``int`` bytes/s; unit strings (``"512MiB"``, ``"64MiBps"``)
are accepted at construction and converted once.  Every value is frozen, validated when built
(``Invalid`` names the field) and JSON round-trippable, because requests and placements travel
between schedulers and nodes.

**Types that carry their bounds.**  Every boundary in berth validates with the types below,
so a bound is written once and the next field added is protected too:

* ``Bytes`` / ``BytesPerSecond`` — whole bytes (bytes/s), unit strings accepted, at most
  :data:`MAX_BYTES` = 2^63 − 1 (the engine's int64 columns); ``ByteCount`` is the same without
  unit strings (snapshots), ``ByteRate`` a finite float rate within the same bound (loads);
* ``Name`` — every name (workloads, namespaces, nodes, layers, reservations): a string of
  1 to 253 printable characters without whitespace; ``Labels`` map names to short, printable
  values;
* ``Cores`` (``0 < x <= MAX_CORES``), ``Fraction`` (0..1), ``Seconds`` (a delay, 0 to one
  year), ``Interval`` (a period or time to live, 1 ms to one year) — finite floats that refuse
  booleans and strings;
* a request lists at most :data:`MAX_LAYERS` layers whose sizes sum to at most ``MAX_BYTES``,
  so no colocation sum can overflow.

**Policies.**  :class:`RestartPolicy` (Kubernetes' ``restartPolicy``, Nomad's ``restart``
block: restart on the same node, with exponential backoff, at most so many times within an
interval) and :class:`ReschedulePolicy` (Nomad's ``reschedule``: place again on another node
when the node is lost or the restarts are exhausted) are values like the others: a request
carries them, the node and the API act on them.

``INSTANCE_TYPES`` is Hyper's instance-type table (docs/design.md §1.4), verbatim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)

from berth import defaults
from berth.errors import Invalid
from berth.platform import Platform
from berth.units import (
    MAX_BYTES,
    format_bandwidth,
    format_information,
    parse_bandwidth,
    parse_information,
)
from berth.validation import BerthModel, Rule, shown

__all__ = [
    "INSTANCE_TYPES",
    "INTERVAL_RULE",
    "MAX_AVOID_NODES",
    "MAX_BYTES",
    "MAX_CORES",
    "MAX_DURATION_S",
    "MAX_LABELS",
    "MAX_LAYERS",
    "MAX_NAME",
    "MAX_PLATFORMS",
    "MAX_REPLICA",
    "MAX_RESCHEDULES",
    "MAX_RESTARTS",
    "MAX_SKEW",
    "MIN_INTERVAL_S",
    "NAME_RULE",
    "ByteCount",
    "ByteRate",
    "Bytes",
    "BytesPerSecond",
    "Cores",
    "Fraction",
    "Interval",
    "Labels",
    "Layer",
    "Name",
    "Names",
    "Placement",
    "Request",
    "ReschedulePolicy",
    "RestartPolicy",
    "Seconds",
    "Spec",
    "Spread",
    "checked_layers",
    "checked_platforms",
    "checked_spec",
    "instance_type",
    "required_spec",
    "unique_layers",
]

MAX_NAME = 253
"""The longest name, in characters (a DNS name's limit)."""
MAX_LAYERS = 1024
"""The most layers one request lists (real images have well under 128)."""
MAX_PLATFORMS = 64
"""The most platforms one request lists."""
MAX_AVOID_NODES = 16
"""The most nodes one request avoids (a reschedule adds the node it left)."""
MAX_LABELS = 64
"""The most labels one node advertises."""
MAX_REPLICA = 2**31 - 1
"""The largest replica index."""
MAX_SKEW = 1024
"""The largest ``Spread.max_skew`` (a skew beyond a thousand replicas spreads nothing)."""
MAX_RESTARTS = 1000
"""The most restarts a restart policy may allow within its interval."""
MAX_RESCHEDULES = 1000
"""The most reschedules a reschedule policy may allow for one workload."""
MAX_CORES = 2.0**20
"""The most cores a spec asks for or a node offers."""
MIN_INTERVAL_S = 0.001
"""The shortest period or time to live, in seconds: anything shorter is a busy loop."""
MAX_DURATION_S = 365 * 24 * 3600.0
"""The longest duration berth accepts, in seconds (one year)."""


def _information(value: Any) -> Any:
    return parse_information(value) if isinstance(value, str) else value


def _bandwidth(value: Any) -> Any:
    return parse_bandwidth(value) if isinstance(value, str) else value


def _name(value: str) -> str:
    if not value:
        raise Invalid("must not be empty")
    if len(value) > MAX_NAME:
        raise Invalid(f"must be at most {MAX_NAME} characters, got {len(value)}")
    if not _printable_without_spaces(value):
        raise Invalid(f"must not contain whitespace or control characters, got {shown(value)}")
    return value


_VISIBLE_ASCII = bytes(range(0x21, 0x7F))  # printable ASCII without the space


def _printable_without_spaces(text: str) -> bool:
    """``text.isprintable()`` and no whitespace — for ASCII (the usual case) one C pass."""
    if text.isascii():
        return not text.encode("ascii").translate(None, _VISIBLE_ASCII)
    # isprintable() is false for every whitespace character but the space itself
    return text.isprintable() and " " not in text


def _names(values: frozenset[str]) -> frozenset[str]:
    # The rule of ``_name`` for a whole set in a few C-level passes (a snapshot carries tens
    # of layer ids and arrives every heartbeat); element by element only to say which failed.
    if not values:
        return values
    joined = "".join(values)
    lengths = list(map(len, values))
    if min(lengths) == 0 or max(lengths) > MAX_NAME or not _printable_without_spaces(joined):
        for value in values:
            _name(value)
    return values


def _label_value(value: str) -> str:
    if len(value) > MAX_NAME:
        raise Invalid(f"must be at most {MAX_NAME} characters, got {len(value)}")
    if not value.isprintable():
        raise Invalid(f"must not contain control characters, got {shown(value)}")
    return value


ByteCount = Annotated[StrictInt, Field(ge=0, le=MAX_BYTES)]
Bytes = Annotated[StrictInt, BeforeValidator(_information), Field(ge=0, le=MAX_BYTES)]
BytesPerSecond = Annotated[StrictInt, BeforeValidator(_bandwidth), Field(ge=0, le=MAX_BYTES)]
# As a float, 2^63 - 1 rounds to 2^63: the bound is that float, so a rate computed from the
# largest cap (1.0 * cap) is still one.
ByteRate = Annotated[float, Strict(), Field(ge=0, le=float(MAX_BYTES), allow_inf_nan=False)]
Name = Annotated[StrictStr, AfterValidator(_name)]
Names = Annotated[frozenset[StrictStr], AfterValidator(_names)]
"""A set of ``Name``s (the same rule, checked in one pass)."""
Labels = Annotated[
    dict[Name, Annotated[StrictStr, AfterValidator(_label_value)]], Field(max_length=MAX_LABELS)
]
Cores = Annotated[float, Strict(), Field(gt=0, le=MAX_CORES, allow_inf_nan=False)]
Fraction = Annotated[float, Strict(), Field(ge=0, le=1, allow_inf_nan=False)]
Seconds = Annotated[float, Strict(), Field(ge=0, le=MAX_DURATION_S, allow_inf_nan=False)]
Interval = Annotated[
    float, Strict(), Field(ge=MIN_INTERVAL_S, le=MAX_DURATION_S, allow_inf_nan=False)
]

NAME_RULE: Rule[str] = Rule(Name)
"""Checks one ``Name`` argument of a plain function: ``NAME_RULE(node, "node")``."""
INTERVAL_RULE: Rule[float] = Rule(Interval)
"""Checks one ``Interval`` argument (seconds, > 0): ``INTERVAL_RULE(ttl, "lease_ttl_s")``."""


class Spec(BerthModel):
    """The resources one workload needs.

    Hard budget (never over-committed): ``mem``, ``disk`` in bytes.
    Soft budget (over-commit only slows things down): ``vcpus`` in cores, ``disk_bw`` and
    ``net_bw`` in bytes/s.
    """

    vcpus: Cores
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
"""Hyper's instance types, smallest first (docs/design.md §1.4)."""


def instance_type(name: str) -> Spec:
    """The ``Spec`` of instance type ``name``; ``Invalid`` lists the valid names otherwise."""
    try:
        return INSTANCE_TYPES[name]
    except (KeyError, TypeError):
        raise Invalid(
            f"unknown instance type {shown(name)}; valid types: {', '.join(INSTANCE_TYPES)}",
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
                raise Invalid(f"a layer is an (id, size) pair, got {shown(value)}", field="layer")
            return cls(id=value[0], size=value[1])
        return cls.from_dict(value)


def _layer_input(value: Any) -> Any:
    if isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[0], str):
        return {"id": value[0], "size": value[1]}
    return value


def unique_layers(cls: type, layers: tuple[Layer, ...]) -> tuple[Layer, ...]:
    """Validator: layer ids of one image are unique (a repeat would count its bytes twice)
    and their sizes sum to at most ``MAX_BYTES`` (so no colocation sum can overflow)."""
    seen: set[str] = set()
    total = 0
    for layer in layers:
        if layer.id in seen:
            raise Invalid(f"layer {shown(layer.id)} is listed more than once")
        seen.add(layer.id)
        total += layer.size
    if total > MAX_BYTES:
        raise Invalid(f"the layers' sizes sum to {total} B, more than 2^63 - 1 = {MAX_BYTES} B")
    return layers


def checked_layers(layers: object, *, field: str = "layers") -> tuple[Layer, ...]:
    """``layers`` as ``Layer`` values — for functions taking a request's layers directly.

    Accepts ``Layer``, ``(id, size)`` pairs or ``{"id", "size"}`` tables in any sequence (not a
    string: ``"sha256:ab"`` is one id, not a list of them); at most :data:`MAX_LAYERS`,
    ids unique, sizes summing to at most ``MAX_BYTES``.  ``Invalid`` names ``field``.
    """
    if type(layers) is tuple and len(layers) <= MAX_LAYERS:
        # Already ``Layer`` values (a request's own, passed on): one pass over them decides,
        # and the same tuple comes back.  Anything else takes the full path, and its errors.
        ids: set[str] = set()
        total = 0
        for layer in layers:
            if type(layer) is not Layer:
                break
            ids.add(layer.id)
            total += layer.size
        else:
            if len(ids) == len(layers) and total <= MAX_BYTES:
                return layers
    if isinstance(layers, str | bytes) or not isinstance(layers, Sequence | set | frozenset):
        raise Invalid(f"expected a list of layers, got {shown(layers)}", field=field)
    if len(layers) > MAX_LAYERS:
        raise Invalid(f"at most {MAX_LAYERS} layers, got {len(layers)}", field=field)
    checked: list[Layer] = []
    for index, layer in enumerate(layers):
        try:
            checked.append(Layer.of(layer))
        except Invalid as error:
            where = f"{field}.{index}" + (f".{error.field}" if error.field != "layer" else "")
            raise Invalid(error.message, field=where.removesuffix(".None")) from None
    try:
        return unique_layers(Layer, tuple(checked))
    except Invalid as error:
        raise Invalid(error.message, field=field) from None


def checked_platforms(platforms: object, *, field: str = "platforms") -> tuple[Platform, ...]:
    """``platforms`` parsed — for functions taking a request's platforms directly.

    Any sequence of ``Platform`` or strings (not one string: ``"linux/amd64"`` is one
    platform, not a list of them), at most :data:`MAX_PLATFORMS`; ``Invalid`` names ``field``.
    """
    if isinstance(platforms, tuple) and len(platforms) <= MAX_PLATFORMS:
        # Already parsed (a Request's, or the node core's after its own check): the common
        # case on every placement, so a plain loop rather than all() over a generator.
        for platform in platforms:
            if type(platform) is not Platform:
                break
        else:
            return platforms
    if isinstance(platforms, str | bytes) or not isinstance(platforms, Sequence | set | frozenset):
        raise Invalid(f"expected a list of platforms, got {shown(platforms)}", field=field)
    if len(platforms) > MAX_PLATFORMS:
        raise Invalid(f"at most {MAX_PLATFORMS} platforms, got {len(platforms)}", field=field)
    return tuple(Platform.parse(platform, field=field) for platform in platforms)


def _spec_input(value: Any) -> Any:
    return instance_type(value) if isinstance(value, str) else value


_SPEC: Rule[Spec | None] = Rule(Annotated[Spec | None, BeforeValidator(_spec_input)])


def checked_spec(spec: object, *, field: str = "spec") -> Spec | None:
    """``spec`` as a ``Spec`` (an instance-type name is looked up), or ``None``."""
    if isinstance(spec, Spec) or spec is None:
        return spec
    return _SPEC(spec, field)


def required_spec(spec: object, what: str, *, field: str = "spec") -> Spec:
    """``spec`` as a ``Spec``, which ``what`` (``a reservation``, ``a workload``…) cannot do
    without: ``Invalid`` naming ``field`` for ``None`` too."""
    checked = checked_spec(spec, field=field)
    if checked is None:
        raise Invalid(
            f"{what} needs its resources (a Spec or an instance type), got None", field=field
        )
    return checked


class Spread(BerthModel):
    """How the replicas of one function (same ``namespace`` and ``name``) spread over nodes.

    ``label=None`` — at most one replica per node (anti-affinity); ``label="zone"`` — across
    the values of that node label (``NodeState.labels``): a node is allowed when its value's
    replica count plus one exceeds the least-loaded value's count by at most ``max_skew``
    (Kubernetes' ``topologySpreadConstraints``; the values counted are those of the nodes
    running one of the request's platforms).  ``hard=True`` — a node that would violate is
    not eligible (``DoNotSchedule``; a ``NoCapacity`` names ``spread`` for it); ``hard=False``
    — such nodes are tried only after every node that would not (``ScheduleAnyway``).  The
    rule, and where the replica counts come from, is :mod:`berth.scheduler.spread`.
    """

    label: Name | None = None
    hard: StrictBool
    max_skew: Annotated[StrictInt, Field(ge=1, le=MAX_SKEW)] = 1

    @field_validator("max_skew")
    @classmethod
    def _skew_needs_label(cls, max_skew: int, info: ValidationInfo) -> int:
        if max_skew != 1 and info.data.get("label") is None:
            raise Invalid(
                f"applies to a label spread only (a per-node spread allows one replica per "
                f"node), got {max_skew} without a label"
            )
        return max_skew

    def __str__(self) -> str:
        kind = "hard" if self.hard else "soft"
        if self.label is None:
            return f"{kind} spread (one replica per node)"
        return f"{kind} spread over label {self.label!r} (max skew {self.max_skew})"


RestartMode = Literal["never", "on-failure", "always"]


class RestartPolicy(BerthModel):
    """When the node restarts a workload that ended, under the same id and reservation.

    ``mode`` — ``never``; ``on-failure``: an end that is not a stop and not an exit with
    code 0 (a non-zero exit, or a kill by anything but a stop); ``always``: any end that is
    not a stop.  A stop never restarts.  ``attempts`` — at most this many restarts within any
    ``interval_s``; the end after those is the workload's last (``failed``: restarts
    exhausted).  The ``k``-th restart in a row (from 0) waits
    ``min(delay_s · 2^k, max_delay_s)`` (:meth:`delay`); a run that lasted a whole interval
    starts the doubling again.
    """

    mode: RestartMode = "never"
    attempts: Annotated[StrictInt, Field(ge=0, le=MAX_RESTARTS)] = defaults.RESTART_ATTEMPTS
    interval_s: Interval = defaults.RESTART_INTERVAL_S
    delay_s: Seconds = defaults.RESTART_DELAY_S
    max_delay_s: Seconds = defaults.RESTART_MAX_DELAY_S

    @field_validator("max_delay_s")
    @classmethod
    def _max_at_least_delay(cls, max_delay_s: float, info: ValidationInfo) -> float:
        delay_s = info.data.get("delay_s")
        if isinstance(delay_s, float) and max_delay_s < delay_s:
            raise Invalid(f"must be at least the first delay ({delay_s:g}s), got {max_delay_s:g}")
        return max_delay_s

    def restarts_after(self, exit_code: int | None, stopped: bool) -> bool:
        """Whether an end (``exit_code`` ``None``: killed by a signal) calls for a restart,
        attempts aside."""
        if stopped or self.mode == "never":
            return False
        return self.mode == "always" or exit_code != 0

    def delay(self, in_a_row: int) -> float:
        """The wait before a restart that follows ``in_a_row`` earlier ones (seconds)."""
        if in_a_row >= 64:  # 2^64 · delay is past any max_delay_s
            return self.max_delay_s
        return float(min(self.delay_s * 2**in_a_row, self.max_delay_s))

    def __str__(self) -> str:
        if self.mode == "never":
            return "restart never"
        return (
            f"restart {self.mode}: {self.attempts} in {self.interval_s:g}s, "
            f"delay {self.delay_s:g}s doubling to {self.max_delay_s:g}s"
        )


class ReschedulePolicy(BerthModel):
    """Whether the API places a workload again, on another node, when it ends ``lost`` (its
    node gone) or ``failed`` with its restarts exhausted (and after a drain).

    ``attempts`` — how many times, over the workload's whole line of replacements (0: never);
    ``unlimited`` — every time (what ``--restartable`` has always meant).
    """

    attempts: Annotated[StrictInt, Field(ge=0, le=MAX_RESCHEDULES)] = 0
    unlimited: StrictBool = False

    @property
    def enabled(self) -> bool:
        return self.unlimited or self.attempts > 0

    def allows(self, done: int) -> bool:
        """Whether one more reschedule is allowed after ``done`` of them."""
        return self.unlimited or done < self.attempts


class Request(BerthModel):
    """One replica to place.

    ``platforms`` — the OCI platforms the artifact provides; empty means any.
    ``spec`` — resources (a ``Spec`` or an instance-type name); ``None`` declares none.
    ``layers`` — the image's layers as ``Layer`` or ``(id, size)`` pairs; ids are unique.
    ``preferred_node`` — a soft hint (e.g. where a forked VM's parent runs), never a rule.
    ``avoid_nodes`` — soft hints the other way (e.g. where a rescheduled workload failed):
    those nodes are asked only after every other candidate; never a rule.
    ``spread`` — how replicas of this function spread (:class:`Spread`); ``None``: no rule.
    """

    namespace: Name
    name: Name
    replica: Annotated[StrictInt, Field(ge=0, le=MAX_REPLICA)] = 0
    platforms: Annotated[tuple[Platform, ...], Field(max_length=MAX_PLATFORMS)] = ()
    spec: Annotated[Spec | None, BeforeValidator(_spec_input)] = None
    layers: Annotated[
        tuple[Annotated[Layer, BeforeValidator(_layer_input)], ...], Field(max_length=MAX_LAYERS)
    ] = ()
    preferred_node: Name | None = None
    avoid_nodes: Annotated[tuple[Name, ...], Field(max_length=MAX_AVOID_NODES)] = ()
    spread: Spread | None = None

    _unique_layers = field_validator("layers")(unique_layers)

    @property
    def key(self) -> str:
        """``namespace/name/replica``: the replica's identity."""
        return f"{self.namespace}/{self.name}/{self.replica}"

    def avoiding(self, node: str) -> Request:
        """This request with ``node`` added to the nodes it avoids (the newest
        :data:`MAX_AVOID_NODES` kept)."""
        node = NAME_RULE(node, "node")
        kept = (*tuple(n for n in self.avoid_nodes if n != node), node)
        return self.model_copy(update={"avoid_nodes": kept[-MAX_AVOID_NODES:]})


class Placement(BerthModel):
    """The scheduler's decision: which worker node runs the replica.

    ``reservation_id`` identifies the hard reservation the node made at confirmation (the
    cluster driver; ``None`` for drivers that reserve nothing); ``colocated_bytes`` is how many
    of the request's layer bytes the node already had mounted; ``rank`` is the node's position
    in the candidate order (0 = best); ``refusals`` lists the ``(node, reason)`` of better-ranked
    nodes that refused at confirmation on the way (their snapshot was stale, or a boot failed).
    """

    worker_node: Name
    reservation_id: Name | None = None
    colocated_bytes: ByteCount = 0
    rank: Annotated[StrictInt, Field(ge=0, le=MAX_BYTES)] = 0
    refusals: tuple[tuple[Name, StrictStr], ...] = ()
