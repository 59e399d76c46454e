"""The microVM runtime with real guests: the runtime contract, layers, limits, stop, cleanup.

Every test here boots QEMU ``microvm`` guests (software emulation on this kind of host, ~2-5 s
a boot), so the set is kept small: the contract suite, then one test per guarantee, several
guests at once where a test needs more than one.  They need what ``berth microvm setup``
prepares (and QEMU, mkfs.ext4, mkfs.erofs, root for the layer conversion); without it they
are skipped with the reason — CI installs the packages and runs the setup, so there they run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from berth.cli.demo_microvm import run_demo, summary
from berth.node.layer_files import LayerFiles
from berth.node.microvm.images import busybox_layer, write_image
from berth.node.microvm.paths import GuestFiles, problems
from berth.node.runtime import BootFailed, BootSpec, Runtime, WorkloadHandle
from berth.node.runtime.microvm import MicrovmRuntime, MicrovmWorkload
from berth.node.runtime.port import AdoptingRuntime
from berth.node.runtime.supervisor import write_owner
from berth.oci import directory, file, opaque, read_layout, whiteout
from berth.testing.runtime_contract import AdoptingRuntimeContract, ExitLog, RuntimeContract, run
from berth.units import MiB

FILES = GuestFiles.at(None)
MISSING = problems(FILES)
if os.geteuid() != 0:
    MISSING.append("converting layers to erofs images needs root")
pytestmark = [
    pytest.mark.skipif(
        bool(MISSING), reason=f"microVM guests cannot boot here: {'; '.join(MISSING)}"
    ),
    pytest.mark.slow,  # boots real QEMU guests under emulation
]

GUEST_TIMEOUT_S = 120.0
"""One test's scenario: a few boots under emulation on a loaded, shared machine."""


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``busybox`` (one layer) and ``stacked`` (busybox + two layers that overwrite, delete
    and hide what is below them; its WorkingDir is ``/srv/app``, which no layer has)."""
    root = tmp_path_factory.mktemp("oci")
    base = busybox_layer()
    write_image(root, "busybox", [base])
    middle = [
        directory("data"),
        file("data/kept", "kept\n"),
        file("data/deleted", "deleted\n"),
        directory("hidden"),
        file("hidden/old", "old\n"),
        file("etc/motd", "middle\n"),
    ]
    top = [
        whiteout("data/deleted"),
        opaque("hidden"),
        directory("hidden"),
        file("hidden/new", "new\n"),
        file("etc/motd", "top\n"),
    ]
    write_image(root, "stacked", [base, middle, top], working_dir="/srv/app")
    accounts = [
        file("etc/passwd", "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n"),
        file("etc/group", "root:x:0:\napp:x:1001:\nstaff:x:50:\n"),
    ]
    write_image(root, "nonroot", [base, accounts], user="app")
    write_image(root, "nonroot-staff", [base, accounts], user="1000:staff")
    write_image(root, "ghost", [base, accounts], user="nobody-here")
    return root


@pytest.fixture(scope="module")
def guests(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LayerFiles, Path]]:
    """The node's layer files (shared by the module's runtimes) and the guests' work dir;
    afterwards no QEMU of ours runs, no scratch file is left and no layer is held."""
    root = tmp_path_factory.mktemp("node")
    work = root / "run"
    layers = LayerFiles(root / "layers", 1 << 30)
    yield layers, work
    assert _our_qemus(work) == []
    assert not work.exists() or list(work.iterdir()) == []
    assert layers.registry.mounted() == frozenset()


def _our_qemus(work: Path) -> list[int]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(str(work) in part for part in cmdline):
            found.append(process.pid)
    return found


def make(guests: tuple[LayerFiles, Path], layout: Path, **options: object) -> MicrovmRuntime:
    layers, work = guests
    return MicrovmRuntime(
        layers,
        layout,
        files=FILES,
        work_dir=work,
        **options,  # type: ignore[arg-type]
    )


class TestMicrovmRuntimeContract(RuntimeContract):
    timeout_s = GUEST_TIMEOUT_S

    @pytest.fixture(autouse=True)
    def _node(self, guests: tuple[LayerFiles, Path], layout: Path) -> None:
        self.guests, self.layout = guests, layout

    def make_runtime(self) -> Runtime:
        return make(self.guests, self.layout, stop_grace_s=5.0)

    def long_running_spec(self) -> BootSpec:
        return BootSpec(name="sleeper", image="busybox", command=("sleep", "600"))

    def failing_spec(self, runtime: Runtime) -> tuple[BootSpec, str]:
        spec = BootSpec(name="broken", image="no-such-image", command=("true",))
        return spec, "image 'no-such-image'"

    async def exit_by_itself(self, runtime: Runtime, code: int) -> WorkloadHandle:
        return await runtime.start(
            BootSpec(name="exits", image="busybox", command=("sh", "-c", f"exit {code}"))
        )

    async def start_ignoring_term(self, runtime: Runtime) -> WorkloadHandle:
        pytest.skip(
            "two more guest boots; test_stop_kills_the_guest_after_its_grace_when_the_workload_"
            "ignores_sigterm covers a stop's own grace with the guests it boots anyway"
        )


def test_guests_boot_concurrently_from_stacked_layers_with_their_resources(
    guests: tuple[LayerFiles, Path], layout: Path
) -> None:
    """Five guests at once: the stacked image seen through overlayfs (topmost layer wins,
    whiteouts and opaque directories honoured), arguments and environment byte for byte,
    vCPUs, memory and the disk budget as the guest sees them, the image's working directory
    and user, output and exit codes back."""
    layers, _ = guests

    async def scenario() -> None:
        runtime = make(guests, layout)
        log = ExitLog()
        runtime.on_exit(log)
        look = (
            "cat /etc/motd; ls /data; ls /hidden; nproc; "
            "awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo; "
            "df -k / | awk 'NR == 2 {print int($2 / 1024)}'; "
            "echo written > /data/new && cat /data/new; pwd; exit 4"
        )
        quoting = (
            "sh",
            "-c",
            'printf "[%s]\\n" "$@" "$GREETING"; exit 0',
            "sh",
            "a b",
            "'q'",
            "$x",
        )
        specs = [
            BootSpec(
                name="look",
                image="stacked",
                command=("sh", "-c", look),
                vcpus=2,
                mem_limit=256 * MiB,
                disk_limit=64 * MiB,
            ),
            BootSpec(
                name="quote",
                image="busybox",
                command=quoting,
                env={"GREETING": "hello 'world'\n$HOME"},
            ),
            BootSpec(
                name="small", image="busybox", command=("sh", "-c", "exit 0"), mem_limit=32 * MiB
            ),
            BootSpec(name="user", image="nonroot", command=("sh", "-c", "id -u; id -g")),
            BootSpec(name="group", image="nonroot-staff", command=("sh", "-c", "id -u; id -g")),
        ]
        workloads = await asyncio.gather(*(runtime.start(spec) for spec in specs))
        ends = await asyncio.gather(*(workload.wait() for workload in workloads))
        assert [end.code for end in ends] == [4, 0, 0, 0, 0]
        look_vm, quote_vm, small_vm, user_vm, group_vm = workloads
        assert isinstance(user_vm, MicrovmWorkload) and isinstance(group_vm, MicrovmWorkload)
        assert user_vm.output == ("1000", "1001")  # the image's User, by name
        assert group_vm.output == ("1000", "50")  # uid:group
        assert isinstance(look_vm, MicrovmWorkload) and isinstance(small_vm, MicrovmWorkload)
        text = [line for line in look_vm.output if not line.startswith("[")]
        motd, data, hidden, cpus, mem_mib, disk_mib, written, workdir = text[:8]
        assert workdir == "/srv/app"  # the image's WorkingDir, made in the upper layer
        assert (motd, data.split(), hidden.split(), written) == (
            "top",
            ["kept"],
            ["new"],
            "written",
        )
        assert int(cpus) == min(2, os.cpu_count() or 1)
        assert 160 <= int(mem_mib) <= 256  # what the kernel keeps for itself is not counted
        assert 40 <= int(disk_mib) <= 64
        assert isinstance(quote_vm, MicrovmWorkload)
        assert quote_vm.output[:4] == ("[a b]", "['q']", "[$x]", "[hello 'world'")
        assert quote_vm.output[4] == "$HOME]"
        assert small_vm.size.mem_mib == 96 and small_vm.size.floored  # the kernel's floor
        assert sorted(log.ids()) == sorted(workload.id for workload in workloads)
        assert runtime.list() == ()

    run(scenario, GUEST_TIMEOUT_S)
    image = read_layout(layout, ref="stacked")
    assert all(layers.has(layer.digest) for layer in image.layers)  # kept for the next boot


def test_a_layer_already_on_the_node_is_not_converted_again(
    guests: tuple[LayerFiles, Path], layout: Path
) -> None:
    layers, _ = guests
    image = read_layout(layout, ref="busybox")

    async def scenario() -> None:
        await layers.acquire_all(image.layers)  # on the node now, converted if it was not
        for layer in image.layers:
            layers.release(layer.digest)
        assert all(layers.registry.is_cached(layer.digest) for layer in image.layers)
        before = layers.conversions
        runtime = make(guests, layout)
        workload = await runtime.start(BootSpec(name="warm", image="busybox", command=("true",)))
        assert (await workload.wait()).code == 0
        assert layers.conversions == before
        assert all(layers.registry.is_cached(layer.digest) for layer in image.layers)

    run(scenario, GUEST_TIMEOUT_S)


def test_a_boot_that_times_out_or_is_cancelled_leaves_no_guest_scratch_or_layer(
    guests: tuple[LayerFiles, Path], layout: Path
) -> None:
    """A boot past ``boot_timeout_s``, and a ``start`` cancelled while its guest boots —
    once, or again while it is cleaning up — leave no QEMU, no scratch and no layer held."""
    layers, work = guests

    async def nothing_left() -> None:
        assert not work.exists() or list(work.iterdir()) == []
        assert layers.registry.mounted() == frozenset()
        for _ in range(100):  # QEMU has been sent SIGKILL; give the kernel a moment
            if not _our_qemus(work):
                break
            await asyncio.sleep(0.1)
        assert _our_qemus(work) == []

    async def scenario() -> None:
        spec = BootSpec(name="slow", image="busybox", command=("sleep", "600"))
        impatient = make(guests, layout, boot_timeout_s=0.2)  # a boot takes seconds here
        with pytest.raises(BootFailed, match=r"did not start its workload within 0\.2 s"):
            await impatient.start(spec)
        await nothing_left()
        runtime = make(guests, layout)
        for cancels in (1, 2):
            task = asyncio.get_running_loop().create_task(runtime.start(spec))
            while not _our_qemus(work):  # QEMU is booting the guest
                await asyncio.sleep(0.05)
            for _ in range(cancels):
                task.cancel()
                for _ in range(5):  # a few loop turns: the start is now waiting for QEMU's end
                    await asyncio.sleep(0)
            with pytest.raises(asyncio.CancelledError):
                await task
            await nothing_left()
        assert runtime.list() == ()

    run(scenario, GUEST_TIMEOUT_S)


def test_a_start_cancelled_while_its_upper_disk_is_made_leaves_no_process(
    guests: tuple[LayerFiles, Path], layout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled during ``mkfs.ext4`` (here one that takes its time: the real one is too
    quick to catch), the start kills it: no process, scratch or layer is left."""
    layers, work = guests
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "mkfs.ext4").write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    (slow / "mkfs.ext4").chmod(0o755)
    monkeypatch.setenv("PATH", f"{slow}:{os.environ['PATH']}")

    async def scenario() -> None:
        spec = BootSpec(name="disk", image="busybox", command=("true",), disk_limit=64 * MiB)
        task = asyncio.get_running_loop().create_task(make(guests, layout).start(spec))
        while not _our_qemus(work):  # the slow mkfs.ext4 runs on the guest's upper disk
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(50):
            if not _our_qemus(work):
                break
            await asyncio.sleep(0.1)
        assert _our_qemus(work) == []
        assert not work.exists() or list(work.iterdir()) == []
        assert layers.registry.mounted() == frozenset()

    run(scenario, GUEST_TIMEOUT_S)


def test_a_guest_whose_files_cannot_be_made_is_a_boot_failure(
    guests: tuple[LayerFiles, Path], layout: Path, tmp_path: Path
) -> None:
    """The node's own disk refusing a guest's files (an upper disk larger than a file may
    be, a console log directory that cannot be made) is a ``BootFailed`` naming it, with
    nothing left behind."""
    layers, work = guests
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")

    async def scenario() -> None:
        huge = BootSpec(name="huge", image="busybox", command=("true",), disk_limit=2**62)
        with pytest.raises(BootFailed, match="cannot make the guest's files"):
            await make(guests, layout).start(huge)
        logged = make(guests, layout, log_dir=blocker / "logs")
        with pytest.raises(BootFailed, match="not-a-directory"):
            await logged.start(BootSpec(name="logged", image="busybox", command=("true",)))
        assert not work.exists() or list(work.iterdir()) == []
        assert layers.registry.mounted() == frozenset()

    run(scenario, GUEST_TIMEOUT_S)


def test_a_program_or_a_user_the_image_lacks_is_a_boot_failure(
    guests: tuple[LayerFiles, Path], layout: Path
) -> None:
    async def scenario() -> None:
        runtime = make(guests, layout)
        missing, ghost = await asyncio.gather(
            runtime.start(BootSpec(name="x", image="busybox", command=("nosuchprogram",))),
            runtime.start(BootSpec(name="y", image="ghost", command=("true",))),
            return_exceptions=True,
        )
        assert isinstance(missing, BootFailed)
        assert "command not found: 'nosuchprogram'" in str(missing)
        assert isinstance(ghost, BootFailed)
        assert "the image's user 'nobody-here' is not in its /etc/passwd" in str(ghost)
        assert runtime.list() == ()

    run(scenario, GUEST_TIMEOUT_S)


def test_stop_kills_the_guest_after_its_grace_when_the_workload_ignores_sigterm(
    guests: tuple[LayerFiles, Path], layout: Path
) -> None:
    """The stop's own grace (1.5 s) rules, not the runtime's configured 60 s: the workload
    that traps SIGTERM is killed with QEMU soon after it; the polite one exits by itself."""

    async def scenario() -> None:
        runtime = make(guests, layout, stop_grace_s=60.0)
        stubborn, polite = await asyncio.gather(
            runtime.start(
                BootSpec(
                    name="stubborn",
                    image="busybox",
                    command=("sh", "-c", "trap '' TERM; echo up; while :; do sleep 1; done"),
                )
            ),
            runtime.start(
                BootSpec(
                    name="polite",
                    image="busybox",
                    command=(
                        "sh",
                        "-c",
                        "trap 'echo bye; exit 7' TERM; echo up; while :; do sleep 1; done",
                    ),
                )
            ),
        )
        for workload in (stubborn, polite):  # their traps are set once they have said so
            assert isinstance(workload, MicrovmWorkload)
            await workload.first_output()
        await runtime.stop(polite.id, grace_s=30.0)
        assert polite.exit is not None and polite.exit.code == 7 and polite.exit.stopped
        assert "bye" in polite.output  # type: ignore[attr-defined]
        began = time.monotonic()
        await runtime.stop(stubborn.id, grace_s=1.5)
        waited = time.monotonic() - began
        assert stubborn.exit is not None
        assert stubborn.exit.signal == signal.SIGKILL and stubborn.exit.stopped
        assert 1.45 <= waited < 20.0  # far below the configured 60 s, even on a loaded host
        assert (
            not psutil.pid_exists(stubborn.pid or 0)
            or psutil.Process(stubborn.pid or 0).status() == psutil.STATUS_ZOMBIE
        )

    run(scenario, GUEST_TIMEOUT_S)


def test_a_guest_that_outgrows_its_memory_is_contained(
    guests: tuple[LayerFiles, Path], layout: Path
) -> None:
    """The workload allocates without bound: the guest's OOM killer ends it, its end is
    reported (killed by SIGKILL, one OOM kill counted), and QEMU's resident memory stayed
    bounded by the guest's size plus QEMU's own overhead."""

    async def scenario() -> None:
        runtime = make(guests, layout)
        hog = await runtime.start(
            BootSpec(
                name="hog",
                image="busybox",
                mem_limit=128 * MiB,
                command=("awk", 'BEGIN { s = "x"; while (1) s = s s }'),
            )
        )
        assert isinstance(hog, MicrovmWorkload)
        peak_kib = 0
        while not hog.done:
            try:
                status = Path(f"/proc/{hog.pid}/status").read_text()
            except OSError:
                break
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    peak_kib = max(peak_kib, int(line.split()[1]))
            await asyncio.sleep(0.05)
        end = await hog.wait()
        assert end.signal == signal.SIGKILL and not end.stopped
        assert hog.oom_kills >= 1
        assert any("Out of memory" in line for line in hog.output)
        assert peak_kib * 1024 < 128 * MiB + 320 * MiB

    run(scenario, GUEST_TIMEOUT_S)


def test_the_demo_places_a_second_guest_where_its_layers_are_and_skips_the_conversion() -> None:
    """``berth demo --runtime microvm`` in small: an embedded cluster of microvm agents, the
    scheduler ranking by colocated layer bytes, the node's layer files behind that rank."""
    starts = asyncio.run(
        asyncio.wait_for(run_demo(order=("web", "web"), app_mib=4, nodes=2), GUEST_TIMEOUT_S)
    )
    first, second = starts
    assert first.cold and first.colocated_bytes == 0
    assert second.node == first.node and not second.cold
    assert second.colocated_bytes == first.converted_bytes > 0
    assert first.output == second.output == "app build 100"
    assert "colocated starts" in summary(starts) and "s saved per start" in summary(starts)


class TestMicrovmRuntimeAdoptionContract(AdoptingRuntimeContract):
    """A second runtime on the same state directory (a restarted agent's) adopts a running
    guest — its QEMU under a supervisor, its console read again from its log — stops it
    through its console, knows how one that ended did, and refuses a forged locator."""

    timeout_s = GUEST_TIMEOUT_S

    @pytest.fixture(autouse=True)
    def _node(self, guests: tuple[LayerFiles, Path], layout: Path) -> None:
        self.guests, self.layout = guests, layout

    def make_runtime(self, state_dir: Path) -> AdoptingRuntime:
        write_owner(state_dir / "agent.pid")  # this process owns the directory
        return make(self.guests, self.layout, stop_grace_s=5.0, state_dir=state_dir)

    def long_running_spec(self) -> BootSpec:
        return BootSpec(name="kept", image="busybox", command=("sleep", "600"))

    def exiting_spec(self, code: int) -> BootSpec:
        return BootSpec(name="quitter", image="busybox", command=("sh", "-c", f"exit {code}"))
