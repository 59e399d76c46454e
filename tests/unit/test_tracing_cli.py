"""``--otlp`` on the command line: a malformed collector URL, from the flag or from the
standard environment, is one ``error:`` line naming where it came from and quoting it, exit
status 2, before anything starts (no server, no connection, no process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from berth.cli.main import app
from berth.embedded import embedded_configs
from berth.node.config import config_toml
from berth.observability import tracing

runner = CliRunner()


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, args, env={"COLUMNS": "200", **(env or {})})


def one_line(result: Result, *expected: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    assert not tracing.enabled()


@pytest.fixture
def node_config(tmp_path: Path) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(config_toml(embedded_configs(1, runtime="fake")[0]))
    return path


def test_a_malformed_otlp_flag_is_one_line(node_config: Path) -> None:
    nats = ["--nats", "nats://127.0.0.1:1"]  # never reached: the flag is checked first
    one_line(
        invoke(["scheduler", *nats, "--otlp", "http//collector"]), "--otlp", "'http//collector'"
    )
    one_line(
        invoke(["agent", "--config", str(node_config), *nats, "--otlp", "ftp://collector:21"]),
        "--otlp",
        "'ftp://collector:21'",
    )
    one_line(invoke(["up", "--nodes", "1", "--otlp", "http://collector:70000"]), "--otlp", "70000")


def test_a_malformed_otlp_environment_names_the_variable() -> None:
    nats = ["--nats", "nats://127.0.0.1:1"]
    bad = {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}
    one_line(invoke(["scheduler", *nats], bad), "OTEL_EXPORTER_OTLP_ENDPOINT", "'collector:4318'")
    grpc = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}
    one_line(invoke(["scheduler", *nats], grpc), "OTEL_EXPORTER_OTLP_PROTOCOL", "'grpc'")
