"""``berth up`` starts again the agents and schedulers that exit by themselves (what a
systemd unit's ``Restart=always`` does in a real deployment): a process whose NATS
connection was closed for good exits (:func:`berth.nats.connection.until_stopped`), and
without this a local cluster would lose it for the rest of its life.  Real processes: both
children are ``kill -9``-ed, started again with the same arguments, and the API (served by
the restarted scheduler, on the same address) sees the restarted agent's node again."""

from __future__ import annotations

import contextlib
import signal
import time

import httpx
import pytest

from berth.processes.up import LocalCluster
from tests.api_helpers import api_client

pytestmark = pytest.mark.slow  # a whole berth up, its children killed and started again


def test_exited_children_are_started_again_and_the_cluster_serves_again() -> None:
    with LocalCluster(1, heartbeat_s=0.5, runtime="fake", http=("127.0.0.1", 0)) as up:
        assert up.restart_exited() == []  # nothing exited: nothing started
        killed = [*up.agent_processes, *up.scheduler_processes]
        for process in killed:
            process.send_signal(signal.SIGKILL)
            process.wait(10)
        said = up.restart_exited()
        assert len(said) == 2 and up.restarts == 2, said
        assert all("exited with status -9; started again" in line for line in said), said
        fresh = [*up.agent_processes, *up.scheduler_processes]
        assert all(process.poll() is None for process in fresh)
        assert {p.pid for p in fresh}.isdisjoint(p.pid for p in killed)
        with api_client(up) as api:
            deadline = time.monotonic() + 30.0
            while True:
                names: list[str] = []
                with contextlib.suppress(httpx.HTTPError):  # still starting: nobody listens
                    nodes = api.get("/v1/nodes")
                    if nodes.status_code == 200:
                        names = [node["name"] for node in nodes.json()["items"]]
                if names == ["node-00"]:
                    break
                assert time.monotonic() < deadline, "the restarted cluster never served"
                time.sleep(0.2)
        assert up.restart_exited() == []
