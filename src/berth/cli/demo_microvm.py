"""``berth demo --runtime microvm``: real guests on an embedded cluster, colocation in seconds.

The demo builds two images as a local OCI layout (the host's busybox as a shared base layer,
each with its own generated application layer), starts an embedded cluster of three
``microvm`` nodes (each with its own, empty layer store in a scratch directory) and places a
handful of guests, one after the other, through the cluster's scheduler with the ``berth``
policy: the first guest of each image lands on a node that must convert its layers; a later
guest of the same image is placed where those layers already are (the policy ranks nodes by
the layer bytes they hold, mounted or cached) and boots from the files the node kept.  Each
placement is shown with its node, the bytes it found there, the bytes it had to convert and
the time from placement to the workload's first output; the summary compares colocated
starts with cold ones.  Each guest prints its image's ``VERSION`` and exits before the next
is placed, so no guest slows another's boot.

It owns nothing but this scenario: placement, booting and the layer store are the cluster's,
the runtime's and the node's.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from berth.cli.common import show_table
from berth.defaults import MICROVM_STOP_GRACE_S
from berth.embedded import EmbeddedCluster, embedded_configs
from berth.errors import Invalid
from berth.model import Request
from berth.node.config import AgentConfig, AgentSection, MicrovmSection
from berth.node.microvm.images import app_layer, busybox_layer, write_image
from berth.node.microvm.paths import GuestFiles, problems
from berth.node.runtime import BootSpec
from berth.node.runtime.microvm import MicrovmRuntime, MicrovmWorkload
from berth.oci import OciImage, read_layout
from berth.scheduler.policy import policy
from berth.units import GiB, format_information

__all__ = ["DemoStart", "run_demo", "show", "summary"]

DEFAULT_ORDER = ("web", "web", "batch", "batch", "web")


@dataclass(frozen=True, slots=True)
class DemoStart:
    """One placement: the guest, its image, the node, the bytes of its layers the node held
    (``colocated_bytes``: mounted or cached, the files it boots from at once) and those it
    converted, the seconds from placement to first output, and that output."""

    workload: str
    image: str
    node: str
    colocated_bytes: int
    converted_bytes: int
    start_s: float
    boot_s: float
    output: str

    @property
    def cold(self) -> bool:
        return self.converted_bytes > 0


def _configs(nodes: int, layout: Path, scratch: Path, data_dir: Path) -> list[AgentConfig]:
    configs = []
    for config in embedded_configs(nodes, platforms=("linux/amd64",), runtime="fake"):
        section = MicrovmSection(
            data_dir=str(data_dir),
            images=str(layout),
            node_dir=str(scratch / "nodes" / config.node.name),
        )
        agent = AgentSection(
            runtime="microvm",
            heartbeat_s=1.0,
            stop_grace_s=MICROVM_STOP_GRACE_S,
            layer_cache=2 * GiB,
        )
        configs.append(config.model_copy(update={"agent": agent, "microvm": section}))
    return configs


def _held(runtime: object, image: OciImage) -> set[str]:
    """The digests of ``image``'s layers whose files the node's runtime holds now."""
    assert isinstance(runtime, MicrovmRuntime)
    return {layer.digest for layer in image.layers if runtime.layer_files.has(layer.digest)}


def _images(layout: Path, app_mib: int) -> dict[str, OciImage]:
    base = busybox_layer()
    images = {}
    for seed, name in enumerate(("web", "batch")):
        write_image(layout, name, [base, app_layer(app_mib << 20, seed=100 + seed)])
        images[name] = read_layout(layout, ref=name)
    return images


async def run_demo(
    *,
    order: Sequence[str] = DEFAULT_ORDER,
    app_mib: int = 192,
    nodes: int = 3,
    data_dir: Path | None = None,
    report: Callable[[DemoStart], None] = lambda _: None,
) -> list[DemoStart]:
    """Place and boot one guest per entry of ``order`` (``web`` or ``batch``); ``report``
    hears each start as it happens.  ``Invalid`` (field ``--runtime``) when this host cannot
    boot guests."""
    files = GuestFiles.at(data_dir)
    missing = problems(files)
    if os.geteuid() != 0:
        missing.append("converting layers to erofs images needs root")
    if missing:
        raise Invalid(f"microVMs are not set up here: {'; '.join(missing)}", field="--runtime")
    unknown = sorted(set(order) - {"web", "batch"})
    if unknown:
        raise Invalid(f"unknown images {unknown}: the demo has web and batch", field="order")
    starts: list[DemoStart] = []
    with tempfile.TemporaryDirectory(prefix="berth-microvm-demo-") as scratch:
        layout = Path(scratch) / "oci"
        images = _images(layout, app_mib)
        configs = _configs(nodes, layout, Path(scratch), files.data_dir)
        async with EmbeddedCluster(configs, policy=policy("berth")) as cluster:
            for replica, name in enumerate(order):
                image = images[name]
                request = Request(
                    namespace="demo",
                    name=name,
                    replica=replica,
                    spec="milli",
                    layers=image.berth_layers(),
                )
                command = ("cat", "/app/VERSION")
                boot = BootSpec(name=f"{name}-{replica}", image=name, command=command)
                held = {node: _held(agent.runtime, image) for node, agent in cluster.agents.items()}
                began = time.monotonic()
                placed = await cluster.run(request, boot)
                workload = placed.result
                assert isinstance(workload, MicrovmWorkload)
                first = await workload.first_output()
                await workload.wait()  # its layers go to the node's cache: still local
                converted = sum(
                    layer.size for layer in image.layers if layer.digest not in held[placed.node]
                )
                start = DemoStart(
                    workload=workload.id,
                    image=name,
                    node=placed.node,
                    colocated_bytes=image.size - converted,
                    converted_bytes=converted,
                    start_s=first - began,
                    boot_s=workload.boot_seconds or 0.0,
                    output=workload.output[0] if workload.output else "",
                )
                starts.append(start)
                report(start)
    return starts


def summary(starts: Sequence[DemoStart]) -> str:
    """One line: colocated starts against cold ones (p50 seconds to first output)."""
    cold = [start.start_s for start in starts if start.cold]
    warm = [start.start_s for start in starts if not start.cold]
    if not cold or not warm:
        return f"{len(starts)} guests started"
    cold_p50, warm_p50 = statistics.median(cold), statistics.median(warm)
    return (
        f"colocated starts (all layers on the node): p50 {warm_p50:.2f} s over {len(warm)}; "
        f"cold starts (layers converted first): p50 {cold_p50:.2f} s over {len(cold)} — "
        f"{cold_p50 - warm_p50:.2f} s saved per start"
    )


def show(console: Console, *, app_mib: int = 192) -> list[DemoStart]:
    """Run the demo, printing each placement as a table row and the summary."""
    console.rule("[bold]berth demo --runtime microvm[/]: real guests on 3 embedded nodes")
    console.print(
        "Two images (busybox + an application layer each) in a local OCI layout.  Each guest "
        "is placed by the cluster's scheduler with the berth policy — the layer bytes a node "
        "holds (mounted or cached) first — and booted in a QEMU microVM; it prints its "
        "image's VERSION and exits.  A node converts a layer it lacks into an erofs image "
        "first; a colocated guest boots from the files already there.  Building the images …"
    )
    table = Table(title="placements, in order")
    for column in ("guest", "node", "colocated", "converted", "first output after", "said"):
        table.add_column(column, justify="right" if column != "said" else "left")

    def report(start: DemoStart) -> None:
        found = (
            f"converted {format_information(start.converted_bytes)}"
            if start.cold
            else "all layers local"
        )
        console.print(
            f"  {start.workload} on {start.node}: {found}, first output after "
            f"{start.start_s:.2f} s",
            highlight=False,
        )
        table.add_row(
            start.workload,
            start.node,
            format_information(start.colocated_bytes),
            format_information(start.converted_bytes),
            f"{start.start_s:.2f} s",
            start.output,
        )

    starts = asyncio.run(run_demo(app_mib=app_mib, report=report))
    show_table(table)
    console.print(summary(starts), highlight=False)
    return starts
