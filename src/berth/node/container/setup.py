"""What a node needs before it runs containers, and the starter image ``berth up`` gives it.

:func:`problems` is the probe ``berth up`` runs before it picks the ``container`` runtime and
``berth agent --check`` runs for an agent configured with it: the agent must be root (it
mounts layers), the OCI runtime must be installed, and this kernel must mount an erofs file
and stack an overlay on it (:func:`~berth.node.container.mounts.probe`, in a temporary
directory: a check changes nothing).  Each missing piece is one line an operator can act on,
with its fix.  :func:`check_rows` adds the ``[container]`` settings in effect, as ``berth
agent --check`` prints them, and whether the image layout exists.

:func:`write_starter_image` writes ``busybox`` — the host's static busybox as one layer, built
here from the distribution's package, never downloaded — into an OCI image layout, so a new
cluster runs ``berth run busybox -- echo hello`` with no extra step.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from berth.errors import BerthError
from berth.node.config import AgentConfig, ContainerSection
from berth.node.container.mounts import probe
from berth.node.microvm.images import busybox_layer, write_image

__all__ = ["STARTER_IMAGE", "check_rows", "problems", "runc_version", "write_starter_image"]

STARTER_IMAGE = "busybox"
"""The image :func:`write_starter_image` writes, under this reference."""


def runc_version(runc: str) -> str | None:
    """The OCI runtime's version line (``runc version 1.1.5``), ``None`` when not installed."""
    found = shutil.which(runc)
    if found is None:
        return None
    try:
        shown = subprocess.run(
            [found, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    first = shown.stdout.splitlines()[0] if shown.stdout else ""
    return first.strip() or found


def problems(section: ContainerSection) -> list[str]:
    """What this host lacks to run containers as ``section`` says (empty: nothing)."""
    missing: list[str] = []
    if runc_version(section.runc) is None:
        missing.append(f"the OCI runtime {section.runc!r} is not installed (apt-get install runc)")
    with tempfile.TemporaryDirectory(prefix="berth-container-probe-") as scratch:
        found = probe(Path(scratch))
    if found is not None:
        missing.append(found)
    return missing


def check_rows(config: AgentConfig) -> tuple[list[tuple[str, str]], list[str]]:
    """The ``[container]`` settings in effect as table rows, and what is missing (with
    fixes)."""
    section = config.container
    images, node_dir = section.directories(config.node.name)
    rows = [
        ("container.runc", runc_version(section.runc) or f"{section.runc} (not installed)"),
        ("container.images", str(images)),
        ("container.node_dir", str(node_dir)),
        ("container.network", section.network),
        ("container.pids_limit", str(section.pids_limit)),
        ("container.log_dir", section.log_dir or "- (output discarded)"),
    ]
    missing = problems(section)
    if not (images / "index.json").is_file():
        missing.append(
            f"no OCI image layout at {images}: write one there (e.g. skopeo copy "
            f"docker://busybox oci:{images}:busybox) or set [container] images"
        )
    return rows, missing


def write_starter_image(layout: Path) -> str | None:
    """Write :data:`STARTER_IMAGE` into the OCI layout at ``layout``; ``None`` when done,
    else why not (the host has no static busybox: its fix)."""
    try:
        base = busybox_layer()
    except BerthError as error:
        return str(error)
    write_image(layout, STARTER_IMAGE, [base], cmd=("sh",))
    return None
