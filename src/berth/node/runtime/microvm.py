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
* **its disk budget as the writable upper layer** (an ext4 disk of ``disk_limit`` bytes, or a
  ``tmpfs`` under :data:`MIN_UPPER_DISK`) and **its command as the guest's main process**, in
  the stacked image with the image's environment, ``WorkingDir`` and ``User``: the guest's
  files in its scratch directory, :mod:`berth.node.microvm.scratch`.  A program the image lacks
  is a :class:`BootFailed` (``command not found: 'x'``), as with the process runtime.

``start`` returns once the guest's init reports the workload running (a real boot: ~2 s
under software emulation, more on a loaded host; ``boot_timeout_s`` bounds it).  The exit
status the init reports becomes the :class:`WorkloadExit` — the shell's 128 + N for a
workload killed by signal N is reported as that signal — and the console output is kept
(:attr:`MicrovmWorkload.output`, and ``<log_dir>/<id>.log`` when a log directory is given).
``stop`` asks the init to ``SIGTERM`` the workload (a line on the serial console), waits the
stop's ``grace_s`` (else ``stop_grace_s``) for the guest to power off, then kills QEMU.  A
guest's scratch directory (its initramfs copy, upper disk, console log and socket) is removed
when it ends, and its layers are released to the node's cache.

**Guests outlive their agent, and are adopted** (issue 20): QEMU runs under a supervisor of
its own, as a process workload does, so a restarted agent adopts a guest that still runs
(:meth:`MicrovmRuntime.adopt`: its supervisor found again, its layer files held again) and
reads how one that ended while it was down ended (:meth:`MicrovmRuntime.ended`) —
:mod:`berth.node.microvm.machine` runs the guests' QEMUs.

This module holds the driver itself: its configuration, the guests it runs and their layers,
and the runtime port's calls (:class:`MicrovmRuntime`), and the handle it gives for each
workload (:class:`MicrovmWorkload`).

Acceleration: ``kvm`` only when a probe guest booted under it (``berth microvm setup``
records the probe; ``auto`` reads it, or probes once), ``tcg`` otherwise; :attr:`labels`
states it for the node's snapshot (``microvm.accel``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import KW_ONLY, InitVar, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from berth.defaults import (
    KVM_PROBE_TIMEOUT_S,
    MICROVM_BOOT_TIMEOUT_S,
    MICROVM_QEMU,
    MICROVM_STOP_GRACE_S,
    ORPHAN_GRACE_S,
)
from berth.errors import BerthError, Invalid
from berth.node.config import AccelChoice, MicrovmSection
from berth.node.layer_files import LayerFiles
from berth.node.microvm.machine import (
    Attempt,
    GuestMachines,
    guest_vm,
    located,
    wait_running,
    workload_exit,
)
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
from berth.node.microvm.scratch import (
    MIN_UPPER_DISK,
    console_of,
    make_initrd,
    make_scratch,
    remove_scratch,
    upper_disk,
)
from berth.node.microvm.vm import MicroVM, new_nonce, probe
from berth.node.runtime.port import (
    BootFailed,
    BootSpec,
    RuntimeDriver,
    WorkloadExit,
    WorkloadHandle,
    end_within_grace,
)
from berth.node.runtime.supervisor import log_path
from berth.oci import OciImage, read_layout
from berth.validation import shown

__all__ = [
    "MIN_UPPER_DISK",
    "AgentSettings",
    "MicrovmRuntime",
    "MicrovmWorkload",
    # the helpers tests check directly, kept importable from here
]

log = logging.getLogger("berth.microvm")


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

    :class:`~berth.node.config.AgentConfig` is one; the driver names only what it reads.
    """

    @property
    def node(self) -> _NodeSettings: ...

    @property
    def agent(self) -> _AgentKnobs: ...

    @property
    def microvm(self) -> MicrovmSection: ...


@dataclass(eq=False, repr=False)
class MicrovmWorkload(WorkloadHandle):
    """A workload running in a guest: the port's handle plus what the guest reports.

    ``accel`` and ``size`` say how the guest runs; ``image`` is the image it booted;
    ``output`` its last console lines; ``first_output_at``/``started_at`` monotonic times
    (``started_at`` is when ``start`` was called: their difference is the time to first
    output); ``boot_seconds`` from QEMU's launch to the workload running; ``oom_kills`` the
    guest kernel's OOM kills; ``console_log`` the log file, if any.
    """

    workload_id: InitVar[str]
    spec: InitVar[BootSpec]
    vm: MicroVM
    _: KW_ONLY
    accel: Accel
    size: VmSize
    image: OciImage
    started_at: float
    console_log: Path | None
    locator: InitVar[dict[str, Any]]
    oom_kills: int = field(default=0, init=False)

    def __post_init__(self, workload_id: str, spec: BootSpec, locator: dict[str, Any]) -> None:
        super().__init__(workload_id, spec, pid=self.vm.pid)
        self.locator = locator  # how a restarted agent finds the guest (module docstring)

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


class MicrovmRuntime(RuntimeDriver):
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
        qemu: str = MICROVM_QEMU,
        stop_grace_s: float = MICROVM_STOP_GRACE_S,
        boot_timeout_s: float = MICROVM_BOOT_TIMEOUT_S,
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
        super().__init__(stop_grace_s)
        grace = self.stop_grace_s
        self.files = files if files is not None else GuestFiles.at(None)
        self.layer_files = layers
        self.images = Path(images)
        self.qemu = qemu
        self.boot_timeout_s = float(boot_timeout_s)
        self.work_dir = Path(work_dir) if work_dir is not None else self.files.data_dir / "run"
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._machines = GuestMachines(
            qemu,
            stop_grace_s=grace,
            log_dir=self.log_dir,
            state_dir=state_dir,
            orphan_grace_s=orphan_grace_s,
        )
        self.state_dir = state_dir
        self.orphan_grace_s = orphan_grace_s
        self.accel, self.accel_detail = self._choose_accel(accel)
        self.cmdline = kernel_cmdline(host_tsc_khz())
        self._guests: dict[str, _Guest] = {}
        self._starting: set[str] = set()
        self._watchers: set[asyncio.Task[None]] = set()
        self._machines.remove_orphans(self.work_dir)
        log.info("microVMs under %s (%s)", self.accel, self.accel_detail)

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
    def log_of(self, workload_id: str) -> Path | None:
        """Where ``workload_id``'s console goes (with a ``log_dir``)."""
        return None if self.log_dir is None else log_path(self.log_dir, workload_id)

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
        attempt = Attempt(tuple(layer.digest for layer in image.layers))
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
        image = self._image(spec.image)
        args = image.config.args(spec.command)
        if not args:
            raise BootFailed("no command: the workload gives none and its image has no Cmd")
        if "=" in args[0]:
            raise BootFailed(f"a guest cannot run a program named with '=': {args[0]!r}")
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
        attempt: Attempt,
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
        scratch = attempt.scratch = make_scratch(self.work_dir, workload_id)
        upper = await upper_disk(scratch, spec.disk_limit)
        nonce = new_nonce()
        initrd = await make_initrd(
            self.files.initramfs,
            scratch,
            nonce,
            workload_id,
            spec,
            image,
            size=size,
            layers=len(layers),
            upper=upper,
        )
        console = console_of(scratch, nonce)
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
        vm, console_path = await self._machines.launch(attempt, argv, nonce, workload_id, console)
        await wait_running(vm, spec, image, self.boot_timeout_s)
        return vm, console_path

    async def _abandon(self, attempt: Attempt) -> None:
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

    async def _watch(self, guest: _Guest) -> None:
        workload = guest.workload
        try:
            end = await workload.vm.wait()
            status = workload_exit(end, guest.stop_requested)
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
        self._machines.record_end(workload.id, status)
        self._cleanup(guest.scratch, guest.layers)
        if workload._end(status):
            self._listeners.notify(workload)

    def _cleanup(self, scratch: Path | None, digests: tuple[str, ...]) -> None:
        if scratch is not None:
            remove_scratch(scratch)
        for digest in digests:
            try:
                self.layer_files.release(digest)
            except BerthError as error:
                log.error("releasing layer %s: %s", digest, error)

    async def stop(self, workload_id: str, *, grace_s: float | None = None) -> None:
        """Ask the guest to stop its workload; kill QEMU after ``grace_s`` (else the
        configured ``stop_grace_s``); wait."""
        grace = self._grace(grace_s)
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
        found = located(locator)
        if found is None or workload_id in self._guests or workload_id in self._starting:
            return None
        scratch, nonce, socket, digests = found
        assert locator is not None
        processes = self._machines.processes(scratch)
        handle = processes.adopt(workload_id, spec, locator)
        if handle is None:
            return None
        held = self._hold_layers(workload_id, spec, digests)
        if held is None:
            processes.kill(workload_id)
            return None
        image, layers = held
        console = GuestConsole(socket, scratch / "console.log")
        log_file, console_path = self._machines.console_log(workload_id)
        vm = guest_vm(processes, handle, nonce, console, log_file, adopted=True)
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
        return self._machines.ended(workload_id, locator)

    def abandon(self, workload_id: str, locator: dict[str, Any] | None) -> None:
        """Kill a guest of this state directory that will not be adopted, if it runs, and
        remove what it left."""
        self._machines.abandon(workload_id, locator)

    async def aclose(self) -> None:
        """Stop every guest."""
        await asyncio.gather(*(self.stop(workload.id) for workload in self.list()))

    def __repr__(self) -> str:
        return f"MicrovmRuntime(running={len(self._guests)}, accel={self.accel!r})"
