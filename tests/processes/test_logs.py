"""A workload's output on a real ``berth up`` (process runtime): the API reads it from the
node over NATS, ``berth logs`` prints it — by id or identity — and ``--follow`` prints each
line as it comes until the workload ends."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from berth.api.client import ApiClient, ApiLocation
from berth.processes.up import LocalCluster

pytestmark = pytest.mark.slow  # a berth up: nats-server, an agent and a scheduler


@pytest.fixture(scope="module")
def up() -> Iterator[LocalCluster]:
    cluster = LocalCluster(1, heartbeat_s=0.5, runtime="process", http=("127.0.0.1", 0))
    with cluster:
        yield cluster


def berth(up: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    assert up.api_url is not None and up.api_token is not None
    env = {**os.environ, "BERTH_API": up.api_url, "BERTH_TOKEN": up.api_token}
    env["BERTH_HOME"] = str(up.directory / "home")  # no api.json of another cluster
    return subprocess.run(
        [sys.executable, "-m", "berth.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def created(up: LocalCluster, name: str, script: str) -> str:
    assert up.api_url is not None and up.api_token is not None
    with ApiClient(ApiLocation(up.api_url, up.api_token, "test")) as api:
        layers = [{"id": "sha256:1111", "size": "1MiB"}]
        body = {"name": name, "type": "micro", "command": ["sh", "-c", script], "layers": layers}
        return api.create_workload(body).id


def test_the_output_of_an_ended_workload_is_read_from_its_node(up: LocalCluster) -> None:
    workload_id = created(up, "said", "echo hi; echo 'ünïcode' >&2; exit 3")
    assert up.api_url is not None and up.api_token is not None
    with ApiClient(ApiLocation(up.api_url, up.api_token, "test")) as api:
        for _ in range(100):
            if api.workload(workload_id).state == "exited":
                break
            time.sleep(0.1)
        piece = api.logs(workload_id)
        assert piece.kept and piece.text == "hi\nünïcode\n", piece
        assert api.logs(workload_id, offset=3).text == "ünïcode\n"
    for ref in (workload_id, "default/said/0", "default/said"):
        shown = berth(up, "logs", ref)
        assert shown.returncode == 0 and shown.stdout == "hi\nünïcode\n", (ref, shown)
    unknown = berth(up, "logs", "default/nothing")
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: ID: no workload")


def test_follow_prints_each_line_as_it_comes_until_the_end(up: LocalCluster) -> None:
    workload_id = created(up, "ticks", "for i in 1 2 3; do echo tick $i; sleep 0.7; done")
    started = time.monotonic()
    shown = berth(up, "logs", "--follow", workload_id)
    assert shown.returncode == 0, shown
    assert shown.stdout == "tick 1\ntick 2\ntick 3\n", shown
    assert time.monotonic() - started >= 1.4  # it waited for the later lines
