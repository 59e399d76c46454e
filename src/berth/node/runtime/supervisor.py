"""One workload's supervisor: the process that keeps a workload findable, and bounds its life.

The process runtime (:mod:`berth.node.runtime.process`) starts one supervisor per workload
and the supervisor starts the workload.  It exists so that two promises hold across the death
of the agent (issue 20):

* **a workload outlives its agent only for a bounded time.**  The supervisor watches the
  agent that owns the node's state directory — the pid and start time the agent writes to
  ``<state_dir>/agent.pid`` when it starts (without a state directory: the agent that started
  it) — and its workload's journal entry.  When no live agent has owned the directory for
  ``orphan_grace_s``, or the entry is gone (a restarted agent gave the workload up), it kills
  the workload's whole process tree and records why.  A restarted agent writes its own pid to
  the file first, so a workload survives a restart shorter than the grace;
* **a workload is findable again.**  The supervisor writes ``<id>.run`` beside the journal
  entry (its own pid and start time, then the workload's) before the agent can lose track of
  it, and ``<id>.exit`` (the exit status, or why it killed the workload) when the workload
  ends, so an agent that restarts adopts a running workload or reports how it ended.

Why a supervisor and not cgroup v2 (the issue allows either): killing every process of a
workload needs either a cgroup (``cgroup.kill``) or a parent that sees them all.  A delegated,
writable cgroup v2 subtree is not something an unprivileged agent can count on (containers,
CI runners and laptops under a user session differ); ``PR_SET_CHILD_SUBREAPER`` needs no
privileges and works everywhere Linux runs.  The supervisor makes itself a child subreaper, so
a process the workload daemonises (double fork, ``setsid``) is re-parented to it rather than
to init, and when the workload ends (or is killed) the supervisor kills whatever of its tree
is left: its process group, then every descendant it can still see, until it has no child.
``PR_SET_PDEATHSIG`` alone would not do: it kills one process at its parent's death, not a
tree, and it would kill the workload on the agent's restart too.

Why pid *and* start time: a pid is recycled once its process is reaped, so every process this
module names on disk or watches is named by both (``/proc/<pid>/stat`` field 22, in clock
ticks since boot — what ``psutil``'s ``create_time`` is computed from); a process whose start
time differs is another process.

What an operator sees: in ``ps``, the workload's processes under ``python3 -I
…/supervisor.py <workload id>`` (its parent, in its own session), which is re-parented to init
(or the nearest subreaper) when the agent dies; on the agent's standard error, the
supervisor's lines — ``berth-supervisor[<pid>] <id>: no agent has owned <dir> for 10 s:
killing the workload``.

This module is run as a script (``python3 -I supervisor.py``), never imported by the
supervisor process itself through ``berth``: it imports only the standard library, so a
supervisor costs a bare interpreter (measured: ~13 MB resident, ~26 ms to start) and not
berth's dependencies.
The agent and the runtime import it for the file formats (:func:`read_owner`,
:func:`write_owner`, :func:`start_ticks`, :func:`read_record`), and every part of the node
for the one liveness check (:func:`alive`, and :func:`pid_alive` where a pid is all there
is).  It is deliberately not the
runtime: it knows nothing of budgets or specs, only one command, its limits, and its owner.

The supervisor is told what to do on its standard input (one JSON object: ``command``,
``env``, ``cwd``, ``user``, ``mem_limit``, ``log``, ``owner_file`` or ``owner``, ``entry``,
``run_file``, ``exit_file``, ``orphan_grace_s``) and answers on its standard output:
``{"started": [pid, ticks], "supervisor": [pid, ticks]}`` or ``{"failed": reason}``, then at
the end the exit record.  ``cwd`` is the workload's scratch directory: the supervisor makes
it (mode 0700, owned by ``user`` — ``[uid, gid, groups, name]``, whom the workload runs as)
and removes it once the workload has ended and its exit record is written — and, with
``temporary_root``, its parent too once empty (a runtime's temporary directory, which
would otherwise outlive an agent that died or whose workloads another agent adopted).  Signals it
obeys: ``SIGTERM`` is passed on to the workload's process group (the graceful stop),
``SIGUSR1`` kills the workload's whole tree (a stop's grace ran out).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

TYPE_CHECKING = False  # not typing's: importing typing costs the supervisor process ~2 ms
if TYPE_CHECKING:  # the supervisor process loads neither typing nor dataclasses: ~2 MB, ~7 ms
    from typing import Any

__all__ = [
    "OWNER_FILE",
    "WORKLOADS_DIR",
    "WorkloadFiles",
    "alive",
    "atomic_write",
    "file_stem",
    "log_path",
    "pid_alive",
    "read_owner",
    "read_record",
    "start_ticks",
    "write_owner",
]

_PR_SET_CHILD_SUBREAPER = 36
_WATCHED = (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1)


# -- what the agent shares with the supervisor: process identity and the files ----------------
OWNER_FILE = "agent.pid"
"""The file in a state directory naming the agent that owns it: ``<pid> <start ticks>``."""

WORKLOADS_DIR = "workloads"
"""The directory of a state directory holding the journal and its supervisors' files."""


def file_stem(workload_id: str) -> str:
    """``workload_id`` as one file name's stem: a ``Name`` may hold ``/`` (and start with
    ``.``), so ``%``, ``/`` and a leading ``.`` are percent-encoded; distinct ids stay
    distinct."""
    stem = workload_id.replace("%", "%25").replace("/", "%2F")
    return "%2E" + stem[1:] if stem.startswith(".") else stem


def log_path(log_dir: Path, workload_id: str) -> Path:
    """Where a runtime with ``log_dir`` writes ``workload_id``'s output: ``<stem>.log``."""
    return log_dir / f"{file_stem(workload_id)}.log"


class WorkloadFiles:
    """One workload's files in the journal directory: ``<stem>.json`` (the journal's entry),
    ``<stem>.run`` (where the supervisor and the workload run), ``<stem>.exit`` (how it
    ended), ``<stem>`` being :func:`file_stem` of its id."""

    __slots__ = ("entry", "exit", "run")

    def __init__(self, entry: Path, run: Path, exit: Path) -> None:
        self.entry, self.run, self.exit = entry, run, exit

    def __repr__(self) -> str:
        return f"WorkloadFiles({self.entry}, {self.run}, {self.exit})"

    @classmethod
    def of(cls, directory: Path, workload_id: str) -> WorkloadFiles:
        stem = file_stem(workload_id)
        return cls(
            directory / f"{stem}.json", directory / f"{stem}.run", directory / f"{stem}.exit"
        )


def start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot; ``None`` if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold anything: split after it
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (this one does; one of another user counts): all a
    pid alone can say — the pid may have been recycled (:func:`alive` asks about *the*
    process).  What names a leftover scratch directory by the pid that made it uses it."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def alive(pid: int, ticks: int) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``ticks`` (not a zombie).

    Without ``/proc`` (not Linux) there are no start times (``ticks`` is 0): the bare pid is
    all there is, and a recycled one would pass — the robust identity is Linux's."""
    if not os.path.isdir("/proc/self"):
        return pid_alive(pid)
    if start_ticks(pid) != ticks:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def atomic_write(path: Path, text: str) -> None:
    """Write ``path`` all at once: a temporary file beside it, fsync, rename, fsync the
    directory — a reader (or a crash) sees the old file or the new one, never a part."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_owner(path: Path, pid: int | None = None) -> None:
    """Record process ``pid`` (default: this one) as the owner of a state directory."""
    pid = os.getpid() if pid is None else pid
    ticks = start_ticks(pid)
    if ticks is None and os.path.isdir("/proc/self"):
        raise OSError(f"process {pid} has no start time in /proc")
    atomic_write(path, f"{pid} {ticks or 0}\n")


def read_owner(path: Path) -> tuple[int, int] | None:
    """The ``(pid, ticks)`` an owner file names; ``None`` if it is missing or malformed."""
    try:
        words = path.read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError):
        return None
    if len(words) != 2 or not all(word.isdigit() for word in words):
        return None
    return int(words[0]), int(words[1])


def read_record(path: Path) -> dict[str, Any] | None:
    """A JSON object the supervisor wrote (``.run``, ``.exit``); ``None`` if absent or not one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# -- the supervisor process --------------------------------------------------------------------
class _Supervisor:
    def __init__(self, order: dict[str, Any]) -> None:
        self.order = order
        self.workload_id = str(order.get("workload_id", "?"))
        self.owner_file = Path(order["owner_file"]) if order.get("owner_file") else None
        owner = order.get("owner")
        self.owner = (int(owner[0]), int(owner[1])) if owner else None
        self.entry = Path(order["entry"]) if order.get("entry") else None
        self.run_file = Path(order["run_file"]) if order.get("run_file") else None
        self.exit_file = Path(order["exit_file"]) if order.get("exit_file") else None
        self.cwd = Path(order["cwd"]) if order.get("cwd") else None
        self.temporary_root = bool(order.get("temporary_root"))
        user = order.get("user")
        self.user = (
            (int(user[0]), int(user[1]), [int(g) for g in user[2]], str(user[3])) if user else None
        )
        self.orphan_grace_s = float(order["orphan_grace_s"])
        self.me = (os.getpid(), start_ticks(os.getpid()) or 0)
        self.leader: subprocess.Popen[bytes] | None = None
        self.orphan_since: float | None = None

    def say(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(f"berth-supervisor[{os.getpid()}] {self.workload_id}: {text}", file=sys.stderr)
            sys.stderr.flush()

    def answer(self, message: dict[str, Any]) -> None:
        # The agent may be gone (a broken pipe): the files are what a new one reads.
        try:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            with contextlib.suppress(OSError):  # no more writes to the dead pipe, nor at exit
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115

    def record(self, path: Path | None, message: dict[str, Any]) -> None:
        if path is None:
            return
        try:
            atomic_write(path, json.dumps(message))
        except OSError as error:
            self.say(f"cannot write {path}: {error}")

    def start(self) -> bool:
        order = self.order
        self.record(self.run_file, {"supervisor": list(self.me)})
        log = order.get("log")
        output = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        mem_limit = order.get("mem_limit")

        def child() -> None:  # between fork and exec: undo what the supervisor set for itself
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _WATCHED)
            if mem_limit:
                resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))

        program = order["command"][0]
        user = self.user
        who = "" if user is None else f" as {user[3]} (uid {user[0]})"
        try:
            self.scratch()
        except OSError as error:
            return self.failed(f"cannot make its scratch directory {self.cwd}: {error}")
        try:
            self.leader = subprocess.Popen(
                order["command"],
                env=order["env"],
                cwd=self.cwd,
                user=None if user is None else user[0],
                group=None if user is None else user[1],
                extra_groups=None if user is None else user[2],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,
                preexec_fn=child,
            )
        except FileNotFoundError:
            return self.failed(f"command not found: {program!r}")
        except PermissionError:
            return self.failed(f"permission denied executing {program!r}{who}")
        except OSError as error:
            return self.failed(f"cannot execute {program!r}: {error.strerror or error}")
        except subprocess.SubprocessError as error:
            return self.failed(f"cannot prepare {program!r}: {error}")
        finally:
            if not isinstance(output, int):
                output.close()
        pid = self.leader.pid
        started = [pid, start_ticks(pid) or 0]
        self.record(self.run_file, {"supervisor": list(self.me), "workload": started})
        self.answer({"started": started, "supervisor": list(self.me)})
        return True

    def scratch(self) -> None:
        """Make the workload's scratch directory, empty, its user's (``OSError`` if not)."""
        if self.cwd is None:
            return
        shutil.rmtree(self.cwd, ignore_errors=True)  # a crashed supervisor's leftovers
        if self.temporary_root:  # the last workload's end may have removed it meanwhile
            with contextlib.suppress(FileExistsError):
                self.cwd.parent.mkdir(mode=0o711)
        self.cwd.mkdir(mode=0o700, parents=True)
        if self.user is not None:
            os.chown(self.cwd, self.user[0], self.user[1])

    def unscratch(self) -> None:
        if self.cwd is not None:
            shutil.rmtree(self.cwd, ignore_errors=True)
            if self.temporary_root:  # a runtime's own root goes with its last workload
                with contextlib.suppress(OSError):
                    self.cwd.parent.rmdir()

    def failed(self, reason: str) -> bool:
        self.unscratch()
        self.answer({"failed": reason})
        if self.run_file is not None:
            with contextlib.suppress(OSError):
                self.run_file.unlink()
        return False

    def owned(self) -> str | None:
        """``None`` while a live agent owns the workload; else why it is an orphan."""
        if self.entry is not None and not self.entry.exists():
            return f"its journal entry {self.entry} is gone"
        owner = read_owner(self.owner_file) if self.owner_file is not None else self.owner
        now = time.monotonic()
        if owner is not None and alive(*owner):
            self.orphan_since = None
            return None
        if self.orphan_since is None:  # first seen without an agent: the grace starts now
            self.orphan_since = now
        if now - self.orphan_since < self.orphan_grace_s:
            return None
        where = self.owner_file.parent if self.owner_file is not None else "the workload"
        return f"no agent has owned {where} for {self.orphan_grace_s:g} s"

    def run(self) -> int:
        leader = self.leader
        assert leader is not None
        period = min(1.0, max(self.orphan_grace_s / 4, 0.05))
        orphaned: str | None = None
        while self.reap() is None:
            received = signal.sigtimedwait(_WATCHED, period)
            if received is not None and received.si_signo == signal.SIGTERM:
                _signal_group(leader.pid, signal.SIGTERM)
            elif received is not None and received.si_signo == signal.SIGUSR1:
                self.kill_tree()
            if orphaned is None and self.reap() is None:
                orphaned = self.owned()
                if orphaned is not None:
                    self.say(f"{orphaned}: killing the workload")
                    self.kill_tree()
        self.kill_tree()  # whatever it left behind goes with it
        status = self.reap()
        assert status is not None
        ended: dict[str, Any] = {"code": status} if status >= 0 else {"signal": -status}
        if orphaned is not None:
            ended["orphaned"] = orphaned
        ended["supervisor"] = list(self.me)
        self.record(self.exit_file, ended)
        self.unscratch()
        self.answer({"ended": ended})
        return 0

    def reap(self) -> int | None:
        """Reap every child that has ended; the leader's exit status once it has ended."""
        leader = self.leader
        assert leader is not None
        while True:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == leader.pid:
                leader.returncode = os.waitstatus_to_exitcode(raw)
        return leader.returncode

    def kill_tree(self) -> None:
        """SIGKILL the workload's process group and every descendant of this supervisor until
        none is left (as a subreaper, it inherits the orphans of each one killed)."""
        leader = self.leader
        assert leader is not None
        _signal_group(leader.pid, signal.SIGKILL)
        for _ in range(1000):
            found = _descendants(os.getpid())
            if not found:
                break
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
            self.reap()
        self.reap()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _descendants(root: int) -> list[int]:
    """Every process below ``root``, from ``/proc`` (a snapshot: the caller loops)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                text = stat.read()
        except OSError:
            continue
        fields = text[text.rfind(b")") + 2 :].split()
        with contextlib.suppress(IndexError, ValueError):
            children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), ()):
            found.append(child)
            pending.append(child)
    return found


def main() -> int:
    signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
    order = json.loads(sys.stdin.buffer.read() or b"{}")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    supervisor = _Supervisor(order)
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is None:  # not Linux: what the workload daemonises escapes (its group does not)
        supervisor.say("no prctl here: not a child subreaper")
    elif prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        supervisor.say(f"cannot become a child subreaper (errno {ctypes.get_errno()})")
    if not supervisor.start():
        return 1
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
