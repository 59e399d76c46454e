"""Issue 9, by kind: every bad input is a named error, and a failed call changes nothing.

One test (or table) per kind of breakage the issue lists — crashes a normal user hits,
values the engine cannot represent, values that were silently wrong, calls that failed after
changing state, messages.  The fuzz tests (``test_fuzz_api.py``, ``test_fuzz_cli.py``) look
for the instances nobody listed.
"""

from __future__ import annotations

import asyncio
import codecs
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from berth import ClusterScheduler, Invalid, Layer, Platform, Request, Spec
from berth.cli.main import app
from berth.model import MAX_BYTES, Placement, checked_layers
from berth.node.agent import Agent
from berth.node.budget import BudgetLimits, NodeBudget
from berth.node.config import AgentConfig, AgentSection, BudgetSection, NodeSection, load_config
from berth.node.core import NodeCore
from berth.node.runtime import BootSpec, FakeRuntime
from berth.nodeclient.local import LocalNodes
from berth.ownership import Lease
from berth.sim.simulator import SimConfig
from berth.sim.workload import WorkloadConfig
from berth.state import NodeState
from berth.store.memory import MemoryStore
from berth.testing.owner import ManualOwner
from berth.units import (
    GiB,
    format_bandwidth,
    format_information,
    parse_bandwidth,
    parse_information,
)

runner = CliRunner()

VALID_TOML = """
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
"""


def invalid(call: Callable[[], object]) -> Invalid:
    with pytest.raises(Invalid) as caught:
        call()
    return caught.value


def one_error_line(result: Result, *expected: str) -> str:
    """The CLI invariant: exit 2, one line on stderr containing every ``expected``."""
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.stdout)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


# -- crashes a normal user hits ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (VALID_TOML.replace('"w1"', '"café"').encode("latin-1"), "not UTF-8 text: byte 0xe9"),
        (VALID_TOML.encode("utf-16"), "UTF-16"),
        (VALID_TOML.encode() + b"\xff\n", "not UTF-8"),
        (b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested"),
        (b"a = " + b"[" * 20 + b"]" * 20 + b"\n", "more than 8 deep"),
        (b"x = '" + b"a" * (1 << 20) + b"'\n", "larger than 1024 KiB"),
    ],
)
def test_config_files_that_are_not_toml_text_are_named(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(content)
    error = invalid(lambda: load_config(path))
    assert error.field == "config" and message in error.message


def test_a_utf8_byte_order_mark_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(codecs.BOM_UTF8 + VALID_TOML.encode())
    assert load_config(path).node.name == "w1"


@pytest.mark.parametrize("where", ["", "   ", "/dev/zero", ".", "/nonexistent/agent.toml"])
def test_config_paths_that_are_not_files_are_named(where: str) -> None:
    error = invalid(lambda: load_config(where))
    assert error.field == "config"


def test_the_agent_command_reports_an_unreadable_config_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(VALID_TOML.encode("utf-16"))
    one_error_line(runner.invoke(app, ["agent", "--config", str(path), "--check"]), "--config")
    one_error_line(runner.invoke(app, ["agent", "--config", "/dev/zero", "--check"]), "--config")
    one_error_line(runner.invoke(app, ["agent", "--config", str(tmp_path), "--check"]), "--config")


@pytest.mark.parametrize("command", ["sim", "demo"])
def test_out_is_checked_before_any_work(tmp_path: Path, command: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    small = ["--nodes", "2", "--requests", "1"] if command == "sim" else []
    for out, expected in [
        ("", "empty"),
        ("  ", "empty"),
        (str(afile), "is a file"),
        (str(afile / "sub"), "lies under"),
        ("/proc/berth-out", "cannot write"),
    ]:
        result = runner.invoke(app, [command, *small, "--quiet", "--out", out])
        one_error_line(result, "--out", expected)
        assert "report" not in result.stdout  # nothing was simulated


def test_cluster_command_quoting_and_missing_programs() -> None:
    result = runner.invoke(app, ["cluster", "--runtime", "fake", "--command", "sleep '1"])
    one_error_line(result, "--command", "No closing quotation")
    result = runner.invoke(
        app,
        ["cluster", "--nodes", "1", "--workloads", "2", "--command", "berth-no-such-program"],
        env={"COLUMNS": "300"},  # the table's rows on one line each
    )
    line = one_error_line(result, "--command", "none of the 2 workloads ran")
    assert "command not found: 'berth-no-such-program'" in line
    assert result.stdout.count("command not found") >= 2  # per workload, in the table


# -- values the engine cannot represent ----------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: Layer(id="x", size=MAX_BYTES + 1),
        lambda: Spec(vcpus=1, mem=2**63, disk=0),
        lambda: Spec(vcpus=1, mem=0, disk=0, net_bw="100000000000000Tbps"),
        lambda: Request(namespace="a", name="b", layers=[("x", MAX_BYTES), ("y", 1)]),
        lambda: NodeState(
            node="n",
            platform="linux/amd64",
            mem_free=2**63,
            disk_free=0,
            cpu_capacity=1.0,
            disk_bw_ceiling=0.0,
            net_bw_ceiling=0.0,
        ),
        lambda: NodeState(
            node="n",
            platform="linux/amd64",
            mem_free=0,
            disk_free=0,
            cpu_capacity=1.0,
            disk_bw_ceiling=1e300,
            net_bw_ceiling=0.0,
        ),
        lambda: NodeState(
            node="n",
            platform="linux/amd64",
            generation=2**64,
            mem_free=0,
            disk_free=0,
            cpu_capacity=1.0,
            disk_bw_ceiling=0,
            net_bw_ceiling=0,
        ),
        lambda: BudgetLimits(
            mem_max=2**63, disk_max=0, cpu_capacity=1, disk_bw_cap=0, net_bw_cap=0
        ),
        lambda: parse_information("9223372036854775808"),
        lambda: parse_bandwidth(2**63),
        lambda: checked_layers([("x", MAX_BYTES), ("y", 1)]),
    ],
)
def test_byte_quantities_beyond_int64_are_invalid(make: Callable[[], object]) -> None:
    invalid(make)


def test_the_largest_quantities_still_work_and_format() -> None:
    assert Layer(id="x", size=MAX_BYTES).size == MAX_BYTES
    request = Request(namespace="a", name="b", layers=[("x", MAX_BYTES - 1), ("y", 1)])
    assert sum(layer.size for layer in request.layers) == MAX_BYTES
    assert format_information(MAX_BYTES) == "8388608TiB"
    assert format_information(2**200).endswith("TiB")  # formatting is total
    assert format_bandwidth(10**400, exact=True).endswith("Bps")


@pytest.mark.parametrize(
    "name",
    ["", "a\x00", "node\x00\x00", "has space", "tab\there", "new\nline", "x" * 254, "\u200b"],
)
def test_every_name_is_one_name_type(name: str) -> None:
    base = dict(
        platform="linux/amd64",
        mem_free=0,
        disk_free=0,
        cpu_capacity=1.0,
        disk_bw_ceiling=0.0,
        net_bw_ceiling=0.0,
    )
    for make in (
        lambda: NodeState(node=name, **base),
        lambda: NodeState(node="n", layers=frozenset({name}), **base),
        lambda: NodeState(node="n", labels={name: "v"}, **base),
        lambda: Request(namespace=name, name="b"),
        lambda: Layer(id=name, size=1),
        lambda: Placement(worker_node=name),
        lambda: NodeSection(name=name),
    ):
        invalid(make)


def test_integers_with_thousands_of_digits_make_short_messages() -> None:
    huge = 10**5000
    for make in (
        lambda: Spec(vcpus=1, mem=huge, disk=0),
        lambda: Request(namespace="a", name="b", replica=huge),
        lambda: parse_information(huge),
        lambda: Layer.of(("x", huge)),
        lambda: Spec(vcpus=huge, mem=0, disk=0),
    ):
        error = invalid(make)
        assert len(str(error)) < 300 and "digits" in str(error), str(error)


# -- values that were accepted and silently wrong ------------------------------------------------
@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf, 0.0, 1e-300, 1e300, True])
def test_durations_are_finite_and_sane_everywhere(seconds: float) -> None:
    clock = lambda: 0.0  # noqa: E731
    store = MemoryStore()
    budget = NodeBudget(
        BudgetLimits(mem_max=GiB, disk_max=GiB, cpu_capacity=1, disk_bw_cap=1, net_bw_cap=1)
    )
    for make in (
        lambda: Lease(seconds, clock),
        lambda: budget.admit_leased(Spec(vcpus=1, mem=1, disk=1), seconds),
        lambda: AgentSection(heartbeat_s=seconds),
        lambda: AgentSection(lease_ttl_s=seconds),
        lambda: Agent("n", "linux/amd64", budget, store, FakeRuntime(), heartbeat_s=seconds),
        lambda: ClusterScheduler(store, LocalNodes({}), lease_ttl_s=seconds),
        # delays may be 0 (or tiny), never negative, unbounded or not a number
        lambda: SimConfig(staleness=-1.0 if 0 <= seconds < 1 else seconds),
        lambda: SimConfig(boot_seconds=-1e-9 if 0 <= seconds < 1 else seconds),
        lambda: WorkloadConfig(lifetime_mean=seconds),
        lambda: WorkloadConfig(rate=seconds),
    ):
        invalid(make)
    assert budget.reservations() == []


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["sim", "--nodes", "1000000000"], "--nodes"),
        (["sim", "--requests", "1000000000000"], "--requests"),
        (["sim", "--concurrency", "1000000"], "--concurrency"),
        (["sim", "--rate", "nan"], "--rate"),
        (["sim", "--rate", "1e-300"], "--rate"),
        (["sim", "--staleness", "inf"], "--staleness"),
        (["sim", "--lifetime", "nan"], "--lifetime"),
        (["sim", "--boot", "-inf"], "--boot"),
        (["sim", "--seed", "1" * 60], "--seed"),
        (["cluster", "--workloads", "1000000000"], "--workloads"),
        (["cluster", "--nodes", "1000000"], "--nodes"),
        (["agent", "--config", "x.toml", "--duration", "nan"], "--duration"),
    ],
)
def test_counts_have_ceilings_and_numbers_are_finite_on_the_command_line(
    args: list[str], flag: str
) -> None:
    one_error_line(runner.invoke(app, args), flag)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Spec(vcpus=True, mem=1, disk=1),
        lambda: Spec(vcpus="1", mem=1, disk=1),
        lambda: Spec(vcpus=1, mem=True, disk=1),
        lambda: Layer(id=b"sha256:ab", size=1),
        lambda: Request(namespace=b"a", name="b"),
        lambda: Platform.parse("linux/amd64/v99"),
        lambda: Platform(os="linux", arch="amd64", variant="x"),
        lambda: Platform(os=b"linux", arch="amd64"),
        lambda: NodeSection(name="w", labels={"": "a"}),
        lambda: NodeSection(name="w", labels={"k": "a\nb"}),
        lambda: BudgetSection(
            mem_max=1,
            disk_max=1,
            cpu_max_load=True,
            disk_bw_cap=1,
            disk_bw_max_load=0.5,
            net_bw_cap=1,
            net_bw_max_load=0.5,
        ),
        lambda: SimConfig(assume=1),
        lambda: SimConfig(nodes=True),
    ],
)
def test_no_loose_coercions(make: Callable[[], object]) -> None:
    invalid(make)


# -- calls that failed after changing state ------------------------------------------------------
class BrokenOwner:
    def add_done_callback(self, fn: object) -> None:
        raise RuntimeError("cannot watch")


def budget_state(budget: NodeBudget) -> object:
    return (
        [(r.id, r.spec) for r in budget.reservations()],
        budget.headroom(),
        budget.admitted,
        budget.overcommit(),
    )


def test_every_admission_entry_point_leaves_the_budget_unchanged_on_a_bad_call() -> None:
    budget = NodeBudget(
        BudgetLimits(
            mem_max=4 * GiB,
            disk_max=4 * GiB,
            cpu_capacity=4,
            disk_bw_cap=1000,
            net_bw_cap=1000,
            cpu_overcommit=2.0,
        ),
        clock=lambda: 0.0,
        platform="linux/amd64",
    )
    spec = Spec(vcpus=1, mem=GiB, disk=GiB)
    leased = budget.admit_leased(spec, 30.0)
    changes: list[int] = []
    budget.add_change_listener(lambda: changes.append(1))
    before = budget_state(budget)
    bad_calls: list[Callable[[], object]] = [
        lambda: budget.admit(spec, object()),  # type: ignore[arg-type]
        lambda: budget.admit(spec, "owner"),  # type: ignore[arg-type]
        lambda: budget.admit(None, ManualOwner()),  # type: ignore[arg-type]
        lambda: budget.admit({"vcpus": 1}, ManualOwner()),  # type: ignore[arg-type]
        lambda: budget.admit("huge", ManualOwner()),  # type: ignore[arg-type]
        lambda: budget.admit(spec, ManualOwner(), "linux/amd64"),  # type: ignore[arg-type]
        lambda: budget.admit(spec, ManualOwner(), ["linux/amd46"]),  # type: ignore[list-item]
        lambda: budget.admit(spec, ManualOwner(), [None]),  # type: ignore[list-item]
        lambda: budget.reserve(spec, 42),  # type: ignore[arg-type]
        lambda: budget.reserve(1.5, ManualOwner()),  # type: ignore[arg-type]
        lambda: budget.admit_leased(spec, math.nan),
        lambda: budget.admit_leased(spec, "30"),  # type: ignore[arg-type]
        lambda: budget.admit_leased(None, 30.0),  # type: ignore[arg-type]
        lambda: budget.admit_leased(spec, 30.0, "linux"),  # type: ignore[arg-type]
        lambda: budget.bind(leased.id, object()),  # type: ignore[arg-type]
        lambda: budget.bind(["r1"], ManualOwner()),  # type: ignore[arg-type]
        lambda: budget.release(["r1"]),  # type: ignore[arg-type]
        lambda: budget.release(None),  # type: ignore[arg-type]
        lambda: budget.lease(math.inf),
    ]
    for call in bad_calls:
        invalid(call)
        assert budget_state(budget) == before
    assert changes == []
    lease = budget._leases[leased.id]
    assert lease.bound_to is None and not lease.done()  # the failed bind left it as it was


def test_an_owner_that_cannot_be_watched_gets_its_reservation_back() -> None:
    budget = NodeBudget(
        BudgetLimits(mem_max=GiB, disk_max=GiB, cpu_capacity=1, disk_bw_cap=1, net_bw_cap=1)
    )
    with pytest.raises(RuntimeError, match="cannot watch"):
        budget.admit(Spec(vcpus=1, mem=GiB, disk=1), BrokenOwner())
    assert budget.reservations() == [] and budget.headroom().mem_free == GiB


def test_node_core_and_scheduler_validate_before_acting() -> None:
    budget = NodeBudget(
        BudgetLimits(mem_max=GiB, disk_max=GiB, cpu_capacity=1, disk_bw_cap=1, net_bw_cap=1)
    )
    core = NodeCore("n1", "linux/amd64", budget, FakeRuntime())
    spec = Spec(vcpus=1, mem=1, disk=1)
    for call in (
        lambda: core.admit(spec, math.nan),
        lambda: core.admit("nope", 5.0),  # type: ignore[arg-type]
        lambda: core.admit(spec, 5.0, "linux/amd64"),  # type: ignore[arg-type]
        lambda: core.bind(7, "w"),  # type: ignore[arg-type]
        lambda: asyncio.run(core.boot(spec, "sha256:x", BootSpec(name="w", command=("x",)))),  # type: ignore[arg-type]
        lambda: asyncio.run(core.boot(spec, [("x", 1)], "not a boot spec")),  # type: ignore[arg-type, list-item]
        lambda: NodeCore("n 1", "linux/amd64", budget, FakeRuntime()),
        lambda: NodeCore("n1", "linux/amd64", budget, FakeRuntime(), labels={"": "x"}),
    ):
        invalid(call)
    assert budget.reservations() == [] and core.layers.mounted() == frozenset()

    store = MemoryStore()
    assert invalid(lambda: ClusterScheduler(store, LocalNodes({}), ranker="nope")).field == (  # type: ignore[arg-type]
        "ranker"
    )
    assert invalid(lambda: ClusterScheduler(store, LocalNodes({}), assume=1)).field == "assume"  # type: ignore[arg-type]
    assert invalid(lambda: ClusterScheduler(store, object())).field == "nodes"  # type: ignore[arg-type]
    scheduler = ClusterScheduler(store, LocalNodes({}))
    assert scheduler.candidates("micro", []) == []  # an instance-type name, as in a Request
    assert invalid(lambda: scheduler.candidates("huge", [])).field == "spec"
    assert invalid(lambda: scheduler.candidates(None, "sha256:ab")).field == "layers"  # type: ignore[arg-type]
    error = invalid(lambda: scheduler.candidates(None, [], "linux/amd64"))  # type: ignore[arg-type]
    assert error.field == "platforms" and "'linux/amd64'" in error.message
    assert invalid(lambda: scheduler.candidates(None, [("a", 1), ("a", 2)])).field == "layers"  # type: ignore[list-item]
    assert invalid(lambda: scheduler.explain("a/b/0")).field == "request"  # type: ignore[arg-type]
    assert invalid(lambda: asyncio.run(scheduler.schedule({"name": "x"}))).field == "request"  # type: ignore[arg-type]


# -- messages ------------------------------------------------------------------------------------
def test_messages_carry_no_pydantic_internals() -> None:
    data = {"node": {"name": "w"}, "budget": 5, "agent": "fast"}
    error = invalid(lambda: AgentConfig.from_dict(data))
    for internal in ("Input should", "instance of", "AgentSection", "BudgetSection", "dictionary"):
        assert internal not in str(error)
    assert "expected a table" in str(error)


def test_a_string_where_a_list_belongs_is_reported_as_such() -> None:
    error = invalid(lambda: Request(namespace="a", name="b", platforms="linux/amd64"))
    assert error.field == "platforms"
    assert error.message == "expected a list, got a string 'linux/amd64'"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["schedule", "--layer", "x:-5MiB"], "--layer: size must not be negative"),
        (["schedule", "--layer", "x:1.5.5GiB"], "--layer"),
        (["schedule", "--node", "a b"], "--node"),
        (["schedule", "--node-platform", "linux/amd46"], "--node-platform"),
        (["schedule", "--replica", "-1"], "--replica"),
        (["schedule", "--name", ""], "--name"),
        (["schedule", "--instance", "huge"], "--instance"),
        (["sim", "--nodes", "abc"], "--nodes"),
        (["sim", "--no-such-flag"], "--no-such-flag"),
        (["sim", "--arrival", "steady"], "--arrival"),
        (["agent"], "--config"),
        (["no-such-command"], "no-such-command"),
    ],
)
def test_cli_errors_name_the_flag_on_one_line(args: list[str], expected: str) -> None:
    line = one_error_line(runner.invoke(app, args), expected)
    assert "Input should" not in line and "Value error" not in line


def test_version_prints_berths_version_and_nothing_else() -> None:
    from berth import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"berth {__version__}\n"
