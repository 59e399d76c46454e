"""The microVM runtime's parts that need no guest: init archive, config quoting, QEMU command
line and sizing, host facts, setup checks, configuration, and how guest ends are reported."""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from berth.cli.main import app
from berth.errors import Invalid
from berth.node.agent import Agent
from berth.node.config import AgentConfig
from berth.node.layer_files import LayerFiles
from berth.node.microvm.initramfs import (
    GUEST_PATH,
    INIT_SCRIPT,
    CpioEntry,
    GuestConfig,
    config_archive,
    newc_archive,
)
from berth.node.microvm.machine import workload_exit
from berth.node.microvm.paths import GuestFiles, problems
from berth.node.microvm.qemu import (
    MAX_LAYERS,
    MIN_GUEST_MEM,
    host_tsc_khz,
    kernel_cmdline,
    qemu_argv,
    vm_size,
)
from berth.node.microvm.scratch import guest_user, guest_workdir
from berth.node.microvm.setup import is_static_elf
from berth.node.microvm.vm import GuestEnd, probe
from berth.node.runtime import BootFailed, BootSpec, WorkloadExit
from berth.node.runtime.microvm import MicrovmRuntime
from berth.store.memory import MemoryStore
from berth.testing.runtime_contract import run
from berth.units import MiB

BUSYBOX = shutil.which("busybox")
needs_busybox = pytest.mark.skipif(BUSYBOX is None, reason="busybox is not installed")

BUDGET = {
    "mem_max": "4GiB",
    "disk_max": "64GiB",
    "cpu_max_load": 0.9,
    "disk_bw_cap": "1GiBps",
    "disk_bw_max_load": 0.8,
    "net_bw_cap": "1Gbps",
    "net_bw_max_load": 0.8,
}


# --- the init's archives ---------------------------------------------------------------------


@needs_busybox
def test_newc_archives_unpack_with_cpio(tmp_path: Path) -> None:
    archive = newc_archive(
        [
            CpioEntry("etc", stat.S_IFDIR | 0o755),
            CpioEntry("etc/motd", stat.S_IFREG | 0o640, b"hello\n"),
            CpioEntry("etc/odd", stat.S_IFREG | 0o644, b"abc"),  # needs padding
            CpioEntry("etc/link", stat.S_IFLNK | 0o777, b"motd"),
        ]
    )
    assert len(archive) % 4 == 0
    assert archive.startswith(b"070701") and b"TRAILER!!!" in archive
    assert BUSYBOX is not None
    subprocess.run(
        [BUSYBOX, "cpio", "-i", "-d"], input=archive, cwd=tmp_path, check=True, capture_output=True
    )
    assert (tmp_path / "etc/motd").read_bytes() == b"hello\n"
    assert stat.S_IMODE((tmp_path / "etc/motd").stat().st_mode) == 0o640
    assert (tmp_path / "etc/odd").read_bytes() == b"abc"
    assert (tmp_path / "etc/link").readlink() == Path("motd")


ARG = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=40)


@needs_busybox
@settings(max_examples=25, deadline=None)
@given(
    command=st.lists(ARG, min_size=1, max_size=5),
    env=st.dictionaries(
        st.text(st.characters(codec="utf-8", exclude_characters="\0="), min_size=1, max_size=10),
        ARG,
        max_size=3,
    ),
)
def test_the_config_hands_arguments_and_environment_over_byte_for_byte(
    command: list[str], env: dict[str, str]
) -> None:
    """The guest's shell (busybox sh, as in the guest) runs the init's own ``eval`` line on
    the config and gets back exactly the command and environment it was written from —
    quotes, ``$``, backslashes, newlines — around the options the init puts between them."""
    config = GuestConfig(nonce="n", command=command, env=env, layers=2, workdir="/srv")
    match = re.search(r'^eval "set -- .*?"$', INIT_SCRIPT, re.MULTILINE | re.DOTALL)
    assert match is not None
    script = (
        config.script()
        + 'ids="-S 7 -G 8"\n'
        + match.group(0)
        + '\nprintf "%s\\0" "$BERTH_PROGRAM" "$@"'
    )
    assert BUSYBOX is not None
    out = subprocess.run([BUSYBOX, "sh", "-c", script], capture_output=True, check=True).stdout
    program, *argv = out.decode().split("\0")[:-1]
    assert program == command[0]
    environment = dict(env)
    environment.setdefault("PATH", GUEST_PATH)
    assert argv == [f"{key}={value}" for key, value in environment.items()] + [
        "/bin/nsenter",
        "-r/newroot",
        "-w/newroot/srv",
        "-S",
        "7",
        "-G",
        "8",
        "-F",
        *command,
    ]


def test_the_config_archive_holds_only_the_config() -> None:
    archive = config_archive(GuestConfig(nonce="abc", command=("true",)))
    assert b"berth/config" in archive and b"BERTH_NONCE=abc" in archive


# --- QEMU --------------------------------------------------------------------------------------


def test_guest_size_rounds_up_floors_memory_and_caps_vcpus() -> None:
    assert vm_size(0.25, 128 * MiB, host_cores=2) == vm_size(1, 128 * MiB, host_cores=2)
    assert vm_size(0.25, 128 * MiB, host_cores=2).vcpus == 1
    assert vm_size(3, None, host_cores=2).vcpus == 2
    assert vm_size(1.5, 300 * MiB + 1, host_cores=8).mem_mib == 301
    small = vm_size(1, 32 * MiB)
    assert small.mem_mib * MiB == MIN_GUEST_MEM and small.floored
    assert not vm_size(1, MIN_GUEST_MEM).floored


def test_host_tsc_khz_reads_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu MHz\t\t: 2596.098\n")
    assert host_tsc_khz(cpuinfo) == 2596098
    cpuinfo.write_text("processor\t: 0\ncpu MHz\t\t: nan\n")
    assert host_tsc_khz(cpuinfo) is None
    assert host_tsc_khz(tmp_path / "missing") is None
    assert "tsc_early_khz=2596098" in kernel_cmdline(2596098)
    assert "tsc_early_khz" not in kernel_cmdline(None)


def test_qemu_argv_attaches_layers_read_only_by_serial_and_escapes_commas(tmp_path: Path) -> None:
    layers = [tmp_path / "a,b.erofs", tmp_path / "c.erofs"]
    argv = qemu_argv(
        "qemu",
        kernel=tmp_path / "k",
        initrd=tmp_path / "i",
        accel="tcg",
        size=vm_size(2, 256 * MiB, host_cores=4),
        cmdline="console=ttyS0",
        layers=layers,
        upper=tmp_path / "u.img",
    )
    text = " ".join(argv)
    assert argv[argv.index("-M") + 1].split(",")[0] == "microvm"
    assert argv[argv.index("-cpu") + 1] == "max" and argv[argv.index("-smp") + 1] == "2"
    assert argv[argv.index("-m") + 1] == "256"
    assert f"file={tmp_path}/a,,b.erofs,format=raw,if=none,readonly=on" in text
    assert "serial=berth-layer-0" in text and "serial=berth-layer-1" in text
    upper = next(arg for arg in argv if arg.startswith("id=upper"))
    assert "readonly" not in upper
    with pytest.raises(ValueError):
        qemu_argv(
            "qemu",
            kernel=tmp_path / "k",
            initrd=tmp_path / "i",
            accel="tcg",
            size=vm_size(1, None),
            cmdline="",
            layers=[tmp_path] * (MAX_LAYERS + 1),
        )


# --- setup and checks ------------------------------------------------------------------------


def test_problems_name_what_is_missing_and_the_command_that_fixes_it(tmp_path: Path) -> None:
    files = GuestFiles.at(tmp_path / "data")
    found = problems(files, qemu="no-such-qemu-binary")
    assert any("apt-get install qemu-system-x86" in line for line in found)
    assert any(f"berth microvm setup --data-dir {tmp_path / 'data'}" in line for line in found)
    assert files.kernel is None and files.probed_accel() is None
    ok, why = probe(files, "tcg")
    assert not ok and "berth microvm setup" in why


def test_static_elf_check() -> None:
    assert not is_static_elf(Path(sys.executable).resolve())  # CPython links the C library
    assert not is_static_elf(Path(__file__))
    ldd = shutil.which("ldd")
    if BUSYBOX is not None and ldd is not None:
        said = subprocess.run([ldd, BUSYBOX], capture_output=True, text=True, check=False)
        static = "not a dynamic executable" in said.stdout + said.stderr
        assert is_static_elf(Path(BUSYBOX)) == static


def test_recorded_acceleration_round_trips(tmp_path: Path) -> None:
    files = GuestFiles.at(tmp_path)
    files.record_accel("tcg", "kvm: no usable /dev/kvm")
    assert files.probed_accel() == ("tcg", "kvm: no usable /dev/kvm")
    files.accel_file.write_text('{"accel": "hvf"}')
    assert files.probed_accel() is None


# --- configuration and the agent -------------------------------------------------------------


def _config(tmp_path: Path, **microvm: object) -> AgentConfig:
    return AgentConfig.from_dict(
        {
            "node": {"name": "vm-node"},
            "budget": BUDGET,
            "agent": {"runtime": "microvm", "layer_cache": "1GiB"},
            "microvm": {
                "data_dir": str(tmp_path / "data"),
                "images": str(tmp_path / "oci"),
                **microvm,
            },
        }
    )


def test_microvm_config_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(Invalid) as caught:
        _config(tmp_path, accel="hvf", data_dir="", boot_timeout_s=0)
    message = str(caught.value)
    assert "microvm.accel: must be 'auto', 'kvm' or 'tcg'" in message
    assert "microvm.data_dir: must not be empty" in message
    assert "microvm.boot_timeout_s" in message


def test_an_agent_configured_for_microvms_advertises_its_layer_files_and_acceleration(
    tmp_path: Path,
) -> None:
    agent = Agent.from_config(_config(tmp_path, accel="tcg"), MemoryStore())
    runtime = agent.runtime
    assert isinstance(runtime, MicrovmRuntime)
    assert agent.layers is runtime.layer_files.registry
    assert runtime.layer_files.root == tmp_path / "data" / "nodes" / "vm-node" / "layers"
    assert agent.snapshot().labels["microvm.accel"] == "tcg"


def test_boots_on_a_node_without_setup_fail_with_the_fix(tmp_path: Path) -> None:
    runtime = MicrovmRuntime(
        LayerFiles(tmp_path / "layers"),
        tmp_path / "oci",
        files=GuestFiles.at(tmp_path / "data"),
        accel="tcg",
    )

    async def scenario() -> None:
        with pytest.raises(BootFailed, match=r"not set up: .*berth microvm setup"):
            await runtime.start(BootSpec(name="x", command=("true",)))
        assert runtime.list() == ()

    run(scenario)


def test_runtime_arguments_are_checked(tmp_path: Path) -> None:
    layers = LayerFiles(tmp_path / "layers")
    with pytest.raises(Invalid, match="accel"):
        MicrovmRuntime(layers, tmp_path, accel="hvf")  # type: ignore[arg-type]
    with pytest.raises(Invalid, match="stop_grace_s"):
        MicrovmRuntime(layers, tmp_path, accel="tcg", stop_grace_s=-1)
    with pytest.raises(Invalid, match="stop_grace_s"):
        MicrovmRuntime(layers, tmp_path, accel="tcg", stop_grace_s=3601)
    with pytest.raises(Invalid, match="layers"):
        MicrovmRuntime(object(), tmp_path, accel="tcg")  # type: ignore[arg-type]


def test_agent_check_reports_what_is_missing_with_the_fix(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        '[node]\nname = "vm-node"\n[budget]\n'
        + "".join(f"{key} = {value!r}\n".replace("'", '"') for key, value in BUDGET.items())
        + f'[agent]\nruntime = "microvm"\n[microvm]\ndata_dir = "{tmp_path / "data"}"\n'
    )
    result = CliRunner().invoke(app, ["agent", "--config", str(config), "--check"])
    assert result.exit_code == 2
    assert "microvm.data_dir" in result.output
    assert f"berth microvm setup --data-dir {tmp_path / 'data'}" in result.output
    assert "no OCI image layout" in result.output
    assert "Traceback" not in result.output


# --- how a guest's end is reported -----------------------------------------------------------


@pytest.mark.parametrize(
    ("end", "stopped", "expected"),
    [
        (GuestEnd(0, 0, None, 0, False), False, WorkloadExit(code=0)),
        (GuestEnd(3, 0, None, 0, False), False, WorkloadExit(code=3)),
        (GuestEnd(137, 1, None, 0, False), False, WorkloadExit(signal=signal.SIGKILL)),
        (GuestEnd(143, 0, None, 0, False), True, WorkloadExit(signal=signal.SIGTERM, stopped=True)),
        (
            GuestEnd(None, 0, None, -9, True),
            True,
            WorkloadExit(signal=signal.SIGKILL, stopped=True),
        ),
        (GuestEnd(None, 0, None, 0, False), False, WorkloadExit()),
        (GuestEnd(255, 0, None, 0, False), False, WorkloadExit(code=255)),
    ],
)
def test_guest_ends_become_workload_exits(
    end: GuestEnd, stopped: bool, expected: WorkloadExit
) -> None:
    assert workload_exit(end, stopped) == expected


def test_scratch_left_by_a_dead_process_is_removed_at_start(tmp_path: Path) -> None:
    work = tmp_path / "run"
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = work / f"web-1.{dead.pid}.abcd1234"
    mine = work / f"web-2.{os.getpid()}.efgh5678"
    other = work / "not-a-guest"
    for directory in (orphan, mine, other):
        (directory / "sub").mkdir(parents=True)
    MicrovmRuntime(
        LayerFiles(tmp_path / "layers"),
        tmp_path / "oci",
        files=GuestFiles.at(tmp_path / "data"),
        accel="tcg",
        work_dir=work,
    )
    assert not orphan.exists()
    assert mine.exists() and other.exists()


def test_an_initramfs_from_another_berth_is_reported_and_refused(tmp_path: Path) -> None:
    files = GuestFiles.at(tmp_path / "data")
    kernel_dir = files.kernel_root / "6.1.0-test"
    kernel_dir.mkdir(parents=True)
    (kernel_dir / "vmlinuz").write_bytes(b"not really a kernel")
    (files.kernel_root / "current").write_text("6.1.0-test\n")
    files.initramfs.write_bytes(newc_archive([CpioEntry("init", stat.S_IFREG | 0o755, b"old")]))
    assert any("another berth's: berth microvm setup" in line for line in problems(files))
    runtime = MicrovmRuntime(
        LayerFiles(tmp_path / "layers"), tmp_path / "oci", files=files, accel="tcg"
    )

    async def scenario() -> None:
        with pytest.raises(BootFailed, match="another berth's"):
            await runtime.start(BootSpec(name="x", command=("true",)))

    run(scenario)


def test_the_working_directory_stays_inside_the_image() -> None:
    assert [guest_workdir(path) for path in ("", "/", "app", "/srv/app/", "/a/../../b", "/..")] == [
        "/",
        "/",
        "/app",
        "/srv/app",
        "/b",
        "/",
    ]
    with pytest.raises(Invalid, match="workdir"):
        GuestConfig(nonce="n", workdir="relative")


def test_image_users_are_checked() -> None:
    assert [guest_user(user) for user in ("", "app", "1000", "app:staff", ":100", " 7 ")] == [
        "",
        "app",
        "1000",
        "app:staff",
        "0:100",
        "7",
    ]
    for bad in ("a:b:c", "a b", "x\ty"):
        with pytest.raises(BootFailed, match="is not a user"):
            guest_user(bad)
    with pytest.raises(Invalid, match="user"):
        GuestConfig(nonce="n", user="a:b:c")
