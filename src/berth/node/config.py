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
    runtime = "process"             # or "fake"
    stop_grace_s = 2.0

Validation happens once, here: a missing or bad key raises ``Invalid`` whose field is the
dotted key (``budget.mem_max``) and whose message quotes the offending value.  Nothing else
in berth reads configuration files or environment variables; it receives these models.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from berth.errors import Invalid
from berth.model import Bytes, BytesPerSecond, Name
from berth.node.budget import BudgetLimits
from berth.platform import Platform, host
from berth.validation import BerthModel

__all__ = ["AgentConfig", "AgentSection", "BudgetSection", "NodeSection", "load_config"]

Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class NodeSection(BerthModel):
    """``[node]``: who this node is."""

    name: Name
    platform: Platform = Field(default_factory=host)
    labels: dict[str, str] = Field(default_factory=dict)


class BudgetSection(BerthModel):
    """``[budget]``: the node's ceilings, in unit strings or plain numbers."""

    mem_max: Bytes
    disk_max: Bytes
    cpu_max_load: Fraction
    cpu_max_cap: Positive | None = None
    disk_bw_cap: BytesPerSecond
    disk_bw_max_load: Fraction
    net_bw_cap: BytesPerSecond
    net_bw_max_load: Fraction
    cpu_overcommit: Positive | None = None
    disk_bw_overcommit: Positive | None = None
    net_bw_overcommit: Positive | None = None

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

    heartbeat_s: Positive = 5.0
    sample_period_s: Positive = 0.25
    tau_s: Positive = 30.0
    layer_cache: Bytes = 10 * 2**30
    lease_ttl_s: Positive = 30.0
    runtime: Literal["process", "fake"] = "process"
    stop_grace_s: Positive = 2.0


class AgentConfig(BerthModel):
    """A whole agent configuration file."""

    node: NodeSection
    budget: BudgetSection
    agent: AgentSection = Field(default_factory=AgentSection)


def load_config(path: str | os.PathLike[str]) -> AgentConfig:
    """Read and validate a TOML configuration file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise Invalid(
            f"cannot read {os.fspath(path)!r}: {error.strerror}", field="config"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise Invalid(f"{os.fspath(path)} is not valid TOML: {error}", field="config") from None
    return AgentConfig.from_dict(data)
