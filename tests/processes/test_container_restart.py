"""Containers survive their agent's ``kill -9`` and are adopted (issue 38), with real
processes: a ``berth agent`` child process (container runtime, a state directory) on a real
nats-server, two busybox containers run through the node client over NATS.

The agent is killed with both containers running; one exits by itself while no agent is
there.  The restarted agent adopts the one still running — reserved again before its first
snapshot, answered ``running``, stopped — and reports the other's exit code.  A container
whose image changed while its agent was down cannot be adopted: the restarted agent kills it
and removes what it left.  Every process is killed, and every layer mount under the test's
directory unmounted, at the end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from berth.boot import RunOrder
from berth.model import Spec
from berth.node.container.mounts import mounted, unmount_under
from berth.node.container.setup import STARTER_IMAGE, write_starter_image
from berth.node.microvm.images import busybox_layer, write_image
from berth.node.runtime import BootSpec
from berth.node.runtime.supervisor import alive
from berth.nodeclient.nats import NatsNodes
from berth.oci import file
from berth.processes.runtimes import container_problems
from berth.store.nats import NatsStore
from berth.testing.nats import NatsServer
from berth.units import MiB
from tests.processes.test_agent_restart import (
    NODE,
    Agents,
    config_text,
    connected,
    first_state_after,
    kill_9,
    reserved,
)

MISSING = container_problems()
pytestmark = [
    pytest.mark.skipif(bool(MISSING), reason=f"no containers here: {'; '.join(MISSING)}"),
    pytest.mark.slow,  # an agent process on a real nats-server
]

BOX = Spec(vcpus=0.1, mem=64 * MiB, disk=8 * MiB)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    layout = tmp_path / "oci"
    assert write_starter_image(layout) is None
    with NatsServer() as server:
        made = Agents(tmp_path, server.url, orphan_grace_s=30.0)
        made.config.write_text(
            config_text().replace('runtime = "process"', 'runtime = "container"')
            + f'\n[container]\nimages = "{layout}"\nnode_dir = "{tmp_path / "node"}"\n'
        )
        try:
            yield made
        finally:
            made.cleanup()
            unmount_under(tmp_path)


async def started(agents: Agents, store: NatsStore, nodes: NatsNodes) -> None:
    """Start the agent and wait for its first snapshot; a container's start may be slow."""
    agents.start()
    await first_state_after(store, 0)
    nodes.timeout_s = 20.0


def test_a_restarted_agent_adopts_its_running_container_and_reports_the_one_that_exited(
    agents: Agents,
) -> None:
    async def scenario() -> None:
        async with connected(agents.url) as (nodes, store):
            await started(agents, store, nodes)
            kept = await nodes.try_run(
                NODE,
                RunOrder(
                    BOX, [], BootSpec(name="kept", image=STARTER_IMAGE, command=("sleep", "600"))
                ),
            )
            quitter = BootSpec(
                name="quits", image=STARTER_IMAGE, command=("sh", "-c", "sleep 2; exit 6")
            )
            quits = await nodes.try_run(NODE, RunOrder(BOX, [], quitter))
            runcs = agents.workload_processes()
            assert sorted(runcs) == sorted([kept, quits])
            kill_9(agents.started[-1])
            exit_file = agents.journal / f"{quits}.exit"
            for _ in range(200):  # the container exits while no agent is there
                if exit_file.exists():
                    break
                await asyncio.sleep(0.1)
            assert exit_file.exists(), "the container never ended"
            assert alive(*runcs[kept]), "the running container died with its agent"
            restarted_at = time.time()
            agents.start()
            state = await first_state_after(store, restarted_at)
            assert reserved(state) == BOX.mem  # the adopted container, before any admission
            status = await nodes.status(NODE, kept)
            assert status.state == "running", status
            ended = await nodes.status(NODE, quits)
            assert (ended.state, ended.exit_code) == ("ended", 6), ended
            assert "while the agent was down" in (ended.reason or "")
            await nodes.stop(NODE, kept, grace_s=5.0)
            stopped = await nodes.status(NODE, kept)
            assert stopped.state == "ended" and stopped.stopped, stopped
            for _ in range(100):
                if not alive(*runcs[kept]):
                    break
                await asyncio.sleep(0.1)
            assert not alive(*runcs[kept]), "the adopted container outlived its stop"

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_container_whose_image_changed_meanwhile_is_killed_and_leaves_nothing(
    agents: Agents, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with connected(agents.url) as (nodes, store):
            await started(agents, store, nodes)
            boot = BootSpec(name="box", image=STARTER_IMAGE, command=("sleep", "600"))
            box = await nodes.try_run(NODE, RunOrder(BOX, [], boot))
            (runc,) = agents.workload_processes().values()
            run_dir = tmp_path / "node" / "run"
            (scratch,) = run_dir.iterdir()
            assert mounted(scratch / "rootfs")
            kill_9(agents.started[-1])
            # while no agent is there, the image is rebuilt on other layers
            extra = [file("etc/motd", "rebuilt\n")]
            write_image(tmp_path / "oci", STARTER_IMAGE, [busybox_layer(), extra])
            agents.start()
            await first_state_after(store, time.time())
            for _ in range(100):
                if not scratch.exists() and not alive(*runc):
                    break
                await asyncio.sleep(0.1)
            assert not alive(*runc), "a container that could not be adopted still runs"
            assert not scratch.exists() and not mounted(scratch / "rootfs")
            assert (await nodes.status(NODE, box)).state == "ended"

    asyncio.run(asyncio.wait_for(scenario(), 120))
