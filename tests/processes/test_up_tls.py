"""``berth up --tls``: a CA made for the cluster, mutual TLS between every process and the
nats-servers (and between the servers of a cluster), HTTPS for the API.  Real processes: a
placement through the API over HTTPS and the CLI's ``berth routes`` with its ``--tls-*`` flags
work; a NATS client without a certificate, a plain-text NATS client, and an HTTPS client that
does not trust the cluster's CA are each refused."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys

import httpx
import pytest

from berth.api.client import ApiClient, ApiLocation
from berth.api.server import write_api_file
from berth.errors import Unavailable
from berth.nats.connection import connect
from berth.processes.up import LocalCluster

pytestmark = pytest.mark.slow  # a whole berth up (one and three nats-servers) with TLS

REQUEST = {"namespace": "tls", "spec": "micro", "layers": [{"id": "sha256:base", "size": 1}]}


@pytest.mark.parametrize("servers", [1, 3])
def test_berth_up_with_tls_serves_over_tls_and_refuses_the_rest(servers: int) -> None:
    with LocalCluster(
        1, heartbeat_s=0.5, runtime="fake", http=("127.0.0.1", 0), tls=True, nats_servers=servers
    ) as up:
        assert up.api_url is not None and up.api_url.startswith("https://")
        assert up.api_token is not None and up.api_ca is not None and up.auth is not None
        assert all(url.startswith("tls://") for url in up.url.split(","))
        assert "(TLS on)" in up.describe()
        # with the API, api.json carries the NATS access: the hints need no flags
        assert "  every route:       berth routes\n" in up.describe()
        location = ApiLocation(up.api_url, up.api_token, "test", ca=str(up.api_ca))
        with ApiClient(location, timeout_s=20.0) as api:
            assert [node.name for node in api.nodes().items] == ["node-00"]
            placed = api.request("POST", "/v1/placements", body={**REQUEST, "name": "p"})
            assert placed["worker_node"] == "node-00"
        with pytest.raises(httpx.ConnectError):  # the system's CAs do not know this one
            httpx.get(f"{up.api_url}/healthz", timeout=5)
        plain = up.api_url.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{plain}/healthz", timeout=5)

        auth = up.auth

        async def nats_clients() -> None:
            client = await connect(up.url, name="t", credentials=auth.client, tls=up.client_tls())
            await client.close()
            anonymous = ssl.create_default_context(cafile=str(up.api_ca))  # no certificate
            with pytest.raises(Unavailable):
                await connect(
                    up.url,
                    name="t",
                    credentials=auth.client,
                    tls=anonymous,
                    first_connect_timeout_s=3,
                )
            plaintext = up.url.replace("tls://", "nats://")
            with pytest.raises(Unavailable):
                await connect(
                    plaintext, name="t", credentials=auth.client, first_connect_timeout_s=3
                )

        asyncio.run(nats_clients())
        files = up.tls_files["client"]
        routes = subprocess.run(
            [
                sys.executable,
                "-m",
                "berth.cli",
                "routes",
                "--nats",
                up.url,
                "--creds",
                str(up.paths["client"]),
                "--tls-ca",
                str(files.ca),
                "--tls-cert",
                str(files.cert),
                "--tls-key",
                str(files.key),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert routes.returncode == 0, routes.stdout + routes.stderr
        assert "tls/p/0" in routes.stdout
        # no flags at all: the URL, credentials and TLS files come from berth up's api.json
        home = up.directory / "home"
        write_api_file(
            up.api_url,
            up.api_token,
            home / "api.json",
            ca=up.api_ca,
            nats=(up.url, up.client_files()),
        )
        found = subprocess.run(
            [sys.executable, "-m", "berth.cli", "routes"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "200", "BERTH_HOME": str(home)},
        )
        assert found.returncode == 0 and "tls/p/0" in found.stdout, found.stdout + found.stderr
        assert found.stderr == ""  # not even asyncio's eof_received warning
