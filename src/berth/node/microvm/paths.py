"""Where the microVM runtime keeps its files, and what is missing from them.

This module owns the layout of berth's microVM data directory (``~/.local/share/berth/microvm``
unless the node config's ``[microvm] data_dir`` or ``berth microvm setup --data-dir`` names
another)::

    <data_dir>/
      kernel/<version>/vmlinuz            the guest kernel (from Debian's cloud kernel package)
      kernel/<version>/modules/*.ko       the modules the init loads
      kernel/current                      the version in use (one line)
      initramfs.img                       busybox + modules + berth's /init
      accel.json                          what the acceleration probe found
      images/                             the default OCI image layout (index.json, blobs/)
      nodes/<node>/layers/                a node's layers as erofs images
      nodes/<node>/run/                   its guests' scratch directories (while they run)

and :func:`problems`: what a node needs before it can boot a guest (QEMU, the kernel, the
initramfs, ``mkfs.ext4``), each with the command that fixes it — ``berth agent --check``
prints them.  Nothing here downloads or builds (that is :mod:`berth.node.microvm.setup`),
reads environment variables, or touches the host's ``/boot``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from berth.defaults import MICROVM_QEMU
from berth.errors import Invalid
from berth.node.microvm.initramfs import INIT_SCRIPT
from berth.validation import shown

__all__ = [
    "Accel",
    "GuestFiles",
    "default_data_dir",
    "problems",
]

Accel = Literal["kvm", "tcg"]


def default_data_dir() -> Path:
    """``~/.local/share/berth/microvm`` — the XDG data location, without reading the environment."""
    return Path.home() / ".local" / "share" / "berth" / "microvm"


@dataclass(frozen=True, slots=True)
class GuestFiles:
    """The files of one data directory (see the module docstring)."""

    data_dir: Path

    @classmethod
    def at(cls, data_dir: str | Path | None) -> GuestFiles:
        """The files under ``data_dir`` (default :func:`default_data_dir`), made absolute."""
        if data_dir is None:
            return cls(default_data_dir())
        if isinstance(data_dir, bytes) or not isinstance(data_dir, str | Path):
            raise Invalid(f"expected a directory path, got {shown(data_dir)}", field="data_dir")
        if not str(data_dir).strip() or "\0" in str(data_dir):
            raise Invalid(f"not a directory path: {shown(data_dir)}", field="data_dir")
        return cls(Path(data_dir).expanduser().absolute())

    @property
    def kernel_root(self) -> Path:
        return self.data_dir / "kernel"

    def kernel_version(self) -> str | None:
        """The kernel version set up here, or ``None``."""
        try:
            version = (self.kernel_root / "current").read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return version if version and "/" not in version and version not in (".", "..") else None

    def kernel_dir(self, version: str | None = None) -> Path | None:
        version = version or self.kernel_version()
        return None if version is None else self.kernel_root / version

    @property
    def kernel(self) -> Path | None:
        """The guest kernel image, or ``None`` when none is set up."""
        directory = self.kernel_dir()
        return None if directory is None else directory / "vmlinuz"

    @property
    def modules_dir(self) -> Path | None:
        directory = self.kernel_dir()
        return None if directory is None else directory / "modules"

    @property
    def initramfs(self) -> Path:
        return self.data_dir / "initramfs.img"

    @property
    def accel_file(self) -> Path:
        return self.data_dir / "accel.json"

    def node_dir(self, node: str) -> Path:
        """Where node ``node`` keeps its own files: ``layers/`` (its layers as erofs images)
        and ``run/`` (its guests' scratch directories).  Per node, so that agents sharing a
        host (an embedded cluster) each hold exactly the layers they advertise."""
        return self.data_dir / "nodes" / node

    @property
    def images_dir(self) -> Path:
        """The default OCI image layout workloads' images are read from."""
        return self.data_dir / "images"

    def initramfs_is_current(self) -> bool:
        """Whether the initramfs holds this berth's init (one built by another version of
        berth would speak another protocol)."""
        try:
            return INIT_SCRIPT.encode() in self.initramfs.read_bytes()
        except OSError:
            return False

    def probed_accel(self) -> tuple[Accel, str] | None:
        """What ``berth microvm setup`` found (``("tcg", "kvm: …")``), or ``None``."""
        try:
            found = json.loads(self.accel_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(found, dict) or found.get("accel") not in ("kvm", "tcg"):
            return None
        return found["accel"], str(found.get("detail", ""))

    def record_accel(self, accel: Accel, detail: str) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        partial = self.accel_file.with_name("accel.json.partial")
        partial.write_text(json.dumps({"accel": accel, "detail": detail}) + "\n", encoding="utf-8")
        partial.replace(self.accel_file)


def problems(files: GuestFiles, qemu: str = MICROVM_QEMU) -> list[str]:
    """What this host lacks to boot microVMs from ``files``, each with its fix; ``[]`` if ready."""
    found: list[str] = []
    setup = "berth microvm setup" + (
        "" if files.data_dir == default_data_dir() else f" --data-dir {files.data_dir}"
    )
    if shutil.which(qemu) is None:
        found.append(f"QEMU ({qemu}) is not installed: apt-get install qemu-system-x86")
    if shutil.which("mkfs.ext4") is None:
        found.append("mkfs.ext4 is not installed: apt-get install e2fsprogs")
    if shutil.which("mkfs.erofs") is None:
        found.append("mkfs.erofs is not installed: apt-get install erofs-utils")
    kernel = files.kernel
    if kernel is None or not kernel.is_file():
        found.append(f"no guest kernel in {files.kernel_root}: {setup}")
    if not files.initramfs.is_file():
        found.append(f"no initramfs at {files.initramfs}: {setup}")
    elif not files.initramfs_is_current():
        found.append(f"the initramfs at {files.initramfs} is another berth's: {setup}")
    return found
