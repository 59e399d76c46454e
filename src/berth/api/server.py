"""Serving the API: the address rule, the token, ``api.json``, uvicorn in the caller's loop.

* **Where** — :func:`parse_address` reads ``--http HOST:PORT`` (``[::1]:8080`` for IPv6, port
  0 picks a free one).  A host that is not a loopback address is refused unless the caller
  says so explicitly (``--http-public``): the API can boot commands on every node, so it is
  not exposed to a network by accident.
* **Who** — :func:`resolve_token`: ``--token`` or ``--token-file`` (first line), else a fresh
  random token (``secrets.token_urlsafe(32)``); a token is 16–512 printable characters
  without spaces.
* **How to find it** — :func:`write_api_file` writes ``{"url", "urls", "token"}`` (``urls``:
  every endpoint serving the cluster, the CLI fails over between them) to
  ``$BERTH_HOME/api.json`` (default ``~/.berth/api.json``, the directory ``0700``, the file
  ``0600``), which the CLI reads when ``--api``/``BERTH_API`` are not given.
* **HTTPS** — :class:`HttpsFiles` (``--https-cert``, ``--https-key``: both or neither,
  checked at the edge) makes :class:`ApiServer` serve TLS and its URL ``https://``; the API
  does not ask clients for certificates (the token authenticates them).
* **Serving** — :class:`ApiServer` runs uvicorn *inside the running event loop* (the
  scheduler's), on a socket it binds itself — so a port in use is an error naming ``--http``,
  not uvicorn's ``sys.exit`` — and leaves signal handling to its caller (the scheduler
  command stops the API, then the scheduler, on SIGINT/SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import secrets
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from berth.api.client import api_file
from berth.errors import Invalid, Unavailable
from berth.pki import check_pair
from berth.private import write_private
from berth.validation import shown

__all__ = [
    "ApiServer",
    "HttpsFiles",
    "bound_socket",
    "parse_address",
    "remove_api_file",
    "resolve_token",
    "write_api_file",
]

DEFAULT_ADDRESS = "127.0.0.1:8080"


def parse_address(value: str, *, public: bool = False, flag: str = "--http") -> tuple[str, int]:
    """``HOST:PORT`` → ``(host, port)``; a non-loopback host only with ``public``."""
    if not isinstance(value, str) or not value or len(value) > 300:
        raise Invalid(f"expected HOST:PORT, got {shown(value)}", field=flag)
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or len(port_text) > 5:
        raise Invalid(
            f"expected HOST:PORT (e.g. {DEFAULT_ADDRESS}), got {shown(value)}", field=flag
        )
    port = int(port_text)
    if port > 65535:
        raise Invalid(f"port {port} is out of range 0-65535", field=flag)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    host = host or "127.0.0.1"
    if not _is_loopback(host) and not public:
        raise Invalid(
            f"{shown(host)} is not a loopback address; the API can boot commands on every "
            "node, so serving it to a network needs --http-public (and a firewall)",
            field=flag,
        )
    return host, port


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(token: str | None = None, token_file: Path | None = None) -> tuple[str, bool]:
    """The API token and whether it was generated here (see the module docstring)."""
    if token is not None and token_file is not None:
        raise Invalid("give --token or --token-file, not both", field="--token")
    if token_file is not None:
        try:
            text = token_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise Invalid(
                f"cannot read {shown(str(token_file))}: {error}", field="--token-file"
            ) from None
        lines = text.splitlines()
        return _checked_token(lines[0].strip() if lines else "", "--token-file"), False
    if token is not None:
        return _checked_token(token, "--token"), False
    return secrets.token_urlsafe(32), True


def _checked_token(token: str, flag: str) -> str:
    if not 16 <= len(token) <= 512 or any(ch.isspace() or not ch.isprintable() for ch in token):
        raise Invalid("a token is 16-512 printable characters without spaces", field=flag)
    return token


def write_api_file(
    url: str,
    token: str,
    path: Path | None = None,
    *,
    others: Sequence[str] = (),
    ca: Path | None = None,
    nats: tuple[str, Mapping[str, Path]] | None = None,
) -> Path:
    """Write ``{"url", "urls", "token"}`` for the CLI (directory ``0700``, file ``0600``):
    ``urls`` is ``url`` and the ``others`` serving the same cluster; ``"ca"`` (absolute) when
    the API's HTTPS certificate is checked against ``ca``; ``"nats"`` — the servers' URL and
    a client's files (:data:`~berth.api.client.NATS_FILES`, absolute) — when ``nats`` is
    given, for the commands that talk to NATS (``berth place``, ``whereis``, ``routes``)."""
    path = path or api_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    document: dict[str, object] = {"url": url, "urls": [url, *others], "token": token}
    if ca is not None:
        document["ca"] = str(ca.resolve())
    if nats is not None:
        servers, files = nats
        document["nats"] = {"url": servers, **{k: str(v.resolve()) for k, v in files.items()}}
    write_private(path, json.dumps(document) + "\n")
    return path


def remove_api_file(token: str, path: Path | None = None) -> None:
    """Remove the API file if it still names ``token`` (another server may have replaced it)."""
    path = path or api_file()
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text(encoding="utf-8")).get("token") == token:
            path.unlink()


@dataclass(frozen=True)
class HttpsFiles:
    """The API's HTTPS certificate and key (``--https-cert``, ``--https-key``)."""

    cert: Path
    key: Path

    @classmethod
    def from_flags(cls, cert: Path | None, key: Path | None) -> HttpsFiles | None:
        """Both flags' files, checked (readable PEM, the key the certificate's, valid now:
        ``Invalid`` naming the flag), or ``None`` when neither is given."""
        if cert is None and key is None:
            return None
        if cert is None or key is None:
            flag = "--https-cert" if cert is None else "--https-key"
            raise Invalid(
                f"--https-cert and --https-key go together: {flag} is missing", field=flag
            )
        check_pair(cert, key, cert_flag="--https-cert", key_flag="--https-key")
        return cls(cert, key)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the caller's loop owns SIGINT/SIGTERM


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one, the kernel's pick);
    ``Invalid`` naming ``--http`` when the address cannot be had, with what to do."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        hint = f" (another port, or {host}:0 for a free one)" if port else ""
        raise Invalid(
            f"cannot listen on {host}:{port}: {error.strerror}{hint}", field="--http"
        ) from None
    return sock


class ApiServer:
    """``app`` served by uvicorn in the running loop (``await start()``, ``await stop()``),
    over HTTPS with ``https``."""

    def __init__(self, app: FastAPI, host: str, port: int, https: HttpsFiles | None = None) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.https = https
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'http' if self.https is None else 'https'}://{host}:{self.port}"

    async def start(self) -> ApiServer:
        sock = bound_socket(self.host, self.port)
        sock.listen(128)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        https = self.https
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_notify=30,
            ssl_certfile=None if https is None else str(https.cert),
            ssl_keyfile=None if https is None else str(https.key),
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="berth api")
        while not self._server.started:
            if self._task.done():
                sock.close()
                raise Unavailable(f"the API server did not start: {self._task.exception()!r}")
            await asyncio.sleep(0.01)
        return self

    async def stop(self, timeout_s: float = 5.0) -> None:
        server, task = self._server, self._task
        if server is None or task is None:
            return
        server.should_exit = True
        _, late = await asyncio.wait({task}, timeout=timeout_s)
        if late:
            server.force_exit = True
            await asyncio.wait({task}, timeout=1.0)
        self._server = self._task = None
