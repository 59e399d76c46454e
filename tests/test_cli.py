"""The command line: output on success, one clear line (no traceback) on bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest


def berth(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from berth.cli import main; main()", *args],
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
        (["schedule", "--platform", "linux/amd46"], "platforms.0"),
        (["schedule", "--layer", "nosize"], "--layer"),
        (["schedule", "--layer", "x:-5MiB"], "negative"),
        (["schedule", "--node", ""], "local"),
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
