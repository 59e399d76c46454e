"""The ``[microvm]`` table of an agent's configuration: where the microVM runtime finds its files.

This module owns the validated model of that table (:class:`MicrovmSection`) and the defaults
the runtime shares with it (the QEMU binary, the boot timeout, the acceleration choices).  It
lives with the microVM code, below both its readers: the agent's configuration
(:mod:`berth.node.config`) nests it as ``AgentConfig.microvm``, and the runtime driver
(:mod:`berth.node.runtime.microvm`) builds itself from it — so the driver never imports the
agent's configuration.  It reads no files and touches no host state; it imports only berth's
value types, so loading the agent's configuration does not load the microVM stack.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, StrictStr

from berth.errors import Invalid
from berth.model import Interval
from berth.validation import BerthModel, shown

__all__ = ["BOOT_TIMEOUT_S", "DEFAULT_QEMU", "AccelChoice", "MicrovmSection", "PathText"]

DEFAULT_QEMU = "qemu-system-x86_64"
"""The QEMU binary guests run under, looked up on ``PATH``."""
BOOT_TIMEOUT_S = 300.0
"""How long a guest may take to start its workload (a cold boot under emulation on a busy
host)."""
AccelChoice = Literal["auto", "kvm", "tcg"]
"""How guests are accelerated: ``kvm``, ``tcg``, or ``auto`` (what the setup's probe found)."""


def _path_text(value: str) -> str:
    if not value.strip():
        raise Invalid("must not be empty")
    if len(value) > 4096 or not value.isprintable():
        raise Invalid(f"not a path: {shown(value)}")
    return value


PathText = Annotated[StrictStr, AfterValidator(_path_text)]
"""A path as configured: non-empty, printable, at most 4,096 characters."""


class MicrovmSection(BerthModel):
    """``[microvm]``: where the microVM runtime finds its files (all optional)."""

    data_dir: PathText | None = None
    images: PathText | None = None
    accel: AccelChoice = "auto"
    qemu: PathText = DEFAULT_QEMU
    boot_timeout_s: Interval = BOOT_TIMEOUT_S
    log_dir: PathText | None = None
    node_dir: PathText | None = None
