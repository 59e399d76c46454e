"""QEMU's ``microvm`` machine: the command line of one guest, and the host facts it needs.

This module owns how berth asks QEMU for a guest — nothing else in berth spells a QEMU
option.  :func:`qemu_argv` builds::

    qemu-system-x86_64 -M microvm,pit=off,pic=off -accel tcg -cpu max -smp N -m MiB
        -nodefaults -no-user-config -display none -serial stdio -no-reboot
        -kernel vmlinuz -initrd initrd -append "console=ttyS0 quiet panic=-1 …"
        -drive id=layer0,file=L0,format=raw,if=none,readonly=on
        -device virtio-blk-device,drive=layer0,serial=berth-layer-0   (one per layer)
        -drive id=upper,file=UPPER,format=raw,if=none
        -device virtio-blk-device,drive=upper,serial=berth-upper

A workload's guest gets its serial console as a *socket* QEMU serves
(``-chardev socket,…,server=on,wait=off,logfile=LOG,logappend=on -serial chardev:console``,
:class:`GuestConsole`) rather than QEMU's stdio: QEMU writes every byte of the console to the
log file whether or not anyone is connected (checked on QEMU 7.2), so the host *reads* the
console from that file — a restarted agent reads it again from the start — and connects to the
socket only to write (the stop request).  Nothing the host does or fails to do can block the
guest's output.  The probe boot keeps ``-serial stdio``.

Facts it relies on (checked on Debian 12's QEMU 7.2 with Debian's cloud kernel 6.1): the
legacy PIT and PIC are not needed (the kernel uses the TSC and the IO-APIC; dropping them
saves ~0.2 s of a ~1.5 s boot under TCG — dropping the RTC too makes the boot 2 s slower);
devices are found through ACPI (``acpi=off`` loses the disks and poweroff); the machine has
:data:`MAX_DISKS` virtio-mmio transports; guests booted concurrently on a busy host hang at TSC
calibration unless the kernel is told the TSC frequency (``tsc_early_khz``, from
:func:`host_tsc_khz`); a stock kernel cannot run under this host's nested KVM, so KVM is used
only where a probe boot showed it works (:mod:`berth.node.microvm.vm`), software emulation
(TCG, ``-cpu max``) otherwise.

Sizing (:func:`vm_size`): memory is the workload's ``mem`` rounded up to MiB, never below
:data:`MIN_GUEST_MEM` — the kernel and init need ~80 MiB to boot, so a smaller spec gets the
floor and the difference is logged; vCPUs are the spec's ``vcpus`` rounded up, at least 1
and at most this host's cores (under TCG every vCPU is a host thread, so more only contend).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from berth.node.microvm.paths import Accel
from berth.units import MiB

__all__ = [
    "MAX_DISKS",
    "MAX_LAYERS",
    "MIN_GUEST_MEM",
    "GuestConsole",
    "VmSize",
    "host_tsc_khz",
    "kernel_cmdline",
    "qemu_argv",
    "vm_size",
]

MIN_GUEST_MEM = 96 * MiB
"""The least memory a guest gets: Debian's cloud kernel with berth's init boots in 80 MiB, not
64; 96 leaves the workload a little."""
MAX_DISKS = 24
"""virtio-mmio transports of QEMU's microvm machine: one disk each."""
MAX_LAYERS = MAX_DISKS - 1
"""Layers one guest can stack (the last transport carries the writable upper disk)."""


@dataclass(frozen=True, slots=True)
class GuestConsole:
    """Where one guest's serial console is: the socket QEMU serves it on (the host writes to
    it) and the file QEMU logs all of it to (the host reads it)."""

    socket: Path
    log: Path

    def argv(self) -> list[str]:
        """QEMU's options for this console."""
        chardev = (
            f"socket,id=console,path={_option_value(self.socket)},server=on,wait=off,"
            f"logfile={_option_value(self.log)},logappend=on"
        )
        return ["-chardev", chardev, "-serial", "chardev:console"]


@dataclass(frozen=True, slots=True)
class VmSize:
    """What a guest gets: ``vcpus`` and ``mem_mib``; ``floored`` when ``mem`` was raised."""

    vcpus: int
    mem_mib: int
    floored: bool = False


def vm_size(vcpus: float | None, mem: int | None, host_cores: int | None = None) -> VmSize:
    """The guest's vCPUs and memory for a workload asking ``vcpus`` cores and ``mem`` bytes."""
    cores = host_cores or os.cpu_count() or 1
    count = 1 if vcpus is None else max(1, math.ceil(vcpus))
    wanted = MIN_GUEST_MEM if mem is None else mem
    mem_bytes = max(wanted, MIN_GUEST_MEM)
    return VmSize(
        vcpus=min(count, cores),
        mem_mib=-(-mem_bytes // MiB),
        floored=mem is not None and mem < MIN_GUEST_MEM,
    )


def host_tsc_khz(cpuinfo: Path = Path("/proc/cpuinfo")) -> int | None:
    """This host's TSC frequency in kHz, from the first ``cpu MHz`` line; ``None`` if unknown."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "cpu MHz":
            try:
                mhz = float(value)
            except ValueError:
                return None
            return round(mhz * 1000) if math.isfinite(mhz) and mhz > 0 else None
    return None


def kernel_cmdline(tsc_khz: int | None) -> str:
    """The guest kernel's command line."""
    words = ["console=ttyS0", "quiet", "panic=-1"]
    # Skip what a one-workload guest never uses and software emulation makes slow: the crypto
    # self-tests (~0.5-1 s under TCG), probing a PS/2 controller, spare UARTs.
    words += ["cryptomgr.notests", "i8042.noaux", "i8042.nokbd", "i8042.nopnp", "8250.nr_uarts=1"]
    if tsc_khz:
        words += [f"tsc_early_khz={tsc_khz}", "tsc=reliable"]
    return " ".join(words)


def _option_value(path: Path) -> str:
    # QEMU's option syntax separates with commas; a comma inside a value is written twice.
    return str(path).replace(",", ",,")


def qemu_argv(
    qemu: str,
    *,
    kernel: Path,
    initrd: Path,
    accel: Accel,
    size: VmSize,
    cmdline: str,
    layers: Sequence[Path] = (),
    upper: Path | None = None,
    console: GuestConsole | None = None,
) -> list[str]:
    """The command line of one guest (see the module docstring)."""
    if len(layers) > MAX_LAYERS:
        raise ValueError(f"{len(layers)} layers: at most {MAX_LAYERS}")
    argv = [
        qemu,
        "-M",
        "microvm,pit=off,pic=off",
        "-accel",
        accel,
        "-cpu",
        "host" if accel == "kvm" else "max",
        "-smp",
        str(size.vcpus),
        "-m",
        str(size.mem_mib),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        *(["-serial", "stdio"] if console is None else console.argv()),
        "-no-reboot",
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        cmdline,
    ]
    for index, layer in enumerate(layers):
        argv += [
            "-drive",
            f"id=layer{index},file={_option_value(layer)},format=raw,if=none,readonly=on",
            "-device",
            f"virtio-blk-device,drive=layer{index},serial=berth-layer-{index}",
        ]
    if upper is not None:
        argv += [
            "-drive",
            f"id=upper,file={_option_value(upper)},format=raw,if=none",
            "-device",
            "virtio-blk-device,drive=upper,serial=berth-upper",
        ]
    return argv
