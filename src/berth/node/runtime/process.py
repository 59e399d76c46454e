"""The process runtime driver: one OS process group per workload, under its own supervisor.

**For development and tests: no image isolation.**  The workload is a host process; its
image is only a label (its layers are never used) and it sees the host's filesystem and
network.  What the driver does bound (issue 38): each workload runs in a scratch directory
of its own (``<scratch_dir>/<id>``, mode 0700, made by its supervisor before the start and
removed after the end; never the agent's or the caller's directory), with a minimal
environment — ``base_env`` (default: ``PATH`` only, the agent's or, for another user, the
standard one; the agent's environment may hold credentials) plus ``HOME`` set to the scratch
directory, overlaid with the spec's ``env`` — and as ``user`` (a :class:`RunAs`; the node's
configuration makes it ``nobody`` when the agent is root) instead of the agent's own
identity.  Real images, isolated, run under the ``container`` runtime
(:mod:`berth.node.runtime.container`).

Each workload is started by a small supervisor process of its own
(:mod:`berth.node.runtime.supervisor`, a bare interpreter), which starts the command as the
leader of its own process group; ``mem_limit`` is enforced as ``RLIMIT_AS`` (address space),
a coarse ceiling that needs no privileges (a cgroup v2 ``memory.max`` would bound resident
memory exactly, but needs a delegated cgroup).

Stopping a workload reaches every process it spawned: ``SIGTERM`` to its group, and once the
grace has run out (the stop's own ``grace_s``, else ``stop_grace_s``) ``SIGKILL`` to its whole
tree.  When the group leader ends, whatever it left behind — its group, and anything it
daemonised, which the supervisor (a child subreaper) inherits — is killed, so nothing
outlives the workload's reservation.  The runtime signals only its supervisor: the child it
has not reaped, or, for an adopted workload, through a pidfd — never a pid that may have
been recycled.

Across the agent's death (issue 20): with a ``state_dir`` each supervisor watches the agent
named in ``<state_dir>/agent.pid`` and its workload's journal entry (if a journal wrote one
before the start), and kills the workload when no live agent has owned the directory for
``orphan_grace_s`` (or the entry is gone);
without one it watches the agent that started it.  A restarted agent finds a workload again
with :meth:`ProcessRuntime.adopt` from the supervisor's ``.run`` record (pid and start time of
both), and reads how one ended from its ``.exit`` record (:meth:`ProcessRuntime.ended`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pwd
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, Strict

from berth.defaults import MAX_ORPHAN_GRACE_S, ORPHAN_GRACE_S, STOP_GRACE_S
from berth.errors import Invalid
from berth.node.runtime import supervisor
from berth.node.runtime.port import (
    BootFailed,
    BootSpec,
    RuntimeDriver,
    WorkloadExit,
    WorkloadHandle,
    end_within_grace,
)
from berth.node.runtime.supervisor import (
    OWNER_FILE,
    WORKLOADS_DIR,
    WorkloadFiles,
    file_stem,
    log_path,
)
from berth.validation import Rule, shown

__all__ = [
    "USER_PATH",
    "OrphanGrace",
    "ProcessRuntime",
    "RunAs",
    "checked_orphan_grace",
    "process_identity",
]

logger = logging.getLogger(__name__)


OrphanGrace = Annotated[float, Strict(), Field(gt=0, le=MAX_ORPHAN_GRACE_S, allow_inf_nan=False)]
"""Seconds a workload outlives its agent before its supervisor kills it: above 0, at most an
hour (:data:`~berth.defaults.MAX_ORPHAN_GRACE_S`)."""

_ORPHAN_GRACE: Rule[float] = Rule(OrphanGrace)


def checked_orphan_grace(value: object, field: str = "orphan_grace_s") -> float:
    """``value`` as an :data:`OrphanGrace`; ``Invalid`` naming ``field`` otherwise."""
    return _ORPHAN_GRACE(value, field)


_SUPERVISOR = supervisor.__file__

USER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The ``PATH`` of a workload run as another user than the agent (the agent's may name
directories only it can read, such as ``/root/…``)."""


@dataclass(frozen=True)
class RunAs:
    """Who a workload runs as: a user of this host, its primary group and its other groups."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    @classmethod
    def named(cls, user: str | int, field: str = "user") -> RunAs:
        """The host's user ``user`` (a name, or a uid); ``Invalid`` naming ``field`` when this
        host has no such user, or when this process may not run anything as it (only root
        runs workloads as another user)."""
        try:
            entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
        except (KeyError, OverflowError, TypeError, ValueError):
            raise Invalid(f"this host has no user {shown(user)}", field=field) from None
        if os.geteuid() != 0 and entry.pw_uid != os.geteuid():
            raise Invalid(
                f"only root runs workloads as another user: this agent runs as uid "
                f"{os.geteuid()}, not {entry.pw_name} (uid {entry.pw_uid})",
                field=field,
            )
        groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups)

    @classmethod
    def default(cls, field: str = "user") -> RunAs | None:
        """``nobody`` when this process is root (a workload never runs as root unless
        asked to); otherwise ``None``: the agent's own user, the only one it can be."""
        return cls.named("nobody", field) if os.geteuid() == 0 else None

    def __str__(self) -> str:
        return f"{self.name} (uid {self.uid})"


@dataclass
class _Running:
    """A workload and its supervisor: the child process it started (``process``), or, once
    adopted by an agent that did not start it, a pidfd on it (``pidfd``)."""

    workload: WorkloadHandle
    process: asyncio.subprocess.Process | None = None
    pidfd: int | None = None
    stop_requested: bool = False
    ended: dict[str, Any] = field(default_factory=dict)

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            if self.process is not None:
                if self.process.returncode is None:
                    self.process.send_signal(signum)
            elif self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signum)


class ProcessRuntime(RuntimeDriver):
    """Each workload is a real OS process, leader of its own process group, under a supervisor.

    ``stop_grace_s`` is how long ``stop`` waits after ``SIGTERM`` before ``SIGKILL`` when the
    stop names no ``grace_s`` of its own.
    ``base_env`` is the environment every workload starts from (default: this process's
    ``PATH`` only, or :data:`USER_PATH` with a ``user``; ``HOME`` is its scratch directory).
    ``log_dir``, when given, receives each workload's stdout and stderr in
    ``<workload id>.log``; otherwise output is discarded.
    ``user`` is who workloads run as (default: this process's user).  ``scratch_dir`` holds
    each workload's working directory, ``<scratch_dir>/<id>`` (default: a temporary
    directory of this runtime's, removed whenever no workload runs; the user must be able to
    reach a configured one: its parents searchable).
    ``state_dir`` is the node's state directory (its journal is in ``<state_dir>/workloads``):
    with it, workloads outlive this process by up to ``orphan_grace_s`` and a new agent on the
    directory may adopt them; without it, they are killed ``orphan_grace_s`` after this
    process dies.
    """

    def __init__(
        self,
        *,
        stop_grace_s: float = STOP_GRACE_S,
        base_env: Mapping[str, str] | None = None,
        log_dir: str | Path | None = None,
        state_dir: Path | None = None,
        orphan_grace_s: float = ORPHAN_GRACE_S,
        user: RunAs | None = None,
        scratch_dir: Path | None = None,
    ) -> None:
        super().__init__(stop_grace_s)
        self.orphan_grace_s = _ORPHAN_GRACE(orphan_grace_s, "orphan_grace_s")
        for name, value in (("state_dir", state_dir), ("scratch_dir", scratch_dir)):
            if value is not None and not isinstance(value, Path):
                raise Invalid(f"expected a directory path, got {shown(value)}", field=name)
        if user is not None and not isinstance(user, RunAs):
            raise Invalid(f"expected a RunAs, got {shown(user)}", field="user")
        self.user = user
        self._scratch_dir = scratch_dir
        self._own_scratch: Path | None = None  # a temporary directory made for want of one
        if base_env is None:  # another user gets the standard PATH: the agent's may be private
            base_env = {"PATH": os.environ.get("PATH", os.defpath) if user is None else USER_PATH}
        self.base_env = dict(base_env)
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.state_dir = state_dir
        self._running: dict[str, _Running] = {}
        self._starting: set[str] = set()
        self._watchers: set[asyncio.Task[None]] = set()

    def list(self) -> tuple[WorkloadHandle, ...]:
        return tuple(entry.workload for entry in self._running.values())

    async def start(self, spec: BootSpec, workload_id: str | None = None) -> WorkloadHandle:
        """Spawn ``spec.command`` as ``workload_id`` (else a generated id) under a supervisor;
        :class:`BootFailed` when it cannot be executed."""
        workload_id = self._ids.choose(spec, workload_id, self._taken())
        self._starting.add(workload_id)  # a concurrent start of this id is refused meanwhile
        try:
            return await self._spawn(spec, workload_id)
        finally:
            self._starting.discard(workload_id)
            self._tidy()  # a start that failed leaves nothing behind

    def _taken(self) -> set[str]:
        return self._running.keys() | self._starting

    def log_of(self, workload_id: str) -> Path | None:
        """Where ``workload_id``'s output goes (with a ``log_dir``)."""
        return None if self.log_dir is None else log_path(self.log_dir, workload_id)

    def files(self, workload_id: str) -> WorkloadFiles | None:
        """Where ``workload_id``'s journal entry and supervisor records are (with a state dir)."""
        if self.state_dir is None:
            return None
        return WorkloadFiles.of(self.state_dir / WORKLOADS_DIR, workload_id)

    def scratch_of(self, workload_id: str) -> Path:
        """The directory ``workload_id`` runs in (made by its supervisor, gone after its
        end)."""
        root = self._scratch_dir
        if root is None:  # a temporary one, made when first needed
            if self._own_scratch is None:
                made = Path(tempfile.mkdtemp(prefix="berth-scratch-"))
                made.chmod(0o711)  # each user reaches its own directory, lists none
                self._own_scratch = made
            root = self._own_scratch
        return root / file_stem(workload_id)

    def _order(self, spec: BootSpec, workload_id: str) -> dict[str, Any]:
        """What the supervisor is told: the command and its limits, whom to watch, where to
        write."""
        files = self.files(workload_id)
        if files is not None:
            files.entry.parent.mkdir(parents=True, exist_ok=True)
        # the entry is watched when there is one (a journal wrote it before this start)
        watched = files is not None and files.entry.exists()
        log = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = str(self.log_of(workload_id))
        me = os.getpid()
        scratch = self.scratch_of(workload_id)
        user = self.user
        return {
            "workload_id": workload_id,
            "command": list(spec.command),
            "env": {**self.base_env, "HOME": str(scratch), **spec.env},
            "cwd": str(scratch),
            "temporary_root": self._scratch_dir is None,
            "user": None if user is None else [user.uid, user.gid, list(user.groups), user.name],
            "mem_limit": spec.mem_limit,
            "log": log,
            "orphan_grace_s": self.orphan_grace_s,
            "owner": None if files is not None else [me, supervisor.start_ticks(me)],
            "owner_file": None if self.state_dir is None else str(self.state_dir / OWNER_FILE),
            "entry": str(files.entry) if files is not None and watched else None,
            "run_file": None if files is None else str(files.run),
            "exit_file": None if files is None else str(files.exit),
        }

    async def _spawn(self, spec: BootSpec, workload_id: str) -> WorkloadHandle:
        if not spec.command:  # an image's Cmd means nothing here: its layers are not used
            raise BootFailed(
                "the process runtime runs the workload's command, and it gives none (an "
                "image's Cmd runs under the container and microvm runtimes only)"
            )
        order = self._order(spec, workload_id)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                _SUPERVISOR,
                workload_id,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={},
                start_new_session=True,
            )
        except OSError as error:
            raise BootFailed(f"cannot start a supervisor: {error.strerror or error}") from None
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(json.dumps(order).encode())
            await process.stdin.drain()
            process.stdin.close()
            answer = _message(await process.stdout.readline())
        except BaseException:  # cancelled, or the supervisor died: it must not go on
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGUSR1)
            await process.wait()
            raise
        if "started" not in answer:
            await process.wait()
            reason = answer.get("failed") or "its supervisor ended before starting it"
            raise BootFailed(str(reason))
        workload = WorkloadHandle(workload_id, spec, pid=int(answer["started"][0]))
        workload.locator = {"supervisor": answer["supervisor"], "workload": answer["started"]}
        self._watch(_Running(workload, process=process))
        return workload

    def _watch(self, entry: _Running) -> None:
        self._running[entry.workload.id] = entry
        watcher = asyncio.get_running_loop().create_task(
            self._wait(entry), name=f"berth-workload-{entry.workload.id}"
        )
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _wait(self, entry: _Running) -> None:
        if entry.process is not None:
            await self._wait_child(entry, entry.process)
        else:
            await self._wait_adopted(entry)
        self._running.pop(entry.workload.id, None)
        self._tidy()
        if entry.workload._end(_exit(entry.ended, entry.stop_requested)):
            self._listeners.notify(entry.workload)

    async def _wait_child(self, entry: _Running, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        while True:
            line = await process.stdout.readline()
            if not line:
                break
            ended = _message(line).get("ended")
            if isinstance(ended, dict):
                entry.ended = ended
        await process.wait()
        if not entry.ended:  # the supervisor was killed: its workload must not run on unseen
            _kill_group(entry.workload)
            entry.ended = {"signal": signal.SIGKILL, "lost": "its supervisor was killed"}

    async def _wait_adopted(self, entry: _Running) -> None:
        assert entry.pidfd is not None
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def exited() -> None:
            if not ended.done():
                ended.set_result(None)

        loop.add_reader(entry.pidfd, exited)
        try:
            await ended
        finally:
            loop.remove_reader(entry.pidfd)
            os.close(entry.pidfd)
            entry.pidfd = None
        entry.ended = self.ended(entry.workload.id) or {}
        if not entry.ended:
            _kill_group(entry.workload)
            entry.ended = {"signal": signal.SIGKILL, "lost": "its supervisor was killed"}

    async def stop(self, workload_id: str, *, grace_s: float | None = None) -> None:
        """``SIGTERM`` the workload's group, ``SIGKILL`` its tree after the grace period
        (``grace_s``, else ``stop_grace_s``); wait for it.  Concurrent stops: the shortest
        grace kills."""
        grace = self._grace(grace_s)
        entry = self._running.get(workload_id)
        if entry is None or entry.workload.done:
            return
        entry.stop_requested = True
        entry.signal(signal.SIGTERM)  # the supervisor passes it on to the workload's group
        await end_within_grace(entry.workload, grace, lambda: entry.signal(signal.SIGUSR1))

    def kill(self, workload_id: str) -> None:
        """Kill ``workload_id``'s whole tree now, without a graceful signal (its end is
        reported as any end is); an unknown or ended id is harmless."""
        entry = self._running.get(workload_id)
        if entry is not None and not entry.workload.done:
            entry.signal(signal.SIGUSR1)

    # -- finding workloads again after a restart ------------------------------------------------
    def adopt(
        self, workload_id: str, spec: BootSpec, locator: dict[str, Any] | None
    ) -> WorkloadHandle | None:
        """Watch (and be able to stop) a workload another agent on this state directory
        started, found by ``locator`` (its ``.run`` record, else the one given); ``None`` when
        its supervisor no longer runs — then :meth:`ended` says how it ended, if known."""
        files = self.files(workload_id)
        record = (supervisor.read_record(files.run) if files is not None else None) or locator
        found = process_identity(record, "supervisor") if record else None
        if found is None or workload_id in self._taken():
            return None
        pid, ticks = found
        open_pidfd = getattr(os, "pidfd_open", None)
        if open_pidfd is None:  # not Linux 5.3+: not adopted; its entry goes, so it ends
            return None
        try:
            pidfd: int = open_pidfd(pid)
        except OSError:
            return None
        # the pidfd is on whatever process had the pid; it is ours only if it still started
        # at the recorded time (checked after opening, so the pid cannot be recycled between)
        if not supervisor.alive(pid, ticks) or (files is not None and files.exit.exists()):
            os.close(pidfd)
            return None
        started = process_identity(record, "workload") if record else None
        workload = WorkloadHandle(workload_id, spec, pid=None if started is None else started[0])
        workload.locator = dict(record or {})
        self._watch(_Running(workload, pidfd=pidfd))
        logger.info("adopted workload %s (supervisor %d)", workload_id, pid)
        return workload

    def ended(
        self, workload_id: str, locator: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """The supervisor's record of how ``workload_id`` ended (``code`` or ``signal``, and
        ``orphaned`` with why it killed it); ``None`` if none was written."""
        files = self.files(workload_id)
        return None if files is None else supervisor.read_record(files.exit)

    def abandon(self, workload_id: str, locator: dict[str, Any] | None) -> None:
        """Kill a workload of this state directory that will not be adopted, if it runs."""
        files = self.files(workload_id)
        record = (supervisor.read_record(files.run) if files is not None else None) or locator
        found = process_identity(record, "supervisor") if record else None
        if found is not None and supervisor.alive(*found):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(found[0], signal.SIGUSR1)

    def _tidy(self) -> None:
        """Remove the temporary scratch directory this runtime made once nothing runs in it
        (each workload's own directory is gone with it: its supervisor removes it)."""
        if self._own_scratch is not None and not self._running and not self._starting:
            with contextlib.suppress(OSError):
                self._own_scratch.rmdir()
                self._own_scratch = None

    async def aclose(self) -> None:
        """Stop every running workload."""
        await asyncio.gather(*(self.stop(workload.id) for workload in self.list()))

    def __repr__(self) -> str:
        user = "" if self.user is None else f", user={self.user.name}"
        return (
            f"ProcessRuntime(running={len(self._running)}, stop_grace_s={self.stop_grace_s}{user})"
        )


def _message(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def process_identity(record: Mapping[str, Any], key: str) -> tuple[int, int] | None:
    """``(pid, start ticks)`` from a record's ``key``; ``None`` unless two integers."""
    value = record.get(key)
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(part, int) and not isinstance(part, bool) for part in value)
    ):
        return value[0], value[1]
    return None


def _kill_group(workload: WorkloadHandle) -> None:
    """Kill the group of a workload whose supervisor died, if its leader is still the process
    that was started (pid and start time)."""
    started = process_identity(workload.locator or {}, "workload")
    if started is not None and supervisor.alive(*started):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(started[0], signal.SIGKILL)


def _exit(ended: Mapping[str, Any], stopped: bool) -> WorkloadExit:
    code, signum = ended.get("code"), ended.get("signal")
    return WorkloadExit(
        code=code if isinstance(code, int) else None,
        signal=signum if isinstance(signum, int) else None,
        stopped=stopped,
    )
