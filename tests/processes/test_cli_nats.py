"""The NATS commands on the command line: one clear line on bad input or an unreachable
cluster (exit 2), against a real nats-server; a child failing while ``berth up`` starts is
named with its own words, and nothing is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from berth.api.server import write_api_file
from berth.embedded import embedded_configs
from berth.errors import Unavailable
from berth.node.config import config_toml
from berth.processes.up import LocalCluster, free_port
from berth.testing.nats import NatsServer


def berth(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from berth.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=None if env is None else {**os.environ, **env},
    )


def _one_line(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_no_scheduler_and_bad_flags_are_one_line(nats_server: NatsServer, tmp_path: Path) -> None:
    _one_line(berth("place", "--nats", nats_server.url), "no scheduler answers")
    _one_line(berth("place", "--nats", nats_server.url, "--instance", "huge"), "huge")
    creds = tmp_path / "bad.creds.json"
    creds.write_text(json.dumps({"user": "x"}))
    _one_line(berth("routes", "--nats", nats_server.url, "--creds", str(creds)), "--creds")
    _one_line(berth("scheduler", "--nats", nats_server.url, "--heartbeat", "0"), "--heartbeat")
    config = tmp_path / "node.toml"
    config.write_text(config_toml(embedded_configs(1)[0]))
    _one_line(
        berth("agent", "--config", str(config), "--config", str(config)), "exactly one --config"
    )
    _one_line(berth("up", "--nodes", "0"), "--nodes")


def test_an_unreachable_cluster_is_one_line_at_once_saying_what_to_do(tmp_path: Path) -> None:
    port = free_port("127.0.0.1")  # nothing listens there
    home = {"BERTH_HOME": str(tmp_path / "home")}
    for command in (("routes",), ("whereis", "default/x/0"), ("place",)):
        started = time.monotonic()
        result = berth(*command, "--nats", f"nats://127.0.0.1:{port}", env=home)
        _one_line(result, f"cannot connect to nats at nats://127.0.0.1:{port}")
        assert "pass --nats URL" in result.stderr and "give no --nats" in result.stderr
        assert time.monotonic() - started < 4.0, command  # not a retry loop
    result = berth("routes", env=home)  # no flags and no berth up: where one would be
    _one_line(result, "start a cluster with `berth up`")
    stale = tmp_path / "home" / "api.json"  # a berth up killed with -9 leaves it behind
    write_api_file("http://127.0.0.1:9", "t", stale, nats=(f"nats://127.0.0.1:{port}", {}))
    _one_line(berth("routes", env=home), f"{stale} is stale")


def test_whereis_an_unplaced_workload(nats_server: NatsServer) -> None:
    result = berth("whereis", "default/nothing/0", "--nats", nats_server.url)
    assert result.returncode == 1, result.stderr
    assert "not placed" in result.stdout


def test_a_config_written_for_berth_up_reads_back_equal(tmp_path: Path) -> None:
    from berth.node.config import load_config

    for config in embedded_configs(3, runtime="fake", heartbeat_s=0.5):
        path = tmp_path / f"{config.node.name}.toml"
        path.write_text(config_toml(config))
        assert load_config(path) == config


def test_bad_values_are_refused_before_anything_starts() -> None:
    # Checked before a server, an agent or a connection is touched: no server needed.
    for args, flag in (
        (("up", "--duration", "nan"), "--duration"),
        (("up", "--heartbeat", "inf"), "--heartbeat"),
        (("up", "--nodes", "100000"), "--nodes"),
        (("up", "--schedulers", "0"), "--schedulers"),
        (("up", "--node-gone-after", "0"), "--node-gone-after"),
        (("up", "--node-gone-after", "nan"), "--node-gone-after"),
        (("scheduler", "--grace", "-1"), "--grace"),
        (("scheduler", "--heartbeat", "inf"), "--heartbeat"),
        (("scheduler", "--node-gone-after", "0"), "--node-gone-after"),
        (("scheduler", "--node-gone-after", "nan"), "--node-gone-after"),
        (("scheduler", "--reconcile-every", "0"), "--reconcile-every"),
        (("scheduler", "--reconcile-every", "-inf"), "--reconcile-every"),
        (("place", "--instance", "nope"), "--instance"),
        (("place", "--platform", "linux/amd64/v99"), "--platform"),
        (("place", "--name", "a b"), "--name"),
        (("place", "--layer", "l:1GiBs"), "--layer"),
        (("whereis", "x/y"), "WORKLOAD"),
        (("whereis", "a b/c/0"), "WORKLOAD"),
    ):
        nats = () if args[0] == "up" else ("--nats", "nats://127.0.0.1:1")
        _one_line(berth(*args, *nats), flag)


@pytest.mark.slow  # starts a whole berth up
def test_a_child_failing_while_berth_up_starts_says_why_and_leaves_nothing() -> None:
    # A failed start removes the cluster's directory, logs included: the error carries the
    # child's own last lines instead of pointing at logs that are gone.
    cluster = LocalCluster(1, runtime="fake", auth=False, lease_ttl_s=0, ready_timeout_s=30)
    with pytest.raises(Unavailable) as failed:
        cluster.start()
    message = str(failed.value)
    assert message.startswith("berth scheduler exited with status 2: error: --lease-ttl"), message
    assert "see the logs" not in message
    assert not cluster.directory.exists()
    assert cluster.server is None and not cluster.agent_processes
    assert not cluster.scheduler_processes
