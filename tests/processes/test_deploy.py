"""berth.deploy: a real deployment's files, tried as written — three clustered nats-servers
with mutual TLS and berth's users, started from the generated configurations."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import KeyValueConfig

from berth.api.client import ApiClient, locate
from berth.deploy import Endpoint, Plan, write_deployment
from berth.errors import Invalid
from berth.nats.connection import Credentials
from berth.nats.server import nats_server_binary
from berth.pki import TlsFiles


def _ports() -> int:
    """A client port whose route port (+2000) is free too."""
    for _ in range(100):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port: int = a.getsockname()[1]
        if port + 2000 < 65536:
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 2000))
                except OSError:
                    continue
            return port
    raise AssertionError("no free pair of ports")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("h1", Endpoint("h1", 4222)),
        ("h1:5000", Endpoint("h1", 5000)),
        ("10.0.0.1:1", Endpoint("10.0.0.1", 1)),
        ("[::1]:9", Endpoint("::1", 9)),
        ("[fe80::1]", Endpoint("fe80::1", 4222)),
    ],
)
def test_endpoints_parse(text: str, expected: Endpoint) -> None:
    assert Endpoint.parse(text, 4222, "--server") == expected


@pytest.mark.parametrize("text", ["", " h", "h:0", "h:65536", "h:x", "a/b", "hé", "[::1]x", "u@h"])
def test_bad_endpoints_name_the_flag(text: str) -> None:
    with pytest.raises(Invalid) as error:
        Endpoint.parse(text, 4222, "--server")
    assert error.value.field == "--server"


def test_a_plan_is_checked() -> None:
    one = (Endpoint("h", 4222),)
    with pytest.raises(Invalid, match="1, 3 or 5") as error:
        Plan(servers=one * 2, nodes=(), schedulers=one)
    assert error.value.field == "--server"
    with pytest.raises(Invalid, match="at least one scheduler"):
        Plan(servers=one, nodes=(), schedulers=())
    with pytest.raises(Invalid) as error:
        Plan(servers=one, nodes=("n1", "n1"), schedulers=one)
    assert error.value.field == "--node"
    with pytest.raises(Invalid) as error:
        Plan(servers=one, nodes=("bad name!",), schedulers=one)
    assert error.value.field == "--node"


def test_the_directory_must_be_new(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    plan = Plan(servers=(Endpoint("h", 4222),), nodes=(), schedulers=(Endpoint("h", 8080),))
    with pytest.raises(Invalid, match="not empty"):
        write_deployment(tmp_path, plan)
    assert [p.name for p in tmp_path.iterdir()] == ["x"]


def test_secrets_are_private_and_units_name_the_machine_paths(tmp_path: Path) -> None:
    plan = Plan(
        servers=tuple(Endpoint(f"10.0.0.{i}", 4222) for i in (1, 2, 3)),
        nodes=("node-1", "node-2"),
        schedulers=(Endpoint("10.0.1.1", 8080), Endpoint("10.0.1.2", 8080)),
    )
    root = write_deployment(tmp_path / "d", plan)
    secrets = [
        *root.rglob("*-key.pem"),
        *root.rglob("creds.json"),
        *root.rglob("api-token"),
        *root.rglob("*.conf"),
        root / "clients" / "api.json",
    ]
    assert len(secrets) > 15
    for path in secrets:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    conf = (root / "servers" / "nats-1" / "nats.conf").read_text()
    assert 'include "auth.conf"' in conf
    assert '"nats-route://10.0.0.2:6222"' in conf and '"nats-route://10.0.0.3:6222"' in conf
    assert "10.0.0.1:6222" in conf and "nats-route://10.0.0.1" not in conf
    agent = (root / "nodes" / "node-1" / "berth-agent.service").read_text()
    assert "KillMode=process" in agent
    assert "--nats tls://10.0.0.1:4222,tls://10.0.0.2:4222,tls://10.0.0.3:4222" in agent
    assert "--tls-cert /etc/berth/tls/agent.pem" in agent
    api = json.loads((root / "clients" / "api.json").read_text())
    assert api["urls"] == ["https://10.0.1.1:8080", "https://10.0.1.2:8080"]
    tokens = {
        (root / "schedulers" / s / "api-token").read_text() for s in ("scheduler-1", "scheduler-2")
    }
    assert tokens == {api["token"] + "\n"}
    node_creds = json.loads((root / "nodes" / "node-2" / "creds.json").read_text())
    assert (
        node_creds["user"]
        != json.loads((root / "nodes" / "node-1" / "creds.json").read_text())["user"]
    )


def _tls(machine: Path, stem: str) -> TlsFiles:
    return TlsFiles(
        machine / "tls" / "ca.pem",
        machine / "tls" / f"{stem}.pem",
        machine / "tls" / f"{stem}-key.pem",
    )


@pytest.fixture
def deployed(tmp_path: Path) -> Iterator[tuple[Path, Plan]]:
    """Three nats-servers started from a deployment's own files (in place, on loopback)."""
    ports: list[int] = []
    while len(ports) < 3:
        port = _ports()
        if port not in ports and port + 2000 not in ports:
            ports.append(port)
    plan = Plan(
        servers=tuple(Endpoint("127.0.0.1", p) for p in ports),
        nodes=("node-1",),
        schedulers=(Endpoint("127.0.0.1", _ports()),),
        in_place=True,
    )
    root = write_deployment(tmp_path / "d", plan)
    processes = [
        subprocess.Popen(
            [str(nats_server_binary()), "-c", str(root / "servers" / f"nats-{i}" / "nats.conf")],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / f"nats-{i}.log").open("wb"),
        )
        for i in (1, 2, 3)
    ]
    try:
        yield root, plan
    finally:
        for process in processes:
            process.kill()
            process.wait()


async def _connect(url: str, machine: Path, stem: str, **options: object) -> Client:
    creds = Credentials.load(machine / "creds.json")  # a password, or a node's nkey
    secret: dict[str, object] = (
        {"user": creds.user, "password": creds.password}
        if creds.seed is None
        else {"nkeys_seed_str": creds.seed}
    )
    return await nats.connect(
        url.split(","),
        inbox_prefix=creds.inbox_prefix,
        tls=_tls(machine, stem).check().client_context(),
        **secret,
        **options,
    )


@pytest.mark.slow
def test_the_servers_form_a_tls_cluster_with_berths_users(deployed: tuple[Path, Plan]) -> None:
    root, plan = deployed
    url = ",".join(f"tls://{s}" for s in plan.servers)

    async def scenario() -> None:
        deadline = time.monotonic() + 30
        scheduler = None
        while scheduler is None:
            try:
                scheduler = await _connect(url, root / "schedulers" / "scheduler-1", "scheduler")
                js = scheduler.jetstream(timeout=3)
                bucket = await js.create_key_value(
                    KeyValueConfig(bucket="berth_nodes", replicas=3, history=1)
                )
            except Exception:
                if scheduler is not None:
                    await scheduler.close()
                    scheduler = None
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        try:
            info = await js.stream_info("KV_berth_nodes")
            assert info.config.num_replicas == 3
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2
            node = await _connect(url, root / "nodes" / "node-1", "agent")
            try:
                await node.publish("$KV.berth_nodes.node-1", b"{}")
                await node.flush()
            finally:
                await node.close()
            for _ in range(50):
                try:
                    entry = await bucket.get("node-1")
                    break
                except Exception:
                    await asyncio.sleep(0.1)
            assert entry.value == b"{}"
        finally:
            await scheduler.close()
        # without a client certificate: refused by the server's mutual TLS
        anonymous = ssl.create_default_context(cafile=str(root / "clients" / "tls" / "ca.pem"))
        creds = json.loads((root / "clients" / "creds.json").read_text())
        with pytest.raises(Exception):  # noqa: B017  # the handshake's error, whatever its type
            await nats.connect(
                url.split(","),
                user=creds["user"],
                password=creds["password"],
                tls=anonymous,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=2,
            )

    asyncio.run(scenario())


def _exec_start(unit: Path) -> list[str]:
    """A unit's command, ``berth`` run by this interpreter (the unit names the installed one)."""
    line = next(line for line in unit.read_text().splitlines() if line.startswith("ExecStart="))
    command = line.removeprefix("ExecStart=").split()
    return [sys.executable, "-m", "berth.cli", *command[1:]]


@pytest.mark.slow
def test_the_units_commands_run_a_cluster_the_cli_reaches_over_https(
    deployed: tuple[Path, Plan], tmp_path: Path
) -> None:
    """The agent's and the scheduler's units, run as written (their TLS, credentials and
    HTTPS flags), make a cluster the operator's ``api.json`` reaches: the node is listed and a
    placement lands on it.  (``--idle-load`` is added: this test machine's load is not a
    node's.)"""
    root, _ = deployed
    agent = [*_exec_start(root / "nodes" / "node-1" / "berth-agent.service"), "--idle-load"]
    scheduler = _exec_start(root / "schedulers" / "scheduler-1" / "berth-scheduler.service")
    processes = [
        subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        for command, log in (
            (agent, (tmp_path / "agent.log").open("wb")),
            (scheduler, (tmp_path / "scheduler.log").open("wb")),
        )
    ]
    try:
        location = locate(None, None, environ={"BERTH_HOME": str(root / "clients")})
        assert location.url.startswith("https://") and location.ca is not None
        with ApiClient(location, timeout_s=10.0) as api:
            deadline = time.monotonic() + 90
            while True:
                for process, log in zip(processes, ("agent", "scheduler"), strict=True):
                    assert process.poll() is None, (tmp_path / f"{log}.log").read_text()
                try:
                    if [node.name for node in api.nodes().items] == ["node-1"]:
                        break
                except Exception:  # not up yet: no API, or no node seen
                    pass
                assert time.monotonic() < deadline, (tmp_path / "scheduler.log").read_text()
                time.sleep(0.5)
            body = {"name": "p", "spec": "micro", "layers": [{"id": "sha256:a", "size": 1}]}
            assert api.request("POST", "/v1/placements", body=body)["worker_node"] == "node-1"
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
