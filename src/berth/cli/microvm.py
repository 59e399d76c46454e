"""``berth microvm setup`` on the command line.

Thin like the rest of the command line: :func:`setup_command` calls
:func:`berth.node.microvm.setup.setup` and prints its steps and result.  What ``berth agent
--check`` reports of the runtime is :func:`berth.node.microvm.setup.check_rows`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from berth.defaults import MICROVM_QEMU

__all__ = ["register", "setup_command"]

console = Console()


def setup_command(
    data_dir: Annotated[
        Path | None,
        typer.Option(help="berth's microVM data directory (default ~/.local/share/berth/microvm)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Fetch the kernel again even if one is set up.")
    ] = False,
    qemu: Annotated[str, typer.Option(help="The QEMU binary to probe with.")] = MICROVM_QEMU,
) -> None:
    """Fetch Debian's cloud kernel and modules, build the guest init, probe KVM/TCG."""
    from berth.node.microvm.paths import GuestFiles
    from berth.node.microvm.setup import setup

    files = GuestFiles.at(data_dir)
    console.print(f"setting up microVMs in {files.data_dir}", highlight=False)
    report = setup(
        files.data_dir,
        force=force,
        qemu=qemu,
        say=lambda step: console.print(f"  {step}", highlight=False),
    )
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


def register(app: typer.Typer) -> None:
    """Add ``berth microvm setup`` to ``app``."""
    group = typer.Typer(
        name="microvm",
        help="Real microVMs: set up the guest kernel and init.",
        no_args_is_help=True,
    )
    group.command("setup")(setup_command)
    app.add_typer(group, name="microvm")
