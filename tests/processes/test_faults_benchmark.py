"""The judge of ``benchmarks/faults.py``: it must count what breaks the invariants, or its
zero would prove nothing.

CI smoke-runs the benchmark itself (``--quick``); these tests check the part a clean run
never exercises: that each invariant's violation is seen.  First on given observations (the
host's workloads, the API's records, the nodes' snapshots), then on a real host: two workload
supervisors started beside a ``berth up``'s agents, running ``sleep`` as one identity with no
record of them anywhere, one under 2 GiB of reserved memory on a 1 GiB node — two ghosts,
twins, and an over-commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import psutil
import pytest

from berth.node.runtime import supervisor
from berth.units import GiB, MiB
from tests.helpers import load_benchmark

faults: ModuleType = load_benchmark("faults")


@pytest.fixture
def harness() -> Iterator[Any]:
    settings = faults.Settings(
        seed=1, faults=0, workers=0, window_s=1.0, settle_s=10.0, lease_ttl_s=4.0
    )
    made = faults.Harness(settings)
    try:
        yield made
    finally:
        made.close()


def running(workload_id: str, node: str, mib: int, identity: str | None = None) -> Any:
    return faults.HostWorkload(
        workload_id, node, identity or f"default/{workload_id}/0", mib * MiB, 0
    )


def record(workload_id: str, node: str, state: str = "running") -> dict[str, Any]:
    return {"id": workload_id, "node_workload_id": workload_id, "node": node, "state": state}


def snapshots(harness: Any, reserved_mib: dict[str, int]) -> dict[str, Any]:
    return {node: {"mem_reserved": reserved_mib.get(node, 0) * MiB} for node in harness.mem_max}


def nothing(workload_id: str) -> dict[str, Any] | None:
    return None


def test_views_that_agree_have_no_disagreement_and_no_violation(harness: Any) -> None:
    host = [running("a", "node-00", 512), running("b", "node-01", 256)]
    records = [record("a", "node-00"), record("b", "node-01")]
    nodes = snapshots(harness, {"node-00": 512, "node-01": 256})
    harness.hard_checks(host)
    assert harness.disagreements(host, records, nodes, nothing, final=True) == []
    assert sum(harness.tally.violations.values()) == 0


def test_more_reserved_memory_running_than_the_budget_is_an_over_commit(harness: Any) -> None:
    budget_mib = harness.mem_max["node-00"] // MiB
    harness.hard_checks([running("a", "node-00", budget_mib), running("b", "node-00", 256)])
    harness.hard_checks([running("a", "node-00", budget_mib), running("b", "node-00", 256)])
    assert harness.tally.violations == {"over_commit": 1}  # once per node per cycle
    harness.cycle += 1
    harness.hard_checks([running("a", "node-00", budget_mib)])  # full, not over
    assert harness.tally.violations == {"over_commit": 1}


def test_two_running_copies_of_one_identity_are_counted(harness: Any) -> None:
    copies = [
        running("a", "node-00", 256, "default/x/0"),
        running("b", "node-01", 256, "default/x/0"),
    ]
    harness.hard_checks(copies)
    assert harness.tally.violations == {"duplicate_identity": 1}


def test_a_running_workload_without_a_live_record_counts_only_after_the_settle(
    harness: Any,
) -> None:
    host = [running("ghost", "node-00", 256), running("orphan", "node-01", 256)]
    nodes = snapshots(harness, {"node-00": 256, "node-01": 256})

    def ended(workload_id: str) -> dict[str, Any] | None:
        return record(workload_id, "node-01", "failed") if workload_id == "orphan" else None

    early = harness.disagreements(host, [], nodes, ended, final=False)
    assert len(early) == 2 and sum(harness.tally.violations.values()) == 0
    harness.disagreements(host, [], nodes, ended, final=True)
    assert harness.tally.violations == {"unrecorded_running": 1, "running_marked_ended": 1}


def test_a_snapshot_reserving_more_than_runs_is_a_leak_and_less_a_disagreement(
    harness: Any,
) -> None:
    host = [running("a", "node-00", 256), running("b", "node-01", 512)]
    records = [record("a", "node-00"), record("b", "node-01")]
    nodes = snapshots(harness, {"node-00": 768, "node-01": 256})
    problems = harness.disagreements(host, records, nodes, nothing, final=True)
    assert len(problems) == 2
    assert harness.tally.violations == {"leaked_reservation": 1}


def test_a_record_running_where_nothing_runs_keeps_the_views_apart(harness: Any) -> None:
    nodes = snapshots(harness, {})
    records = [record("gone", "node-02"), record("done", "node-02", "stopped")]
    problems = harness.disagreements([], records, nodes, nothing, final=True)
    assert problems == ["record gone running runs nowhere"]
    missing = {node: value for node, value in nodes.items() if node != "node-03"}
    assert "node-03 missing from the API's nodes" in harness.disagreements(
        [], [], missing, nothing, final=True
    )


def start_ghost(harness: Any, node: str, workload_id: str, mem: int) -> subprocess.Popen[bytes]:
    """A workload supervisor beside ``node``'s agent, as the process runtime starts one, for a
    workload no one recorded: ``sleep`` under ``mem`` of ``RLIMIT_AS``, identity
    ``default/twin/0`` in its environment; it dies with this test's process."""
    files = supervisor.WorkloadFiles.of(harness.state_dirs[node], workload_id)
    files.run.parent.mkdir(parents=True, exist_ok=True)  # the agent makes it at a first run
    me = os.getpid()
    order = {
        "workload_id": workload_id,
        "command": ["sleep", "60"],
        "env": {"PATH": os.environ.get("PATH", os.defpath), faults.IDENTITY_ENV: "default/twin/0"},
        "mem_limit": mem,
        "log": None,
        "orphan_grace_s": 1.0,
        "owner": [me, supervisor.start_ticks(me)],
        "owner_file": None,
        "entry": None,
        "run_file": str(files.run),
        "exit_file": str(files.exit),
    }
    ghost = subprocess.Popen(
        [sys.executable, "-I", supervisor.__file__, workload_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert ghost.stdin is not None and ghost.stdout is not None
    ghost.stdin.write(json.dumps(order).encode())
    ghost.stdin.close()
    assert "started" in json.loads(ghost.stdout.readline())
    return ghost


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """A supervisor and its workload (a subreaper: the workload first, or it is orphaned)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(process.pid).children(recursive=True):
            child.kill()
    process.kill()
    process.wait()


@pytest.mark.slow  # a whole berth up
def test_real_ghosts_beside_agents_are_unrecorded_twins_and_an_over_commit(harness: Any) -> None:
    harness.up.start()
    assert harness.mem_max["node-00"] < 2 * GiB
    ghosts: list[subprocess.Popen[bytes]] = []
    with harness.api() as api:
        deadline = time.monotonic() + 20
        while harness.agreement(api, final=False):  # an idle cluster's views agree
            assert time.monotonic() < deadline, harness.agreement(api, final=False)
            time.sleep(0.1)
        assert sum(harness.tally.violations.values()) == 0
        try:
            ghosts.append(start_ghost(harness, "node-00", "ghost-1", 2 * GiB))
            ghosts.append(start_ghost(harness, "node-01", "ghost-2", 256 * MiB))
            seen = sorted((w.workload_id, w.node, w.identity, w.reserved) for w in harness.host())
            assert seen == [
                ("ghost-1", "node-00", "default/twin/0", 2 * GiB),
                ("ghost-2", "node-01", "default/twin/0", 256 * MiB),
            ]
            harness.agreement(api, final=True)
        finally:
            for ghost in ghosts:
                kill_tree(ghost)
    assert harness.tally.violations == {
        "over_commit": 1,
        "duplicate_identity": 1,
        "unrecorded_running": 2,
    }
