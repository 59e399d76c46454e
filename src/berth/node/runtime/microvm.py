"""The microVM runtime driver: each workload boots in its own QEMU ``microvm`` guest.

A workload's image comes from the node's OCI image layout (``BootSpec.image``, a reference
in it); its layers are the node's erofs image files (:class:`~berth.node.layer_files.LayerFiles`:
converted once from the layer blob, then kept and shared), attached read-only as virtio-blk
disks and stacked by berth's init with overlayfs, topmost layer first.  The guest gets:

* **vCPUs and memory** from the workload's spec (``vcpus`` rounded up, at most this host's
  cores; ``mem_limit`` rounded up to MiB, never below the kernel's floor of
  :data:`~berth.node.microvm.qemu.MIN_GUEST_MEM` — a smaller spec gets the floor, and the
  log says so).  A workload that outgrows its memory meets the *guest's* OOM killer: it is
  reported killed (``SIGKILL``) with ``oom_kills`` counted, and the host only ever gave QEMU
  the memory it was configured with.
* **its disk budget as the writable upper layer**: a sparse ext4 image of ``disk_limit``
  bytes made per guest (a ``tmpfs`` of that size, in guest memory, when the budget is under
  16 MiB or absent) and deleted when the guest ends.
* **its command as the guest's main process**: with the image's environment overlaid by the
  spec's ``env``, in the stacked image, starting in the image's ``WorkingDir`` (``/`` if
  none; made if missing), as the image's ``User`` (root if none).  A program the image lacks is a
  :class:`BootFailed` (``command not found: 'x'``), as with the process runtime.

``start`` returns once the guest's init reports the workload running (a real boot: ~2 s
under software emulation, more on a loaded host; ``boot_timeout_s`` bounds it).  The exit
status the init reports becomes the :class:`WorkloadExit` — the shell's 128 + N for a
workload killed by signal N is reported as that signal — and the console output is kept
(:attr:`MicrovmWorkload.output`, and ``<log_dir>/<id>.log`` when a log directory is given).
``stop`` asks the init to ``SIGTERM`` the workload (a line on the serial console), waits the
stop's ``grace_s`` (else ``stop_grace_s``) for the guest to power off, then kills QEMU.  A
guest's scratch directory (its initramfs copy, upper disk, console log and socket) is removed
when it ends, and its layers are released to the node's cache.

**Guests outlive their agent, and are adopted** (issue 20).  QEMU runs under a supervisor of
its own, exactly as a process workload does (a :class:`~berth.node.runtime.process.ProcessRuntime`
per guest: ``<state_dir>/workloads/<id>.run`` and ``.exit`` beside the node's journal entry),
and its serial console is a socket QEMU serves plus a log file QEMU writes all of it to
(:class:`~berth.node.microvm.qemu.GuestConsole`): nothing ties the guest to the agent's
process.  When the agent dies the guest runs on for ``orphan_grace_s``, then its supervisor
kills QEMU (with a state directory: when no live agent has owned the directory for that long;
without one: when the agent that started it is gone).  A restarted agent **adopts** a guest
whose supervisor still runs (:meth:`MicrovmRuntime.adopt`: the supervisor's pid and start
time, through a pidfd; its layer files held again; its console log read again from the start,
so the protocol lines say how far it got), and for one that ended while it was down reads the
exit status the init printed in that log (:meth:`MicrovmRuntime.ended`).  The workload's
locator in the journal holds the supervisor's and QEMU's pid and start time, the boot's nonce,
its scratch directory and socket, and its layers' digests.

Acceleration: ``kvm`` only when a probe guest booted under it (``berth microvm setup``
records the probe; ``auto`` reads it, or probes once), ``tcg`` otherwise; :attr:`labels`
states it for the node's snapshot (``microvm.accel``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import posixpath
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from berth.defaults import KVM_PROBE_TIMEOUT_S, MICROVM_STOP_GRACE_S, ORPHAN_GRACE_S
from berth.errors import BerthError, Invalid
from berth.node.erofs import pid_alive
from berth.node.layer_files import LayerFiles
from berth.node.microvm.config import BOOT_TIMEOUT_S, DEFAULT_QEMU, AccelChoice, MicrovmSection
from berth.node.microvm.initramfs import GuestConfig
from berth.node.microvm.paths import Accel, GuestFiles, problems
from berth.node.microvm.qemu import (
    MAX_LAYERS,
    GuestConsole,
    VmSize,
    host_tsc_khz,
    kernel_cmdline,
    qemu_argv,
    vm_size,
)
from berth.node.microvm.vm import (
    GuestBootFailed,
    GuestEnd,
    MicroVM,
    console_status,
    new_nonce,
    probe,
    write_initrd,
)
from berth.node.runtime.port import (
    BootFailed,
    BootSpec,
    ExitListener,
    ExitListeners,
    WorkloadExit,
    WorkloadHandle,
    WorkloadIds,
    configured_grace,
    end_within_grace,
    stop_grace,
)
from berth.node.runtime.process import ProcessRuntime, process_identity
from berth.node.runtime.supervisor import alive, atomic_write, file_stem, read_record
from berth.oci import OciImage, read_layout
from berth.units import MiB
from berth.validation import shown

__all__ = ["MIN_UPPER_DISK", "AgentSettings", "MicrovmRuntime", "MicrovmWorkload"]

log = logging.getLogger("berth.microvm")

MIN_UPPER_DISK = 16 * MiB
"""The smallest disk budget given an ext4 upper disk; below it the upper layer is a tmpfs."""


class _NodeSettings(Protocol):
    @property
    def name(self) -> str: ...


class _AgentKnobs(Protocol):
    @property
    def layer_cache(self) -> int: ...

    @property
    def stop_grace_s(self) -> float: ...


class AgentSettings(Protocol):
    """What :meth:`MicrovmRuntime.from_config` reads of an agent's configuration: the node's
    name, the agent's layer cache and stop grace, and the ``[microvm]`` table.

    :class:`~berth.node.config.AgentConfig` is one; naming only what is read keeps this driver
    from importing the agent's configuration (which sits above the runtimes).
    """

    @property
    def node(self) -> _NodeSettings: ...

    @property
    def agent(self) -> _AgentKnobs: ...

    @property
    def microvm(self) -> MicrovmSection: ...


class MicrovmWorkload(WorkloadHandle):
    """A workload running in a guest: the port's handle plus what the guest reports.

    ``accel`` and ``size`` say how the guest runs; ``image`` is the image it booted;
    ``output`` its last console lines; ``first_output_at``/``started_at`` monotonic times
    (``started_at`` is when ``start`` was called: their difference is the time to first
    output); ``boot_seconds`` from QEMU's launch to the workload running; ``oom_kills`` the
    guest kernel's OOM kills; ``console_log`` the log file, if any.
    """

    def __init__(
        self,
        workload_id: str,
        spec: BootSpec,
        vm: MicroVM,
        *,
        accel: Accel,
        size: VmSize,
        image: OciImage,
        started_at: float,
        console_log: Path | None,
        locator: dict[str, Any],
    ) -> None:
        super().__init__(workload_id, spec, pid=vm.pid)
        self.locator = locator  # how a restarted agent finds the guest (module docstring)
        self.vm = vm
        self.accel = accel
        self.size = size
        self.image = image
        self.started_at = started_at
        self.console_log = console_log
        self.oom_kills = 0

    @property
    def output(self) -> tuple[str, ...]:
        """The workload's last console lines (kernel messages included)."""
        return tuple(self.vm.output)

    @property
    def first_output_at(self) -> float | None:
        return self.vm.first_output_at

    @property
    def boot_seconds(self) -> float | None:
        running = self.vm.running_at
        return None if running is None else running - self.vm.launched_at

    async def first_output(self) -> float:
        """Wait for the workload's first line of output; its monotonic time (or, for a
        workload that printed nothing, the time its guest ended)."""
        first = await self.vm.first_output()
        return first if first is not None else time.monotonic()


@dataclass
class _Guest:
    workload: MicrovmWorkload
    scratch: Path
    layers: tuple[str, ...]
    stop_requested: bool = False


@dataclass
class _Attempt:
    """What a start has made so far — the layers it holds, its scratch directory, its QEMU —
    so that a failure or cancellation at any step undoes exactly that (:meth:`MicrovmRuntime.
    _abandon`)."""

    layers: tuple[str, ...]
    scratch: Path | None = None
    vm: MicroVM | None = None
    locator: dict[str, Any] | None = None


def _status(end: GuestEnd, stopped: bool) -> WorkloadExit:
    if end.status is not None:
        signum = end.status - 128
        if 0 < signum < signal.NSIG and end.status > 128:
            return WorkloadExit(signal=signum, stopped=stopped)
        return WorkloadExit(code=end.status, stopped=stopped)
    if end.killed:
        return WorkloadExit(signal=signal.SIGKILL, stopped=stopped)
    if end.returncode < 0:
        return WorkloadExit(signal=-end.returncode, stopped=stopped)
    return WorkloadExit(stopped=stopped)


_SCRATCH = re.compile(r".+\.([0-9]{1,10})\.[^.]+")
GUEST_FILE = "guest.json"
"""In a guest's scratch directory: its workload id, nonce and supervisor (pid, start time)."""
MAX_SOCKET_PATH = 100
"""A console socket's longest path (a Unix socket's is at most 107 bytes); a scratch directory
deeper than that gets its socket in a private directory under the system's temporary one."""


def _console_of(scratch: Path, nonce: str) -> GuestConsole:
    """Where a guest's console is: its socket and log in its scratch directory (the socket
    in a private temporary directory when the scratch path is too long for one)."""
    socket = scratch / "console.sock"
    if len(str(socket)) > MAX_SOCKET_PATH:
        private = Path(tempfile.gettempdir()) / f"berth-{os.getuid()}"
        private.mkdir(mode=0o700, exist_ok=True)
        socket = private / f"{nonce}.sock"
    return GuestConsole(socket, scratch / "console.log")


def _nonce_in(scratch: Path) -> str:
    record = read_record(scratch / GUEST_FILE) or {}
    nonce = record.get("nonce")
    return nonce if isinstance(nonce, str) else "none"


def _guest_runs(scratch: Path) -> bool:
    """Whether the supervisor a scratch directory's :data:`GUEST_FILE` names still runs."""
    found = process_identity(read_record(scratch / GUEST_FILE) or {}, "supervisor")
    return found is not None and alive(*found)


def _located(locator: dict[str, Any] | None) -> tuple[Path, str, Path, tuple[str, ...]] | None:
    """A guest's scratch directory, nonce, console socket and layer digests from its
    locator; ``None`` unless it has them all (an older agent's locator has not)."""
    if not isinstance(locator, dict):
        return None
    scratch, nonce, socket, layers = (
        locator.get("scratch"),
        locator.get("nonce"),
        locator.get("socket"),
        locator.get("layers"),
    )
    if not (
        isinstance(scratch, str)
        and isinstance(nonce, str)
        and isinstance(socket, str)
        and isinstance(layers, str)
    ):
        return None
    return Path(scratch), nonce, Path(socket), tuple(filter(None, layers.split(",")))


async def _returncode(handle: WorkloadHandle) -> int:
    """QEMU's exit status once its process has ended (negative: the signal that ended it)."""
    ended = await handle.wait()
    if ended.code is not None:
        return ended.code
    return -(ended.signal or signal.SIGKILL)


def _workdir(working_dir: str) -> str:
    # The image's WorkingDir (OCI: absolute; a relative one is taken from /), normalised
    # lexically, so no ``..`` climbs out of the image.
    return posixpath.normpath("/" + working_dir.lstrip("/"))


def _user(user: str) -> str:
    # The image's User; an empty user part means root (``:100`` is root with group 100).
    user = user.strip()
    if user.startswith(":"):
        user = "0" + user
    if not user.isprintable() or user.count(":") > 1 or " " in user:
        raise BootFailed(f"the image's user {user!r} is not a user, uid, user:group or uid:gid")
    return user


def _hostname(workload_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", workload_id)[:63].strip("-") or "berth"


class MicrovmRuntime:
    """Boots each workload in a QEMU ``microvm`` guest (see the module docstring).

    ``layers`` — the node's layer files (give its ``registry`` to the node);  ``images`` —
    the OCI image layout workloads' images are read from; ``files`` — the data directory
    ``berth microvm setup`` prepared (default :func:`~berth.node.microvm.paths.GuestFiles.at`
    ``None``); ``accel`` — ``auto`` (the recorded probe, or one now), ``kvm`` or ``tcg``;
    ``work_dir`` — where guests' scratch directories go (default ``<data_dir>/run``; each
    is removed when its guest ends);
    ``log_dir`` — where each workload's console goes (``<id>.log``), if anywhere.
    """

    def __init__(
        self,
        layers: LayerFiles,
        images: str | Path,
        *,
        files: GuestFiles | None = None,
        accel: AccelChoice = "auto",
        qemu: str = DEFAULT_QEMU,
        stop_grace_s: float = MICROVM_STOP_GRACE_S,
        boot_timeout_s: float = BOOT_TIMEOUT_S,
        work_dir: str | Path | None = None,
        log_dir: str | Path | None = None,
        state_dir: Path | None = None,
        orphan_grace_s: float = ORPHAN_GRACE_S,
    ) -> None:
        if not isinstance(layers, LayerFiles):
            raise Invalid(f"expected the node's LayerFiles, got {shown(layers)}", field="layers")
        if isinstance(images, bytes) or not isinstance(images, str | Path) or not str(images):
            raise Invalid(
                f"expected an OCI image layout directory, got {shown(images)}", field="images"
            )
        if accel not in ("auto", "kvm", "tcg"):
            raise Invalid(f"must be 'auto', 'kvm' or 'tcg', got {shown(accel)}", field="accel")
        if (
            isinstance(boot_timeout_s, bool)
            or not isinstance(boot_timeout_s, int | float)
            or (not boot_timeout_s > 0)
        ):
            raise Invalid(
                f"must be a positive number of seconds, got {shown(boot_timeout_s)}",
                field="boot_timeout_s",
            )
        grace = configured_grace(stop_grace_s)
        self.files = files if files is not None else GuestFiles.at(None)
        self.layer_files = layers
        self.images = Path(images)
        self.qemu = qemu
        self.stop_grace_s = grace
        self.boot_timeout_s = float(boot_timeout_s)
        self.work_dir = Path(work_dir) if work_dir is not None else self.files.data_dir / "run"
        self.log_dir = Path(log_dir) if log_dir is not None else None
        # the state directory's supervisor records and journal files, as the process runtime
        # that runs each guest's QEMU keeps them (it checks both arguments)
        self._host = ProcessRuntime(state_dir=state_dir, orphan_grace_s=orphan_grace_s)
        self.state_dir = state_dir
        self.orphan_grace_s = orphan_grace_s
        self.accel, self.accel_detail = self._choose_accel(accel)
        self.cmdline = kernel_cmdline(host_tsc_khz())
        self._guests: dict[str, _Guest] = {}
        self._starting: set[str] = set()
        self._watchers: set[asyncio.Task[None]] = set()
        self._listeners = ExitListeners()
        self._ids = WorkloadIds()
        self._remove_orphans()
        log.info("microVMs under %s (%s)", self.accel, self.accel_detail)

    def _remove_orphans(self) -> None:
        """Delete scratch directories left by a process that has died whose guest no longer
        runs either (its supervisor, named in the directory's :data:`GUEST_FILE`, is gone)
        and that the node's journal no longer names; a live process's, a guest's that a
        restarted agent may adopt, or one whose end it is to read, are kept."""
        try:
            entries = list(os.scandir(self.work_dir))
        except OSError:
            return
        for entry in entries:
            match = _SCRATCH.fullmatch(entry.name)
            if match is None or not entry.is_dir(follow_symlinks=False):
                continue
            pid = int(match.group(1))
            if pid_alive(pid) or _guest_runs(Path(entry.path)) or self._journaled(Path(entry.path)):
                continue
            log.info("removing %s, left by process %d", entry.path, pid)
            shutil.rmtree(entry.path, ignore_errors=True)

    def _journaled(self, scratch: Path) -> bool:
        """Whether the node's journal still names the guest of ``scratch``: then a restarted
        agent reads how it ended there (:meth:`ended`), which removes it."""
        record = read_record(scratch / GUEST_FILE) or {}
        workload_id = record.get("workload_id")
        files = self._host.files(str(workload_id))
        return isinstance(workload_id, str) and files is not None and files.entry.exists()

    @classmethod
    def from_config(
        cls,
        config: AgentSettings,
        *,
        state_dir: Path | None = None,
        orphan_grace_s: float = ORPHAN_GRACE_S,
    ) -> MicrovmRuntime:
        """The runtime an agent's ``[microvm]`` table describes: its layers under
        ``<node_dir>/layers`` (default ``<data_dir>/nodes/<node>``) with the agent's
        ``layer_cache`` budget, its guests' scratch under ``<node_dir>/run``; ``state_dir``
        and ``orphan_grace_s`` the agent's (where its journal is, how long a guest outlives
        it)."""
        section = config.microvm
        files = GuestFiles.at(section.data_dir)
        if section.node_dir:
            node_dir = Path(section.node_dir).expanduser()
        else:
            node_dir = files.node_dir(config.node.name)
        images = Path(section.images).expanduser() if section.images else files.images_dir
        return cls(
            LayerFiles(node_dir / "layers", config.agent.layer_cache),
            images,
            files=files,
            accel=section.accel,
            qemu=section.qemu,
            stop_grace_s=config.agent.stop_grace_s,
            boot_timeout_s=section.boot_timeout_s,
            work_dir=node_dir / "run",
            log_dir=Path(section.log_dir).expanduser() if section.log_dir else None,
            state_dir=state_dir,
            orphan_grace_s=orphan_grace_s,
        )

    def _choose_accel(self, accel: AccelChoice) -> tuple[Accel, str]:
        if accel != "auto":
            return accel, f"{accel}: configured"
        recorded = self.files.probed_accel()
        if recorded is not None:
            return recorded
        if not os.access("/dev/kvm", os.R_OK | os.W_OK):
            return "tcg", "tcg: no usable /dev/kvm"
        ok, detail = probe(self.files, "kvm", qemu=self.qemu, timeout_s=KVM_PROBE_TIMEOUT_S)
        chosen: Accel = "kvm" if ok else "tcg"
        detail = f"kvm: {detail}" if ok else f"tcg; kvm: {detail}"
        with contextlib.suppress(OSError):
            self.files.record_accel(chosen, detail)
        return chosen, detail

    @property
    def labels(self) -> dict[str, str]:
        """What the node states about its guests in its snapshot's labels."""
        return {"microvm.accel": self.accel}

    def problems(self) -> list[str]:
        """What this host lacks to boot guests, each with its fix (``[]`` when ready)."""
        return problems(self.files, self.qemu)

    # -- the port ----------------------------------------------------------------------------
    def on_exit(self, listener: ExitListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def list(self) -> tuple[WorkloadHandle, ...]:
        return tuple(guest.workload for guest in self._guests.values())

    async def start(self, spec: BootSpec, workload_id: str | None = None) -> WorkloadHandle:
        """Boot ``spec`` in a new guest; return once its workload runs (``BootFailed`` if not).

        The steps: check the guest can be built (:meth:`_bootable`), size it, acquire its
        layers, then make its scratch directory, upper disk and initramfs, launch QEMU and wait
        for the init to report the workload running (:meth:`_boot`).  Whatever ends a start
        early — a failure or a cancellation at any step — kills the QEMU it launched and
        releases the scratch and layers it took (:meth:`_abandon`); an ``OSError`` of this
        node's disk (the work dir, log dir, upper disk) becomes a ``BootFailed`` naming it.
        """
        started_at = time.monotonic()
        if not isinstance(spec, BootSpec):
            raise Invalid(f"expected a BootSpec, got {shown(spec)}", field="spec")
        workload_id = self._ids.choose(spec, workload_id, self._guests.keys() | self._starting)
        self._starting.add(workload_id)  # a concurrent start of this id is refused meanwhile
        try:
            return await self._start(spec, workload_id, started_at)
        finally:
            self._starting.discard(workload_id)

    async def _start(self, spec: BootSpec, workload_id: str, started_at: float) -> WorkloadHandle:
        kernel, image = self._bootable(spec)
        size = self._size(workload_id, spec)
        paths = await self._acquire_layers(image)
        attempt = _Attempt(tuple(layer.digest for layer in image.layers))
        try:
            vm, console_path = await self._boot(
                attempt, workload_id, spec, image, kernel=kernel, size=size, layers=paths
            )
        except BaseException as error:
            await self._abandon(attempt)
            if isinstance(error, OSError):  # this node's disk: the work dir, log dir, upper disk
                where = f" ({error.filename})" if error.filename else ""
                raise BootFailed(
                    f"cannot make the guest's files: {error.strerror or error}{where}"
                ) from None
            raise
        assert attempt.scratch is not None and attempt.locator is not None
        workload = MicrovmWorkload(
            workload_id,
            spec,
            vm,
            accel=self.accel,
            size=size,
            image=image,
            started_at=started_at,
            console_log=console_path,
            locator=attempt.locator,
        )
        self._adopt(_Guest(workload, attempt.scratch, attempt.layers))
        return workload

    def _bootable(self, spec: BootSpec) -> tuple[Path, OciImage]:
        """The guest kernel and ``spec``'s image, or ``BootFailed`` saying why no guest can run
        it: microVMs not set up, a program named with ``=`` (the kernel would take it for a
        parameter), an image that is not in the layout or has too many layers."""
        kernel = self.files.kernel
        if kernel is None or not kernel.is_file() or not self.files.initramfs_is_current():
            missing = "; ".join(self.problems()) or "no guest kernel"
            raise BootFailed(f"microVMs are not set up: {missing}")
        if "=" in spec.command[0]:
            raise BootFailed(f"a guest cannot run a program named with '=': {spec.command[0]!r}")
        image = self._image(spec.image)
        if len(image.layers) > MAX_LAYERS:
            raise BootFailed(
                f"image {image.ref or image.digest} has {len(image.layers)} layers; "
                f"a guest stacks at most {MAX_LAYERS}"
            )
        return kernel, image

    @staticmethod
    def _size(workload_id: str, spec: BootSpec) -> VmSize:
        """The guest's vCPUs and memory for ``spec`` (logged when memory is floored)."""
        size = vm_size(spec.vcpus, spec.mem_limit)
        if size.floored:
            log.info(
                "%s: %s of memory asked, the guest gets the kernel's floor of %d MiB",
                workload_id,
                spec.mem_limit,
                size.mem_mib,
            )
        return size

    async def _acquire_layers(self, image: OciImage) -> tuple[Path, ...]:
        """The erofs files of ``image``'s layers, held for the guest (``BootFailed`` if not)."""
        try:
            return await self.layer_files.acquire_all(image.layers)
        except BerthError as error:
            raise BootFailed(f"layers of {image.ref or image.digest}: {error}") from None

    async def _boot(
        self,
        attempt: _Attempt,
        workload_id: str,
        spec: BootSpec,
        image: OciImage,
        *,
        kernel: Path,
        size: VmSize,
        layers: tuple[Path, ...],
    ) -> tuple[MicroVM, Path | None]:
        """Make the guest's files, launch it and wait until its workload runs; its QEMU and
        console log path.  What is made is recorded in ``attempt`` as soon as it exists."""
        scratch = attempt.scratch = self._make_scratch(workload_id)
        upper = await self._upper_disk(scratch, spec.disk_limit)
        nonce = new_nonce()
        initrd = await self._write_initrd(
            scratch, nonce, workload_id, spec, image, size=size, layers=len(layers), upper=upper
        )
        console = _console_of(scratch, nonce)
        argv = qemu_argv(
            self.qemu,
            kernel=kernel,
            initrd=initrd,
            accel=self.accel,
            size=size,
            cmdline=self.cmdline,
            layers=layers,
            upper=upper,
            console=console,
        )
        vm, console_path = await self._launch(attempt, argv, nonce, workload_id, console)
        await self._wait_running(vm, spec, image)
        return vm, console_path

    def _make_scratch(self, workload_id: str) -> Path:
        """A new scratch directory for one guest under ``work_dir``, named with this process's
        pid (see :meth:`_remove_orphans`)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        prefix = f"{file_stem(workload_id)[:40]}.{os.getpid()}."
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.work_dir))

    async def _write_initrd(
        self,
        scratch: Path,
        nonce: str,
        workload_id: str,
        spec: BootSpec,
        image: OciImage,
        *,
        size: VmSize,
        layers: int,
        upper: Path | None,
    ) -> Path:
        """The guest's initramfs: berth's, with this boot's configuration added."""
        config = GuestConfig(
            nonce=nonce,
            command=spec.command,
            env={**image.config.environment(), **spec.env},
            layers=layers,
            upper_disk=upper is not None,
            tmpfs_size=spec.disk_limit or (size.mem_mib * MiB) // 2,
            hostname=_hostname(workload_id),
            workdir=_workdir(image.config.working_dir),
            user=_user(image.config.user),
        )
        initrd = scratch / "initrd"
        await asyncio.to_thread(write_initrd, self.files.initramfs, config, initrd)
        return initrd

    def _processes(self, scratch: Path) -> ProcessRuntime:
        """The process runtime one guest's QEMU runs under (its messages in ``scratch``)."""
        return ProcessRuntime(
            stop_grace_s=self.stop_grace_s,
            log_dir=scratch,
            state_dir=self.state_dir,
            orphan_grace_s=self.orphan_grace_s,
        )

    async def _launch(
        self,
        attempt: _Attempt,
        argv: Sequence[str],
        nonce: str,
        workload_id: str,
        console: GuestConsole,
    ) -> tuple[MicroVM, Path | None]:
        """Start QEMU under its supervisor, with its console copied to the workload's log, if
        any; the console log is closed if the launch does not happen (a missing QEMU is a
        ``BootFailed``).  What a restarted agent needs to find the guest is recorded in
        ``attempt.locator`` and in the scratch directory's :data:`GUEST_FILE`."""
        scratch = attempt.scratch
        assert scratch is not None
        log_file, console_path = self._console(workload_id)
        processes = self._processes(scratch)
        try:
            handle = await processes.start(
                BootSpec(name=workload_id, command=tuple(argv)), workload_id=workload_id
            )
        except BaseException as error:
            if log_file is not None:
                log_file.close()
            if isinstance(error, BootFailed):
                raise BootFailed(f"cannot run {self.qemu}: {error.reason}") from None
            raise
        assert handle.locator is not None and handle.pid is not None
        attempt.locator = {
            **handle.locator,
            "nonce": nonce,
            "scratch": str(scratch),
            "socket": str(console.socket),
            "layers": ",".join(attempt.layers),
        }
        atomic_write(
            scratch / GUEST_FILE, json.dumps({"workload_id": workload_id, **attempt.locator})
        )
        vm = self._vm(processes, handle, nonce, console, log_file)
        attempt.vm = vm
        return vm, console_path

    @staticmethod
    def _vm(
        processes: ProcessRuntime,
        handle: WorkloadHandle,
        nonce: str,
        console: GuestConsole,
        console_log: IO[str] | None,
        *,
        adopted: bool = False,
    ) -> MicroVM:
        """The guest whose QEMU runs as ``handle`` under ``processes`` (started here, or
        ``adopted`` from an agent that died), killed through its supervisor."""
        workload_id = handle.id
        return MicroVM(
            handle.pid or 0,
            nonce,
            console,
            _returncode(handle),
            lambda: processes.kill(workload_id),
            console_log=console_log,
            stderr=processes.log_of(workload_id),
            adopted=adopted,
        )

    async def _wait_running(self, vm: MicroVM, spec: BootSpec, image: OciImage) -> None:
        """Wait until the guest's init reports the workload running; ``BootFailed`` with the
        init's reason, or after ``boot_timeout_s``."""
        try:
            await asyncio.wait_for(asyncio.shield(vm.running), self.boot_timeout_s)
        except GuestBootFailed as failed:
            raise BootFailed(self._reason(failed.reason, spec, image)) from None
        except TimeoutError:
            raise BootFailed(
                f"the guest did not start its workload within {self.boot_timeout_s:g} s"
            ) from None

    async def _abandon(self, attempt: _Attempt) -> None:
        """Undo a start that ended early: kill its QEMU and wait for it, then remove its
        scratch and release its layers — the cleanup even when the wait is cancelled too
        (QEMU has had its SIGKILL)."""
        try:
            if attempt.vm is not None:
                attempt.vm.kill()
                with contextlib.suppress(Exception):
                    await attempt.vm.wait()
        finally:
            self._cleanup(attempt.scratch, attempt.layers)

    def _adopt(self, guest: _Guest) -> None:
        """Keep a running guest and watch for its end."""
        workload = guest.workload
        self._guests[workload.id] = guest
        watcher = asyncio.get_running_loop().create_task(
            self._watch(guest), name=f"berth-microvm-{workload.id}"
        )
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    def _image(self, ref: str | None) -> OciImage:
        try:
            return read_layout(self.images, ref=ref)
        except Invalid as error:
            which = "the only image" if ref is None else f"image {ref!r}"
            raise BootFailed(f"{which} of {self.images}: {error}") from None

    async def _upper_disk(self, scratch: Path, disk_limit: int | None) -> Path | None:
        if disk_limit is None or disk_limit < MIN_UPPER_DISK:
            return None
        mkfs = shutil.which("mkfs.ext4")
        if mkfs is None:
            raise BootFailed("mkfs.ext4 is not installed: apt-get install e2fsprogs")
        upper = scratch / "upper.img"
        with open(upper, "wb") as file:
            file.truncate(disk_limit)
        process = await asyncio.create_subprocess_exec(
            mkfs,
            "-q",
            "-F",
            "-O",
            "^has_journal",
            "-m",
            "0",
            "-E",
            "lazy_itable_init=1,nodiscard",
            str(upper),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            said, _ = await process.communicate()
        except BaseException:  # cancelled: the guest will not need it, nor its scratch
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            raise
        if process.returncode != 0:
            detail = said.decode("utf-8", "replace").strip().splitlines()
            raise BootFailed(f"cannot make the upper disk: {detail[-1] if detail else '?'}")
        return upper

    def _console(self, workload_id: str) -> tuple[IO[str] | None, Path | None]:
        if self.log_dir is None:
            return None, None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"{file_stem(workload_id)}.log"
        return open(path, "a", encoding="utf-8"), path  # the guest closes it

    @staticmethod
    def _reason(said: str, spec: BootSpec, image: OciImage) -> str:
        word, _, rest = said.partition(" ")
        if word == "not-found":
            return f"command not found: {spec.command[0]!r}"
        if word == "module":
            return f"the guest kernel could not load module {rest}: berth microvm setup"
        if word == "mount" and rest.startswith("layer-"):
            index = int(rest.removeprefix("layer-")) if rest[6:].isdigit() else -1
            which = image.layers[index].digest if 0 <= index < len(image.layers) else rest
            return f"the guest could not mount layer {which}"
        if word == "disks":
            return f"the guest found only {rest} of its disks"
        if word in ("user", "group"):
            return f"the image's user {image.config.user!r} is not in its /etc/passwd or /etc/group"
        return said

    async def _watch(self, guest: _Guest) -> None:
        workload = guest.workload
        try:
            end = await workload.vm.wait()
            status = _status(end, guest.stop_requested)
            workload.oom_kills = end.oom_kills
        except Exception as error:  # the console could not be read: the guest is lost
            log.error("microVM %s: %s", workload.id, error)
            workload.vm.kill()
            status = WorkloadExit(signal=signal.SIGKILL, stopped=guest.stop_requested)
        if workload.oom_kills:
            log.warning(
                "microVM %s: the guest's OOM killer ran %d time(s)", workload.id, workload.oom_kills
            )
        self._guests.pop(workload.id, None)
        self._record_end(workload.id, status)
        self._cleanup(guest.scratch, guest.layers)
        if workload._end(status):
            self._listeners.notify(workload)

    def _record_end(self, workload_id: str, status: WorkloadExit) -> None:
        """Make the supervisor's exit record (QEMU's end) the guest's: how its workload
        ended, so :meth:`ended` answers it after its scratch directory is gone."""
        if self.state_dir is None:
            return
        files = self._host.files(workload_id)
        if files is None or not files.exit.exists():
            return
        record = read_record(files.exit) or {}
        ended = {"code": status.code} if status.code is not None else {"signal": status.signal}
        with contextlib.suppress(OSError):
            kept = {key: value for key, value in record.items() if key not in ("code", "signal")}
            atomic_write(files.exit, json.dumps({**kept, **ended, "qemu": record}))

    def _cleanup(self, scratch: Path | None, digests: tuple[str, ...]) -> None:
        if scratch is not None:
            socket = _console_of(scratch, _nonce_in(scratch)).socket
            if socket.parent != scratch:  # a socket kept outside: its own file
                socket.unlink(missing_ok=True)
            shutil.rmtree(scratch, ignore_errors=True)
        for digest in digests:
            try:
                self.layer_files.release(digest)
            except BerthError as error:
                log.error("releasing layer %s: %s", digest, error)

    async def stop(self, workload_id: str, *, grace_s: float | None = None) -> None:
        """Ask the guest to stop its workload; kill QEMU after ``grace_s`` (else the
        configured ``stop_grace_s``); wait."""
        grace = stop_grace(grace_s, self.stop_grace_s)
        guest = self._guests.get(workload_id)
        if guest is None or guest.workload.done:
            return
        guest.stop_requested = True
        workload = guest.workload
        await workload.vm.request_stop()
        await end_within_grace(workload, grace, workload.vm.kill)

    # -- finding guests again after a restart -----------------------------------------------
    def adopt(
        self, workload_id: str, spec: BootSpec, locator: dict[str, Any] | None
    ) -> WorkloadHandle | None:
        """Watch (and be able to stop) a guest another agent on this state directory started,
        found by ``locator`` (its workload's, in the journal): its QEMU's supervisor must
        still run (pid and start time, through a pidfd), its image must still name the
        layers it booted from and their files must be here; ``None`` otherwise (a guest that
        runs but cannot be adopted is killed)."""
        found = _located(locator)
        if found is None or workload_id in self._guests or workload_id in self._starting:
            return None
        scratch, nonce, socket, digests = found
        assert locator is not None
        processes = self._processes(scratch)
        handle = processes.adopt(workload_id, spec, locator)
        if handle is None:
            return None
        held = self._hold_layers(workload_id, spec, digests)
        if held is None:
            processes.kill(workload_id)
            return None
        image, layers = held
        console = GuestConsole(socket, scratch / "console.log")
        log_file, console_path = self._console(workload_id)
        vm = self._vm(processes, handle, nonce, console, log_file, adopted=True)
        workload = MicrovmWorkload(
            workload_id,
            spec,
            vm,
            accel=self.accel,
            size=vm_size(spec.vcpus, spec.mem_limit),
            image=image,
            started_at=time.monotonic(),
            console_log=console_path,
            locator=dict(locator),
        )
        self._adopt(_Guest(workload, scratch, layers))
        log.info("adopted microVM %s (QEMU %s)", workload_id, handle.pid)
        return workload

    def _hold_layers(
        self, workload_id: str, spec: BootSpec, digests: tuple[str, ...]
    ) -> tuple[OciImage, tuple[str, ...]] | None:
        """Hold the layer files an adopted guest booted from; ``None`` (nothing held) when
        its image no longer names them or a file is gone."""
        try:
            image = self._image(spec.image)
        except BootFailed as error:
            log.warning("microVM %s is not adopted: %s", workload_id, error.reason)
            return None
        if tuple(layer.digest for layer in image.layers) != digests:
            log.warning("microVM %s is not adopted: its image's layers changed", workload_id)
            return None
        held: list[str] = []
        for layer in image.layers:
            if self.layer_files.hold(layer) is None:
                for digest in held:
                    self.layer_files.release(digest)
                log.warning(
                    "microVM %s is not adopted: layer %s is gone", workload_id, layer.digest
                )
                return None
            held.append(layer.digest)
        return image, tuple(held)

    def ended(
        self, workload_id: str, locator: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """How a guest that ended while no agent watched it ended: the exit status its init
        printed in its console log (``code``, or ``signal`` for the shell's 128 + N), else its
        supervisor's record of QEMU's end; ``None`` if neither is known.  What the guest
        left (its scratch directory) is removed."""
        found = _located(locator)
        record = self._host.ended(workload_id)
        if found is None:
            return record
        scratch, nonce, _, _ = found
        status, oom_kills = console_status(scratch / "console.log", nonce)
        self._cleanup(scratch, ())
        if status is None:
            return record
        ended = _status(GuestEnd(status, oom_kills, None, 0, False), False)
        result: dict[str, Any] = (
            {"code": ended.code} if ended.code is not None else {"signal": ended.signal}
        )
        if oom_kills:
            result["lost"] = f"the guest's OOM killer ran {oom_kills} time(s)"
        return result

    def abandon(self, workload_id: str, locator: dict[str, Any] | None) -> None:
        """Kill a guest of this state directory that will not be adopted, if it runs, and
        remove what it left."""
        self._host.abandon(workload_id, locator)
        found = _located(locator)
        if found is not None:
            self._cleanup(found[0], ())

    async def aclose(self) -> None:
        """Stop every guest."""
        await asyncio.gather(*(self.stop(workload.id) for workload in self.list()))

    def __repr__(self) -> str:
        return f"MicrovmRuntime(running={len(self._guests)}, accel={self.accel!r})"
