"""``berth microvm setup``: the guest kernel, its modules and berth's init, in berth's data dir.

This module owns preparing a host to boot microVMs, once, with Debian's own packages and
nothing installed into the host's ``/boot``:

1. resolve the versioned kernel package Debian's ``linux-image-cloud-amd64`` depends on
   (``apt-cache depends``), fetch it with ``apt-get download`` and unpack it with ``dpkg -x``
   into a scratch directory — a download of ~27 MB;
2. keep its ``vmlinuz`` and the modules the init loads (:data:`~berth.node.microvm.initramfs.
   MODULES`) under ``<data_dir>/kernel/<version>/`` and point ``kernel/current`` at it;
3. build the initramfs from the static busybox of ``busybox-static`` and those modules;
4. start the default OCI image layout (``<data_dir>/images``) with one image, ``busybox``
   (the same static busybox), if there is no layout there yet — a node can boot a guest at
   once;
5. boot a probe guest under KVM (if ``/dev/kvm`` is usable) and under TCG, and record which
   acceleration works in ``accel.json`` — the runtime reads it instead of probing again.

A kernel already set up is kept (``force`` fetches again); the initramfs is always rebuilt,
so a newer berth's init takes effect.  Failures are :class:`SetupFailed` naming the step and
the command that would fix it (``apt-get install busybox-static``).

:func:`check_rows` is the other half, for ``berth agent --check``: the runtime's effective
paths and acceleration, and what the host still lacks, each problem with the command that
fixes it.
"""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from berth.defaults import KVM_PROBE_TIMEOUT_S, MICROVM_QEMU
from berth.errors import BerthError
from berth.node.config import AgentConfig
from berth.node.microvm.images import busybox_layer, write_image
from berth.node.microvm.initramfs import MODULES, build_initramfs
from berth.node.microvm.paths import Accel, GuestFiles, problems
from berth.node.microvm.vm import probe

__all__ = [
    "KERNEL_META_PACKAGE",
    "SetupFailed",
    "SetupReport",
    "check_rows",
    "is_static_elf",
    "setup",
]

KERNEL_META_PACKAGE = "linux-image-cloud-amd64"
BUSYBOX_CANDIDATES = (Path("/bin/busybox"), Path("/usr/bin/busybox"))


class SetupFailed(BerthError):
    """A setup step failed; the message says which and how to fix it."""


@dataclass(frozen=True, slots=True)
class SetupReport:
    """What setup did: the kernel version, whether it was fetched now, the acceleration."""

    data_dir: Path
    kernel_version: str
    fetched: bool
    initramfs_bytes: int
    accel: Accel
    accel_detail: str


def _run(argv: list[str], cwd: Path | None = None, timeout_s: float = 600.0) -> str:
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError:
        raise SetupFailed(f"{argv[0]} is not installed (setup needs Debian's apt)") from None
    except subprocess.TimeoutExpired:
        raise SetupFailed(f"{' '.join(argv)} did not finish within {timeout_s:g} s") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SetupFailed(f"{' '.join(argv)} failed: {said[-1] if said else done.returncode}")
    return done.stdout


def kernel_package() -> str:
    """The versioned package ``linux-image-cloud-amd64`` depends on (``linux-image-6.1.0-…``)."""
    out = _run(["apt-cache", "depends", KERNEL_META_PACKAGE])
    for line in out.splitlines():
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key.strip() == "Depends" and value.startswith("linux-image-"):
            return value
    raise SetupFailed(
        f"apt knows no kernel package behind {KERNEL_META_PACKAGE}: run apt-get update"
    )


def is_static_elf(path: Path) -> bool:
    """Whether ``path`` is a 64-bit little-endian ELF executable without a program interpreter
    (so it runs inside a guest that has no C library)."""
    try:
        with open(path, "rb") as file:
            header = file.read(64)
            if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
                return False
            phoff = int.from_bytes(header[32:40], "little")
            phentsize = int.from_bytes(header[54:56], "little")
            phnum = int.from_bytes(header[56:58], "little")
            file.seek(phoff)
            table = file.read(phentsize * phnum)
    except OSError:
        return False
    types = (int.from_bytes(table[i : i + 4], "little") for i in range(0, len(table), phentsize))
    return 3 not in types  # PT_INTERP


def static_busybox() -> Path:
    """The host's static busybox; :class:`SetupFailed` when there is none."""
    for candidate in BUSYBOX_CANDIDATES:
        if candidate.is_file() and is_static_elf(candidate):
            return candidate
    raise SetupFailed("no static busybox on this host: apt-get install busybox-static")


def _unpacked_module(root: Path, name: str) -> bytes:
    for suffix in (".ko", ".ko.xz"):
        found = sorted(root.glob(f"lib/modules/*/kernel/**/{name}{suffix}"))
        if found:
            data = found[0].read_bytes()
            return lzma.decompress(data) if suffix == ".ko.xz" else data
    raise SetupFailed(f"the kernel package has no module {name}")


def fetch_kernel(files: GuestFiles, say: Callable[[str], None]) -> str:
    """Download, unpack and keep the kernel and its modules; return the kernel version."""
    package = kernel_package()
    version = package.removeprefix("linux-image-")
    say(f"fetching {package} (apt-get download) …")
    with tempfile.TemporaryDirectory(prefix="berth-kernel-") as scratch:
        where = Path(scratch)
        where.chmod(0o755)  # apt's sandbox user may write here
        _run(["apt-get", "download", package], cwd=where)
        debs = sorted(where.glob("*.deb"))
        if not debs:
            raise SetupFailed(f"apt-get download {package} left no .deb")
        root = where / "root"
        _run(["dpkg", "-x", str(debs[0]), str(root)])
        kernels = sorted(root.glob("boot/vmlinuz-*"))
        if not kernels:
            raise SetupFailed(f"{debs[0].name} has no boot/vmlinuz-*")
        target = files.kernel_root / version
        partial = files.kernel_root / f"{version}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        (partial / "modules").mkdir(parents=True)
        shutil.copyfile(kernels[0], partial / "vmlinuz")
        for name in MODULES:
            (partial / "modules" / f"{name}.ko").write_bytes(_unpacked_module(root, name))
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    current = files.kernel_root / "current.partial"
    current.write_text(version + "\n", encoding="utf-8")
    current.replace(files.kernel_root / "current")
    return version


def setup(
    data_dir: str | Path | None = None,
    *,
    force: bool = False,
    qemu: str = MICROVM_QEMU,
    say: Callable[[str], None] = lambda _: None,
) -> SetupReport:
    """Prepare ``data_dir`` (see the module docstring); ``say`` hears each step."""
    files = GuestFiles.at(data_dir)
    files.kernel_root.mkdir(parents=True, exist_ok=True)
    busybox = static_busybox()
    version = files.kernel_version()
    fetched = False
    if force or version is None or not (files.kernel or Path("/nonexistent")).is_file():
        version = fetch_kernel(files, say)
        fetched = True
    else:
        say(f"kernel {version} already in {files.kernel_root}")
    modules_dir = files.modules_dir
    assert modules_dir is not None
    modules = {name: modules_dir / f"{name}.ko" for name in MODULES}
    if not all(path.is_file() for path in modules.values()):
        version = fetch_kernel(files, say)
        fetched = True
    size = build_initramfs(busybox, modules, files.initramfs)
    say(f"initramfs {files.initramfs} ({size / 2**20:.1f} MiB, busybox from {busybox})")
    if not (files.images_dir / "index.json").exists():
        write_image(files.images_dir, "busybox", [busybox_layer(busybox)])
        say(f"an OCI image layout at {files.images_dir} with one image, busybox")
    accel, detail = choose_accel(files, qemu, say)
    files.record_accel(accel, detail)
    return SetupReport(files.data_dir, version, fetched, size, accel, detail)


def choose_accel(
    files: GuestFiles, qemu: str, say: Callable[[str], None] = lambda _: None
) -> tuple[Accel, str]:
    """KVM if a probe guest boots under it, else TCG if one boots under that; the detail says
    what each probe found.  :class:`SetupFailed` when no guest boots at all."""
    kvm_ok, kvm_detail = probe(files, "kvm", qemu=qemu, timeout_s=KVM_PROBE_TIMEOUT_S)
    say(f"probe under kvm: {'ok, ' if kvm_ok else ''}{kvm_detail}")
    if kvm_ok:
        return "kvm", f"kvm: {kvm_detail}"
    tcg_ok, tcg_detail = probe(files, "tcg", qemu=qemu, timeout_s=120.0)
    say(f"probe under tcg: {'ok, ' if tcg_ok else ''}{tcg_detail}")
    if not tcg_ok:
        raise SetupFailed(f"no guest boots on this host: kvm: {kvm_detail}; tcg: {tcg_detail}")
    return "tcg", f"tcg: {tcg_detail}; kvm: {kvm_detail}"


def check_rows(config: AgentConfig) -> tuple[list[tuple[str, str]], list[str]]:
    """The ``[microvm]`` settings in effect as table rows, and what is missing (with fixes)."""
    section = config.microvm
    files = GuestFiles.at(section.data_dir)
    images = Path(section.images).expanduser() if section.images else files.images_dir
    recorded = files.probed_accel()
    if section.accel != "auto":
        accel = f"{section.accel} (configured)"
    elif recorded is not None:
        accel = f"{recorded[0]} ({recorded[1]})"
    else:
        accel = "not probed yet: the agent probes KVM once at start"
    rows = [
        ("microvm.data_dir", str(files.data_dir)),
        ("microvm.kernel", files.kernel_version() or "missing"),
        ("microvm.initramfs", str(files.initramfs)),
        ("microvm.accel", accel),
        ("microvm.images", str(images)),
        ("microvm.node_dir", section.node_dir or str(files.node_dir(config.node.name))),
        ("microvm.log_dir", section.log_dir or "- (consoles kept in memory)"),
    ]
    missing = problems(files, section.qemu)
    if not (images / "index.json").is_file():
        missing.append(
            f"no OCI image layout at {images}: write one there (e.g. skopeo copy "
            f"docker://busybox oci:{images}:busybox) or set [microvm] images"
        )
    if os.geteuid() != 0:
        missing.append("converting layers to erofs images needs root: run the agent as root")
    return rows, missing
