"""Small real images for guests, built locally as OCI layouts: a busybox base and app layers.

Tests, ``benchmarks/microvm_start.py`` and ``berth demo --runtime microvm`` boot real guests
without a registry: this module writes the images they boot with :func:`berth.oci.
write_layout`.  :func:`busybox_layer` is the host's static busybox (from ``busybox-static``)
with a symlink per applet — a working ``/bin/sh``, ``echo``, ``sleep``, ``awk`` …, about 1 MB
compressed; :func:`app_layer` is an application layer of a chosen size, deterministic from
its seed, mixing incompressible data (like binaries and compressed assets) with text (like
sources) so that its gzip blob and its erofs image have realistic sizes and conversion
costs.  Nothing here runs a guest.
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Sequence
from pathlib import Path

from berth.errors import BerthError
from berth.oci import ImageSpec, TarMember, directory, file, symlink, write_layout

__all__ = ["BUSYBOX", "app_layer", "busybox_layer", "write_image"]

BUSYBOX = Path("/bin/busybox")
"""Where Debian's ``busybox-static`` puts its static busybox."""


def busybox_layer(busybox: Path = BUSYBOX) -> list[TarMember]:
    """A base layer: ``/bin/busybox`` (static), a ``/bin/<applet>`` symlink each, ``/etc``."""
    try:
        data = busybox.read_bytes()
        listed = subprocess.run(
            [str(busybox), "--list"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.split()
    except (OSError, subprocess.SubprocessError) as error:
        raise BerthError(
            f"cannot read {busybox}: {error} (apt-get install busybox-static)"
        ) from None
    members = [directory("bin"), directory("etc"), directory("tmp", 0o1777)]
    members.append(file("bin/busybox", data, 0o755))
    members += [
        symlink(f"bin/{name}", "busybox")
        for name in sorted(set(listed))
        if "/" not in name and name != "busybox"
    ]
    members.append(file("etc/hostname", "berth\n"))
    return members


def app_layer(size_bytes: int, seed: int, *, prefix: str = "app") -> list[TarMember]:
    """An application layer of about ``size_bytes`` (uncompressed) under ``/<prefix>``:
    half incompressible files, half text, in files of 64 KiB-2 MiB; a ``VERSION`` file names
    the seed, so two seeds never share a digest."""
    rng = random.Random(seed)
    members = [directory(prefix), file(f"{prefix}/VERSION", f"{prefix} build {seed}\n")]
    written = 0
    index = 0
    words = [f"{rng.getrandbits(32):08x}" for _ in range(512)]
    while written < size_bytes:
        length = min(rng.randint(64 << 10, 2 << 20), max(size_bytes - written, 1))
        if index % 2 == 0:
            data = rng.randbytes(length)
            name = f"{prefix}/lib/blob{index:04d}.bin"
        else:
            text = " ".join(rng.choices(words, k=length // 9 + 1))
            data = text.encode()[:length]
            name = f"{prefix}/src/module{index:04d}.txt"
        members.append(file(name, data))
        written += length
        index += 1
    return [directory(f"{prefix}/lib"), directory(f"{prefix}/src"), *members]


def write_image(
    layout: Path,
    ref: str,
    layers: Sequence[Sequence[TarMember]],
    *,
    cmd: Sequence[str] = (),
    working_dir: str = "",
    user: str = "",
) -> Path:
    """Write one linux/amd64 image of ``layers`` (base first) as ``ref`` into ``layout``;
    ``user`` is its config's ``User`` (empty: root)."""
    spec = ImageSpec(
        layers=[list(layer) for layer in layers], cmd=tuple(cmd), working_dir=working_dir
    )
    if user:  # ImageSpec has no User: give the whole runtime config, with it
        config = {
            "Env": list(spec.env),
            "Cmd": list(cmd) or None,
            "WorkingDir": working_dir,
            "User": user,
        }
        spec = ImageSpec(
            layers=spec.layers,
            cmd=spec.cmd,
            working_dir=working_dir,
            extra_config={"config": config},
        )
    return write_layout(layout, spec, ref=ref)
