"""The API on every scheduler: ``berth up --schedulers 2`` serves it from both, ``api.json``
lists both, and when one API process is ``kill -9``-ed under create load the CLI's client
goes on through the other.  Real processes; the pause between the kill and the next answered
create is printed (no timing is asserted: this machine's speed varies)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from berth.api.client import ApiClient, ApiLocation
from berth.api.server import write_api_file
from berth.errors import Unavailable
from berth.processes.up import LocalCluster

pytestmark = pytest.mark.slow  # a whole berth up with two API processes, one killed

IMAGE = {"name": "hello", "layers": [{"id": "sha256:2222", "size": "8MiB"}]}


def _create(api: ApiClient, name: str) -> str:
    """Create ``name`` and stop it again (the nodes' memory is not used up); its id."""
    body = {"name": name, "image": "hello", "type": "micro", "command": ["sleep", "60"]}
    workload_id = api.create_workload(body).id
    api.stop(workload_id, grace_s=0)
    return workload_id


def test_both_schedulers_serve_the_api_and_the_client_fails_over(tmp_path: Path) -> None:
    with LocalCluster(
        2, schedulers=2, heartbeat_s=0.5, runtime="fake", http=("127.0.0.1", 0)
    ) as up:
        assert len(up.api_urls) == 2 and up.api_url == up.api_urls[0]
        assert up.api_token is not None
        assert "other endpoints:" in up.describe() and up.api_urls[1] in up.describe()
        for url in up.api_urls:  # both answer on their own
            assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        location = ApiLocation(up.api_url, up.api_token, "test", tuple(up.api_urls[1:]))
        with ApiClient(location, timeout_s=20.0) as api:
            api.add_image(IMAGE)
        created: list[tuple[float, str]] = []
        unknown: list[str] = []
        stop = threading.Event()

        def load(worker: int) -> None:
            with ApiClient(location, timeout_s=20.0) as api:
                for index in range(1000):
                    if stop.is_set():
                        return
                    name = f"w{worker}-{index}"
                    try:
                        created.append((time.monotonic(), _create(api, name)))
                    except Unavailable:  # the create was out when its endpoint died
                        unknown.append(name)

        workers = [threading.Thread(target=load, args=(n,)) for n in range(2)]
        for worker in workers:
            worker.start()
        time.sleep(1.5)
        killed_at = time.monotonic()
        up.scheduler_processes[0].send_signal(signal.SIGKILL)  # the first endpoint's process
        up.scheduler_processes[0].wait(10)
        time.sleep(3.0)
        stop.set()
        for worker in workers:
            worker.join(60)
        after = [at for at, _ in created if at > killed_at]
        assert after, "no create was answered after the first endpoint died"
        print(
            f"{len(created)} creates answered ({len(after)} after the kill, the first "
            f"{after[0] - killed_at:.2f} s after it), {len(unknown)} of unknown outcome"
        )
        assert len(unknown) <= 2, unknown  # at most one in flight per worker at the kill

        # the CLI itself, from api.json naming both endpoints: the first is dead
        home = tmp_path / "home"
        write_api_file(up.api_urls[0], up.api_token, home / "api.json", others=up.api_urls[1:])
        assert json.loads((home / "api.json").read_text())["urls"] == up.api_urls
        environ = {k: v for k, v in os.environ.items() if k not in ("BERTH_API", "BERTH_TOKEN")}
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "berth.cli",
                "run",
                "hello",
                "--type",
                "micro",
                "--name",
                "from-cli",
                "--",
                "sleep",
                "60",
            ],
            env={**environ, "BERTH_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        with ApiClient(location, timeout_s=20.0) as api:
            names = [workload.name for workload in api.workloads().items]
        assert "from-cli" in names
        ids = {workload_id for _, workload_id in created}
        assert len(ids) == len(created)  # each answered create is one workload
