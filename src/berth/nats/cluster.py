"""A cluster of local ``nats-server`` processes: JetStream clustered, so one can die.

One nats-server is a single point of failure: kill it and nothing places.  JetStream is built
to run as a cluster — a stream (a KV bucket is one) with three replicas keeps accepting writes
while two of its three servers live, through its Raft group — so ``berth up --nats-servers 3``
and the tests run :class:`NatsCluster`: ``size`` :class:`~berth.nats.server.NatsServer`
processes on one host, each with

* a unique ``server_name`` (``<name>-1`` …) and its own store directory,
* a cluster listener on a port chosen before any starts (the routes name each other's), and
  the ``routes`` to every other server;
* the routes' own credentials — a random user and password in the ``cluster`` block, so no
  other local process can join as a route (a route is trusted with every message) — or
  mutual TLS on the routes when certificates are given;
* the durability setting :data:`SYNC_INTERVAL` (below);
* whatever the single-server configuration says (accounts and users, client TLS), included
  from ``config_file``.

**Durability** (``sync_interval``).  nats-server acknowledges a write once it is in the
stream's replicas' memory and fsyncs every two minutes by default; Jepsen's analysis of NATS
2.12.1 (2025) showed acknowledged writes lost when every replica lost power within that
window.  berth's writes — node states every heartbeat, a record per workload, a route per
placement — are small and few next to what a server syncs, so berth chooses ``always``: every
write is fsync'ed before it is acknowledged, and an acknowledged record survives a power loss
of the whole cluster.  ``benchmarks/nats_placement.py`` measures what it costs (the
three-server row).  ``sync_interval`` can be given (a Go duration such as ``"2m"``, or
``"always"``) for a deployment that would rather trade it.

Clients get every server's URL (:attr:`NatsCluster.url`, comma-separated, which
:func:`berth.nats.connection.connect` and nats-py take) and fail over between them by
themselves.  :meth:`NatsCluster.kill` and :meth:`NatsCluster.restart` act on one server (as
a fault would); a restarted server keeps its port and store and catches its streams up.

Like :class:`~berth.nats.server.NatsServer` it is not a supervisor: a server that dies stays
down until restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from berth.errors import Invalid, Unavailable
from berth.nats.server import NatsServer, OwnedDirectory
from berth.pki import TlsFiles
from berth.private import write_private
from berth.validation import shown

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = [
    "SYNC_INTERVAL",
    "NatsCluster",
    "checked_size",
    "server_config",
    "single_server_config",
]

SYNC_INTERVAL = "always"
"""berth's JetStream durability setting: fsync every write before acknowledging it."""
MAX_SERVERS = 7
"""The largest cluster :class:`NatsCluster` starts (JetStream's Raft groups want few, odd)."""


def _free_port(host: str) -> int:
    """A port nothing listens on now (chosen before the servers start: routes name it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def _quoted(path: Path) -> str:
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _tls_block(indent: str, tls: TlsFiles, *, verify: bool) -> list[str]:
    lines = [f"{indent}tls {{", f"{indent}  cert_file: {_quoted(tls.cert)}"]
    lines += [f"{indent}  key_file: {_quoted(tls.key)}", f"{indent}  ca_file: {_quoted(tls.ca)}"]
    lines += [f"{indent}  verify: {str(verify).lower()}", f"{indent}  timeout: 2", f"{indent}}}"]
    return lines


def checked_size(size: object, field: str = "nats_servers") -> int:
    """``size`` when it is a whole number of servers from 1 to :data:`MAX_SERVERS`, else
    ``Invalid`` naming ``field``."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SERVERS:
        raise Invalid(f"a cluster has 1 to {MAX_SERVERS} servers, got {shown(size)}", field=field)
    return size


def single_server_config(*, client_tls: TlsFiles | None, include: Path | None) -> str:
    """A lone server's configuration file beside :class:`~berth.nats.server.NatsServer`'s
    flags: the clients' mutual TLS (when given) and ``include`` (relative to the file's
    directory, as in :func:`server_config`)."""
    if include is not None and include.is_absolute():
        raise Invalid(f"an include is relative to the configuration file, got {include}")
    lines = [] if client_tls is None else _tls_block("", client_tls, verify=True)
    if include is not None:
        lines.append(f"include {_quoted(include)}")
    return "\n".join(lines) + "\n"


def server_config(
    *,
    server_name: str,
    cluster_name: str,
    cluster_listen: str,
    routes: Sequence[str],
    route_user: str | None = None,
    route_password: str | None = None,
    route_tls: TlsFiles | None = None,
    sync_interval: str = SYNC_INTERVAL,
    client_listen: str | None = None,
    client_tls: TlsFiles | None = None,
    store_dir: Path | None = None,
    include: Path | None = None,
) -> str:
    """One clustered server's configuration: its name, JetStream with ``sync_interval`` (in
    ``store_dir`` when given), its cluster listener and the ``routes`` (``host:port``) to the
    others — authenticated by ``route_user``/``route_password`` or by mutual ``route_tls`` —,
    optionally its client listener and the clients' mutual TLS, and ``include`` (the accounts
    and users, :meth:`~berth.nats.auth.ClusterAuth.server_config`) — a path *relative to the
    configuration file's directory*: nats-server joins even an absolute one to it."""
    if include is not None and include.is_absolute():
        raise Invalid(f"an include is relative to the configuration file, got {include}")
    if (route_user is None) == (route_tls is None) or (route_user is None) != (
        route_password is None
    ):
        raise Invalid("routes are authenticated by a user and password, or by TLS: one of them")
    lines = [f"server_name: {json.dumps(server_name)}"]
    if client_listen is not None:
        lines.append(f"listen: {json.dumps(client_listen)}")
    if client_tls is not None:
        lines += _tls_block("", client_tls, verify=True)
    lines += ["jetstream {", f"  sync_interval: {json.dumps(sync_interval)}"]
    if store_dir is not None:
        lines.append(f"  store_dir: {_quoted(store_dir)}")
    lines += ["}", "cluster {", f"  name: {json.dumps(cluster_name)}"]
    lines.append(f"  listen: {json.dumps(cluster_listen)}")
    if route_tls is not None:
        lines += _tls_block("  ", route_tls, verify=True)
        urls = [f"nats-route://{route}" for route in routes]
    else:
        lines += ["  authorization {", f"    user: {json.dumps(route_user)}"]
        lines += [f"    password: {json.dumps(route_password)}", "  }"]
        urls = [f"nats-route://{route_user}:{route_password}@{route}" for route in routes]
    lines += ["  routes: ["] + [f"    {json.dumps(url)}" for url in urls] + ["  ]", "}"]
    if include is not None:
        lines.append(f"include {_quoted(include)}")
    return "\n".join(lines) + "\n"


class NatsCluster(OwnedDirectory):
    """``size`` clustered nats-servers on ``host`` (see the module docstring)."""

    def __init__(
        self,
        size: int = 3,
        *,
        base_dir: Path | str | None = None,
        config_file: Path | str | None = None,
        host: str = "127.0.0.1",
        name: str = "berth",
        sync_interval: str = SYNC_INTERVAL,
        route_tls: TlsFiles | None = None,
        client_tls: TlsFiles | None = None,
        probe_options: Mapping[str, object] | None = None,
        start_timeout_s: float = 20.0,
        field: str = "nats_servers",
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SERVERS:
            raise Invalid(
                f"a cluster has 1 to {MAX_SERVERS} servers, got {shown(size)}", field=field
            )
        if not name.replace("-", "").replace("_", "").isalnum():
            raise Invalid(f"a cluster name is letters, digits, - and _, got {shown(name)}")
        self.size, self.host, self.name = size, host, name
        self.sync_interval = sync_interval
        self.route_tls = route_tls
        self.client_tls = client_tls
        """The clients' mutual TLS (the servers' certificate and CA): clients then dial
        ``tls://`` URLs and must show a certificate the CA signed."""
        self.probe_options = dict(probe_options or {})
        """Extra ``nats.connect`` options for :meth:`wait_ready`'s probe (a user and password,
        or a TLS context, when the included configuration requires them)."""
        self.config_file = Path(config_file) if config_file is not None else None
        self.start_timeout_s = start_timeout_s
        self.base_dir = self._directory(base_dir, "berth-nats-cluster-")
        self._route_user = f"route-{secrets.token_hex(4)}"
        self._route_password = secrets.token_urlsafe(24)
        self.cluster_ports: list[int] = []
        self.servers: list[NatsServer] = []

    # -- configuration -----------------------------------------------------------------------
    def server_name(self, index: int) -> str:
        return f"{self.name}-{index + 1}"

    def _config(self, index: int) -> str:
        """Server ``index``'s configuration file's text."""
        return server_config(
            server_name=self.server_name(index),
            cluster_name=self.name,
            cluster_listen=f"{self.host}:{self.cluster_ports[index]}",
            routes=[
                f"{self.host}:{port}"
                for other, port in enumerate(self.cluster_ports)
                if other != index
            ],
            route_user=None if self.route_tls is not None else self._route_user,
            route_password=None if self.route_tls is not None else self._route_password,
            route_tls=self.route_tls,
            sync_interval=self.sync_interval,
            client_tls=self.client_tls,
            include=None if self.config_file is None else self._include(index),
        )

    def _include(self, index: int) -> Path:
        assert self.config_file is not None
        here = (self.base_dir / self.server_name(index)).resolve()
        return Path(os.path.relpath(self.config_file.resolve(), here))

    # -- the processes -----------------------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @property
    def url(self) -> str:
        """Every server's client URL, comma-separated (what clients are given)."""
        return ",".join(self.urls)

    def start(self) -> NatsCluster:
        """Start every server and wait until JetStream's meta group has a leader."""
        if self.servers:
            for index, server in enumerate(self.servers):
                if not server.running:
                    self.restart(index)
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.cluster_ports = [_free_port(self.host) for _ in range(self.size)]
        try:
            for index in range(self.size):
                directory = self.base_dir / self.server_name(index)
                directory.mkdir(parents=True, exist_ok=True)
                config = directory / "cluster.conf"  # holds the routes' password
                write_private(config, self._config(index).encode())
                server = NatsServer(
                    store_dir=directory,
                    config_file=config,
                    host=self.host,
                    start_timeout_s=self.start_timeout_s,
                    tls=self.client_tls is not None,
                )
                self.servers.append(server)
                server.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until a client of the cluster sees JetStream answer (a meta leader elected)
        and, without a probe user, until a stream replicated on every running server can be
        placed (:meth:`_places_replicas`)."""
        asyncio.run(self._await_ready(self.start_timeout_s if timeout_s is None else timeout_s))

    async def _await_ready(self, timeout_s: float) -> None:
        import nats
        from nats.errors import Error as NatsError

        deadline = time.monotonic() + timeout_s
        last: object = None
        urls = [server.url for server in self.servers if server.running]
        while time.monotonic() < deadline:
            try:
                connection = await nats.connect(
                    urls,
                    connect_timeout=1,
                    allow_reconnect=False,
                    max_reconnect_attempts=0,
                    **self.probe_options,
                )
            except (NatsError, OSError, TimeoutError) as error:
                last = error
                await asyncio.sleep(0.1)
                continue
            try:
                # the meta group's leader answers $JS.API.INFO; before the election: no answer
                reply = await connection.request("$JS.API.INFO", b"", timeout=1)
                if b'"error"' in reply.data:
                    last = reply.data.decode(errors="replace")
                elif "user" in self.probe_options or await self._places_replicas(
                    connection, len(urls)
                ):
                    return  # (a probe user given may not create streams: the leader will do)
                else:
                    last = f"no stream of {len(urls)} replicas could be placed yet"
            except (NatsError, TimeoutError) as error:
                last = error
            finally:
                with contextlib.suppress(Exception):
                    await connection.close()
            await asyncio.sleep(0.1)
        raise Unavailable(f"the NATS cluster formed no JetStream leader in {timeout_s:g}s: {last}")

    @staticmethod
    async def _places_replicas(connection: Client, replicas: int) -> bool:
        """Whether a stream of ``replicas`` replicas can be placed now (a memory stream,
        created and deleted): a meta leader is elected before every peer is current, and
        until they are, creating an R3 bucket fails ("no suitable peers for placement")."""
        from nats.js.api import StorageType, StreamConfig

        js = connection.jetstream()
        name = f"berth_ready_{secrets.token_hex(4)}"
        config = StreamConfig(
            name=name, subjects=[f"{name}.x"], num_replicas=replicas, storage=StorageType.MEMORY
        )
        try:
            await js.add_stream(config)
        except Exception:
            return False
        with contextlib.suppress(Exception):
            await js.delete_stream(name)
        return True

    def kill(self, index: int) -> None:
        """SIGKILL server ``index``, as a crash would (its port and store are kept)."""
        self.servers[index].kill()

    def stop_server(self, index: int) -> None:
        self.servers[index].stop()

    def restart(self, index: int) -> NatsServer:
        """Start server ``index`` again on its port, with its store: it rejoins the cluster."""
        server = self.servers[index]
        server.stop()
        return server.start()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def close(self) -> None:
        """Stop every server and delete the directory if this object created it."""
        for server in self.servers:
            server.close()
        self._delete_owned_dir()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __repr__(self) -> str:
        running = sum(server.running for server in self.servers)
        return f"NatsCluster({self.name}, {running}/{self.size} running, {self.base_dir})"
