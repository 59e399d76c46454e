"""What a start costs per runtime: placement to first output, cold and warm, and bytes read.

berth ranks nodes by the bytes of a workload's layers they already hold, on the premise that
a node holding them starts the workload sooner.  With the ``container`` runtime a layer is
an erofs image file on the node, **mounted read-only once per node** and shared by every
container of it (:class:`~berth.node.container.mounts.LayerMounts`); a container's root is
an overlay of those mounts under an upper directory of its own, run by ``runc`` under the
process runtime's supervisor.  This benchmark measures, on one node of this machine, from
the moment the node is asked to boot (``NodeCore.boot``: the node's whole lifecycle — take
and mount the layers, make the overlay and bundle, start the supervisor and ``runc``, admit)
to the workload's first line of output (its log file, polled every millisecond):

* **container, cold** — the issue's meaning: the image's layer files are on the node (an
  earlier run converted them; this node's agent was restarted, so nothing is mounted) and
  none of them is mounted; their pages are evicted from the page cache first
  (``fsync`` + ``POSIX_FADV_DONTNEED`` on each file), so the mount and the workload's
  reads go to the disk;
* **container, warm** — another workload of the same image runs on the node (the cold one:
  it prints, then sleeps), so every layer is mounted and its pages cached;
* **container, convert** — the node holds nothing of the image (an empty layer store): the
  layers are converted from the OCI blobs (evicted from the page cache too) before
  anything is mounted — the cost colocation avoids altogether;
* **process** — ``sh -c 'echo ready'`` under the process runtime: no layers, so cold and
  warm are the same start (a floor for the container's supervisor and spawn);
* **microvm** — only where ``berth microvm setup`` has been done (else ``skipped`` with
  what is missing; always skipped in ``--quick``, a guest under TCG boots in ~2 s): cold is
  an empty layer store (converted), warm the same node again (its layer files cached), as
  ``benchmarks/microvm_start.py`` measures;
* **sharing** — N containers of the image (8; 3 in ``--quick``) on one node: the node's
  layer mounts (``erofs`` mounts under its mount root, which should equal the image's layer
  count, not N×) and memory: what the kernel charges the containers' cgroups (``memory.
  usage_in_bytes``/``memory.current``: a page of a layer is charged once, to the container
  that read it first), the containers' processes' PSS and RSS (``smaps_rollup``: PSS splits
  a shared page among its users, RSS counts it in each), and the host-side processes each
  container brings (its supervisor, a Python interpreter, and ``runc run``), as PSS; and
  the marginal memory of one more container.

**Bytes read** is the growth of the sectors-read column of ``/proc/diskstats`` (× 512) for
the block device holding the benchmark's scratch directory, over the same interval as the
start: it counts every reader of that device meanwhile (the machine may be shared; a
second disk is not counted), so a figure near zero is exact and a large one an upper bound.

Each container start is also split into phases, timed by wrapping two of the runtime's
steps (the node's ``LayerMounts.acquire`` and the supervisor's start): ``layers`` (from the
boot call: the node's checks, the journal's entry if it has one, the layers converted and
mounted if needed), ``rootfs`` (the overlay mount and OCI bundle), ``supervisor`` (the
supervisor's interpreter starting and spawning ``runc``), ``admit`` (the container's record
and the node's bookkeeping after the start) and ``runc_to_output`` (``runc`` creating the
container — namespaces, cgroups, pivot_root — and the workload's exec until its first
line).  ``python_startup_p50_s`` (``python -I -c pass``, timed in the same run) is the
floor of the supervisor phase.

The nodes have no state directory by default (an agent may run without one); with
``--journal`` they have one, as an agent with a journal does: each start then also writes
and fsyncs the journal's entry and the supervisor's records.

Targets (issue 38): a warm container start within 0.1 s, and at most 0.5 of a cold one,
both measured in the same run (``targets``, ``met``).  Every figure in the JSON line
(``--json``) is measured in this run, with the machine's load average beside it.  It needs
root, ``runc`` and a kernel that mounts erofs files (``probe``); without them it prints
``"skipped"`` with the reason and exits 0.  Every mount, container and directory it made is
removed at the end, also after a failure (``left_behind`` says what the runtimes had left
before that sweep).  The exit status is 1 when a full run misses a target; ``--quick`` (CI:
two starts of each kind, three containers shared, no microVM) exits 0 whatever it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from berth.model import Spec
from berth.node.budget import IDLE, BudgetLimits, NodeBudget
from berth.node.container.mounts import unmount
from berth.node.core import NodeCore
from berth.node.journal import Journal
from berth.node.layer_files import LayerFiles
from berth.node.layers import MountOutcome
from berth.node.microvm.images import app_layer, busybox_layer, write_image
from berth.node.microvm.paths import GuestFiles, problems
from berth.node.runtime import BootSpec, ProcessRuntime, WorkloadHandle
from berth.node.runtime.container import ContainerRuntime, container_id
from berth.node.runtime.microvm import MicrovmRuntime, MicrovmWorkload
from berth.node.runtime.supervisor import OWNER_FILE, write_owner
from berth.oci import OciImage, OciLayer, read_layout
from berth.platform import host
from berth.processes.runtimes import container_problems
from berth.units import GiB, MiB, TiB

TARGET_WARM_S = 0.1
TARGET_WARM_OVER_COLD = 0.5
DEFAULT_APP_MIB = 64
"""The application layer beside busybox: a real-sized one (python:3.12-slim unpacks to
~130 MB); only the convert case depends on it."""
SPEC = Spec(vcpus=1, mem="128MiB", disk="1GiB")
VM_SPEC = Spec(vcpus=1, mem="256MiB", disk="1GiB")
HOLD = ("sh", "-c", 'trap "exit 0" TERM; cat /app/VERSION; sleep 3600 & wait')
"""A container's workload: its first line is a file of its image, then it runs until
stopped (its init ends on SIGTERM: an init without a handler would ignore it)."""
ONCE = ("sh", "-c", "echo ready")
POLL_S = 0.001
FIRST_OUTPUT_TIMEOUT_S = 60.0
SECTOR = 512
CLOSE_TIMEOUT_S = 30.0


# -- the machine -----------------------------------------------------------------------------
def cannot_run() -> str | None:
    """Why containers cannot start here, as an operator would fix it; ``None`` if they can
    (what ``berth up --runtime auto`` asks)."""
    return "; ".join(container_problems()) or None


def block_device(path: Path) -> str | None:
    """The ``/proc/diskstats`` name of the block device holding ``path``, if it has one."""
    dev = os.stat(path).st_dev
    wanted = (str(os.major(dev)), str(os.minor(dev)))
    with contextlib.suppress(OSError), open("/proc/diskstats") as table:
        for line in table:
            fields = line.split()
            if tuple(fields[:2]) == wanted:
                return fields[2]
    return None


def sectors_read(device: str | None) -> int | None:
    """The device's sectors read so far (``None`` without a device)."""
    if device is None:
        return None
    with open("/proc/diskstats") as table:
        for line in table:
            fields = line.split()
            if fields[2] == device:
                return int(fields[5])
    return None


def evict(paths: Iterable[Path]) -> None:
    """Drop ``paths``' pages from the page cache (written back first), so the next read of
    them goes to the disk; other files' pages are left alone."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def mount_points(under: Path) -> list[tuple[str, str]]:
    """``(mount point, file system type)`` of every mount below ``under``, deepest first."""
    prefix = f"{under}/"
    with open("/proc/mounts") as table:
        found = [(line.split()[1], line.split()[2]) for line in table]
    return sorted(((p, t) for p, t in found if p.startswith(prefix)), reverse=True)


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


def build_image(layout: Path, app_mib: int) -> OciImage:
    """busybox + an application layer of ``app_mib`` MiB with ``/app/VERSION``."""
    ref = f"app-{app_mib}mib"
    write_image(layout, ref, [busybox_layer(), app_layer(app_mib * MiB, seed=38)])
    return read_layout(layout, ref=ref)


# -- the nodes -------------------------------------------------------------------------------
class _Closing(Protocol):
    async def aclose(self) -> None: ...


@dataclass
class Tracker:
    """What the run made, for the cleanup that runs whatever happens."""

    runtimes: list[_Closing] = field(default_factory=list)
    runc_roots: list[Path] = field(default_factory=list)

    async def close(self) -> None:
        """Each runtime's own cleanup (its containers stopped, its layers unmounted), bounded:
        what it cannot do in time is left to :func:`sweep`."""
        for runtime in reversed(self.runtimes):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runtime.aclose(), CLOSE_TIMEOUT_S)
        self.runtimes.clear()


@dataclass
class Phases:
    """The monotonic times one container start passed, from the wrapped steps."""

    layers_done: float = 0.0
    launch: float = 0.0
    launched: float = 0.0


@dataclass
class ContainerNode:
    runtime: ContainerRuntime
    core: NodeCore
    phases: Phases


def state_dir(where: Path, journal: bool) -> Path | None:
    """An agent's state directory on ``where``, owned by this process, with ``journal``."""
    if not journal:
        return None
    state = where / "state"
    state.mkdir(parents=True, exist_ok=True)
    write_owner(state / OWNER_FILE)
    return state


def container_node(layout: Path, where: Path, tracker: Tracker, journal: bool) -> ContainerNode:
    """A node with the container runtime on ``where`` (its layer files adopted if there);
    with ``journal``, a state directory as an agent with one has: the journal's entry and the
    supervisor's records are written (and fsynced) on every start."""
    files = LayerFiles(where / "layers", GiB)
    state = state_dir(where, journal)
    runtime = ContainerRuntime(
        files, layout, where / "node", log_dir=where / "logs", stop_grace_s=2.0, state_dir=state
    )
    tracker.runtimes.append(runtime)
    tracker.runc_roots.append(runtime.runc_root)
    core = NodeCore(
        "bench",
        host(),
        NodeBudget(limits(), IDLE),
        runtime,
        layers=files.registry,
        journal=None if state is None else Journal(state),
    )
    return ContainerNode(runtime, core, instrument(runtime))


def instrument(runtime: ContainerRuntime) -> Phases:
    """Record when the start's layers are ready and when its supervisor is asked and
    answers (instance attributes wrapping the runtime's own steps; nothing else changes)."""
    phases = Phases()
    mounts, supervisors = runtime.mounts, runtime._host
    acquire, start = mounts.acquire, supervisors.start

    async def timed_acquire(layers: tuple[OciLayer, ...]) -> tuple[Path, ...]:
        paths = await acquire(layers)
        phases.layers_done = time.monotonic()
        return paths

    async def timed_start(spec: BootSpec, workload_id: str | None = None) -> WorkloadHandle:
        phases.launch = time.monotonic()
        handle = await start(spec, workload_id)
        phases.launched = time.monotonic()
        return handle

    mounts.acquire = timed_acquire  # type: ignore[method-assign]
    supervisors.start = timed_start  # type: ignore[method-assign]
    return phases


async def first_line(log: Path, workload: WorkloadHandle) -> tuple[float, str]:
    """When the workload's first line of output appeared in ``log`` (polled), and the line."""
    deadline = time.monotonic() + FIRST_OUTPUT_TIMEOUT_S
    while True:
        ended = workload.done  # read before the file: a line written before the end is seen
        with contextlib.suppress(FileNotFoundError):
            if log.stat().st_size:
                data = log.read_bytes()
                if b"\n" in data:
                    return time.monotonic(), data.split(b"\n", 1)[0].decode(errors="replace")
        if ended:
            raise RuntimeError(f"{workload.id} {workload.reason} before its first output")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{workload.id} printed nothing in {FIRST_OUTPUT_TIMEOUT_S} s")
        await asyncio.sleep(POLL_S)


async def container_start(
    node: ContainerNode, image: OciImage, kind: str, workload_id: str, device: str | None
) -> dict[str, Any]:
    """Boot ``image`` on ``node`` and time it to its first output, in phases."""
    runtime, phases = node.runtime, node.phases
    mounts_before = runtime.mounts.mounts
    boot = BootSpec(name=workload_id, image=image.ref, command=HOLD)
    read_before = sectors_read(device)
    began = time.monotonic()
    booted = await node.core.boot(SPEC, image.berth_layers(), boot, workload_id=workload_id)
    returned = time.monotonic()
    log = runtime.log_of(booted.workload.id)
    assert log is not None
    first, line = await first_line(log, booted.workload)
    read_after = sectors_read(device)
    outcomes = sorted({mount.outcome.value for mount in booted.mounts})
    return {
        "kind": kind,
        "start_s": round(first - began, 4),
        "layers_s": round(phases.layers_done - began, 4),
        "rootfs_s": round(phases.launch - phases.layers_done, 4),
        "supervisor_s": round(phases.launched - phases.launch, 4),
        "admit_s": round(returned - phases.launched, 4),
        "runc_to_output_s": round(first - returned, 4),
        "read_bytes": None
        if read_before is None or read_after is None
        else (read_after - read_before) * SECTOR,
        "mounts_made": runtime.mounts.mounts - mounts_before,
        "layer_outcomes": outcomes,
        "output": line,
    }


async def container_round(
    layout: Path,
    image: OciImage,
    where: Path,
    device: str | None,
    tracker: Tracker,
    round_: int,
    journal: bool,
) -> list[dict[str, Any]]:
    """One convert, one cold and one warm start (see the module docstring)."""
    evict(layer.path for layer in image.layers)
    node = container_node(layout, where, tracker, journal)
    convert = await container_start(node, image, "convert", f"convert-{round_}", device)
    await node.runtime.aclose()  # an agent that stops: its layers unmounted, files kept
    tracker.runtimes.remove(node.runtime)
    files = list((where / "layers").glob("*.erofs"))
    if len(files) != len(image.layers):
        raise RuntimeError(f"expected {len(image.layers)} layer files, found {files}")
    evict(files)
    node = container_node(layout, where, tracker, journal)  # restarted: files, no mounts
    if mount_points(where / "node" / "mounts"):
        raise RuntimeError("a cold node has its layers mounted")
    cold = await container_start(node, image, "cold", f"cold-{round_}", device)
    warm = await container_start(node, image, "warm", f"warm-{round_}", device)
    await node.runtime.aclose()
    tracker.runtimes.remove(node.runtime)
    shutil.rmtree(where, ignore_errors=True)
    return [convert, cold, warm]


def check_container(samples: Sequence[dict[str, Any]], layers: int) -> None:
    """Each kind did what it is named for (else the figures would lie)."""
    expected = {
        "convert": ([MountOutcome.PULLED.value], layers),
        "cold": ([MountOutcome.FROM_CACHE.value], layers),
        "warm": ([MountOutcome.ALREADY_MOUNTED.value], 0),
    }
    for sample in samples:
        outcomes, mounts = expected[sample["kind"]]
        if sample["layer_outcomes"] != outcomes or sample["mounts_made"] != mounts:
            raise RuntimeError(f"a {sample['kind']} start was not one: {sample}")


# -- process ---------------------------------------------------------------------------------
async def process_start(
    core: NodeCore, runtime: ProcessRuntime, workload_id: str, device: str | None
) -> dict[str, Any]:
    read_before = sectors_read(device)
    began = time.monotonic()
    booted = await core.boot(
        SPEC, (), BootSpec(name=workload_id, command=ONCE), workload_id=workload_id
    )
    log = runtime.log_of(booted.workload.id)
    assert log is not None
    first, line = await first_line(log, booted.workload)
    read_after = sectors_read(device)
    await booted.workload.wait()
    return {
        "kind": "process",
        "start_s": round(first - began, 4),
        "read_bytes": None
        if read_before is None or read_after is None
        else (read_after - read_before) * SECTOR,
        "output": line,
    }


async def python_startup() -> float:
    """One ``python -I -c pass``: the interpreter every supervisor starts with."""
    began = time.monotonic()
    process = await asyncio.create_subprocess_exec(sys.executable, "-I", "-c", "pass")
    await process.wait()
    return time.monotonic() - began


# -- sharing ---------------------------------------------------------------------------------
def cgroup_memory(cid: str) -> tuple[int, int, int, list[int]]:
    """A container's cgroup: bytes charged, of them file and anonymous, and its processes
    (cgroup v1's memory controller, else v2)."""
    v1 = Path("/sys/fs/cgroup/memory/berth") / cid
    if v1.is_dir():
        stat = _keyed(v1 / "memory.stat")
        usage = int((v1 / "memory.usage_in_bytes").read_text())
        file, anon = stat.get("cache", 0), stat.get("rss", 0)
    else:
        v2 = Path("/sys/fs/cgroup/berth") / cid
        stat = _keyed(v2 / "memory.stat")
        usage = int((v2 / "memory.current").read_text())
        file, anon = stat.get("file", 0), stat.get("anon", 0)
        v1 = v2
    procs = [int(pid) for pid in (v1 / "cgroup.procs").read_text().split()]
    return usage, file, anon, procs


def _keyed(path: Path) -> dict[str, int]:
    pairs = (line.split() for line in path.read_text().splitlines())
    return {pair[0]: int(pair[1]) for pair in pairs if len(pair) == 2 and pair[1].isdigit()}


def pss_rss(pid: int) -> tuple[int, int]:
    """A process's PSS and RSS in bytes (0, 0 once it is gone)."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    kib = {
        line.split(":")[0]: int(line.split()[1])
        for line in rollup.splitlines()
        if line.startswith(("Pss:", "Rss:"))
    }
    return kib.get("Pss", 0) * 1024, kib.get("Rss", 0) * 1024


def node_memory(workloads: Sequence[WorkloadHandle]) -> dict[str, int]:
    """What ``workloads`` (containers) hold: their cgroups' charge, their processes' PSS
    and RSS, and the PSS of their supervisors and ``runc run`` processes on the host."""
    total = {
        "cgroup_bytes": 0,
        "cgroup_file_bytes": 0,
        "cgroup_anon_bytes": 0,
        "container_pss_bytes": 0,
        "container_rss_bytes": 0,
        "supervisor_pss_bytes": 0,
        "runc_pss_bytes": 0,
    }
    for workload in workloads:
        usage, file, anon, procs = cgroup_memory(container_id(workload.id))
        total["cgroup_bytes"] += usage
        total["cgroup_file_bytes"] += file
        total["cgroup_anon_bytes"] += anon
        for pid in procs:
            pss, rss = pss_rss(pid)
            total["container_pss_bytes"] += pss
            total["container_rss_bytes"] += rss
        supervisor = (workload.locator or {}).get("supervisor")
        if isinstance(supervisor, list) and supervisor:
            total["supervisor_pss_bytes"] += pss_rss(int(supervisor[0]))[0]
        if workload.pid is not None:
            total["runc_pss_bytes"] += pss_rss(workload.pid)[0]
    return total


async def sharing(
    layout: Path,
    image: OciImage,
    where: Path,
    device: str | None,
    tracker: Tracker,
    count: int,
    journal: bool,
) -> dict[str, Any]:
    """``count`` containers of ``image`` on one node: its mounts and memory."""
    node = container_node(layout, where, tracker, journal)
    started: list[WorkloadHandle] = []
    starts: list[float] = []
    first_memory: dict[str, int] = {}
    for index in range(count):
        sample = await container_start(node, image, "shared", f"shared-{index}", device)
        starts.append(sample["start_s"])
        started.append(node.core.workloads()[f"shared-{index}"])
        if index == 0:
            first_memory = node_memory(started)
    memory = node_memory(started)
    points = mount_points(where)
    erofs = [point for point, kind in points if kind == "erofs"]
    overlays = [point for point, kind in points if kind == "overlay"]
    host_side = ("supervisor_pss_bytes", "runc_pss_bytes", "container_pss_bytes")
    marginal = {
        key: round((memory[key] - first_memory[key]) / max(count - 1, 1))
        for key in ("cgroup_bytes", "container_pss_bytes", *host_side[:2])
    }
    result = {
        "workloads": count,
        "image_layers": len(image.layers),
        "layer_mounts": len(erofs),
        "layer_mounts_made": node.runtime.mounts.mounts,
        "overlay_mounts": len(overlays),
        "start_p50_s": round(statistics.median(starts), 4),
        "first": first_memory,
        **memory,
        "pss_per_workload_bytes": round(sum(memory[key] for key in host_side) / count),
        "marginal_per_workload": marginal,
    }
    await node.runtime.aclose()
    tracker.runtimes.remove(node.runtime)
    return result


# -- microvm ---------------------------------------------------------------------------------
async def microvm_start(
    core: NodeCore,
    layers: LayerFiles,
    image: OciImage,
    kind: str,
    workload_id: str,
    device: str | None,
) -> dict[str, Any]:
    converted_before = layers.conversion_seconds
    boot = BootSpec(name=workload_id, image=image.ref, command=("cat", "/app/VERSION"))
    read_before = sectors_read(device)
    began = time.monotonic()
    booted = await core.boot(VM_SPEC, image.berth_layers(), boot, workload_id=workload_id)
    workload = booted.workload
    assert isinstance(workload, MicrovmWorkload)
    first = await workload.first_output()
    read_after = sectors_read(device)
    end = await workload.wait()
    if end.code != 0 or not workload.output:
        raise RuntimeError(f"{workload.id} ended {end.reason} with {workload.output!r}")
    return {
        "kind": kind,
        "start_s": round(first - began, 3),
        "boot_s": round(workload.boot_seconds or 0.0, 3),
        "conversion_s": round(layers.conversion_seconds - converted_before, 3),
        "read_bytes": None
        if read_before is None or read_after is None
        else (read_after - read_before) * SECTOR,
        "pulled_layers": sum(m.outcome is MountOutcome.PULLED for m in booted.mounts),
        "output": workload.output[0],
    }


async def microvm(
    layout: Path, image: OciImage, work: Path, device: str | None, tracker: Tracker, repeats: int
) -> dict[str, Any]:
    """Cold (empty layer store) then warm (layers cached) guest starts, ``repeats`` times."""
    files = GuestFiles.at(None)
    samples: list[dict[str, Any]] = []
    accel = "?"
    for repeat in range(repeats):
        node = work / f"vm-{repeat}"
        layers = LayerFiles(node / "layers", GiB)
        runtime = MicrovmRuntime(layers, layout, files=files, work_dir=node / "run")
        tracker.runtimes.append(runtime)
        accel = runtime.accel
        core = NodeCore(
            "bench", "linux/amd64", NodeBudget(limits(), IDLE), runtime, layers=layers.registry
        )
        evict(layer.path for layer in image.layers)
        samples.append(
            await microvm_start(core, layers, image, "cold", f"vm-cold-{repeat}", device)
        )
        samples.append(
            await microvm_start(core, layers, image, "warm", f"vm-warm-{repeat}", device)
        )
        await runtime.aclose()
        tracker.runtimes.remove(runtime)
        shutil.rmtree(node, ignore_errors=True)
    cold = [s for s in samples if s["kind"] == "cold"]
    warm = [s for s in samples if s["kind"] == "warm"]
    if not all(s["pulled_layers"] for s in cold) or any(s["pulled_layers"] for s in warm):
        raise RuntimeError("a cold guest start found its layers, or a warm one converted one")
    cold_p50, warm_p50 = p50(cold, "start_s"), p50(warm, "start_s")
    return {
        "accel": accel,
        "cold_start_p50_s": cold_p50,
        "cold_start_max_s": most(cold, "start_s"),
        "warm_start_p50_s": warm_p50,
        "warm_start_max_s": most(warm, "start_s"),
        "warm_over_cold": ratio(warm_p50, cold_p50),
        "conversion_p50_s": p50(cold, "conversion_s"),
        "boot_p50_s": p50(samples, "boot_s"),
        "cold_read_bytes_p50": p50(cold, "read_bytes"),
        "warm_read_bytes_p50": p50(warm, "read_bytes"),
        "samples": samples,
    }


# -- the run ---------------------------------------------------------------------------------
def p50(samples: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [float(s[key]) for s in samples if s.get(key) is not None]
    return round(float(statistics.median(values)), 4) if values else None


def most(samples: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [float(s[key]) for s in samples if s.get(key) is not None]
    return round(max(values), 4) if values else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


PHASES = ("layers_s", "rootfs_s", "supervisor_s", "admit_s", "runc_to_output_s")


async def measure(
    root: Path, image: OciImage, args: argparse.Namespace, device: str | None, tracker: Tracker
) -> dict[str, Any]:
    layout = root / "oci"
    containers: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    startups: list[float] = []
    state = state_dir(root / "process", args.journal)
    runtime = ProcessRuntime(log_dir=root / "process-logs", stop_grace_s=2.0, state_dir=state)
    tracker.runtimes.append(runtime)
    process_core = NodeCore(
        "bench",
        host(),
        NodeBudget(limits(), IDLE),
        runtime,
        journal=None if state is None else Journal(state),
    )
    for round_ in range(args.repeats):  # interleaved, so drift hits every kind alike
        containers += await container_round(
            layout, image, root / f"round-{round_}", device, tracker, round_, args.journal
        )
        processes.append(await process_start(process_core, runtime, f"proc-{round_}", device))
        startups.append(await python_startup())
    check_container(containers, len(image.layers))
    shared = await sharing(
        layout, image, root / "shared", device, tracker, args.shared, args.journal
    )
    vm: dict[str, Any]
    missing = problems(GuestFiles.at(None))
    if args.quick:
        vm = {"skipped": "not in --quick (a guest under TCG boots in ~2 s)"}
    elif args.microvm_repeats < 1:
        vm = {"skipped": "--microvm-repeats 0"}
    elif missing:
        vm = {"skipped": f"microVMs are not set up here: {'; '.join(missing)}"}
    else:
        vm = await microvm(layout, image, root / "vm", device, tracker, args.microvm_repeats)
    by_kind = {
        kind: [s for s in containers if s["kind"] == kind] for kind in ("cold", "warm", "convert")
    }
    result: dict[str, Any] = {}
    for kind, samples in by_kind.items():
        result[f"container_{kind}_start_p50_s"] = p50(samples, "start_s")
        result[f"container_{kind}_start_max_s"] = most(samples, "start_s")
        result[f"container_{kind}_read_bytes_p50"] = p50(samples, "read_bytes")
    cold_p50 = result["container_cold_start_p50_s"]
    warm_p50 = result["container_warm_start_p50_s"]
    result["container_warm_over_cold"] = ratio(warm_p50, cold_p50)
    result["container_warm_over_convert"] = ratio(warm_p50, result["container_convert_start_p50_s"])
    result["container_phases_p50_s"] = {
        kind: {phase.removesuffix("_s"): p50(samples, phase) for phase in PHASES}
        for kind, samples in by_kind.items()
    }
    result["process_start_p50_s"] = p50(processes, "start_s")
    result["process_start_max_s"] = most(processes, "start_s")
    result["process_read_bytes_p50"] = p50(processes, "read_bytes")
    result["python_startup_p50_s"] = round(statistics.median(startups), 4)
    result["sharing"] = shared
    result["microvm"] = vm
    result["samples"] = {"container": containers, "process": processes}
    return result


def runc_containers(runc_root: Path) -> list[str]:
    """The ids of the containers ``runc`` keeps state for under ``runc_root``."""
    if not runc_root.is_dir():
        return []
    listed = subprocess.run(
        ["runc", "--root", str(runc_root), "list", "-q"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return listed.stdout.split()


def left_behind(root: Path, tracker: Tracker) -> dict[str, int]:
    """What is still mounted below ``root`` and which containers ``runc`` still knows."""
    containers = sum(len(runc_containers(runc_root)) for runc_root in tracker.runc_roots)
    return {"mounts": len(mount_points(root)), "runc_containers": containers}


def sweep(root: Path, tracker: Tracker) -> None:
    """Remove whatever the runtimes left: containers, then mounts (deepest first)."""
    for runc_root in tracker.runc_roots:
        for cid in runc_containers(runc_root):
            subprocess.run(
                ["runc", "--root", str(runc_root), "delete", "--force", cid],
                capture_output=True,
                timeout=30,
                check=False,
            )
    for point, _ in mount_points(root):
        unmount(Path(point))


async def run(root: Path, args: argparse.Namespace, tracker: Tracker) -> dict[str, Any]:
    # SIGTERM cancels this task only, as asyncio.run does for ^C: the runtimes' own tasks
    # (which see their workloads end) go on, so the cleanup below can stop the workloads
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    device = block_device(root)
    image = build_image(root / "oci", args.app_mib)
    try:
        return {
            "device": device,
            **await measure(root, image, args, device, tracker),
            "image": {
                "ref": image.ref,
                "layers": len(image.layers),
                "blob_bytes": image.size,
                "app_mib": args.app_mib,
            },
        }
    finally:
        await tracker.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=10, help="starts of each kind")
    parser.add_argument("--shared", type=int, default=8, help="containers of one image")
    parser.add_argument("--microvm-repeats", type=int, default=3, help="0: no microVMs")
    parser.add_argument("--app-mib", type=int, default=DEFAULT_APP_MIB)
    parser.add_argument(
        "--journal", action="store_true", help="nodes with a state directory and journal"
    )
    parser.add_argument("--json", action="store_true", help="print only one JSON object")
    parser.add_argument("--quick", action="store_true", help="CI: 2 starts each, 3 shared")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.shared, args.app_mib = 2, 3, 8
    started = time.perf_counter()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="berth-runtime-bench-") as scratch:
        root = Path(scratch)
        reason = cannot_run()
        if reason is not None:
            print(f"runtime_start: skipped: {reason}", file=sys.stderr)
            print(json.dumps({"benchmark": "runtime_start", "skipped": reason}))
            return 0
        tracker = Tracker()
        try:
            measured = asyncio.run(run(root, args, tracker))
            left = left_behind(root, tracker)
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("runtime_start: interrupted; cleaned up", file=sys.stderr)
            return 130
        finally:
            sweep(root, tracker)
        if mount_points(root):
            raise RuntimeError(f"still mounted below {root}: {mount_points(root)}")
    warm = measured["container_warm_start_p50_s"]
    over = measured["container_warm_over_cold"]
    shared = measured["sharing"]
    result: dict[str, Any] = {
        "benchmark": "runtime_start",
        **{k: v for k, v in measured.items() if k != "samples"},
        "targets": {
            "container_warm_s": TARGET_WARM_S,
            "container_warm_over_cold": TARGET_WARM_OVER_COLD,
        },
        "met": {
            "container_warm_s": warm is not None and warm <= TARGET_WARM_S,
            "container_warm_over_cold": over is not None and over <= TARGET_WARM_OVER_COLD,
            "layer_mounts_shared": shared["layer_mounts"] == shared["image_layers"]
            and shared["layer_mounts_made"] == shared["image_layers"],
        },
        "left_behind": left,
        "load_average": [round(x, 2) for x in load_before],
        "load_average_1m": round(os.getloadavg()[0], 2),
        "config": {
            "repeats": args.repeats,
            "shared": args.shared,
            "microvm_repeats": 0 if args.quick else args.microvm_repeats,
            "app_mib": args.app_mib,
            "journal": args.journal,
            "quick": args.quick,
            "cpus": os.cpu_count(),
        },
        "wall_s": round(time.perf_counter() - started, 1),
        "samples": measured["samples"],
    }
    if args.json:
        print(json.dumps(result))
    else:
        report(result)
    met: dict[str, bool] = result["met"]
    return 0 if args.quick or all(met.values()) else 1


def report(result: dict[str, Any]) -> None:
    """The run in a few lines."""
    for sample in result["samples"]["container"]:
        phases = ", ".join(f"{p.removesuffix('_s')} {sample[p] * 1000:.1f}" for p in PHASES)
        print(
            f"container {sample['kind']:7} {sample['start_s'] * 1000:7.1f} ms  ({phases} ms)"
            f"  read {sample['read_bytes'] or 0:,} B"
        )
    for sample in result["samples"]["process"]:
        print(f"process           {sample['start_s'] * 1000:7.1f} ms")
    microvm = {k: v for k, v in result["microvm"].items() if k != "samples"}
    for sample in result["microvm"].get("samples", ()):
        print(
            f"microvm {sample['kind']:9} {sample['start_s']:7.2f} s  (conversion "
            f"{sample['conversion_s']:.2f} s, boot {sample['boot_s']:.2f} s)"
        )
    print({k: v for k, v in result.items() if k not in ("samples", "microvm")})
    print({"microvm": microvm})


if __name__ == "__main__":
    sys.exit(main())
