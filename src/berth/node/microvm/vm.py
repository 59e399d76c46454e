"""One running guest seen from the host: its QEMU, its console, its protocol lines.

This module owns the host side of a microVM's life once QEMU runs: reading the serial
console — from the log file QEMU writes it to (:class:`~berth.node.microvm.qemu.GuestConsole`),
so the host never blocks the guest and a restarted agent reads it again from the start —
recognising the init's protocol lines (``berth:<nonce>:<event>``, see
:mod:`berth.node.microvm.initramfs`), asking the init to stop (a ``berth-stop`` line written
to the console's socket) and killing QEMU when asked.  Starting QEMU is not its job:
:mod:`berth.node.microvm.machine` runs it under a supervisor, which is what lets a guest
outlive its agent for the orphan grace and be adopted.  What this module reports
is raw: the exit status the init printed, the OOM kills it counted, the reason a boot failed,
how QEMU ended.  Turning that into a workload's end is :mod:`berth.node.microvm.machine`'s job.

:func:`probe` boots a guest that only says hello: ``berth microvm setup`` and the runtime use
it to find out whether KVM can run the guest kernel on this host (a nested hypervisor may
accept ``/dev/kvm`` and still fail every guest), falling back to software emulation.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from berth.defaults import MICROVM_QEMU
from berth.node.microvm.initramfs import GuestConfig, config_archive
from berth.node.microvm.paths import Accel, GuestFiles
from berth.node.microvm.qemu import (
    GuestConsole,
    host_tsc_khz,
    kernel_cmdline,
    qemu_argv,
    vm_size,
)

__all__ = [
    "GuestBootFailed",
    "GuestEnd",
    "MicroVM",
    "console_status",
    "new_nonce",
    "probe",
    "write_initrd",
]

log = logging.getLogger("berth.microvm")

MAX_LINE = 4096
"""Console lines longer than this are cut into pieces (a guest could print without newlines)."""
OUTPUT_LINES = 1000
"""How many lines of a workload's console output a guest keeps for its caller."""
CONSOLE_POLL_S = 0.02
"""How often a guest's console log is read for new lines while its QEMU runs."""
STOP_CONNECT_S = 2.0
"""How long a stop waits to connect to a guest's console socket."""
_KERNEL_LINE = re.compile(r"\[\s*\d+\.\d+\] ")
_PR_SET_PDEATHSIG = 1


def new_nonce() -> str:
    """A fresh random tag for one boot's protocol lines."""
    return secrets.token_hex(8)


def write_initrd(base: Path, config: GuestConfig, target: Path) -> None:
    """``target`` = the base initramfs followed by this boot's config archive."""
    with open(target, "wb") as out, open(base, "rb") as source:
        shutil.copyfileobj(source, out, 1 << 20)
        out.write(config_archive(config))


@dataclass(frozen=True, slots=True)
class GuestEnd:
    """How a guest ended, as the host saw it.

    ``status`` is the exit status the init reported for the workload (the shell's: 128 + N
    for a workload killed by signal N), ``None`` when the guest never reported one (it was
    killed, crashed, or failed to boot — then ``boot_failed`` says why); ``oom_kills`` is the
    guest kernel's OOM-kill count; ``returncode`` is QEMU's own; ``killed`` says the host
    killed QEMU.
    """

    status: int | None
    oom_kills: int
    boot_failed: str | None
    returncode: int
    killed: bool


def _pdeathsig() -> Callable[[], None] | None:
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def apply() -> None:  # in the child between fork and exec: one call, nothing else
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return apply


class MicroVM:
    """One guest's QEMU seen through its console (see the module docstring).

    ``pid`` is QEMU's; ``ended`` completes with QEMU's exit status (negative: the signal that
    killed it) once it has ended; ``kill`` kills it at once.  The console is read from its
    log file (:class:`~berth.node.microvm.qemu.GuestConsole`), from the start — for a guest
    another process started (``adopted``), its protocol lines say again how far it got — and
    the stop request written to its socket.

    ``running`` completes when the init reports the workload started (or fails with the boot
    failure's reason); ``output`` holds the workload's last :data:`OUTPUT_LINES` console lines
    (kernel messages included, protocol lines not), ``first_output_at`` the monotonic time of
    its first line.  ``console_log`` — a file receiving every console line read from now on
    (an adopted guest's earlier lines are not copied again); ``stderr`` — the file QEMU's own
    messages go to, read for a failure's reason.
    """

    def __init__(
        self,
        pid: int,
        nonce: str,
        console: GuestConsole,
        ended: Awaitable[int],
        kill: Callable[[], None],
        *,
        console_log: IO[str] | None = None,
        stderr: Path | None = None,
        adopted: bool = False,
    ) -> None:
        self.pid = pid
        self.nonce = nonce
        self.console = console
        self.launched_at = time.monotonic()
        self.running_at: float | None = None
        self.first_output_at: float | None = None
        self.output: deque[str] = deque(maxlen=OUTPUT_LINES)
        self.status: int | None = None
        self.oom_kills = 0
        self.boot_failed: str | None = None
        self.killed = False
        self._kill = kill
        self._stderr = stderr
        self._console_log = console_log
        self._copy_from = _size(console.log) if adopted else 0
        self._prefix = f"berth:{nonce}:"
        self._first_output = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.running: asyncio.Future[None] = loop.create_future()
        self._end: asyncio.Future[GuestEnd] = loop.create_future()
        self._reader = loop.create_task(self._read(ended), name=f"berth-microvm-{pid}")

    # -- the console ------------------------------------------------------------------------
    async def _read(self, ended: Awaitable[int]) -> None:
        exited = asyncio.ensure_future(ended)
        offset, pending = 0, b""
        try:
            while True:
                finished = exited.done()  # asked before the read: nothing written after is lost
                chunk, offset = _read_from(self.console.log, offset)
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for raw in lines:
                        self._line(raw, offset)
                    while len(pending) > MAX_LINE:
                        self._line(pending[:MAX_LINE], offset)
                        pending = pending[MAX_LINE:]
                if finished:
                    break
                await asyncio.wait({exited}, timeout=CONSOLE_POLL_S)
            if pending:
                self._line(pending, offset)
            returncode = exited.result()
        except BaseException as error:
            exited.cancel()
            if not self.running.done():
                self.running.set_exception(error)
                self.running.exception()  # retrieved: the end reports it
            if not self._end.done():
                self._end.set_exception(error)
                self._end.exception()  # retrieved too: a start given up on waits no more
            raise
        finally:
            self._first_output.set()  # no more output will come: wake whoever waits for it
            if self._console_log is not None:
                with contextlib.suppress(OSError):
                    self._console_log.close()
        if not self.running.done():
            reason = self.boot_failed or self._qemu_failure(returncode)
            self.running.set_exception(GuestBootFailed(reason))
            self.running.exception()
        self._end.set_result(
            GuestEnd(self.status, self.oom_kills, self.boot_failed, returncode, self.killed)
        )

    def _qemu_failure(self, returncode: int) -> str:
        said = "; ".join(line for line in _last_lines(self._stderr) if line)
        if said:
            return f"qemu: {said}"
        if self.killed:
            return "the guest was killed before its workload started"
        return f"the guest ended before its workload started (qemu exit status {returncode})"

    def _line(self, raw: bytes, offset: int) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if self._console_log is not None and offset > self._copy_from:
            with contextlib.suppress(OSError):
                self._console_log.write(line + "\n")
                self._console_log.flush()
        if line.startswith(self._prefix):
            self._event(line[len(self._prefix) :].split())
            return
        if self.running_at is None or self.status is not None:
            return  # boot chatter before the workload, or after it ended
        self.output.append(line)
        if self.first_output_at is None and not _KERNEL_LINE.match(line):
            self.first_output_at = time.monotonic()
            self._first_output.set()

    def _event(self, words: list[str]) -> None:
        if not words:
            return
        event, args = words[0], words[1:]
        if event == "running" and not self.running.done():
            self.running_at = time.monotonic()
            self.running.set_result(None)
        elif event == "boot-failed":
            self.boot_failed = " ".join(args) or "unknown"
        elif event == "exit" and args:
            with contextlib.suppress(ValueError):
                self.status = int(args[0])
                self.oom_kills = int(args[1]) if len(args) > 1 else 0

    # -- control ----------------------------------------------------------------------------
    async def request_stop(self) -> None:
        """Ask the init to ``SIGTERM`` the workload (it reports the exit and powers off): a
        ``berth-stop`` line written to the console's socket.  A socket that cannot be reached
        (QEMU ending) is no error: the stop's grace then kills it."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(str(self.console.socket)), STOP_CONNECT_S
            )
        except (OSError, TimeoutError) as error:
            log.info("microVM %d: cannot reach its console to stop it: %s", self.pid, error)
            return
        try:
            writer.write(b"berth-stop\n")
            await writer.drain()
            # keep the connection while QEMU takes the line in; what it echoes is dropped
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(65536), 0.2)
        except OSError as error:
            log.info("microVM %d: writing its stop request: %s", self.pid, error)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def kill(self) -> None:
        """Kill QEMU at once."""
        if not self._end.done():
            self.killed = True
            self._kill()

    async def first_output(self) -> float | None:
        """The monotonic time of the workload's first line, once there is one; ``None`` if
        the guest ended without printing any."""
        await self._first_output.wait()
        return self.first_output_at

    @property
    def ended(self) -> bool:
        return self._end.done()

    async def wait(self) -> GuestEnd:
        """How the guest ended, once QEMU has exited and its console is read to the end."""
        return await asyncio.shield(self._end)


def console_status(log_path: Path, nonce: str) -> tuple[int | None, int]:
    """The exit status and OOM kills a guest's console log reports (``(None, 0)`` if none):
    how a guest that ended while no agent read its console ended."""
    status, oom_kills = None, 0
    prefix = f"berth:{nonce}:exit "
    try:
        text = log_path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return None, 0
    for line in text.splitlines():
        if line.startswith(prefix):
            words = line[len(prefix) :].split()
            with contextlib.suppress(ValueError, IndexError):
                status = int(words[0])
                oom_kills = int(words[1]) if len(words) > 1 else 0
    return status, oom_kills


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> tuple[bytes, int]:
    """What ``path`` holds past ``offset`` (nothing if it does not exist yet), and the new
    offset."""
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            chunk = file.read(1 << 20)
    except OSError:
        return b"", offset
    return chunk, offset + len(chunk)


def _last_lines(path: Path | None, count: int = 20) -> list[str]:
    if path is None:
        return []
    try:
        with open(path, "rb") as file:
            file.seek(max(0, _size(path) - 8192))
            text = file.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line.rstrip()[:MAX_LINE] for line in text.splitlines()[-count:]]


class GuestBootFailed(Exception):
    """The guest ended (or QEMU failed) before its workload started.

    ``reason`` is the init's word for it (``not-found``, ``module erofs``, ``mount layer-2``)
    or what QEMU said; the runtime turns it into a ``BootFailed`` a person can read.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def probe(
    files: GuestFiles,
    accel: Accel,
    *,
    qemu: str = MICROVM_QEMU,
    timeout_s: float = 60.0,
) -> tuple[bool, str]:
    """Boot a guest that only reports in, under ``accel``: ``(True, "booted in 1.9 s")`` or
    ``(False, why)``.  Blocking (a setup step, or once when a runtime starts without a
    recorded probe); leaves no process or file behind."""
    kernel = files.kernel
    if kernel is None or not kernel.is_file() or not files.initramfs.is_file():
        return False, "no guest kernel or initramfs: berth microvm setup"
    if accel == "kvm" and not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "no usable /dev/kvm"
    nonce = new_nonce()
    with tempfile.TemporaryDirectory(prefix="berth-probe-") as scratch:
        initrd = Path(scratch) / "initrd"
        write_initrd(files.initramfs, GuestConfig(nonce=nonce, probe=True), initrd)
        argv = qemu_argv(
            qemu,
            kernel=kernel,
            initrd=initrd,
            accel=accel,
            size=vm_size(1, None),
            cmdline=kernel_cmdline(host_tsc_khz()),
        )
        started = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
                start_new_session=True,
                preexec_fn=_pdeathsig(),
                check=False,
            )
        except OSError as error:
            return False, f"cannot run {qemu}: {error.strerror or error}"
        except subprocess.TimeoutExpired:  # run() has killed and reaped it
            return False, f"no answer from the guest within {timeout_s:g} s"
    elapsed = time.monotonic() - started
    console = done.stdout.decode("utf-8", "replace")
    if f"berth:{nonce}:probe-ok" in console and done.returncode == 0:
        return True, f"booted in {elapsed:.1f} s"
    for line in console.splitlines():
        if line.startswith(f"berth:{nonce}:boot-failed"):
            return False, f"the guest's init failed: {line.split(maxsplit=1)[-1]}"
    said = [line.strip() for line in done.stderr.decode("utf-8", "replace").splitlines()]
    first = next((line for line in said if line), "")
    first = first.removeprefix(f"{qemu}: ").removeprefix("error: ")[:120]
    return False, f"qemu: {first}" if first else f"no answer (qemu exit status {done.returncode})"
