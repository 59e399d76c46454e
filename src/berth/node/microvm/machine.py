"""One guest's QEMU run as a supervised process: launched, found again, and how it ended.

**Guests outlive their agent, and are adopted** (issue 20).  QEMU runs under a supervisor of
its own, exactly as a process workload does (a :class:`~berth.node.runtime.process.ProcessRuntime`
per guest: ``<state_dir>/workloads/<id>.run`` and ``.exit`` beside the node's journal entry),
and its serial console is a socket QEMU serves plus a log file QEMU writes all of it to
(:class:`~berth.node.microvm.qemu.GuestConsole`): nothing ties the guest to the agent's
process.  When the agent dies the guest runs on for ``orphan_grace_s``, then its supervisor
kills QEMU (with a state directory: when no live agent has owned the directory for that long;
without one: when the agent that started it is gone).  A restarted agent **adopts** a guest
whose supervisor still runs (the supervisor's pid and start time, through a pidfd; its console
log read again from the start, so the protocol lines say how far it got), and for one that
ended while it was down reads the exit status the init printed in that log.  The workload's
locator in the journal holds the supervisor's and QEMU's pid and start time, the boot's nonce,
its scratch directory and socket, and its layers' digests (:func:`located` reads it back).

This module owns that side of a guest: :class:`GuestMachines` launches each guest's QEMU under
its supervisor and records where to find it again (:meth:`~GuestMachines.launch`), copies its
console to the workload's log, records how its workload ended for a later agent, reads how a
guest that ended unwatched ended (:meth:`~GuestMachines.ended`), kills one that will not be
adopted, and removes the scratch directories no guest will use again; :func:`guest_vm` is the
:class:`~berth.node.microvm.vm.MicroVM` over a supervised QEMU.  It also turns what a guest
reports into the runtime port's terms: a failed boot's reason (:func:`wait_running`) and the
workload's exit (:func:`workload_exit` — the shell's 128 + N for a workload killed by signal N
is reported as that signal).  Which guests run, their layers and their handles are the
runtime driver's (:mod:`berth.node.runtime.microvm`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from berth.node.microvm.qemu import GuestConsole
from berth.node.microvm.scratch import GUEST_FILE, leftovers, remove_scratch
from berth.node.microvm.vm import GuestBootFailed, GuestEnd, MicroVM, console_status
from berth.node.runtime.port import BootFailed, BootSpec, WorkloadExit, WorkloadHandle
from berth.node.runtime.process import ProcessRuntime, process_identity
from berth.node.runtime.supervisor import alive, atomic_write, log_path, read_record
from berth.oci import OciImage

__all__ = [
    "Attempt",
    "GuestMachines",
    "boot_failure",
    "guest_vm",
    "located",
    "wait_running",
    "workload_exit",
]

log = logging.getLogger("berth.microvm")


@dataclass
class Attempt:
    """What a start has made so far — the layers it holds, its scratch directory, its QEMU —
    so that a failure or cancellation at any step undoes exactly that (the runtime driver's
    ``_abandon``)."""

    layers: tuple[str, ...]
    scratch: Path | None = None
    vm: MicroVM | None = None
    locator: dict[str, Any] | None = None


class GuestMachines:
    """The QEMUs of one runtime's guests, each run by a process runtime of its own (see the
    module docstring).

    ``qemu`` — the binary (named in a launch's failure); ``stop_grace_s``, ``state_dir`` and
    ``orphan_grace_s`` — the supervisors'; ``log_dir`` — where each workload's console goes
    (``<id>.log``), if anywhere.
    """

    def __init__(
        self,
        qemu: str,
        *,
        stop_grace_s: float,
        log_dir: Path | None,
        state_dir: Path | None,
        orphan_grace_s: float,
    ) -> None:
        # the state directory's supervisor records and journal files, as the process runtime
        # that runs each guest's QEMU keeps them (it checks both arguments)
        self._host = ProcessRuntime(state_dir=state_dir, orphan_grace_s=orphan_grace_s)
        self.qemu = qemu
        self.stop_grace_s = stop_grace_s
        self.log_dir = log_dir
        self.state_dir = state_dir
        self.orphan_grace_s = orphan_grace_s

    def processes(self, scratch: Path) -> ProcessRuntime:
        """The process runtime one guest's QEMU runs under (its messages in ``scratch``)."""
        return ProcessRuntime(
            stop_grace_s=self.stop_grace_s,
            log_dir=scratch,
            state_dir=self.state_dir,
            orphan_grace_s=self.orphan_grace_s,
        )

    def console_log(self, workload_id: str) -> tuple[IO[str] | None, Path | None]:
        """The workload's console log, opened to append (the guest closes it), and its path;
        ``(None, None)`` without a log directory."""
        if self.log_dir is None:
            return None, None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = log_path(self.log_dir, workload_id)
        return open(path, "a", encoding="utf-8"), path  # the guest closes it

    async def launch(
        self,
        attempt: Attempt,
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
        log_file, console_path = self.console_log(workload_id)
        processes = self.processes(scratch)
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
        vm = guest_vm(processes, handle, nonce, console, log_file)
        attempt.vm = vm
        return vm, console_path

    def record_end(self, workload_id: str, status: WorkloadExit) -> None:
        """Make the supervisor's exit record (QEMU's end) the guest's: how its workload
        ended, so a later agent reads it after the guest's scratch directory is gone."""
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

    def remove_orphans(self, work_dir: Path) -> None:
        """Delete scratch directories left by a process that has died whose guest no longer
        runs either (its supervisor, named in the directory's :data:`GUEST_FILE`, is gone)
        and that the node's journal no longer names; a live process's, a guest's that a
        restarted agent may adopt, or one whose end it is to read, are kept."""
        for scratch, pid in leftovers(work_dir):
            if _guest_runs(scratch) or self._journaled(scratch):
                continue
            log.info("removing %s, left by process %d", scratch, pid)
            shutil.rmtree(scratch, ignore_errors=True)

    def ended(self, workload_id: str, locator: dict[str, Any] | None) -> dict[str, Any] | None:
        """How a guest that ended while no agent watched it ended: the exit status its init
        printed in its console log (``code``, or ``signal`` for the shell's 128 + N), else its
        supervisor's record of QEMU's end; ``None`` if neither is known.  What the guest
        left (its scratch directory) is removed."""
        found = located(locator)
        record = self._host.ended(workload_id)
        if found is None:
            return record
        scratch, nonce, _, _ = found
        status, oom_kills = console_status(scratch / "console.log", nonce)
        remove_scratch(scratch)
        if status is None:
            return record
        ended = workload_exit(GuestEnd(status, oom_kills, None, 0, False), False)
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
        found = located(locator)
        if found is not None:
            remove_scratch(found[0])

    def _journaled(self, scratch: Path) -> bool:
        """Whether the node's journal still names the guest of ``scratch``: then a restarted
        agent reads how it ended there, which removes it."""
        record = read_record(scratch / GUEST_FILE) or {}
        workload_id = record.get("workload_id")
        files = self._host.files(str(workload_id))
        return isinstance(workload_id, str) and files is not None and files.entry.exists()


def _guest_runs(scratch: Path) -> bool:
    """Whether the supervisor a scratch directory's :data:`GUEST_FILE` names still runs."""
    found = process_identity(read_record(scratch / GUEST_FILE) or {}, "supervisor")
    return found is not None and alive(*found)


def guest_vm(
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


async def _returncode(handle: WorkloadHandle) -> int:
    """QEMU's exit status once its process has ended (negative: the signal that ended it)."""
    ended = await handle.wait()
    if ended.code is not None:
        return ended.code
    return -(ended.signal or signal.SIGKILL)


def located(locator: dict[str, Any] | None) -> tuple[Path, str, Path, tuple[str, ...]] | None:
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


async def wait_running(vm: MicroVM, spec: BootSpec, image: OciImage, timeout_s: float) -> None:
    """Wait until the guest's init reports the workload running; ``BootFailed`` with the
    init's reason (:func:`boot_failure`), or after ``timeout_s``."""
    try:
        await asyncio.wait_for(asyncio.shield(vm.running), timeout_s)
    except GuestBootFailed as failed:
        raise BootFailed(boot_failure(failed.reason, spec, image)) from None
    except TimeoutError:
        raise BootFailed(f"the guest did not start its workload within {timeout_s:g} s") from None


def boot_failure(said: str, spec: BootSpec, image: OciImage) -> str:
    """Why a boot failed, in the workload's terms, from the reason the guest's init gave."""
    word, _, rest = said.partition(" ")
    if word == "not-found":
        return f"command not found: {image.config.args(spec.command)[0]!r}"
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


def workload_exit(end: GuestEnd, stopped: bool) -> WorkloadExit:
    """How the workload of a guest that ended as ``end`` ended: the exit status its init
    reported (the shell's 128 + N as signal N), else how QEMU ended (``stopped`` if asked)."""
    if end.status is not None:
        return WorkloadExit.from_status(end.status, stopped=stopped)
    if end.killed:
        return WorkloadExit(signal=signal.SIGKILL, stopped=stopped)
    if end.returncode < 0:
        return WorkloadExit(signal=-end.returncode, stopped=stopped)
    return WorkloadExit(stopped=stopped)
