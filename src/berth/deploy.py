"""A real deployment's files: what an operator copies to each machine of a berth cluster.

``berth up`` runs a whole cluster on one machine; a real one runs a nats-server on each of
three machines (JetStream clustered, every bucket with three replicas), a node agent on every
worker machine and schedulers (each serving the HTTP API) on one or more.  They need a
configuration that agrees across machines — the same users and permissions on every server,
certificates from one CA, every server's URL in every process — so :func:`write_deployment`
writes it all at once from a :class:`Plan` into one directory, one sub-directory per machine
to copy to its ``/etc/berth``:

``servers/<name>/``
    ``nats.conf`` (:func:`~berth.nats.cluster.server_config`: its name, client listener with
    mutual TLS, JetStream with ``sync_interval`` in ``/var/lib/berth/nats``, the routes to the
    other servers over mutual TLS), ``auth.conf`` (every role's and node's user with its
    permissions, :meth:`~berth.nats.auth.ClusterAuth.server_config`), ``tls/`` (the CA and the
    server's certificate, valid for its host, used for clients and routes alike) and
    ``nats-server.service``;
``nodes/<node>/``
    ``agent.toml`` (the node's name and a budget to edit to the machine), ``creds.json``
    (this node's user: it may write only its own keys), ``tls/`` (a client certificate named
    after the node) and ``berth-agent.service``;
``schedulers/<name>/``
    ``creds.json`` (the scheduler role), ``tls/``, ``https/`` (the API's server certificate
    for its host), ``api-token`` and ``berth-scheduler.service`` (the API on every scheduler);
``clients/``
    the operator's: ``creds.json`` (the client role), ``tls/`` and ``api.json`` naming every
    scheduler's API (the CLI fails over between them) with the token;
``ca/``
    the CA's certificate and key.  The key signs new certificates; it belongs on no machine
    of the cluster (``README.md`` says so).

Every secret — keys, credentials, the token, the files holding passwords — is written
``0600`` from its creation (:func:`~berth.private.write_private`); the directories ``0700``.

The units run ``/usr/local/bin/berth`` (``BERTH`` below); the agent's has ``KillMode=process``
— systemd's default kills the whole control group when the agent stops, workloads included,
and an agent that restarts must find its workloads running to adopt them (they die by
themselves after the agent's ``orphan_grace_s`` if it does not come back).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from berth.errors import Invalid
from berth.model import NAME_RULE
from berth.nats.auth import ClusterAuth, generate
from berth.nats.cluster import SYNC_INTERVAL, server_config
from berth.nats.connection import Credentials
from berth.node.config import AgentConfig, config_toml
from berth.pki import CA_CERT, CertificateAuthority, TlsFiles
from berth.private import write_private
from berth.validation import shown

__all__ = ["BERTH", "ETC", "Endpoint", "Plan", "write_deployment"]

BERTH = "/usr/local/bin/berth"
"""Where the units expect the ``berth`` command (``pip install berth`` into a venv, linked)."""
NATS_SERVER = "/usr/local/bin/nats-server"
ETC = "/etc/berth"
"""Where each machine's sub-directory is copied."""
STATE = "/var/lib/berth"
NATS_PORT = 4222
CLUSTER_PORT_OFFSET = 2000
"""A server's route port is its client port plus this (4222 → 6222, NATS's conventions)."""
HTTP_PORT = 8080


@dataclass(frozen=True)
class Endpoint:
    """A machine's address and a port on it."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str, default_port: int, field: str) -> Endpoint:
        """``HOST`` or ``HOST:PORT`` (``[v6]:PORT`` for IPv6)."""
        if not isinstance(text, str) or not text or len(text) > 261 or text != text.strip():
            raise Invalid(f"expected HOST or HOST:PORT, got {shown(text)}", field=field)
        host, port = text, default_port
        if text.startswith("["):
            host, _, rest = text[1:].partition("]")
            if rest:
                if not rest.startswith(":"):
                    raise Invalid(f"expected [V6]:PORT, got {shown(text)}", field=field)
                port = _port(rest[1:], text, field)
        elif text.count(":") == 1:
            host, _, rest = text.partition(":")
            port = _port(rest, text, field)
        if not host or any(ch.isspace() or ch in "/\"'\\,@" for ch in host):
            raise Invalid(f"not a host name or address: {shown(text)}", field=field)
        try:
            host.encode("ascii")
        except UnicodeEncodeError:
            raise Invalid(f"a host name must be ASCII, got {shown(text)}", field=field) from None
        return cls(host, port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _port(text: str, whole: str, field: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise Invalid(f"a port is 1 to 65535, got {shown(whole)}", field=field)
    return int(text)


@dataclass(frozen=True)
class Plan:
    """What runs where: the NATS servers, the nodes (agents), the schedulers (and APIs)."""

    servers: tuple[Endpoint, ...]
    nodes: tuple[str, ...]
    schedulers: tuple[Endpoint, ...]
    sync_interval: str = SYNC_INTERVAL
    state_dir: str = STATE
    """Where each machine keeps its state (JetStream's store, the agents' journals)."""
    in_place: bool = False
    """Name every file where it is written, and keep each machine's state in its own
    directory (``<machine>/state``), instead of :data:`ETC` and :attr:`state_dir`: to try
    the whole cluster on one machine (and test it) without copying anything."""

    def __post_init__(self) -> None:
        if len(self.servers) not in (1, 3, 5):
            raise Invalid(
                f"give 1, 3 or 5 NATS servers (a JetStream cluster wants an odd number), "
                f"got {len(self.servers)}",
                field="--server",
            )
        if not self.schedulers:
            raise Invalid("give at least one scheduler", field="--scheduler")
        for name in self.nodes:
            NAME_RULE(name, "--node")
        for what, items in (
            ("--server", [str(s) for s in self.servers]),
            ("--node", list(self.nodes)),
            ("--scheduler", [str(s) for s in self.schedulers]),
        ):
            if len(set(items)) != len(items):
                raise Invalid(f"each {what} once, got {', '.join(items)}", field=what)

    @property
    def nats_urls(self) -> str:
        """Every server's client URL, comma-separated: what each process is given."""
        return ",".join(f"tls://{server}" for server in self.servers)

    def server_name(self, index: int) -> str:
        return f"nats-{index + 1}"

    def scheduler_name(self, index: int) -> str:
        return f"scheduler-{index + 1}"


def _unit(description: str, exec_start: list[str], *, extra: tuple[str, ...] = ()) -> str:
    command = " ".join(exec_start)
    lines = ["[Unit]", f"Description={description}", "After=network-online.target"]
    lines += ["Wants=network-online.target", "", "[Service]", f"ExecStart={command}"]
    lines += ["Restart=always", "RestartSec=1", *extra, "", "[Install]"]
    lines += ["WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def _tls(
    directory: Path,
    authority: CertificateAuthority,
    stem: str,
    common_name: str,
    *,
    host: str | None = None,
) -> TlsFiles:
    """Issue a certificate into ``directory`` beside a copy of the CA's certificate: a
    server's for ``host`` (also a client's: a NATS route dials too), else a client's."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    (directory / CA_CERT).write_bytes(authority.pem)
    names = () if host is None else (host,)
    issued = authority.issue(common_name[:64], names=names, server=host is not None)
    write_private(directory / f"{stem}-key.pem", issued.key)
    (directory / f"{stem}.pem").write_bytes(issued.certificate)
    return TlsFiles(directory / CA_CERT, directory / f"{stem}.pem", directory / f"{stem}-key.pem")


class _Machine:
    """One machine's directory in the deployment, and how its files are named there."""

    def __init__(self, directory: Path, plan: Plan) -> None:
        self.directory = directory
        self.in_place = plan.in_place
        self.state_dir = str(directory / "state") if plan.in_place else plan.state_dir
        directory.parent.mkdir(exist_ok=True, mode=0o700)  # servers/, nodes/ …: private too
        directory.mkdir(exist_ok=True, mode=0o700)

    def there(self, path: Path) -> Path:
        """``path`` (in this directory) as the machine names it once copied to :data:`ETC`."""
        return path.resolve() if self.in_place else Path(ETC) / path.relative_to(self.directory)

    def etc(self, name: str) -> str:
        return str(self.there(self.directory / name))

    def tls(self, files: TlsFiles) -> TlsFiles:
        return TlsFiles(self.there(files.ca), self.there(files.cert), self.there(files.key))


def _tls_flags(files: TlsFiles) -> list[str]:
    return ["--tls-ca", str(files.ca), "--tls-cert", str(files.cert), "--tls-key", str(files.key)]


def _write_creds(path: Path, credentials: Credentials) -> None:
    write_private(path, json.dumps(credentials.document()).encode())


def _agent_config(node: str) -> str:
    config = AgentConfig.from_dict(
        {
            "node": {"name": node},
            "budget": {
                "mem_max": "16GiB",
                "disk_max": "200GiB",
                "cpu_max_load": 0.9,
                "disk_bw_cap": "1GiBps",
                "disk_bw_max_load": 0.8,
                "net_bw_cap": "10Gbps",
                "net_bw_max_load": 0.8,
            },
        }
    )
    return (
        "# berth agent configuration (berth agent --config); edit [budget] to this machine.\n"
        "# `berth agent --config agent.toml --check` validates it and prints the result.\n"
        + config_toml(config)
    )


def write_deployment(directory: Path, plan: Plan, *, auth: ClusterAuth | None = None) -> Path:
    """Write ``plan``'s files into ``directory`` (which must not exist, or be empty): see the
    module docstring.  ``directory``."""
    if directory.exists() and any(directory.iterdir()):
        raise Invalid(f"{directory} is not empty: give a new directory", field="directory")
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    authority = CertificateAuthority.create("berth cluster CA")
    authority.write(directory / "ca")
    auth = auth if auth is not None else generate(list(plan.nodes))
    accounts = auth.server_config()
    cluster_ports = [server.port + CLUSTER_PORT_OFFSET for server in plan.servers]

    for index, server in enumerate(plan.servers):
        name = plan.server_name(index)
        machine = _Machine(directory / "servers" / name, plan)
        tls = machine.tls(
            _tls(machine.directory / "tls", authority, "server", name, host=server.host)
        )
        write_private(machine.directory / "auth.conf", accounts.encode())
        routes = [
            str(Endpoint(other.host, cluster_ports[i]))
            for i, other in enumerate(plan.servers)
            if i != index
        ]
        text = server_config(
            server_name=name,
            cluster_name="berth",
            cluster_listen=str(Endpoint(server.host, cluster_ports[index])),
            routes=routes,
            route_tls=tls,
            sync_interval=plan.sync_interval,
            client_listen=str(server),
            client_tls=tls,
            store_dir=Path(machine.state_dir) / "nats",
            include=Path("auth.conf"),  # beside nats.conf
        )
        write_private(machine.directory / "nats.conf", text.encode())
        (machine.directory / "nats-server.service").write_text(
            _unit(
                f"NATS JetStream server {name} of a berth cluster",
                [NATS_SERVER, "-c", machine.etc("nats.conf")],
            )
        )

    for node in plan.nodes:
        machine = _Machine(directory / "nodes" / node, plan)
        tls = machine.tls(_tls(machine.directory / "tls", authority, "agent", f"node {node}"))
        _write_creds(machine.directory / "creds.json", auth.nodes[node])
        (machine.directory / "agent.toml").write_text(_agent_config(node))
        command = [BERTH, "agent", "--config", machine.etc("agent.toml")]
        command += ["--nats", plan.nats_urls, "--creds", machine.etc("creds.json")]
        command += [*_tls_flags(tls), "--state-dir", machine.state_dir]
        (machine.directory / "berth-agent.service").write_text(
            _unit(f"berth node agent {node}", command, extra=("KillMode=process",))
        )

    token = _token()
    api_urls = [f"https://{scheduler}" for scheduler in plan.schedulers]
    for index, scheduler in enumerate(plan.schedulers):
        name = plan.scheduler_name(index)
        machine = _Machine(directory / "schedulers" / name, plan)
        tls = machine.tls(_tls(machine.directory / "tls", authority, "scheduler", name))
        https = machine.tls(
            _tls(machine.directory / "https", authority, "api", f"{name} API", host=scheduler.host)
        )
        _write_creds(machine.directory / "creds.json", auth.scheduler)
        write_private(machine.directory / "api-token", f"{token}\n".encode())
        command = [BERTH, "scheduler", "--nats", plan.nats_urls]
        command += ["--creds", machine.etc("creds.json"), *_tls_flags(tls)]
        command += ["--http", str(scheduler), "--http-public"]
        command += ["--https-cert", str(https.cert), "--https-key", str(https.key)]
        command += ["--token-file", machine.etc("api-token")]
        (machine.directory / "berth-scheduler.service").write_text(
            _unit(f"berth scheduler {name} with the HTTP API", command)
        )

    clients = _Machine(directory / "clients", plan)
    _tls(clients.directory / "tls", authority, "client", "operator")
    _write_creds(clients.directory / "creds.json", auth.client)
    # the operator's ~/.berth: the CA named relative to api.json, wherever it is copied to
    api = {"url": api_urls[0], "urls": api_urls, "token": token, "ca": f"tls/{CA_CERT}"}
    write_private(clients.directory / "api.json", json.dumps(api, indent=2).encode())
    (directory / "README.md").write_text(_readme(plan))
    return directory


def _token() -> str:
    import secrets

    return secrets.token_urlsafe(32)


def _readme(plan: Plan) -> str:
    servers = ", ".join(f"{plan.server_name(i)} ({s})" for i, s in enumerate(plan.servers))
    schedulers = ", ".join(f"{plan.scheduler_name(i)} ({s})" for i, s in enumerate(plan.schedulers))
    return f"""# A berth cluster's files

Written by `berth deploy`. Each sub-directory is one machine's `{ETC}`:

- `servers/<name>/` → each NATS server: {servers}.
  `install -m 0644 nats-server.service /etc/systemd/system/` then
  `systemctl enable --now nats-server`. JetStream keeps its store in `{plan.state_dir}/nats`
  and fsyncs every write (`sync_interval: {plan.sync_interval}`).
- `nodes/<node>/` → each worker machine (edit `agent.toml`'s `[budget]` to the machine,
  check it with `berth agent --config {ETC}/agent.toml --check`), then install and enable
  `berth-agent.service`.
- `schedulers/<name>/` → {schedulers}: `berth-scheduler.service` serves the placement port
  and the HTTP API (HTTPS, the token in `api-token`).
- `clients/` → the operator's machine, as `~/.berth/` (the CLI reads `api.json`; it names
  every API endpoint and fails over between them).
- `ca/` → keep it off the cluster (offline): its key signs new certificates.

Every secret is readable by its owner only; copy with `cp -a` or `rsync -a` to keep the modes.
"""
