"""The workload runtime: one contract both drivers pass, then real-process specifics."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from berth.errors import Invalid
from berth.node.runtime import (
    BootFailed,
    BootSpec,
    FakeRuntime,
    ProcessRuntime,
    Runtime,
    WorkloadExit,
    WorkloadHandle,
)
from berth.node.runtime.port import AdoptingRuntime
from berth.node.runtime.process import RunAs
from berth.node.runtime.supervisor import write_owner
from berth.testing.runtime_contract import AdoptingRuntimeContract, ExitLog, RuntimeContract, run
from berth.units import MiB

T = TypeVar("T")
PYTHON = sys.executable


def python(code: str, **fields: Any) -> BootSpec:
    return BootSpec(name=fields.pop("name", "py"), command=(PYTHON, "-c", code), **fields)


class TestProcessRuntimeContract(RuntimeContract):
    @pytest.fixture(autouse=True)
    def _scratch(self, tmp_path: Path) -> None:
        self.scratch = tmp_path

    def make_runtime(self) -> Runtime:
        return ProcessRuntime(stop_grace_s=1.0)

    async def start_ignoring_term(self, runtime: Runtime) -> WorkloadHandle:
        ready = self.scratch / f"ready-{len(runtime.list())}"
        spec = BootSpec(
            name="stubborn",
            command=("sh", "-c", 'trap "" TERM; echo ready > "$READY"; sleep 60'),
            env={"READY": str(ready)},
        )
        workload = await runtime.start(spec)
        await wait_for_file(ready)  # the trap is set
        return workload

    def long_running_spec(self) -> BootSpec:
        return BootSpec(name="sleeper", command=("sleep", "30"))

    def failing_spec(self, runtime: Runtime) -> tuple[BootSpec, str]:
        return BootSpec(name="broken", command=("nosuchcmd",)), "command not found: 'nosuchcmd'"

    async def exit_by_itself(self, runtime: Runtime, code: int) -> WorkloadHandle:
        return await runtime.start(python(f"raise SystemExit({code})"))


class TestProcessRuntimeAdoptionContract(AdoptingRuntimeContract):
    def make_runtime(self, state_dir: Path) -> AdoptingRuntime:
        write_owner(state_dir / "agent.pid")  # this process owns the directory
        return ProcessRuntime(state_dir=state_dir, stop_grace_s=0.5)

    def long_running_spec(self) -> BootSpec:
        return BootSpec(name="sleeper", command=("sleep", "30"))

    def exiting_spec(self, code: int) -> BootSpec:
        return BootSpec(name="quitter", command=("sh", "-c", f"exit {code}"))


class TestFakeRuntimeContract(RuntimeContract):
    def make_runtime(self) -> Runtime:
        return FakeRuntime(
            failing_commands={"firecracker-broken"},
            ignoring_term={"firecracker-stubborn"},
            stop_grace_s=0.5,
        )

    async def start_ignoring_term(self, runtime: Runtime) -> WorkloadHandle:
        return await runtime.start(BootSpec(name="vm", command=("firecracker-stubborn",)))

    def long_running_spec(self) -> BootSpec:
        return BootSpec(name="vm", command=("firecracker", "--config", "vm.json"))

    def failing_spec(self, runtime: Runtime) -> tuple[BootSpec, str]:
        return BootSpec(name="vm", command=("firecracker-broken",)), "'firecracker-broken'"

    async def exit_by_itself(self, runtime: Runtime, code: int) -> WorkloadHandle:
        assert isinstance(runtime, FakeRuntime)
        workload = await runtime.start(self.long_running_spec())
        runtime.finish(workload.id, code)
        return workload


# --- BootSpec --------------------------------------------------------------------------------


def test_boot_spec_accepts_unit_strings_for_the_memory_limit() -> None:
    spec = BootSpec(name="vm", command=["sleep", "1"], mem_limit="256MiB")
    assert spec.command == ("sleep", "1")
    assert spec.mem_limit == 256 * MiB
    assert spec.env == {}
    assert BootSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"command": ()}, "command"),
        ({"command": ("",)}, "command"),
        ({"command": "sleep 1"}, "command"),
        ({"name": ""}, "name"),
        ({"name": "two words"}, "name"),
        ({"mem_limit": 0}, "mem_limit"),
        ({"mem_limit": -1}, "mem_limit"),
        ({"mem_limit": "lots"}, "mem_limit"),
        ({"env": {"A=B": "x"}}, "env"),
        ({"env": {"": "x"}}, "env"),
    ],
)
def test_bad_boot_specs_are_invalid(fields: dict[str, Any], field: str) -> None:
    values: dict[str, Any] = {"name": "vm", "command": ("sleep", "1"), **fields}
    with pytest.raises(Invalid) as caught:
        BootSpec(**values)
    assert caught.value.field is not None
    assert caught.value.field.startswith(field)


# --- real processes --------------------------------------------------------------------------


async def wait_for_file(path: Path, timeout_s: float = 3.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text()).strip():
            return text.strip()
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


def is_gone(pid: int) -> bool:
    """Dead, or a zombie that only waits for whoever adopted it to reap it."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def wait_until_gone(pid: int, timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if is_gone(pid):
            return True
        await asyncio.sleep(0.01)
    return False


def test_a_process_killed_from_outside_is_reported() -> None:
    async def scenario() -> None:
        runtime = ProcessRuntime()
        log = ExitLog()
        runtime.on_exit(log)
        workload = await runtime.start(BootSpec(name="victim", command=("sleep", "30")))
        assert workload.pid is not None
        os.killpg(workload.pid, signal.SIGKILL)
        status = await workload.wait()
        assert status == WorkloadExit(signal=signal.SIGKILL)
        assert workload.reason == "killed by SIGKILL"
        assert log.ids() == [workload.id]
        assert runtime.list() == ()

    run(scenario)


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"

    async def scenario() -> None:
        runtime = ProcessRuntime(stop_grace_s=1.0)
        spec = BootSpec(
            name="parent", command=("sh", "-c", f"sleep 30 & echo $! > {child_pid_file}; wait")
        )
        workload = await runtime.start(spec)
        child = int(await wait_for_file(child_pid_file))
        assert not is_gone(child)
        await runtime.stop(workload.id)
        assert await wait_until_gone(child)

    run(scenario)


def test_processes_left_behind_by_an_exited_leader_are_killed(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"

    async def scenario() -> None:
        runtime = ProcessRuntime()
        spec = BootSpec(
            name="leaky", command=("sh", "-c", f"sleep 30 & echo $! > {child_pid_file}")
        )
        workload = await runtime.start(spec)
        assert (await workload.wait()).code == 0
        child = int(await wait_for_file(child_pid_file))
        assert await wait_until_gone(child)

    run(scenario)


def test_stop_escalates_to_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import signal, time, pathlib\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(ready)!r}).write_text('ready')\n"
        "time.sleep(30)\n"
    )

    async def scenario() -> None:
        runtime = ProcessRuntime(stop_grace_s=0.2)
        workload = await runtime.start(python(code, name="stubborn"))
        await wait_for_file(ready)
        started = time.monotonic()
        await runtime.stop(workload.id)
        assert time.monotonic() - started >= 0.2
        assert workload.exit == WorkloadExit(signal=signal.SIGKILL, stopped=True)
        assert workload.reason == "stopped (killed by SIGKILL)"

    run(scenario)


def test_nonexistent_command_fails_the_boot_with_a_clear_message() -> None:
    async def scenario() -> None:
        with pytest.raises(BootFailed) as caught:
            await ProcessRuntime().start(BootSpec(name="x", command=("nosuchcmd", "--flag")))
        assert str(caught.value) == "boot_failed: command not found: 'nosuchcmd'"

    run(scenario)


def test_non_executable_command_fails_the_boot(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)

    async def scenario() -> None:
        with pytest.raises(BootFailed) as caught:
            await ProcessRuntime().start(BootSpec(name="x", command=(str(script),)))
        assert "permission denied" in caught.value.reason

    run(scenario)


def test_memory_limit_is_applied() -> None:
    allocate = "import sys; sys.exit(0 if len(bytearray({n} * 1024 * 1024)) else 1)"

    async def scenario() -> None:
        runtime = ProcessRuntime()
        small = await runtime.start(python(allocate.format(n=16), mem_limit="256MiB"))
        large = await runtime.start(python(allocate.format(n=512), mem_limit="256MiB"))
        assert (await small.wait()).code == 0
        assert (await large.wait()).code == 1  # MemoryError: the address space is capped

    run(scenario)


def test_workloads_get_their_env_but_not_the_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTH_AGENT_SECRET", "hunter2")
    check = (
        "import os, sys\n"
        "ok = os.environ.get('GREETING') == 'hi' and 'BERTH_AGENT_SECRET' not in os.environ\n"
        "sys.exit(0 if ok else 1)\n"
    )

    async def scenario() -> None:
        workload = await ProcessRuntime().start(python(check, env={"GREETING": "hi"}))
        assert (await workload.wait()).code == 0

    run(scenario)


def test_output_goes_to_the_log_dir(tmp_path: Path) -> None:
    async def scenario() -> None:
        runtime = ProcessRuntime(log_dir=tmp_path / "logs")
        workload = await runtime.start(
            python("print('hello'); import sys; print('oops', file=sys.stderr)")
        )
        await workload.wait()
        text = (tmp_path / "logs" / f"{workload.id}.log").read_text()
        assert "hello" in text and "oops" in text

    run(scenario)


def test_a_callers_workload_id_never_names_a_file_outside_the_log_dir(tmp_path: Path) -> None:
    async def scenario() -> None:
        logs = tmp_path / "a" / "logs"
        runtime = ProcessRuntime(log_dir=logs)
        workload = await runtime.start(python("print('hi')"), workload_id="../../escaped")
        await workload.wait()
        assert workload.id == "../../escaped"
        assert [path.name for path in logs.iterdir()] == ["%2E.%2F..%2Fescaped.log"]
        assert list(tmp_path.glob("escaped*")) == [] and "hi" in next(logs.iterdir()).read_text()

    run(scenario)


def test_aclose_stops_everything() -> None:
    async def scenario() -> None:
        runtime = ProcessRuntime()
        log = ExitLog()
        runtime.on_exit(log)
        for _ in range(3):
            await runtime.start(BootSpec(name="s", command=("sleep", "30")))
        await runtime.aclose()
        assert runtime.list() == ()
        assert len(log.ended) == 3
        assert all(workload.exit and workload.exit.stopped for workload in log.ended)

    run(scenario)


def test_a_stops_own_grace_overrides_the_configured_one(tmp_path: Path) -> None:
    """``sh -c 'trap "" TERM; sleep 60'`` under a 30 s default, stopped with grace 0.5: it is
    killed within a few seconds, by SIGKILL; a stop without a grace waits the default."""
    ready = tmp_path / "ready"

    async def scenario() -> None:
        runtime = ProcessRuntime(stop_grace_s=30.0)
        spec = BootSpec(
            name="stubborn",
            command=("sh", "-c", f'trap "" TERM; echo ready > {ready}; sleep 60'),
        )
        workload = await runtime.start(spec)
        await wait_for_file(ready)
        began = time.monotonic()
        await runtime.stop(workload.id, grace_s=0.5)
        waited = time.monotonic() - began
        assert workload.exit == WorkloadExit(signal=signal.SIGKILL, stopped=True)
        assert 0.45 <= waited < 10.0  # far below the 30 s default, even on a loaded machine
        assert workload.pid is not None and await wait_until_gone(workload.pid)

        ready.unlink()
        default = ProcessRuntime(stop_grace_s=0.3)
        workload = await default.start(spec)
        await wait_for_file(ready)
        began = time.monotonic()
        await default.stop(workload.id)  # no grace: the configured 0.3 s
        assert time.monotonic() - began >= 0.25
        assert workload.exit == WorkloadExit(signal=signal.SIGKILL, stopped=True)

    run(scenario, 20.0)


def test_fake_runtime_stops_honour_the_grace_only_where_sigterm_is_ignored() -> None:
    async def scenario() -> None:
        runtime = FakeRuntime(ignoring_term={"stubborn"}, stop_grace_s=30.0)
        polite = await runtime.start(BootSpec(name="vm", command=("polite",)))
        stubborn = await runtime.start(BootSpec(name="vm", command=("stubborn",)))
        await runtime.stop(polite.id, grace_s=60.0)  # honours SIGTERM: at once
        assert polite.exit == WorkloadExit(signal=signal.SIGTERM, stopped=True)
        stopping = asyncio.create_task(runtime.stop(stubborn.id))  # the 30 s default
        await asyncio.sleep(0.05)
        assert not stubborn.done
        runtime.finish(stubborn.id, 4)  # it exits by itself during the grace: that is its end
        await stopping
        assert stubborn.exit == WorkloadExit(code=4)
        with pytest.raises(Invalid) as caught:
            FakeRuntime(stop_grace_s=-1.0)
        assert caught.value.field == "stop_grace_s"

    run(scenario)


@pytest.mark.parametrize("grace", [-1, float("nan"), True])
def test_bad_grace_period_is_invalid(grace: float) -> None:
    with pytest.raises(Invalid) as caught:
        ProcessRuntime(stop_grace_s=grace)
    assert caught.value.field == "stop_grace_s"


# --- fake specifics --------------------------------------------------------------------------


def test_fake_runtime_kill_and_finish_control_the_end() -> None:
    async def scenario() -> None:
        runtime = FakeRuntime()
        log = ExitLog()
        runtime.on_exit(log)
        spec = BootSpec(name="vm", command=("fc",))
        killed, finished = await runtime.start(spec), await runtime.start(spec)
        runtime.kill(killed.id)
        runtime.finish(finished.id)
        assert killed.exit == WorkloadExit(signal=signal.SIGKILL)
        assert finished.exit == WorkloadExit(code=0)
        assert log.ids() == [killed.id, finished.id]
        with pytest.raises(Invalid) as caught:
            runtime.finish(finished.id)
        assert caught.value.field == "workload_id"
        runtime.failing_commands.add("fc")
        with pytest.raises(BootFailed):
            await runtime.start(spec)

    run(scenario)


def test_a_workload_runs_in_a_scratch_directory_of_its_own_never_the_callers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its working directory and ``HOME`` are ``<scratch>/<id>``, made for it and removed
    after its end; the agent's directory is not where it starts."""
    monkeypatch.chdir(tmp_path)
    script = 'pwd; echo "home=$HOME"; echo data > left-behind; ls'

    async def scenario() -> None:
        runtime = ProcessRuntime(log_dir=tmp_path / "logs", scratch_dir=tmp_path / "scratch")
        workload = await runtime.start(BootSpec(name="w", command=("sh", "-c", script)))
        assert (await workload.wait()).code == 0
        where, home, listing = (tmp_path / "logs" / f"{workload.id}.log").read_text().split()
        assert Path(where) == runtime.scratch_of(workload.id) == tmp_path / "scratch" / "w-1"
        assert home == f"home={where}" and listing == "left-behind"
        assert not Path(where).exists()  # gone with the workload
        assert list(tmp_path.glob("left-behind")) == []
        default = ProcessRuntime()  # no directory configured: a temporary one of its own
        second = await default.start(BootSpec(name="w", command=("sleep", "30")))
        own = default.scratch_of(second.id)
        assert own.is_dir() and own.parent != tmp_path
        await default.stop(second.id)
        assert not own.parent.exists()  # nothing runs there any more

    run(scenario)


@pytest.mark.skipif(os.geteuid() != 0, reason="running as another user needs root")
def test_a_workload_runs_as_the_configured_user_and_cannot_read_roots_files(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("hunter2")
    secret.chmod(0o600)
    script = f"id -u; stat -c %U .; cat {secret} || echo refused"

    async def scenario() -> None:
        runtime = ProcessRuntime(log_dir=tmp_path / "logs", user=RunAs.named("nobody"))
        workload = await runtime.start(BootSpec(name="w", command=("sh", "-c", script)))
        await workload.wait()
        uid, owner, *rest = (tmp_path / "logs" / f"{workload.id}.log").read_text().split("\n")
        assert (uid, owner) == ("65534", "nobody")
        assert "hunter2" not in rest and "refused" in rest
        # a program this user may not execute is refused with who it was run as
        private = tmp_path / "private.sh"
        private.write_text("#!/bin/sh\necho hi\n")
        private.chmod(0o700)
        with pytest.raises(BootFailed, match=r"permission denied .* as nobody \(uid 65534\)"):
            await runtime.start(BootSpec(name="p", command=(str(private),)))

    run(scenario)


def test_an_unknown_user_is_refused_by_name() -> None:
    with pytest.raises(Invalid, match="no user 'no-such-user-b3'") as refused:
        RunAs.named("no-such-user-b3", "process.user")
    assert refused.value.field == "process.user"
    with pytest.raises(Invalid, match="no user"):
        RunAs.named(2**40)


def test_an_image_without_a_command_cannot_run_as_a_process() -> None:
    """A boot spec may leave its command to its image's ``Cmd``; the process runtime, which
    never uses the image, refuses it with why, and starts nothing."""

    async def scenario() -> None:
        runtime = ProcessRuntime()
        with pytest.raises(BootFailed, match="gives none"):
            await runtime.start(BootSpec(name="w", image="busybox"))
        assert runtime.list() == ()

    run(scenario)
