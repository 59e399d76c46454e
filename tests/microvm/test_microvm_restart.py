"""microVM guests survive their agent's ``kill -9`` and are adopted (issue 20), with real
processes: a ``berth agent`` child process (microVM runtime, a state directory) on a real
nats-server, two QEMU guests booted through the node client over NATS.

The agent is killed with both guests running; one guest's workload exits by itself while no
agent is there.  The restarted agent adopts the one still running — reserved again before its
first snapshot, answered ``running``, stopped through its console — and reports the other's
exit code, which it read from the guest's console log.  Every process is killed at the end.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from berth.boot import RunOrder
from berth.model import Spec
from berth.node.microvm.images import busybox_layer, write_image
from berth.node.microvm.paths import GuestFiles, problems
from berth.node.runtime import BootSpec
from berth.node.runtime.supervisor import alive
from berth.testing.nats import NatsServer
from berth.units import MiB
from tests.processes.test_agent_restart import (
    MEM_MAX,
    NODE,
    Agents,
    config_text,
    connected,
    first_state_after,
    kill_9,
    reserved,
)

FILES = GuestFiles.at(None)
MISSING = problems(FILES)
if os.geteuid() != 0:
    MISSING.append("converting layers to erofs images needs root")
pytestmark = [
    pytest.mark.skipif(
        bool(MISSING), reason=f"microVM guests cannot boot here: {'; '.join(MISSING)}"
    ),
    pytest.mark.slow,  # QEMU guests under emulation and an agent process
]

GUEST = Spec(vcpus=1, mem=128 * MiB, disk=8 * MiB)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    layout = tmp_path / "oci"
    write_image(layout, "busybox", [busybox_layer()])
    with NatsServer() as server:
        made = Agents(tmp_path, server.url, orphan_grace_s=60.0)
        made.config.write_text(
            config_text().replace('runtime = "process"', 'runtime = "microvm"')
            + f'\n[microvm]\nimages = "{layout}"\nnode_dir = "{tmp_path / "node"}"\n'
            f'data_dir = "{FILES.data_dir}"\n'
        )
        try:
            yield made
        finally:
            made.cleanup()


def test_a_restarted_agent_adopts_its_running_guest_and_reports_the_one_that_exited(
    agents: Agents,
) -> None:
    async def scenario() -> None:
        async with connected(agents.url) as (nodes, store):
            agents.start()
            await first_state_after(store, 0, limit_s=60.0)
            nodes.timeout_s = 60.0  # a guest's boot under emulation
            kept = await nodes.try_run(
                NODE,
                RunOrder(
                    GUEST, [], BootSpec(name="kept", image="busybox", command=("sleep", "600"))
                ),
            )
            quitter = BootSpec(
                name="quits", image="busybox", command=("sh", "-c", "sleep 4; exit 6")
            )
            quits = await nodes.try_run(NODE, RunOrder(GUEST, [], quitter))
            qemus = agents.workload_processes()
            assert sorted(qemus) == sorted([kept, quits])
            kill_9(agents.started[-1])
            exit_file = agents.journal / f"{quits}.exit"
            for _ in range(300):  # the guest's workload exits while no agent is there
                if exit_file.exists():
                    break
                await asyncio.sleep(0.1)
            assert exit_file.exists(), "the guest never ended"
            assert alive(*qemus[kept]), "the running guest died with its agent"
            restarted_at = time.time()
            agents.start()
            state = await first_state_after(store, restarted_at, limit_s=60.0)
            assert reserved(state) == GUEST.mem  # the adopted guest, before any admission
            assert reserved(state) <= MEM_MAX
            status = await nodes.status(NODE, kept)
            assert status.state == "running", status
            ended = await nodes.status(NODE, quits)
            assert (ended.state, ended.exit_code) == ("ended", 6), ended
            assert "while the agent was down" in (ended.reason or "")
            await nodes.stop(NODE, kept, grace_s=10.0)
            stopped = await nodes.status(NODE, kept)
            assert stopped.state == "ended" and stopped.stopped, stopped
            for _ in range(100):
                if not alive(*qemus[kept]):
                    break
                await asyncio.sleep(0.1)
            assert not alive(*qemus[kept]), "the adopted guest's QEMU outlived its stop"

    asyncio.run(asyncio.wait_for(scenario(), 240))
