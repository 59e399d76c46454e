"""``berth microvm setup`` and the microVM part of ``berth agent --check``.

Thin like the rest of the command line: :func:`setup_command` calls
:func:`berth.node.microvm.setup.setup` and prints its steps and result; :func:`check_rows`
gives ``berth agent --check`` the runtime's effective paths and acceleration and what the
host still lacks, each problem with the command that fixes it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from berth.node.config import AgentConfig
from berth.node.microvm.paths import DEFAULT_QEMU, GuestFiles, problems
from berth.node.microvm.setup import setup

__all__ = ["check_rows", "register", "setup_command"]

console = Console()


def setup_command(
    data_dir: Annotated[
        Path | None,
        typer.Option(help="berth's microVM data directory (default ~/.local/share/berth/microvm)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Fetch the kernel again even if one is set up.")
    ] = False,
    qemu: Annotated[str, typer.Option(help="The QEMU binary to probe with.")] = DEFAULT_QEMU,
) -> None:
    """Fetch Debian's cloud kernel and modules, build the guest init, probe KVM/TCG."""
    files = GuestFiles.at(data_dir)
    console.print(f"setting up microVMs in {files.data_dir}", highlight=False)
    report = setup(files.data_dir, force=force, qemu=qemu,
                   say=lambda step: console.print(f"  {step}", highlight=False))  # fmt: skip
    console.print(
        f"[green]ready[/]: kernel {report.kernel_version}, guests under "
        f"[bold]{report.accel}[/] ({report.accel_detail})",
        highlight=False,
    )
    config = '[agent]\nruntime = "microvm"\n\n[microvm]\n'
    if data_dir is not None:
        config += f"data_dir = {json.dumps(str(files.data_dir))}\n"
    config += f"images = {json.dumps(str(files.images_dir))}  # an OCI image layout\n"
    console.print("a node config that uses it:\n" + config, highlight=False, markup=False)


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


def register(app: typer.Typer) -> None:
    """Add ``berth microvm setup`` to ``app``."""
    group = typer.Typer(name="microvm", help="Real microVMs: set up the guest kernel and init.",
                        no_args_is_help=True)  # fmt: skip
    group.command("setup")(setup_command)
    app.add_typer(group, name="microvm")
