"""The API's create when the workload registry fails between the placement and the record:
the backend (:class:`~berth.api.backend.ClusterBackend`) in-process over agents and a
scheduler on a real nats-server, its registry's bucket on a connection that is closed before
the create — the intent (the ``pending`` record) is written before any boot, so it fails
first, nothing is booted, and nothing is left behind (no running workload, no reservation,
no route, no claim on the identity)."""

from __future__ import annotations

import asyncio

import pytest

from berth.api.backend import ClusterBackend
from berth.api.schemas import WorkloadCreate
from berth.embedded import embedded_configs
from berth.errors import Unavailable
from berth.nodeclient.faults import FaultyNodes
from berth.registry.nats import NatsClaims, NatsImages, NatsWorkloads
from berth.registry.port import StoredWorkload
from berth.testing.cluster import Names, NatsServices, nats_cluster
from berth.testing.nats import NatsServer, client, unique_name


class BrokenRecords(NatsWorkloads):
    """A registry whose driver fails in a way nobody planned for (not ``Unavailable``)."""

    async def record(self, workload: StoredWorkload) -> None:
        raise RuntimeError("the registry's driver broke")


async def _records(how: str, url: str, running: NatsServices, bucket: str) -> NatsWorkloads:
    if how == "unexpected":
        return await BrokenRecords(running.client, bucket=bucket).start()
    async with client(url) as lost:
        workloads = await NatsWorkloads(lost, bucket=bucket).start()
        workloads.claims = await NatsClaims(running.client, bucket=bucket).start()
        await lost.close()  # the records' connection fails; the claims' does not
    return workloads


@pytest.mark.parametrize(
    ("how", "error", "match"),
    [
        ("connection closed", Unavailable, r"not recorded .*; nothing was booted"),
        # security finding 4: a failure that is not Unavailable kept the reservation and
        # blocked the identity with nothing listed
        ("unexpected", RuntimeError, "driver broke"),
    ],
)
def test_a_create_whose_record_fails_leaves_nothing_behind(
    nats_server: NatsServer, how: str, error: type[Exception], match: str
) -> None:
    async def scenario() -> None:
        configs = embedded_configs(1, runtime="fake", heartbeat_s=1.0)
        names = Names.namespaced(unique_name("c"))
        async with nats_cluster(nats_server.url, configs, names=names) as running:
            bucket = unique_name("api")
            workloads = await _records(how, nats_server.url, running, bucket)
            backend = ClusterBackend(
                running.scheduler_services[0].scheduler,
                running.nodes,
                running.scheduler,
                workloads,
                await NatsImages(running.client, bucket=bucket).start(),
            )
            body = WorkloadCreate(name="job", type="micro", command=["sleep", "60"])
            with pytest.raises(error, match=match):
                await backend.create(body)
            (agent,) = (service.agent for service in running.node_services.values())
            assert agent.workloads() == {}
            for _ in range(100):  # the release reaches the node as its own request
                if not agent.core.budget.reservations():
                    break
                await asyncio.sleep(0.02)
            assert agent.core.budget.reservations() == []
            assert await running.routes.whereis("default/job/0") is None
            assert await workloads.claims.holder("default/job/0") is None
            assert backend.recent(1)[0].outcome == "unavailable"

    asyncio.run(scenario())


def test_a_create_whose_run_answer_is_lost_over_nats_boots_once(nats_server: NatsServer) -> None:
    """The run reaches the agent's node server over a real nats-server and boots; its answer
    is lost (:class:`~berth.nodeclient.faults.FaultyNodes`): the API asks again under the
    same id, and the node answers it without booting a second copy."""

    async def scenario() -> None:
        configs = embedded_configs(1, runtime="fake", heartbeat_s=1.0)
        names = Names.namespaced(unique_name("c"))
        async with nats_cluster(nats_server.url, configs, names=names) as running:
            bucket = unique_name("api")
            faults = FaultyNodes(running.nodes)
            backend = ClusterBackend(
                running.scheduler_services[0].scheduler,
                faults,
                running.scheduler,
                await NatsWorkloads(running.client, bucket=bucket).start(),
                await NatsImages(running.client, bucket=bucket).start(),
            )
            faults.lose_run_answers(1)
            body = WorkloadCreate(name="job", type="micro", command=["sleep", "60"])
            workload = await backend.create(body)
            assert workload.state == "running" and workload.node_workload_id == workload.id
            assert faults.runs == [(workload.node, workload.id)] * 2
            (agent,) = (service.agent for service in running.node_services.values())
            assert list(agent.workloads()) == [workload.id]
            assert len(agent.core.budget.reservations()) == 1
            stored = await backend.workloads.get(workload.id)
            assert stored is not None and stored.state == "running"

    asyncio.run(scenario())


def test_a_node_gone_over_nats_loses_its_workload_and_places_it_again(
    nats_server: NatsServer,
) -> None:
    """An agent on a real nats-server leaves for good: the API (``node_gone_after`` 0.5 s)
    records its workload ``unknown``, then ``lost``, and boots the restartable one again on
    the node that is left — the identity kept for the replacement."""

    async def scenario() -> None:
        configs = embedded_configs(2, runtime="fake", heartbeat_s=0.5)
        names = Names.namespaced(unique_name("c"))
        async with nats_cluster(nats_server.url, configs, names=names) as running:
            bucket = unique_name("api")
            backend = ClusterBackend(
                running.scheduler_services[0].scheduler,
                running.nodes,
                running.scheduler,
                await NatsWorkloads(running.client, bucket=bucket).start(),
                await NatsImages(running.client, bucket=bucket).start(),
                node_gone_after_s=0.5,
            )
            doomed, other = sorted(running.node_services)
            await backend.cordon(other, True)
            body = WorkloadCreate(
                name="svc", type="micro", command=["sleep", "60"], restartable=True
            )
            workload = await backend.create(body)
            assert workload.node == doomed
            await backend.cordon(other, False)
            await running.node_services[doomed].stop()
            assert (await backend.workload(workload.id)).state == "unknown"
            deadline = asyncio.get_running_loop().time() + 10.0
            while (lost := await backend.workload(workload.id)).state != "lost":
                assert asyncio.get_running_loop().time() < deadline, lost
                await asyncio.sleep(0.1)
            assert lost.replaced_by is not None
            replacement = await backend.workload(lost.replaced_by)
            assert (replacement.state, replacement.node) == ("running", other)
            claims = backend.workloads.claims
            assert await claims.holder("default/svc/0") == replacement.id

    asyncio.run(scenario())
