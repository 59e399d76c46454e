"""What a layer already on the node saves: converting an OCI layer to erofs versus reusing it.

A node that boots a microVM from an image must hold each layer as an erofs image file
(:class:`berth.node.layer_files.LayerFiles`).  A layer it does not hold is converted — the blob is
streamed, its digest checked, the tar extracted into scratch space and ``mkfs.erofs`` run —
once; a layer it holds (mounted or in the LRU cache) costs a reference count.  This benchmark
builds a real-sized gzip layer from a directory on this machine (default: Debian's Python
standard library, ``/usr/lib/python3.11``, or this interpreter's), writes it into an OCI
layout with :func:`berth.oci.write_layout`, and measures in the same run:

* ``read_s`` — gunzip the blob and read every tar member (the floor any conversion pays);
* ``cold_convert_s`` — ``LayerFiles.acquire`` on an empty store (median of ``--repeat``);
* ``warm_acquire_s`` — ``acquire`` of the same layer once released into the cache;
* sizes: blob (gzip), tar, erofs image, and the file count.

Targets (ratios, so they hold on any machine): ``warm_speedup`` = cold / warm ≥ 100 (a
cached layer costs nothing next to a conversion), and ``convert_over_read`` = cold / read ≤ 10
(extraction and mkfs.erofs stay within an order of magnitude of merely reading the layer).

Needs root and ``mkfs.erofs`` (erofs-utils); without them it prints why and exits 0 with
``"skipped"`` in the JSON.  ``--quick`` converts a small tree once (CI); ``--json`` prints one
JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import shutil
import statistics
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import berth
from berth.node.layer_files import LayerFiles
from berth.oci import ImageSpec, OciLayer, read_layout, write_layout
from berth.units import GiB, MiB


def default_source() -> Path:
    debian = Path("/usr/lib/python3.11")
    return debian if debian.is_dir() else Path(sysconfig.get_paths()["stdlib"])


def read_once(layer: OciLayer) -> tuple[float, int, int]:
    """Seconds to gunzip and read the whole tar; its byte count and member count."""
    started = time.perf_counter()
    members = 0
    with gzip.open(layer.path) as raw:
        counted = _Counter(raw)
        with tarfile.open(fileobj=counted, mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                members += 1
                if member.isreg():
                    data = tar.extractfile(member)
                    while data is not None and data.read(MiB):
                        pass
        while counted.read(MiB):
            pass
    return time.perf_counter() - started, counted.size, members


class _Counter:
    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        data: bytes = self.stream.read(size)
        self.size += len(data)
        return data


async def convert_and_reuse(layer: OciLayer, store_root: Path) -> tuple[float, float, int]:
    """Cold acquire (conversion), then a warm one from the cache: seconds each, image bytes."""
    shutil.rmtree(store_root, ignore_errors=True)
    files = LayerFiles(store_root, 64 * GiB)
    started = time.perf_counter()
    await files.acquire(layer)
    cold = time.perf_counter() - started
    files.release(layer.digest)
    started = time.perf_counter()
    await files.acquire(layer)
    warm = time.perf_counter() - started
    files.release(layer.digest)
    assert files.conversions == 1
    return cold, warm, files.disk_bytes


def cannot_run() -> str:
    if shutil.which("mkfs.erofs") is None:
        return "mkfs.erofs not installed (apt-get install erofs-utils)"
    if os.geteuid() != 0:
        return "layer conversion needs root"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=None, help="directory to make the layer of")
    parser.add_argument("--repeat", type=int, default=3, help="cold conversions (median)")
    parser.add_argument("--quick", action="store_true", help="a small tree, once (CI)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    reason = cannot_run()
    if reason:
        print(json.dumps({"benchmark": "layer_convert", "skipped": reason}))
        return 0
    source = args.source or (Path(berth.__file__).parent if args.quick else default_source())
    repeat = 1 if args.quick else max(1, args.repeat)
    with tempfile.TemporaryDirectory(prefix="berth-layer-bench-") as scratch:
        started = time.perf_counter()
        layout = write_layout(Path(scratch) / "layout", ImageSpec(layers=[source]))
        write_s = time.perf_counter() - started
        layer = read_layout(layout).layers[0]
        read_s, tar_bytes, members = read_once(layer)
        colds, warms, image_bytes = [], [], 0
        for _ in range(repeat):
            cold, warm, image_bytes = asyncio.run(convert_and_reuse(layer, Path(scratch) / "store"))
            colds.append(cold)
            warms.append(warm)
    cold_s, warm_s = statistics.median(colds), statistics.median(warms)
    warm_speedup, convert_over_read = round(cold_s / warm_s, 1), round(cold_s / read_s, 2)
    result = {
        "benchmark": "layer_convert",
        "source": str(source),
        "members": members,
        "blob_bytes": layer.size,
        "tar_bytes": tar_bytes,
        "image_bytes": image_bytes,
        "image_over_blob": round(image_bytes / layer.size, 2),
        "write_layout_s": round(write_s, 3),
        "read_s": round(read_s, 3),
        "cold_convert_s": round(cold_s, 3),
        "cold_convert_all_s": [round(value, 3) for value in colds],
        "warm_acquire_s": round(warm_s, 6),
        "convert_mb_per_s": round(tar_bytes / cold_s / 1e6, 1),
        "warm_speedup": warm_speedup,
        "convert_over_read": convert_over_read,
    }
    result["targets_met"] = warm_speedup >= 100 and convert_over_read <= 10
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>20}: {value}")
    return 0 if result["targets_met"] or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
