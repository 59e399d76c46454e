"""What colocation saves in seconds: a microVM's start on a node without its layers vs with them.

berth ranks nodes by the bytes of a workload's layers they already hold.  With the
``microvm`` runtime those layers are erofs image files on the node: a node that lacks one
converts it from the OCI layer blob (gunzip, untar, ``mkfs.erofs``) before the guest can
boot; a node that holds it (mounted by another guest, or in its LRU cache) attaches the file
at once.  This benchmark measures the difference end to end, on real guests:

* a few real-sized images, built locally as an OCI layout (no registry): the host's static
  busybox as the base layer plus a generated application layer of 64, 128 or 256 MiB (half
  incompressible data like binaries, half text: a 256 MiB layer is a ~150 MB gzip blob),
  one image per size;
* for each image and repetition, a **cold** start — a fresh node (empty layer store) boots
  it — then a **warm** start — the same node boots it again, its layers now cached;
* a start is timed from the moment the chosen node is asked to boot (``NodeCore.boot``: the
  node's whole lifecycle — mount, convert if needed, boot the guest, admit) to the
  workload's first line of output (it prints its image's ``VERSION`` file).

The JSON line (``--json``) has ``cold_start_p50_s``, ``warm_start_p50_s``, their ratio
``warm_over_cold`` and its target (``targets.warm_over_cold``: a warm start takes at most
0.75 of a cold one, both measured in the same run), ``accel`` (``kvm`` or ``tcg``),
``conversion_p50_s`` (the cold starts' layer conversion), the image sizes, every sample,
``met`` (judged on the default sizes only, ``null`` otherwise).  ``--quick`` (CI) boots one
32 MiB image cold and warm, once.  The guests run under whatever acceleration ``berth
microvm setup`` found; under software emulation (TCG) the boot itself is slow, which shrinks
the ratio's contrast but not the seconds saved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from berth.model import Spec
from berth.node.budget import IDLE, BudgetLimits, NodeBudget
from berth.node.core import NodeCore
from berth.node.layer_files import LayerFiles
from berth.node.layers import MountOutcome
from berth.node.microvm.images import app_layer, busybox_layer, write_image
from berth.node.microvm.paths import GuestFiles, problems
from berth.node.runtime import BootSpec
from berth.node.runtime.microvm import MicrovmRuntime, MicrovmWorkload
from berth.oci import OciImage, read_layout
from berth.units import GiB, MiB, TiB

TARGET_WARM_OVER_COLD = 0.75
DEFAULT_SIZES = "64,128,256"
"""Application layers the size of real ones (python:3.12-slim and node:20-slim unpack to
~130-200 MB); the target is judged on these."""
SPEC = Spec(vcpus=1, mem="256MiB", disk="1GiB")


def build_images(layout: Path, sizes_mib: Sequence[int]) -> list[OciImage]:
    """One image per size: busybox + an application layer of that many MiB (uncompressed)."""
    base = busybox_layer()
    images = []
    for index, size in enumerate(sizes_mib):
        ref = f"app-{size}mib"
        write_image(layout, ref, [base, app_layer(size * MiB, seed=index)])
        images.append(read_layout(layout, ref=ref))
    return images


def limits() -> BudgetLimits:
    return BudgetLimits(
        mem_max=64 * GiB,
        disk_max=TiB,
        cpu_capacity=64.0,
        cpu_max_load=1.0,
        disk_bw_cap=TiB,
        disk_bw_max_load=1.0,
        net_bw_cap=TiB,
        net_bw_max_load=1.0,
    )


async def start_once(
    core: NodeCore, layers: LayerFiles, image: OciImage, name: str
) -> dict[str, Any]:
    """Boot ``image`` on ``core`` and time it to the workload's first output."""
    converted_before = layers.conversion_seconds
    boot = BootSpec(name=name, image=image.ref, command=("cat", "/app/VERSION"))
    began = time.monotonic()
    booted = await core.boot(SPEC, image.berth_layers(), boot)
    workload = booted.workload
    assert isinstance(workload, MicrovmWorkload)
    first = await workload.first_output()
    end = await workload.wait()
    if end.code != 0 or not workload.output:
        raise RuntimeError(f"{workload.id} ended {end.reason} with {workload.output!r}")
    return {
        "image": image.ref,
        "start_s": round(first - began, 3),
        "boot_s": round(workload.boot_seconds or 0.0, 3),
        "conversion_s": round(layers.conversion_seconds - converted_before, 3),
        "pulled_layers": sum(m.outcome is MountOutcome.PULLED for m in booted.mounts),
        "output": workload.output[0],
    }


async def measure(
    images: Sequence[OciImage], layout: Path, work: Path, repeats: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """Cold then warm starts of every image, ``repeats`` times; also the acceleration."""
    files = GuestFiles.at(None)
    cold: list[dict[str, Any]] = []
    warm: list[dict[str, Any]] = []
    accel = "?"
    for repeat in range(repeats):
        for image in images:
            node = work / f"node-{repeat}-{image.ref}"
            layers = LayerFiles(node / "layers", GiB)
            runtime = MicrovmRuntime(layers, layout, files=files, work_dir=node / "run")
            accel = runtime.accel
            core = NodeCore(
                "bench", "linux/amd64", NodeBudget(limits(), IDLE), runtime, layers=layers.registry
            )
            cold.append(await start_once(core, layers, image, "cold"))
            warm.append(await start_once(core, layers, image, "warm"))
            await runtime.aclose()
            shutil.rmtree(node, ignore_errors=True)
    return cold, warm, accel


def p50(samples: Sequence[dict[str, Any]], key: str) -> float:
    return round(float(statistics.median(float(sample[key]) for sample in samples)), 3)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="app layer sizes in MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print only one JSON object")
    parser.add_argument("--quick", action="store_true", help="one image, once (CI)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = "32", 1
    missing = problems(GuestFiles.at(None))
    if missing:
        print(f"microVMs are not set up here: {'; '.join(missing)}", file=sys.stderr)
        return 2
    sizes = [int(size) for size in args.sizes.split(",") if size]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="berth-microvm-bench-") as scratch:
        root = Path(scratch)
        images = build_images(root / "oci", sizes)
        cold, warm, accel = asyncio.run(measure(images, root / "oci", root / "nodes", args.repeats))
    cold_p50, warm_p50 = p50(cold, "start_s"), p50(warm, "start_s")
    ratio = round(warm_p50 / cold_p50, 3) if cold_p50 else None
    result = {
        "accel": accel,
        "cold_start_p50_s": cold_p50,
        "warm_start_p50_s": warm_p50,
        "warm_over_cold": ratio,
        "saved_p50_s": round(cold_p50 - warm_p50, 3),
        "conversion_p50_s": p50(cold, "conversion_s"),
        "boot_p50_s": p50(cold + warm, "boot_s"),
        "images": [
            {"ref": image.ref, "layers": len(image.layers), "blob_bytes": image.size}
            for image in images
        ],
        "targets": {"warm_over_cold": TARGET_WARM_OVER_COLD},
        "met": {
            "warm_over_cold": None
            if args.sizes != DEFAULT_SIZES
            else ratio is not None and ratio <= TARGET_WARM_OVER_COLD
        },
        "cold": cold,
        "warm": warm,
        "config": {"sizes_mib": sizes, "repeats": args.repeats, "quick": args.quick},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    met: dict[str, bool | None] = result["met"]  # type: ignore[assignment]
    if not all(sample["pulled_layers"] for sample in cold) or any(
        sample["pulled_layers"] or sample["conversion_s"] for sample in warm
    ):
        raise RuntimeError("a cold start found its layers, or a warm start converted one")
    if args.json:
        print(json.dumps(result))
    else:
        for kind, samples in (("cold", cold), ("warm", warm)):
            for sample in samples:
                print(
                    f"{kind} {sample['image']}: first output after {sample['start_s']:.2f} s "
                    f"(conversion {sample['conversion_s']:.2f} s, boot {sample['boot_s']:.2f} s)"
                )
        print({key: value for key, value in result.items() if key not in ("cold", "warm")})
    return 0 if met["warm_over_cold"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
