"""``berth up --runtime microvm``: the service's cluster booting real QEMU guests.

A real cluster (:class:`~berth.processes.up.LocalCluster`, as ``berth up --runtime microvm
--nodes 2 --http 127.0.0.1:0`` starts it: nats-server, two ``microvm`` agents as processes,
a scheduler serving the API) and the operator's commands against it: import the default OCI
layout ``berth microvm setup`` wrote, run ``busybox`` twice — a long-running guest, then
``echo hello`` placed next to it because the node holds its layers (colocated bytes = the
image's) — ``berth ps`` shows the second exited with code 0, and once every guest has ended
the node advertises the image's layer digests as cached: the ids the scheduler ranks by are
the ids of the node's layer files.  Two boots under TCG.  Skipped, saying why, only where
QEMU, the setup or root is missing (``.ci/run`` installs the packages and runs the setup).

The refusal needs no guest and always runs: on a host without the setup, ``berth up
--runtime microvm`` is one error line naming ``--runtime`` and the command that fixes it,
before anything starts.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from berth.cli.main import app
from berth.nats.connection import connect
from berth.node.microvm.paths import GuestFiles, problems
from berth.oci import read_layout
from berth.processes.up import LocalCluster
from berth.store.nats import NatsStore, bucket_ttl_s

pytestmark = pytest.mark.slow  # starts a whole berth up

FILES = GuestFiles.at(None)
MISSING = problems(FILES)
if os.geteuid() != 0:
    MISSING.append("converting layers to erofs images needs root")
if not (FILES.images_dir / "index.json").is_file():
    MISSING.append(f"no OCI image layout at {FILES.images_dir}: berth microvm setup")
needs_guests = pytest.mark.skipif(
    bool(MISSING), reason=f"microVM guests cannot boot here: {'; '.join(MISSING)}"
)

GUEST_TIMEOUT_S = 90.0
"""A boot under emulation on a loaded, shared machine."""


def berth(cluster: LocalCluster | None, *args: str, env: dict[str, str] | None = None) -> Any:
    """``berth ARGS`` in this process, against ``cluster``'s API; its result."""
    overrides: dict[str, str | None] = {key: None for key in os.environ if key.startswith("BERTH_")}
    if cluster is not None:
        assert cluster.api_url is not None and cluster.api_token is not None
        overrides |= {"BERTH_API": cluster.api_url, "BERTH_TOKEN": cluster.api_token}
    overrides |= {"COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    return CliRunner().invoke(app, list(args), env=overrides)


def ok(cluster: LocalCluster, *args: str) -> str:
    result = berth(cluster, *args)
    assert result.exit_code == 0, (args, result.stdout, result.stderr)
    return str(result.stdout)


def document(cluster: LocalCluster, *args: str) -> Any:
    """``berth ARGS --json`` (before a ``--``): its one JSON document."""
    at = args.index("--") if "--" in args else len(args)
    return json.loads(ok(cluster, *args[:at], "--json", *args[at:]))


def test_up_refuses_microvm_where_guests_cannot_boot(tmp_path: Path) -> None:
    home = tmp_path / "home"  # berth's default data directory is under $HOME: empty here
    home.mkdir()
    result = berth(
        None,
        "up",
        "--runtime",
        "microvm",
        "--nodes",
        "2",
        "--http",
        "off",
        env={"HOME": str(home), "BERTH_HOME": str(tmp_path)},
    )
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: --runtime: "), result.stderr
    data_dir = home / ".local" / "share" / "berth" / "microvm"
    assert f"no guest kernel in {data_dir / 'kernel'}: berth microvm setup" in lines[0]
    assert "starting nats-server" not in result.stdout  # refused before anything started


def test_up_rejects_an_unknown_runtime() -> None:
    result = berth(None, "up", "--runtime", "firecracker", "--http", "off")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --runtime: must be 'auto', 'container', 'process', 'fake' or 'microvm', got "
        "'firecracker'"
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(2, runtime="microvm", heartbeat_s=0.5, http=("127.0.0.1", 0)) as running:
        yield running


async def _advertised(cluster: LocalCluster) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Each node's mounted and cached layer ids, as the scheduler reads them."""
    assert cluster.auth is not None
    client = await connect(cluster.url, name="test", credentials=cluster.auth.scheduler)
    try:
        bucket, ttl_s = cluster.names.nodes_bucket, bucket_ttl_s(cluster.heartbeat_s)
        async with NatsStore(client, bucket=bucket, ttl_s=ttl_s) as store:
            states = await store.states()
    finally:
        await client.close()
    return {name: (state.layers, state.cached_layers) for name, state in states.items()}


@needs_guests
def test_up_microvm_boots_guests_through_the_api(cluster: LocalCluster) -> None:
    description = cluster.describe()
    assert f"berth images import-oci {FILES.images_dir}" in description
    assert "microVM guests:" in description
    nodes = document(cluster, "nodes")["items"]
    assert sorted(node["name"] for node in nodes) == ["node-00", "node-01"]
    assert {node["platform"] for node in nodes} == {"linux/amd64"}

    imported = ok(cluster, "images", "import-oci", str(FILES.images_dir))
    assert imported.startswith("imported busybox: "), imported
    image = read_layout(FILES.images_dir, ref="busybox")
    digests = {layer.digest for layer in image.layers}
    registered = document(cluster, "images")["items"]
    assert [(i["name"], {layer["id"] for layer in i["layers"]}) for i in registered] == [
        ("busybox", digests)  # named by its ref, ranked by the layers' digests
    ]

    # a guest that stays up holds the image's layers on its node
    sleeper = document(cluster, "run", "busybox", "--type", "micro", "--", "sleep", "120")
    assert sleeper["state"] == "running" and sleeper["colocated_bytes"] == 0, sleeper
    held = sleeper["node"]
    # the next one is placed where those layers are, and says so
    hello = document(
        cluster, "run", "busybox", "--name", "hello", "--type", "micro", "--", "echo", "hello"
    )
    assert hello["node"] == held, (sleeper, hello)
    assert hello["colocated_bytes"] == image.size > 0, hello

    deadline = time.monotonic() + GUEST_TIMEOUT_S
    while (row := _row(cluster, hello["id"]))["state"] == "running":
        assert time.monotonic() < deadline, f"echo hello did not exit: {row}"
        time.sleep(0.25)
    assert row["state"] == "exited" and row["exit_code"] == 0, row
    table = ok(cluster, "ps")
    assert "exited (0)" in table and "echo hello" in table, table

    stopped = document(cluster, "stop", sleeper["id"], "--grace", "2")
    assert stopped["state"] == "stopped", stopped

    # every guest ended: the node keeps the layer files, advertised under the same ids
    while True:
        advertised = asyncio.run(_advertised(cluster))
        if advertised[held] == (frozenset(), frozenset(digests)):
            break
        assert time.monotonic() < deadline, advertised
        time.sleep(0.25)
    other = next(name for name in advertised if name != held)
    assert advertised[other] == (frozenset(), frozenset())
    layer_files = cluster.directory / "microvm" / held / "layers"
    names = {path.name.split(".")[0] for path in layer_files.glob("*.erofs")}
    assert names == {digest.replace(":", "-") for digest in digests}


def _row(cluster: LocalCluster, workload_id: str) -> Any:
    items = document(cluster, "ps")["items"]
    return next(item for item in items if item["id"] == workload_id)
