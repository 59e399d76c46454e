"""The command line: output on success, one clear line (no traceback) on bad input."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def berth(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from berth.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_schedule_prints_the_placement() -> None:
    result = berth(
        *("schedule", "--node", "w1", "--node-platform", "linux/amd64", "--platform"),
        *("linux/x86_64", "--instance", "micro", "--layer", "sha256:ab:12MiB"),
    )
    assert result.returncode == 0, result.stderr
    assert "w1" in result.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["schedule", "--instance", "huge"], "unknown instance type 'huge'"),
        (["schedule", "--platform", "linux/amd46"], "--platform: unknown architecture"),
        (["schedule", "--layer", "nosize"], "--layer"),
        (["schedule", "--layer", "x:-5MiB"], "negative"),
        (["schedule", "--node", ""], "--node: must not be empty"),
        (
            ["schedule", "--node-platform", "linux/amd64", "--platform", "linux/arm64"],
            "[linux/arm64/v8]",
        ),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], expected: str) -> None:
    result = berth(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert expected in result.stderr


AGENT_TOML = """
[node]
name = "w1"
platform = "linux/amd64"
[budget]
mem_max = "8GiB"
disk_max = "100GiB"
cpu_max_load = 0.9
disk_bw_cap = "2GiBps"
disk_bw_max_load = 0.8
net_bw_cap = "10Gbps"
net_bw_max_load = 0.8
[agent]
heartbeat_s = 0.2
"""


def test_agent_check_prints_the_effective_configuration(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(AGENT_TOML)
    result = berth("agent", "--config", str(path), "--check")
    assert result.returncode == 0, result.stderr
    assert "budget.mem_max" in result.stdout and "8GiB" in result.stdout
    assert "configuration is valid" in result.stdout


def test_agent_check_says_whom_process_workloads_run_as_and_what_containers_lack(
    tmp_path: Path,
) -> None:
    """The process runtime's user and its lack of isolation; for the container runtime, the
    OCI runtime found and, with no image layout, one line naming ``container`` and the fix."""
    path = tmp_path / "agent.toml"
    path.write_text(AGENT_TOML + 'runtime = "process"\n[process]\nuser = "nobody"\n')
    result = berth("agent", "--config", str(path), "--check")
    assert result.returncode == 0, result.stderr
    assert "nobody (uid" in result.stdout and "development and tests" in result.stdout
    images = tmp_path / "no-images"
    path.write_text(AGENT_TOML + f'runtime = "container"\n[container]\nimages = "{images}"\n')
    result = berth("agent", "--config", str(path), "--check")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "container.runc" in result.stdout
    assert result.stderr.startswith("error: container: ")
    if shutil.which("runc"):  # installed: not among what is missing
        assert "install runc" not in result.stderr
    assert f"no OCI image layout at {images}" in result.stderr


def test_agent_runs_and_advertises_for_a_while(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(AGENT_TOML)
    result = berth("agent", "--config", str(path), "--duration", "0.5")
    assert result.returncode == 0, result.stderr
    assert "w1: mem_free=8GiB" in result.stdout


def test_agent_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(AGENT_TOML.replace('"8GiB"', '"8 GiBs"'))
    result = berth("agent", "--config", str(path), "--check")
    assert result.returncode == 2
    assert "budget.mem_max" in result.stderr and "8 GiBs" in result.stderr
    assert "Traceback" not in result.stderr


def test_cluster_boots_real_processes() -> None:
    result = berth("cluster", "--nodes", "3", "--workloads", "4", "--command", "sleep 0.1")
    assert result.returncode == 0, result.stderr
    assert "job-0" in result.stdout and "node-00" in result.stdout
    # With live monitors a busy machine may legitimately refuse (cpu_saturated): only the run
    # itself is checked here.
    live = berth(
        "cluster", "--nodes", "2", "--workloads", "2", "--command", "true", "--live-monitors"
    )
    assert live.returncode == 0, live.stderr
    assert "2 workloads on 2 embedded agents" in live.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["cluster", "--nodes", "0"], "nodes"),
        (["cluster", "--runtime", "docker"], "--runtime"),
        (["cluster", "--command", ""], "--command"),
    ],
)
def test_cluster_bad_flags(args: list[str], expected: str) -> None:
    result = berth(*args)
    assert result.returncode == 2
    assert expected in result.stderr and "Traceback" not in result.stderr


def test_the_demo_in_an_80_column_pipe_keeps_every_figure_whole(tmp_path: Path) -> None:
    """Piped, a table is as wide as its figures: none is cut to ``3.07/2.…``."""
    result = subprocess.run(
        [sys.executable, "-m", "berth.cli", "demo", "--quiet", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert result.returncode == 0, result.stderr
    assert "berth" in result.stdout and "…" not in result.stdout, result.stdout
