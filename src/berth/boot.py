"""A workload as the node, its clients and the scheduler all speak of it: how to boot one, how a
boot fails, what a node says about one.

This module owns the value types that cross the node's edge — :class:`BootSpec` (what a
client asks a node to boot), :class:`AdmitOrder` and :class:`RunOrder` (a whole ``admit`` or
``try_run`` of the node-client port, checked once when made, so every driver and the node
agent take one value instead of restating the parameters), :class:`BootFailed` (a boot that
cannot happen, with the real reason), :class:`WorkloadStatus` (``running``, ``ended`` or
``unknown``, read back by id) and :class:`WorkloadLogs` (a piece of a workload's output).
They sit below both the node (:mod:`berth.node.core`, the runtime port
:mod:`berth.node.runtime.port`, which re-exports ``BootSpec`` and ``BootFailed`` as part of
its signature) and the ports that reach a node (:mod:`berth.nodeclient.port`), so a port
never imports the implementation it fronts and a scheduler recognises a boot failure
without loading a node.

It is deliberately only vocabulary: booting, stopping and remembering workloads are the
runtime drivers' and the node core's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictInt, field_validator, model_validator

from berth.defaults import MAX_LOG_CHUNK_BYTES
from berth.errors import BerthError, Invalid
from berth.model import (
    INTERVAL_RULE,
    MAX_DURATION_S,
    MIN_INTERVAL_S,
    NAME_RULE,
    Cores,
    Layer,
    Name,
    RestartPolicy,
    Spec,
    checked_layers,
    checked_platforms,
    required_spec,
)
from berth.platform import Platform
from berth.units import parse_information
from berth.validation import BerthModel, Rule, Text, shown

__all__ = [
    "LIMIT_RULE",
    "OFFSET_RULE",
    "AdmitOrder",
    "BootFailed",
    "BootSpec",
    "LogLimit",
    "LogOffset",
    "RunOrder",
    "WorkloadLogs",
    "WorkloadStatus",
]


class BootFailed(BerthError):
    """A workload could not be started; ``reason`` says why (``command not found: 'x'``)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"boot_failed: {reason}")


def _information(value: Any) -> Any:
    return parse_information(value) if isinstance(value, str) else value


def _workload_name(value: str) -> str:
    if not value:
        raise Invalid("must not be empty")
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise Invalid(f"must not contain whitespace or control characters, got {value!r}")
    return value


class BootSpec(BerthModel):
    """How to boot one workload.

    ``name`` — a label (workload ids are derived from it); ``command`` — the program and its
    arguments; empty only with an ``image``, whose ``Cmd`` then runs (the ``container`` and
    ``microvm`` runtimes run the image's ``Entrypoint`` followed by ``command``, which
    replaces ``Cmd`` when given, as Docker does); ``env`` — environment variables for the
    workload; ``mem_limit`` — a memory ceiling in bytes (or a unit string such as
    ``"256MiB"``), ``None`` for none.  For runtimes that run images (``container``,
    ``microvm``): ``image`` — the image to run (a reference
    in the node's OCI image layout; ``None``: the layout's only image), ``vcpus`` and
    ``disk_limit`` — the guest's cores and writable disk in bytes.  ``process`` and ``fake``
    ignore these three.  ``NodeCore.boot`` fills the limits from the workload's ``Spec``.
    ``restart`` — when the node restarts the workload after it ends (``None``: never); it
    travels with the boot spec, so the node's journal keeps it too.  Every string of
    ``command`` and ``env`` is text UTF-8 can encode (:data:`~berth.validation.Text`; a lone
    surrogate is ``Invalid`` naming ``command.<i>`` or ``env.<KEY>``): the boot spec is
    written to the node's journal and to the wire, and a string that cannot be written must
    not boot.
    """

    name: str
    command: tuple[Text, ...] = ()
    env: dict[Text, Text] = Field(default_factory=dict)
    mem_limit: Annotated[StrictInt, BeforeValidator(_information), Field(gt=0)] | None = None
    image: Name | None = None
    vcpus: Cores | None = None
    disk_limit: Annotated[StrictInt, BeforeValidator(_information), Field(gt=0)] | None = None
    restart: RestartPolicy | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        return _workload_name(name)

    @field_validator("command")
    @classmethod
    def _check_command(cls, command: tuple[str, ...]) -> tuple[str, ...]:
        if command and not command[0]:
            raise Invalid("the program (first element) must not be empty")
        if any("\0" in part for part in command):
            raise Invalid("must not contain NUL characters")
        return command

    @model_validator(mode="after")
    def _command_or_image(self) -> BootSpec:
        if not self.command and self.image is None:
            raise Invalid(
                "must not be empty without an image (whose Cmd would run)", field="command"
            )
        return self

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not key or "=" in key or "\0" in key:
                raise Invalid(f"variable names must be non-empty without '=' or NUL: {key!r}")
            if "\0" in value:
                raise Invalid(f"the value of {key!r} must not contain NUL characters")
        return env


def _checked_boot(boot: object) -> BootSpec:
    if not isinstance(boot, BootSpec):
        raise Invalid(f"expected a BootSpec, got {shown(boot)}", field="boot")
    return boot


def _checked_reservation(reservation: object) -> str | None:
    if reservation is not None and not isinstance(reservation, str):
        raise Invalid(f"expected a reservation id, got {shown(reservation)}", field="reservation")
    return reservation


_set = object.__setattr__  # how a frozen order's __init__ sets its checked fields


@dataclass(frozen=True, init=False, slots=True)
class AdmitOrder:
    """One ``admit`` of the node-client port: reserve ``spec`` under a lease, for an artifact
    built for ``platforms``.

    ``spec`` — the resources (a ``Spec``, or an instance type's name); ``lease_ttl_s`` — how
    long the reservation lives unless it is bound to its workload (or released) first, in
    seconds (an :data:`~berth.model.Interval`); ``platforms`` — the platforms the artifact is
    built for (empty: any): a node that runs none of them refuses (``platform_mismatch``).

    Checked once, here: a malformed order is ``Invalid`` naming the field (``spec``,
    ``platforms``, ``lease_ttl_s`` — a non-positive or non-finite one among them) and never
    reaches a driver.
    """

    spec: Spec
    lease_ttl_s: float
    platforms: tuple[Platform, ...]

    def __init__(self, spec: Spec, lease_ttl_s: float, platforms: Sequence[Platform] = ()) -> None:
        # made once per placement: the common case (a Spec, a float in bounds) is decided
        # without a call; anything else takes the full check, and its error
        spec = spec if type(spec) is Spec else required_spec(spec, "a workload")
        platforms = checked_platforms(platforms)
        ttl = lease_ttl_s
        if type(ttl) is not float or not MIN_INTERVAL_S <= ttl <= MAX_DURATION_S:
            ttl = INTERVAL_RULE(ttl, "lease_ttl_s")
        _set(self, "spec", spec)
        _set(self, "platforms", platforms)
        _set(self, "lease_ttl_s", ttl)


@dataclass(frozen=True, init=False, slots=True)
class RunOrder:
    """One ``try_run`` of the node-client port: boot ``boot`` owning a reservation of ``spec``.

    ``spec`` — the resources the workload holds; ``layers`` — the layers it needs mounted
    (``Layer`` values, ``(id, size)`` pairs or tables: :func:`~berth.model.checked_layers`);
    ``boot`` — how to boot it; ``platforms`` — as for :class:`AdmitOrder`: a node that runs
    none of them refuses (``platform_mismatch``) before it mounts or starts anything.

    ``reservation`` — a lease taken by ``admit`` (e.g. a scheduler's placement): the workload
    is bound to it instead of admitted again, and a refused boot releases it.

    ``workload_id`` — a :data:`~berth.model.Name`, the caller's record of it: the node boots
    it under that id, and the run is **idempotent by it**: asked again with an id it already
    runs or is booting, the node answers that id and boots nothing — so a caller whose answer
    was lost (``Unavailable``: the outcome is unknown) asks again safely.

    Checked once, here: a malformed order is ``Invalid`` naming the field (``spec``,
    ``layers``, ``platforms``, ``boot``, ``reservation``, ``workload_id``, the first wrong
    one in that order) and never reaches a driver.
    """

    spec: Spec
    layers: tuple[Layer, ...]
    boot: BootSpec
    platforms: tuple[Platform, ...]
    reservation: str | None
    workload_id: str | None

    def __init__(
        self,
        spec: Spec,
        layers: Sequence[Layer],
        boot: BootSpec,
        platforms: Sequence[Platform] = (),
        *,
        reservation: str | None = None,
        workload_id: str | None = None,
    ) -> None:
        _set(self, "spec", required_spec(spec, "a workload"))
        _set(self, "layers", checked_layers(layers))
        _set(self, "platforms", checked_platforms(platforms))
        _set(self, "boot", _checked_boot(boot))
        _set(self, "reservation", _checked_reservation(reservation))
        _set(
            self,
            "workload_id",
            None if workload_id is None else NAME_RULE(workload_id, "workload_id"),
        )


@dataclass(frozen=True)
class WorkloadStatus:
    """What a node knows of one workload id: ``running``, ``ended`` (with how: its exit code,
    or the signal's ``reason``, and whether a stop ended it) or ``unknown`` (never ran here,
    or ended longer ago than the node remembers — :data:`~berth.node.core.ENDED_MEMORY`
    ends — or before the agent restarted).  ``restarts`` is how many times the node
    restarted it under its restart policy; while it runs again, ``exit_code`` and ``reason``
    say how its last run ended; ``exhausted`` that its end is the last because its restarts
    ran out."""

    state: str
    exit_code: int | None = None
    reason: str | None = None
    stopped: bool = False
    restarts: int = 0
    exhausted: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "state": self.state,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "stopped": self.stopped,
            "restarts": self.restarts,
            "exhausted": self.exhausted,
        }

    @classmethod
    def from_dict(cls, value: object) -> WorkloadStatus:
        """A status read back from the wire (``Invalid`` naming the field when malformed)."""
        if not isinstance(value, dict):
            raise Invalid(f"expected an object, got {shown(value)}", field="status")
        state, code = value.get("state"), value.get("exit_code")
        reason, stopped = value.get("reason"), value.get("stopped", False)
        if state not in ("running", "ended", "unknown"):
            raise Invalid(f"unknown state {shown(state)}", field="status.state")
        if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
            raise Invalid(f"expected an integer, got {shown(code)}", field="status.exit_code")
        if reason is not None and not isinstance(reason, str):
            raise Invalid(f"expected a string, got {shown(reason)}", field="status.reason")
        if not isinstance(stopped, bool):
            raise Invalid(f"expected true or false, got {shown(stopped)}", field="status.stopped")
        restarts, exhausted = value.get("restarts", 0), value.get("exhausted", False)
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            raise Invalid(f"expected a count (≥ 0), got {shown(restarts)}", field="status.restarts")
        if not isinstance(exhausted, bool):
            raise Invalid(
                f"expected true or false, got {shown(exhausted)}", field="status.exhausted"
            )
        return cls(state, code, reason, stopped, restarts, exhausted)


LogOffset = Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]
"""Where a read of a workload's output starts: a byte offset."""
LogLimit = Annotated[StrictInt, Field(ge=1, le=MAX_LOG_CHUNK_BYTES)]
"""How many bytes one read returns at most (1 to :data:`~berth.defaults.MAX_LOG_CHUNK_BYTES`)."""

OFFSET_RULE: Rule[int] = Rule(LogOffset)
LIMIT_RULE: Rule[int] = Rule(LogLimit)


class WorkloadLogs(BerthModel):
    """A piece of one workload's output as its node keeps it (stdout and stderr together, a
    microVM's console): ``text`` — the bytes from ``offset`` to ``next_offset`` decoded as
    UTF-8 (a character split at the end is left for the next read; undecodable bytes are
    shown as U+FFFD); ``size`` — the bytes kept so far; ``kept`` — whether this node keeps
    this workload's output at all (its runtime writes none without a log directory)."""

    text: str
    offset: Annotated[StrictInt, Field(ge=0)]
    next_offset: Annotated[StrictInt, Field(ge=0)]
    size: Annotated[StrictInt, Field(ge=0)]
    kept: bool
