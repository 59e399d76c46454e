"""Node agent configuration: a TOML file validated into typed models.

The file has Hyper's ``[budget]`` table plus a ``[node]`` table and an optional ``[agent]``
table::

    [node]
    name = "worker-1"
    platform = "linux/amd64"        # default: this host's
    labels = { zone = "a" }

    [budget]                        # all required except cpu_max_cap and the over-commit factors
    mem_max = "64GiB"
    disk_max = "500GiB"
    cpu_max_load = 0.9              # fraction of the machine (0..1)
    cpu_max_cap = 16                # soft CPU capacity in cores; default: this host's core count
    disk_bw_cap = "2GiBps"
    disk_bw_max_load = 0.8
    net_bw_cap = "10Gbps"
    net_bw_max_load = 0.8
    cpu_overcommit = 4.0            # optional β_max factors k_max (ceiling = k * total)

    [agent]                         # optional; defaults shown
    heartbeat_s = 5.0
    sample_period_s = 0.25
    tau_s = 30.0
    layer_cache = "10GiB"
    lease_ttl_s = 30.0
    runtime = "process"             # or "fake", "container" ([container] applies), "microvm"
    stop_grace_s = 2.0
    orphan_grace_s = 10.0           # a workload outlives a dead agent this long, then is killed

    [process]                       # optional: the process runtime (development and tests)
    user = "nobody"                 # whom workloads run as; default: nobody when the agent is
                                    # root, else the agent's own user (a name or a uid)
    scratch_dir = "/var/lib/berth/scratch"  # each workload runs in <scratch_dir>/<id>
                                    # (default: a temporary directory of the agent's)
    log_dir = "/var/log/berth"      # each workload's output in <workload id>.log, which
                                    # berth logs reads (default: none kept)

    [microvm]                       # optional; defaults shown (berth microvm setup fills data_dir)
    data_dir = "~/.local/share/berth/microvm"
    images = "<data_dir>/images"    # the OCI image layout workloads' images are read from
    accel = "auto"                  # or "kvm", "tcg"; auto = what the setup's probe found
    qemu = "qemu-system-x86_64"
    boot_timeout_s = 300.0
    log_dir = "/var/log/berth"      # each workload's console in <workload id>.log (default: kept
                                    # in memory only, the last 1,000 lines)
    node_dir = "<data_dir>/nodes/<node name>"   # this node's layers/ and guests' run/

    [container]                     # optional; defaults shown
    data_dir = "~/.local/share/berth/container"
    images = "<data_dir>/images"    # the OCI image layout workloads' images are read from
    runc = "runc"                   # the OCI runtime, looked up on PATH
    network = "host"                # or "none": a network namespace with only loopback
    pids_limit = 1024               # processes one container may hold at once
    log_dir = "/var/log/berth"      # each workload's output in <workload id>.log (default: none)
    node_dir = "<data_dir>/nodes/<node name>"   # this node's layers/, mounts/, run/, runc/

The ``[process]``, ``[microvm]`` and ``[container]`` tables' models, :class:`ProcessSection`,
:class:`MicrovmSection` and :class:`ContainerSection`, are here with the others: the runtime
drivers (:mod:`berth.node.runtime.process`, :mod:`berth.node.runtime.microvm`,
:mod:`berth.node.runtime.container`) build themselves from them, and sit above this module;
their machinery takes plain values.

Validation happens once, here: a missing or bad key raises ``Invalid`` whose field is the
dotted key (``budget.mem_max``) and whose message quotes the offending value.  Nothing else
in berth reads configuration files or environment variables; it receives these models.

The values take the bounded types of :mod:`berth.model` (sizes at most 2^63 − 1 bytes,
fractions 0..1, durations from 1 ms to a year, no booleans where numbers belong).  Reading the
file is as strict: :func:`load_config` refuses an empty path, a directory, anything larger
than :data:`MAX_CONFIG_BYTES` (so ``/dev/zero`` is an error, not a hang), text that is not
UTF-8 (a UTF-8 byte-order mark is skipped; UTF-16 is named as such), invalid TOML and TOML
nested deeper than :data:`MAX_DEPTH` tables — each an ``Invalid`` with field ``config``.
:func:`config_toml` writes a configuration back as that file (``berth up``, ``berth deploy``).
"""

from __future__ import annotations

import codecs
import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PlainValidator, Strict, StrictInt, StrictStr

from berth.defaults import (
    CONTAINER_DATA_DIR,
    CONTAINER_PIDS_LIMIT,
    CONTAINER_RUNC,
    HEARTBEAT_S,
    LEASE_TTL_S,
    LOAD_SAMPLE_PERIOD_S,
    LOAD_TAU_S,
    MICROVM_BOOT_TIMEOUT_S,
    MICROVM_QEMU,
    ORPHAN_GRACE_S,
    STOP_GRACE_S,
)
from berth.errors import Invalid
from berth.model import Bytes, BytesPerSecond, Cores, Fraction, Interval, Labels, Name
from berth.node.budget import BudgetLimits
from berth.node.runtime.port import StopGrace
from berth.node.runtime.process import OrphanGrace, RunAs
from berth.platform import Platform, host
from berth.validation import BerthModel, shown

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "AccelChoice",
    "AgentConfig",
    "AgentSection",
    "BudgetSection",
    "ContainerSection",
    "MicrovmSection",
    "NodeSection",
    "PathText",
    "ProcessSection",
    "config_toml",
    "load_config",
]

MAX_CONFIG_BYTES = 1 << 20
"""The largest configuration file read (1 MiB; a real one is well under a kilobyte)."""
MAX_DEPTH = 8
"""The deepest nesting of tables and arrays a configuration file may use."""

Factor = Annotated[float, Strict(), Field(gt=0, le=1e6, allow_inf_nan=False)]


class NodeSection(BerthModel):
    """``[node]``: who this node is."""

    name: Name
    platform: Platform = Field(default_factory=host)
    labels: Labels = Field(default_factory=dict)


class BudgetSection(BerthModel):
    """``[budget]``: the node's ceilings, in unit strings or plain numbers."""

    mem_max: Bytes
    disk_max: Bytes
    cpu_max_load: Fraction
    cpu_max_cap: Cores | None = None
    disk_bw_cap: BytesPerSecond
    disk_bw_max_load: Fraction
    net_bw_cap: BytesPerSecond
    net_bw_max_load: Fraction
    cpu_overcommit: Factor | None = None
    disk_bw_overcommit: Factor | None = None
    net_bw_overcommit: Factor | None = None

    def limits(self) -> BudgetLimits:
        """The resolved ceilings (``cpu_max_cap`` defaults to this host's core count)."""
        return BudgetLimits(
            mem_max=self.mem_max,
            disk_max=self.disk_max,
            cpu_capacity=self.cpu_max_cap or float(os.cpu_count() or 1),
            cpu_max_load=self.cpu_max_load,
            disk_bw_cap=self.disk_bw_cap,
            disk_bw_max_load=self.disk_bw_max_load,
            net_bw_cap=self.net_bw_cap,
            net_bw_max_load=self.net_bw_max_load,
            cpu_overcommit=self.cpu_overcommit,
            disk_bw_overcommit=self.disk_bw_overcommit,
            net_bw_overcommit=self.net_bw_overcommit,
        )


class AgentSection(BerthModel):
    """``[agent]``: how the agent runs (all optional)."""

    heartbeat_s: Interval = HEARTBEAT_S
    sample_period_s: Interval = LOAD_SAMPLE_PERIOD_S
    tau_s: Interval = LOAD_TAU_S
    layer_cache: Bytes = 10 * 2**30
    lease_ttl_s: Interval = LEASE_TTL_S
    runtime: Literal["process", "fake", "container", "microvm"] = "process"
    stop_grace_s: StopGrace = STOP_GRACE_S  # the runtimes' rule: 0 to an hour
    orphan_grace_s: OrphanGrace = ORPHAN_GRACE_S


AccelChoice = Literal["auto", "kvm", "tcg"]
"""How microVM guests are accelerated: ``kvm``, ``tcg``, or ``auto`` (what ``berth microvm
setup``'s probe found)."""


def _path_text(value: str) -> str:
    if not value.strip():
        raise Invalid("must not be empty")
    if len(value) > 4096 or not value.isprintable():
        raise Invalid(f"not a path: {shown(value)}")
    return value


PathText = Annotated[StrictStr, AfterValidator(_path_text)]
"""A path as configured: non-empty, printable, at most 4,096 characters."""


def _user(value: object) -> str | int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32:
        return value
    if isinstance(value, str) and 0 < len(value) <= 256 and value.isprintable():
        return value
    raise Invalid(f"must be a user name or a uid, got {shown(value)}")


UserText = Annotated[str | int, PlainValidator(_user)]
"""A user of the host as configured: its name, or its uid."""


class ProcessSection(BerthModel):
    """``[process]``: how the process runtime runs workloads (all optional)."""

    user: UserText | None = None
    scratch_dir: PathText | None = None
    log_dir: PathText | None = None

    def run_as(self) -> RunAs | None:
        """Whom workloads run as: ``user``, else ``nobody`` when the agent is root, else the
        agent's own user (``None``); ``Invalid`` naming ``process.user`` for a user this host
        does not have, or one this agent may not run as."""
        if self.user is None:
            return RunAs.default("process.user")
        return RunAs.named(self.user, "process.user")

    def scratch(self) -> Path | None:
        """The configured scratch directory, absolute (``None``: the runtime's own)."""
        return None if self.scratch_dir is None else Path(self.scratch_dir).expanduser().absolute()

    def logs(self) -> Path | None:
        """The configured log directory, absolute (``None``: output is not kept)."""
        return None if self.log_dir is None else Path(self.log_dir).expanduser().absolute()


class MicrovmSection(BerthModel):
    """``[microvm]``: where the microVM runtime finds its files (all optional)."""

    data_dir: PathText | None = None
    images: PathText | None = None
    accel: AccelChoice = "auto"
    qemu: PathText = MICROVM_QEMU
    boot_timeout_s: Interval = MICROVM_BOOT_TIMEOUT_S
    log_dir: PathText | None = None
    node_dir: PathText | None = None


class ContainerSection(BerthModel):
    """``[container]``: where the container runtime finds its images and keeps its files (all
    optional)."""

    data_dir: PathText | None = None
    images: PathText | None = None
    runc: PathText = CONTAINER_RUNC
    network: Literal["host", "none"] = "host"
    pids_limit: Annotated[StrictInt, Field(ge=1, le=4_194_304)] = CONTAINER_PIDS_LIMIT
    log_dir: PathText | None = None
    node_dir: PathText | None = None

    def directories(self, node: str) -> tuple[Path, Path]:
        """The image layout and this node's directory, defaults filled in (absolute)."""
        data_dir = Path(self.data_dir or CONTAINER_DATA_DIR).expanduser().absolute()
        images = Path(self.images).expanduser() if self.images else data_dir / "images"
        node_dir = Path(self.node_dir).expanduser() if self.node_dir else data_dir / "nodes" / node
        return images.absolute(), node_dir.absolute()


class AgentConfig(BerthModel):
    """A whole agent configuration file."""

    node: NodeSection
    budget: BudgetSection
    agent: AgentSection = Field(default_factory=AgentSection)
    process: ProcessSection = Field(default_factory=ProcessSection)
    microvm: MicrovmSection = Field(default_factory=MicrovmSection)
    container: ContainerSection = Field(default_factory=ContainerSection)


def load_config(path: str | os.PathLike[str]) -> AgentConfig:
    """Read and validate a TOML configuration file (see the module docstring for the rules)."""
    return AgentConfig.from_dict(read_toml(path))


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML document at ``path`` as plain data; ``Invalid`` (field ``config``) otherwise."""
    if isinstance(path, bytes) or not isinstance(path, str | os.PathLike):
        raise Invalid(f"expected a file path, got {shown(path)}", field="config")
    name = os.fspath(path)
    if not isinstance(name, str) or not name.strip():
        raise Invalid("the configuration file's path must not be empty", field="config")
    if "\0" in name:
        raise Invalid(f"not a file path: {shown(name)}", field="config")
    data = _read_limited(name)
    text = _decode(data, name)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise Invalid(f"{shown(name)} is not valid TOML: {error}", field="config") from None
    except RecursionError:
        raise Invalid(f"{shown(name)} is nested too deeply", field="config") from None
    if _depth(document) > MAX_DEPTH:
        raise Invalid(
            f"{shown(name)} nests tables or arrays more than {MAX_DEPTH} deep", field="config"
        )
    return document


def _read_limited(name: str) -> bytes:
    """At most ``MAX_CONFIG_BYTES`` bytes of a regular file (or a stream such as a pipe)."""
    try:
        with open(name, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            if stat.S_ISDIR(mode):
                raise Invalid(f"{shown(name)} is a directory, not a file", field="config")
            if stat.S_ISREG(mode) and os.fstat(file.fileno()).st_size > MAX_CONFIG_BYTES:
                raise Invalid(_too_large(name), field="config")
            data = file.read(MAX_CONFIG_BYTES + 1)
    except IsADirectoryError:
        raise Invalid(f"{shown(name)} is a directory, not a file", field="config") from None
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise Invalid(f"cannot read {shown(name)}: {reason}", field="config") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise Invalid(_too_large(name), field="config")
    return data


def _too_large(name: str) -> str:
    return f"{shown(name)} is larger than {MAX_CONFIG_BYTES // 1024} KiB: not a configuration file"


def _decode(data: bytes, name: str) -> str:
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise Invalid(f"{shown(name)} is UTF-16 text; save it as UTF-8", field="config")
    try:
        return data.decode("utf-8-sig")  # a UTF-8 byte-order mark is harmless: skip it
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise Invalid(
            f"{shown(name)} is not UTF-8 text: byte {data[error.start]:#04x} at offset "
            f"{error.start} (line {line})",
            field="config",
        ) from None


def _depth(value: object, level: int = 0) -> int:
    """How deeply ``value`` nests tables and arrays (stops counting past ``MAX_DEPTH``)."""
    if level > MAX_DEPTH or not isinstance(value, dict | list):
        return level
    children = value.values() if isinstance(value, dict) else value
    return max((_depth(child, level + 1) for child in children), default=level)


def config_toml(config: AgentConfig) -> str:
    """``config`` as the TOML file ``berth agent --config`` reads back into an equal value."""
    lines: list[str] = []
    for section, values in config.model_dump(mode="json").items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if value is None:
                continue
            if isinstance(value, dict):
                items = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items())
                lines.append(f"{key} = {{ {items} }}")
            else:
                lines.append(f"{key} = {json.dumps(value)}")
        lines.append("")
    return "\n".join(lines)
