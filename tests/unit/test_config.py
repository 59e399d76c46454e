"""Agent configuration files: valid files load, every bad key is named with its value."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from berth import Invalid, Platform
from berth.node.config import AgentConfig, load_config
from berth.platform import host

VALID = """
[node]
name = "worker-1"
platform = "linux/aarch64"
labels = { zone = "a" }

[budget]
mem_max = "64GiB"
disk_max = "500GiB"
cpu_max_load = 0.9
cpu_max_cap = 16
disk_bw_cap = "2GiBps"
disk_bw_max_load = 0.8
net_bw_cap = "10Gbps"
net_bw_max_load = 0.5
cpu_overcommit = 4.0

[agent]
heartbeat_s = 2.5
layer_cache = "20GiB"
runtime = "fake"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_valid_file_loads_into_typed_models(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, VALID))
    assert config.node.platform == Platform.parse("linux/arm64/v8")
    assert config.node.labels == {"zone": "a"}
    limits = config.budget.limits()
    assert limits.mem_max == 64 * 2**30
    assert limits.cpu_capacity == 16
    assert limits.net_bw_cap == 1_250_000_000
    assert limits.net_bw_ceiling == 625_000_000
    assert limits.cpu_overcommit == 4.0 and limits.overcommit_enabled
    assert config.agent.heartbeat_s == 2.5 and config.agent.runtime == "fake"
    assert config.agent.layer_cache == 20 * 2**30
    assert config.agent.lease_ttl_s == 30.0


def test_defaults_platform_to_host_and_capacity_to_cores(tmp_path: Path) -> None:
    text = VALID.replace('platform = "linux/aarch64"\n', "").replace("cpu_max_cap = 16\n", "")
    config = load_config(write(tmp_path, text))
    assert config.node.platform == host()
    assert config.budget.limits().cpu_capacity >= 1


@pytest.mark.parametrize(
    ("old", "new", "field", "quoted"),
    [
        ('mem_max = "64GiB"', 'mem_max = "64 gigs"', "budget.mem_max", "64 gigs"),
        ('mem_max = "64GiB"', 'mem_max = "-1GiB"', "budget.mem_max", "-1GiB"),
        ("cpu_max_load = 0.9", "cpu_max_load = 1.5", "budget.cpu_max_load", "1.5"),
        ('net_bw_cap = "10Gbps"', 'net_bw_cap = "10GiB"', "budget.net_bw_cap", "10GiB"),
        ('net_bw_cap = "10Gbps"\n', "", "budget.net_bw_cap", "required, but missing"),
        ('name = "worker-1"', 'name = ""', "node.name", "empty"),
        ('platform = "linux/aarch64"', 'platform = "linux/amd46"', "node.platform", "amd46"),
        ("heartbeat_s = 2.5", "heartbeat_s = 0", "agent.heartbeat_s", "0"),
        ('runtime = "fake"', 'runtime = "docker"', "agent.runtime", "docker"),
        ("cpu_overcommit = 4.0", "cpu_overcomit = 4.0", "budget.cpu_overcomit", "unknown key"),
    ],
)
def test_bad_keys_are_named_with_their_value(
    tmp_path: Path, old: str, new: str, field: str, quoted: str
) -> None:
    assert old in VALID
    with pytest.raises(Invalid) as caught:
        load_config(write(tmp_path, VALID.replace(old, new)))
    assert caught.value.field == field
    assert quoted in str(caught.value)


def test_missing_section_unreadable_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(Invalid) as caught:
        load_config(write(tmp_path, "[node]\nname = 'x'\n"))
    assert caught.value.field == "budget"
    with pytest.raises(Invalid, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(Invalid, match="not valid TOML"):
        load_config(write(tmp_path, "[node\nname="))


def test_config_round_trips_through_json(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, VALID))
    assert AgentConfig.from_json(config.to_json()) == config


def test_stop_grace_is_the_runtimes_rule_and_reaches_the_runtime(tmp_path: Path) -> None:
    """``[agent] stop_grace_s`` follows the one stop-grace rule (0 to an hour, as a stop's
    own ``grace_s``), and the agent's runtime — fake and process alike — gets it."""
    from berth.node.agent import Agent
    from berth.store.memory import MemoryStore

    for grace, runtime in ((0, "fake"), (3600, "process"), (7.5, "fake")):
        text = VALID.replace('runtime = "fake"', f'runtime = "{runtime}"\nstop_grace_s = {grace}')
        config = load_config(write(tmp_path, text))
        assert config.agent.stop_grace_s == grace
        agent = Agent.from_config(config, MemoryStore())
        assert agent.runtime.stop_grace_s == grace  # type: ignore[attr-defined]
    for bad in ("3601", "-1", "inf", '"5s"'):
        text = VALID.replace('runtime = "fake"', f'runtime = "fake"\nstop_grace_s = {bad}')
        with pytest.raises(Invalid) as refused:
            load_config(write(tmp_path, text))
        assert refused.value.field == "agent.stop_grace_s", refused.value


def test_process_workloads_run_as_nobody_under_a_root_agent_or_as_configured(
    tmp_path: Path,
) -> None:
    """``[process] user``: by default ``nobody`` when the agent is root (else the agent's own
    user); a named user reaches the runtime; an unknown user is refused, named."""
    from berth.node.agent import Agent
    from berth.node.runtime.process import ProcessRuntime
    from berth.store.memory import MemoryStore

    text = VALID.replace('runtime = "fake"', 'runtime = "process"')
    runtime = Agent.from_config(load_config(write(tmp_path, text)), MemoryStore()).runtime
    assert isinstance(runtime, ProcessRuntime)
    if os.geteuid() == 0:
        assert runtime.user is not None and runtime.user.name == "nobody"
    else:
        assert runtime.user is None
    me = pwd.getpwuid(os.geteuid()).pw_name
    for value in (f'"{me}"', str(os.geteuid())):
        config = load_config(write(tmp_path, f"{text}\n[process]\nuser = {value}\n"))
        runtime = Agent.from_config(config, MemoryStore()).runtime
        assert isinstance(runtime, ProcessRuntime) and runtime.user is not None
        assert runtime.user.uid == os.geteuid()
    config = load_config(write(tmp_path, f'{text}\n[process]\nuser = "no-such-user-b3"\n'))
    with pytest.raises(Invalid, match="no-such-user-b3") as refused:
        Agent.from_config(config, MemoryStore())
    assert refused.value.field == "process.user"
    for bad in ('""', "true", "1.5"):
        with pytest.raises(Invalid) as refused:
            load_config(write(tmp_path, f"{text}\n[process]\nuser = {bad}\n"))
        assert refused.value.field == "process.user", refused.value
