"""The command line of the API: bad --http/--token flags are one line naming the flag, before
anything starts; so is an argument that is not UTF-8 text; ``berth api openapi`` prints the
committed document."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from berth.cli.main import app

runner = CliRunner()
DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["scheduler", "--http", "0.0.0.0:8080"], "--http"),
        (["scheduler", "--http", "127.0.0.1:70000"], "--http"),
        (["scheduler", "--http", "127.0.0.1:80", "--token", "short"], "--token"),
        (["scheduler", "--token", "a" * 20], "--http"),
        (["scheduler", "--http", "127.0.0.1:80", "--token-file", "/nonexistent"], "--token-file"),
        (["up", "--http", "10.0.0.1:80"], "--http"),
        (["up", "--http", "nonsense"], "--http"),
    ],
)
def test_bad_flags_are_one_line(args: list[str], flag: str) -> None:
    result = runner.invoke(
        app, [*args, "--nats", "nats://127.0.0.1:1"] if args[0] == "scheduler" else args
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}"), result.output


def test_a_command_argument_that_is_not_utf8_is_one_line_and_nothing_is_sent() -> None:
    # argv's byte 0xff becomes a lone surrogate in Python: no request may carry it
    run = ["run", "--api", "http://127.0.0.1:1", "--token", "t" * 24, "--type", "micro", "img"]
    entry = "from berth.cli.main import main; main()"
    args: list[str | bytes] = [sys.executable, "-c", entry, *run, "--", "echo", b"caf\xff"]
    result = subprocess.run(args, capture_output=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.decode(errors="replace").strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: CMD:"), lines
    assert "surrogate" in lines[0] and "cannot reach" not in lines[0]  # refused, never sent


def test_state_dir_goes_with_nats(tmp_path: Path) -> None:
    config = tmp_path / "n.toml"
    config.write_text("[node]\nname='n'\n")
    result = runner.invoke(app, ["agent", "--config", str(config), "--state-dir", str(tmp_path)])
    assert result.exit_code == 2 and "--state-dir" in result.output, result.output


def test_api_openapi_prints_the_committed_document() -> None:
    result = runner.invoke(app, ["api", "openapi"])
    assert result.exit_code == 0
    assert json.loads(result.output) == json.loads(DOCUMENT.read_text(encoding="utf-8"))


@pytest.mark.slow  # starts a whole berth up
def test_up_with_a_taken_port_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(
            app,
            ["up", "--nodes", "1", "--runtime", "fake", "--http", f"127.0.0.1:{port}"],
            env={"BERTH_HOME": str(tmp_path)},
        )
    assert result.exit_code == 2, result.output
    assert f"error: --http: cannot listen on 127.0.0.1:{port}" in result.output
    assert "or 127.0.0.1:0 for a free one" in result.output
    assert not (tmp_path / "api.json").exists()
