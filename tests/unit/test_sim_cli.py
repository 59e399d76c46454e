"""``berth sim`` and ``berth demo``: outputs on success; bad flags: one clear line, status 2."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from berth.cli.sim import parse_policies, sim, sim_config
from berth.sim.simulator import SimConfig
from tests.helpers import sim_app

runner = CliRunner()


SMALL = ["--nodes", "10", "--requests", "60", "--rate", "1", "--lifetime", "20", "--quiet"]


def test_sim_writes_report_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(sim_app(), ["sim", *SMALL, "--policy", "seed,berth", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    document = json.loads((out / "report.json").read_text())
    assert list(document["policies"]) == ["seed", "berth"]
    assert document["config"]["nodes"] == 10
    assert document["config"]["workload"]["requests"] == 60
    assert (out / "bytes_pulled.png").is_file() and (out / "utilisation.png").is_file()
    assert "berth" in result.stdout and "report.json" in result.stdout


def test_sim_all_policies_with_stale_concurrent_schedulers(tmp_path: Path) -> None:
    result = runner.invoke(
        sim_app(),
        ["sim", *SMALL, "--concurrency", "3", "--staleness", "2", "--out", str(tmp_path)],
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads((tmp_path / "report.json").read_text())
    assert list(document["policies"]) == ["seed", "random", "binpack", "spread", "kube", "berth"]
    assert document["config"]["concurrency"] == 3
    assert document["config"]["staleness"] == 2.0


def test_demo_explains_placements_and_compares_policies(tmp_path: Path) -> None:
    result = runner.invoke(sim_app(), ["demo", "--quiet", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.stderr
    assert "berth demo" in result.stdout
    assert "→" in result.stdout and "verdict" in result.stdout  # explained placements
    assert "nodes can run it" in result.stdout  # the explanation's summary
    for name in ("seed", "random", "binpack", "spread", "kube", "berth"):
        assert name in result.stdout
    assert str(tmp_path / "report.json") in result.stdout.replace("\n", "")
    assert (tmp_path / "utilisation.png").is_file()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--nodes", "-5"], "--nodes"),
        (["--nodes", "0"], "--nodes"),
        (["--requests", "-1"], "--requests"),
        (["--rate", "0"], "--rate"),
        (["--staleness", "-1"], "--staleness"),
        (["--concurrency", "0"], "--concurrency"),
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--policy", ","], "--policy"),
        (["--cache", "12XB"], "--cache"),
        (["--cache", ""], "--cache"),
        (["--cache", "  "], "--cache"),
        (["--pull-bandwidth", "-5MBps"], "--pull-bandwidth"),
        (["--flatten", "2"], "--flatten"),
    ],
)
def test_bad_flags_are_one_clear_line(flags: list[str], expected: str, tmp_path: Path) -> None:
    result = runner.invoke(sim_app(), ["sim", *flags, "--quiet", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()  # nothing was run


def test_demo_bad_runtime_is_one_clear_line(tmp_path: Path) -> None:
    result = runner.invoke(sim_app(), ["demo", "--runtime", "qemu", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "--runtime: must be 'simulated' or 'microvm', got 'qemu'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_unknown_policy_lists_the_valid_ones(tmp_path: Path) -> None:
    result = runner.invoke(sim_app(), ["sim", "--policy", "seed,nope", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "valid policies: seed, random, binpack, spread, kube, berth" in result.stderr


def test_typer_rejects_malformed_numbers() -> None:
    result = runner.invoke(sim_app(), ["sim", "--nodes", "many"])
    assert result.exit_code == 2
    assert "--nodes" in result.stderr


def test_parse_policies() -> None:
    assert parse_policies("all") == ["seed", "random", "binpack", "spread", "kube", "berth"]
    assert parse_policies(" berth , seed,berth") == ["berth", "seed"]


def test_berth_cli_exposes_sim_and_demo_once_registered() -> None:
    from berth.cli import main as cli  # the module

    names = {command.name for command in cli.app.registered_commands}
    if "sim" not in names:
        pytest.skip("berth.cli has not registered the sim commands yet")
    result = runner.invoke(cli.app, ["sim", "--staleness", "-1"])
    assert result.exit_code == 2
    assert "--staleness" in result.stderr


def test_berth_defers_its_commands_and_lists_each_with_its_own_help() -> None:
    """berth's app registers its commands deferred (``main.Deferred``: a command is built from
    its function only when it runs or shows its own help, and ``sim`` and ``demo`` — whose
    flags are defined from the simulator's models — are not even imported before), each with
    its function's docstring as help, so ``berth --help`` lists them as before; asked for
    ``sim`` or ``demo``, the app runs the real command, whose help is a fresh app's."""
    from berth.cli import main as cli

    deferred = {
        str(info.name): (info.help, info.cls.target)
        for info in cli.app.registered_commands
        if info.cls is not None and issubclass(info.cls, cli.Deferred)
    }
    assert {"schedule", "sim", "demo", "ps", "drain"} <= set(deferred)
    listing = " ".join(runner.invoke(cli.app, ["--help"]).output.replace("│", " ").split())
    for name, (help_text, (module, function)) in deferred.items():
        assert help_text == inspect.getdoc(getattr(importlib.import_module(module), function))
        first = " ".join(str(help_text).split("\n\n")[0].split())  # what the listing shows
        assert f" {name} {first} " in listing  # its row, the text wrapped as it fits
    for name in ("sim", "demo"):
        shown = runner.invoke(cli.app, [name, "--help"], prog_name="berth", terminal_width=100)
        fresh = runner.invoke(sim_app(), [name, "--help"], prog_name="berth", terminal_width=100)
        assert shown.exit_code == fresh.exit_code == 0, shown.output
        assert shown.output == fresh.output


def test_no_assume_turns_the_assume_cache_off(tmp_path: Path) -> None:
    flags = ["sim", *SMALL, "--policy", "binpack", "--staleness", "5"]
    off = runner.invoke(sim_app(), [*flags, "--no-assume", "--out", str(tmp_path / "off")])
    assert off.exit_code == 0, off.stderr
    assert "no assume" in off.stdout  # the title says so
    document = json.loads((tmp_path / "off" / "report.json").read_text())
    assert document["config"]["assume"] is False
    on = runner.invoke(sim_app(), [*flags, "--out", str(tmp_path / "on")])
    assert on.exit_code == 0, on.stderr
    assert json.loads((tmp_path / "on" / "report.json").read_text())["config"]["assume"] is True


def test_sim_flag_defaults_are_simconfigs() -> None:
    # One source of truth: running with no flags builds exactly SimConfig's defaults.
    defaults = {
        name: param.default
        for name, param in inspect.signature(sim).parameters.items()
        if name not in ("policy", "out", "quiet", "scenario_name", "quick")
    }
    assert sim_config(**defaults) == SimConfig()
    assert defaults["cache"] == "auto" and defaults["pull_bandwidth"] == "125MBps"


def test_the_shell_completes_commands_and_the_flags_of_a_deferred_one() -> None:
    """``berth --install-completion`` installs it; what the shell then asks (``_BERTH_COMPLETE``)
    is answered with the commands, and the flags of the one typed — loaded for it."""

    def completed(words: str) -> list[str]:
        env = {**os.environ, "_BERTH_COMPLETE": "complete_bash", "COMP_WORDS": words}
        env["COMP_CWORD"] = str(len(words.split()) - 1)
        done = subprocess.run(
            [str(Path(sys.executable).parent / "berth")], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert completed("berth p") == ["place", "ps"]
    assert {"--namespace", "--node"} <= set(completed("berth ps --n"))
    from berth.cli.main import app

    assert "--install-completion" in runner.invoke(app, ["--help"]).output
