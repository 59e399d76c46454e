"""The node's journal and what a restart does with it, in one process: entries written whole
(atomically) and read back, corrupt or foreign files reported and skipped, and the node core's
recovery — adopt a live process workload (re-reserved even past shrunk limits), record the end
of one that ended, end a fake runtime's as not adoptable — plus the agent's gate and lock."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from berth.boot import AdmitOrder, RunOrder
from berth.cli.main import app
from berth.errors import Invalid
from berth.model import Layer, Spec
from berth.node.agent import Agent
from berth.node.budget import BudgetLimits, NodeBudget
from berth.node.config import load_config
from berth.node.core import NodeCore
from berth.node.journal import Journal, JournalEntry
from berth.node.layers import LayerRegistry
from berth.node.runtime import BootSpec, FakeRuntime, ProcessRuntime, Runtime
from berth.node.runtime.supervisor import alive, atomic_write, file_stem, read_record, write_owner
from berth.ownership import Refused
from berth.store.memory import MemoryStore
from berth.units import GiB, MiB

SPEC = Spec(vcpus=0.1, mem=256 * MiB, disk=MiB)
LAYERS = (Layer(id="sha256:base", size=100),)
SLEEPER = BootSpec(name="w", command=("sleep", "600"))


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def entry(workload_id: str = "w-1") -> JournalEntry:
    return JournalEntry(
        workload_id=workload_id, spec=SPEC, layers=LAYERS, boot=SLEEPER, runtime="ProcessRuntime"
    )


def core(
    runtime: Runtime, state_dir: Path, mem_max: int = GiB, *, journal: bool = True
) -> NodeCore:
    limits = BudgetLimits(
        mem_max=mem_max, disk_max=10 * GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
    )
    return NodeCore(
        "n1",
        "linux/amd64",
        NodeBudget(limits),
        runtime,
        layers=LayerRegistry(GiB),
        journal=Journal(state_dir) if journal else None,
    )


# -- the journal's files ----------------------------------------------------------------------


def test_an_entry_is_written_whole_and_read_back(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.record(entry("w-1"))
    journal.record(entry("a/../b"))  # a Name may hold a slash: never a path outside
    names = sorted(os.listdir(journal.directory))
    assert names == sorted([f"{file_stem('a/../b')}.json", "w-1.json"])
    entries, unreadable = journal.read()
    assert unreadable == []
    assert {e.workload_id for e in entries} == {"w-1", "a/../b"}
    read = next(e for e in entries if e.workload_id == "w-1")
    assert read.spec == SPEC and read.layers == LAYERS and read.boot == SLEEPER
    assert read.recorded_at > 0
    journal.remove("w-1")
    journal.remove("w-1")  # twice is harmless
    assert [e.workload_id for e in journal.read()[0]] == ["a/../b"]


def test_a_write_leaves_no_temporary_file_and_a_crashed_ones_are_cleared(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.record(entry())
    assert os.listdir(journal.directory) == ["w-1.json"]
    (journal.directory / ".w-2.json.123.tmp").write_text('{"half": ')  # a crash mid-write
    entries, unreadable = journal.read()
    assert [e.workload_id for e in entries] == ["w-1"] and unreadable == []
    assert os.listdir(journal.directory) == ["w-1.json"]


def test_an_atomic_write_replaces_the_old_file_or_leaves_it(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    atomic_write(path, "old")
    atomic_write(path, "new")
    assert path.read_text() == "new"
    (tmp_path / "f.json").chmod(0o444)
    tmp_path.chmod(0o555)  # a directory that refuses the temporary file
    try:
        if os.geteuid() != 0:  # root writes anyway
            with pytest.raises(OSError):
                atomic_write(path, "newer")
            assert path.read_text() == "new"
    finally:
        tmp_path.chmod(0o755)


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("w-3.json", b"{not json", "not JSON"),
        ("w-4.json", b"\xff\xfe", "not JSON"),
        ("w-5.json", b"[1, 2]", "not a version 1 journal entry"),
        ("w-6.json", json.dumps({"version": 2}).encode(), "not a version 1 journal entry"),
        ("w-7.json", json.dumps({"version": 1, "workload_id": "w-7"}).encode(), "not a journal"),
        ("w-8.json", entry("w-9").model_dump_json().encode(), "names workload 'w-9'"),
        ("notes.txt", b"hello", "no .json"),
    ],
)
def test_corrupt_or_foreign_files_are_reported_and_skipped(
    tmp_path: Path, name: str, content: bytes, why: str
) -> None:
    journal = Journal(tmp_path)
    journal.record(entry("w-1"))
    (journal.directory / name).write_bytes(content)
    entries, unreadable = journal.read()
    assert [e.workload_id for e in entries] == ["w-1"]
    assert len(unreadable) == 1 and unreadable[0].path.name == name
    assert why in unreadable[0].reason
    assert (journal.directory / name).exists()  # left for an operator to look at


def test_remove_takes_the_supervisors_records_with_the_entry(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.record(entry())
    files = journal.files("w-1")
    files.run.write_text("{}")
    files.exit.write_text('{"code": 0}')
    assert journal.exit_record("w-1") == {"code": 0}
    journal.remove("w-1")
    assert os.listdir(journal.directory) == []


# -- a restart in one process: a second core on the same journal --------------------------------


def test_a_core_journals_a_workload_before_its_start_and_forgets_it_after_its_end(
    tmp_path: Path,
) -> None:
    seen: list[list[str]] = []

    class Peeking(FakeRuntime):
        async def start(self, spec: BootSpec, workload_id: str | None = None) -> Any:
            seen.append(sorted(os.listdir(tmp_path / "workloads")))
            return await super().start(spec, workload_id)

    async def test() -> None:
        runtime = Peeking()
        node = core(runtime, tmp_path)
        booted = await node.boot(SPEC, LAYERS, SLEEPER)
        assert seen == [[f"{booted.workload.id}.json"]]  # written before the start
        (kept,) = node.journal.read()[0] if node.journal else []
        assert kept.reservation == booted.admission.reservation_id
        runtime.finish(booted.workload.id, 0)
        assert os.listdir(tmp_path / "workloads") == []

    run(test)


def test_a_restarted_core_adopts_live_process_workloads_even_past_shrunk_limits(
    tmp_path: Path,
) -> None:
    async def test() -> None:
        first = core(ProcessRuntime(state_dir=tmp_path, stop_grace_s=0.2), tmp_path)
        booted = [await first.boot(SPEC, LAYERS, SLEEPER) for _ in range(3)]
        pids = [b.workload.pid for b in booted]
        # the "restarted" node: a new runtime and core on the same state dir, half the memory
        runtime = ProcessRuntime(state_dir=tmp_path, stop_grace_s=0.2)
        second = core(runtime, tmp_path, mem_max=512 * MiB)
        recovery = await second.recover()
        assert sorted(recovery.adopted) == sorted(b.workload.id for b in booted)
        assert recovery.overcommitted is not None and "exceeds" in recovery.overcommitted
        held = {r.id for r in second.budget.reservations()}
        assert held == {b.admission.reservation_id for b in booted}  # the same ids
        assert second.budget.headroom().mem_free == 512 * MiB - 3 * SPEC.mem
        assert second.snapshot(0.0).mem_free == 0  # it says it is full, not negative
        with pytest.raises(Refused) as refused:
            second.admit(Spec(vcpus=0.1, mem=0, disk=0), 30.0)
        assert refused.value.reason == "mem_exhausted"
        assert second.layers.mounted() == {"sha256:base"}
        await second.stop(booted[0].workload.id)
        assert second.status(booted[0].workload.id).state == "ended"
        assert len(second.budget.reservations()) == 2
        await second.stop_all()
        assert second.budget.reservations() == [] and second.layers.mounted() == frozenset()
        for pid in pids:
            assert pid is not None
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert os.listdir(tmp_path / "workloads") == []

    run(test)


def test_a_restarted_core_records_the_exit_status_of_one_that_ended(tmp_path: Path) -> None:
    async def test() -> None:
        first = core(ProcessRuntime(state_dir=tmp_path), tmp_path)
        quitter = BootSpec(name="q", command=("sh", "-c", "exit 7"))
        booted = await first.boot(SPEC, LAYERS, quitter)
        await booted.workload.wait()
        # the first core removed its entry at the end: put one back, as if it had died first
        assert first.journal is not None
        first.journal.record(entry(booted.workload.id))
        first.journal.files(booted.workload.id).exit.write_text('{"code": 7}')
        second = core(ProcessRuntime(state_dir=tmp_path), tmp_path)
        recovery = await second.recover()
        assert recovery.ended == [booted.workload.id] and recovery.adopted == []
        status = second.status(booted.workload.id)
        assert status.state == "ended" and status.exit_code == 7
        assert "while the agent was down" in (status.reason or "")
        unknown = entry("w-99")
        assert second.journal is not None
        second.journal.record(unknown)  # no supervisor record at all
        await second.recover()
        assert second.status("w-99").reason == "ended while the agent was down, status unknown"
        assert os.listdir(tmp_path / "workloads") == []
        assert second.budget.reservations() == []

    run(test)


def test_a_fake_runtimes_entries_are_ended_as_not_adoptable(tmp_path: Path) -> None:
    async def test() -> None:
        first = core(FakeRuntime(), tmp_path)
        booted = await first.boot(SPEC, LAYERS, SLEEPER)
        second = core(FakeRuntime(), tmp_path)
        recovery = await second.recover()
        assert recovery.ended == [booted.workload.id]
        assert "not adoptable" in (second.status(booted.workload.id).reason or "")
        new = await second.boot(SPEC, LAYERS, SLEEPER)
        assert new.workload.id != booted.workload.id  # generated ids skip the journal's

    run(test)


def test_a_journal_the_disk_refuses_refuses_the_boot_and_leaves_nothing(tmp_path: Path) -> None:
    async def test() -> None:
        (tmp_path / "workloads").write_text("a file where the directory should be")
        runtime = FakeRuntime()
        node = core(runtime, tmp_path)
        with pytest.raises(Refused) as refused:
            await node.boot(SPEC, LAYERS, SLEEPER)
        assert refused.value.reason == "journal_failed"
        assert runtime.list() == () and node.layers.mounted() == frozenset()
        assert node.budget.reservations() == []

    run(test)


# -- the agent: the state directory taken, nothing admitted before the journal is reconciled -----


def test_an_agent_admits_nothing_before_its_journal_is_reconciled(tmp_path: Path) -> None:
    async def test() -> None:
        limits = BudgetLimits(
            mem_max=GiB, disk_max=GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
        )

        def agent_on(state_dir: Path) -> Agent:
            budget = NodeBudget(limits)
            return Agent(
                "n1", "linux/amd64", budget, MemoryStore(), FakeRuntime(), state_dir=state_dir
            )

        agent = agent_on(tmp_path)
        with pytest.raises(Refused) as refused:
            agent.admit(AdmitOrder(SPEC, 30.0))
        assert refused.value.reason == "node_starting" and refused.value.node == "n1"
        with pytest.raises(Refused, match="node_starting"):
            await agent.try_run(RunOrder(SPEC, LAYERS, SLEEPER))
        await agent.start()
        try:
            owner = (tmp_path / "agent.pid").read_text().split()
            assert int(owner[0]) == os.getpid() and alive(int(owner[0]), int(owner[1]))
            agent.admit(AdmitOrder(SPEC, 30.0))
            other = agent_on(tmp_path)
            with pytest.raises(Invalid) as taken:
                await other.start()
            assert taken.value.field == "state_dir" and str(tmp_path) in str(taken.value)
        finally:
            await agent.stop()
        assert not (tmp_path / "agent.pid").exists()

    run(test)


def test_a_supervisor_without_a_state_dir_kills_its_workload_when_its_agent_dies(
    tmp_path: Path,
) -> None:
    # the "agent" is a child python that starts one workload, then is killed -9
    script = (
        "import asyncio, sys\n"
        "from berth.node.runtime import BootSpec, ProcessRuntime\n"
        "async def main():\n"
        "    runtime = ProcessRuntime(orphan_grace_s=0.5)\n"
        "    w = await runtime.start(BootSpec(name='w', command=('sleep', '600')))\n"
        "    print(w.pid, w.locator['workload'][1], flush=True)\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )

    async def test() -> None:
        agent = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
        )
        assert agent.stdout is not None
        try:
            line = await asyncio.wait_for(agent.stdout.readline(), 20)
            pid, ticks = (int(word) for word in line.split())
            assert alive(pid, ticks)
            agent.send_signal(signal.SIGKILL)
            await agent.wait()
            for _ in range(100):
                if not alive(pid, ticks):
                    break
                await asyncio.sleep(0.05)
            assert not alive(pid, ticks)
        finally:
            if agent.returncode is None:
                agent.kill()
                await agent.wait()

    run(test)


def test_read_record_is_none_for_anything_but_a_json_object(tmp_path: Path) -> None:
    path = tmp_path / "r"
    assert read_record(path) is None
    path.write_text("[1]")
    assert read_record(path) is None
    path.write_text('{"code": 1}')
    assert read_record(path) == {"code": 1}


# -- the orphan grace: a config key and a flag, bounded --------------------------------------

CONFIG = (
    '[node]\nname = "n1"\n\n[budget]\nmem_max = "1GiB"\ndisk_max = "1GiB"\ncpu_max_load = 1.0\n'
    'disk_bw_cap = "1GiBps"\ndisk_bw_max_load = 1.0\nnet_bw_cap = "1GiBps"\n'
    "net_bw_max_load = 1.0\n"
)


@pytest.mark.parametrize("grace", ["0", "-1", "nan", "inf", "3601", "soon"])
def test_a_bad_orphan_grace_flag_is_one_line_naming_it(tmp_path: Path, grace: str) -> None:
    config = tmp_path / "n.toml"
    config.write_text(CONFIG)
    args = ["agent", "--config", str(config), "--nats", "nats://127.0.0.1:1"]
    result = CliRunner().invoke(app, [*args, "--orphan-grace", grace])
    assert result.exit_code == 2, result.output
    assert "--orphan-grace" in result.output, result.output


def test_the_orphan_grace_flag_goes_with_nats(tmp_path: Path) -> None:
    config = tmp_path / "n.toml"
    config.write_text(CONFIG)
    result = CliRunner().invoke(app, ["agent", "--config", str(config), "--orphan-grace", "5"])
    assert result.exit_code == 2 and "--orphan-grace goes with --nats" in result.output


@pytest.mark.parametrize("grace", ["0", "-1", "true", "7200"])
def test_a_bad_orphan_grace_key_is_invalid_naming_it(tmp_path: Path, grace: str) -> None:
    config = tmp_path / "n.toml"
    config.write_text(CONFIG + f"\n[agent]\norphan_grace_s = {grace}\n")
    with pytest.raises(Invalid) as caught:
        load_config(config)
    assert caught.value.field == "agent.orphan_grace_s"
    config.write_text(CONFIG + "\n[agent]\norphan_grace_s = 2.5\n")
    assert load_config(config).agent.orphan_grace_s == 2.5


def test_a_supervisor_whose_journal_entry_is_gone_kills_its_workload(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    async def test() -> None:
        write_owner(tmp_path / "agent.pid")  # a live agent owns the directory: this process
        node = core(ProcessRuntime(state_dir=tmp_path, orphan_grace_s=60.0), tmp_path)
        spawner = BootSpec(name="t", command=("sh", "-c", "setsid sleep 600 & wait"))
        booted = await node.boot(SPEC, LAYERS, spawner)
        assert node.journal is not None
        files = node.journal.files(booted.workload.id)
        files.entry.unlink()  # as a restarted agent that gave it up would have
        status = await asyncio.wait_for(booted.workload.wait(), 5)
        assert status.signal == signal.SIGKILL
        await asyncio.sleep(0.1)
        assert _sleepers() == []  # the daemonised one went too

    run(test)
    said = capfd.readouterr().err
    assert "its journal entry" in said and "is gone: killing the workload" in said


def _sleepers() -> list[int]:
    """``sleep 600`` processes whose parent is init (what an escaped daemon would be)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            text = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        state = text[text.rfind(b")") + 2 :].split()
        if cmdline == b"sleep\x00600\x00" and state[0] != b"Z" and state[1] == b"1":
            found.append(int(name))
    return found
