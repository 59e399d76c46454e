"""A node rewrites its own routes (issue 20): one node service on a real nats-server, its
route passes driven by the test (a heartbeat of a minute never fires on its own).

* a route purged while its reservation is held comes back exactly as it was, also after a
  second (late) purge; one whose workload ended, one removed on purpose and another node's
  are left alone;
* the node's copy of its routes is kept in its state directory, and a file that is not one,
  an entry of another node or of a reservation it does not hold, rewrites nothing.

Agents silenced with SIGSTOP, and restarted on their journal, are in
``tests/processes/test_routes_return_nats.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from berth.boot import AdmitOrder, RunOrder
from berth.embedded import embedded_configs
from berth.model import Layer, Placement, Spec
from berth.node.budget import IDLE
from berth.node.runtime import BootSpec
from berth.nodeclient.nats_node import ROUTES_FILE, NodeService
from berth.processes.agent import node_service
from berth.registry.nats_routes import NatsRoutes, route_document
from berth.registry.port import Route
from berth.testing.nats import NatsServer, client, unique_name
from berth.units import MiB

SMALL = Spec(vcpus=0.01, mem=16 * MiB, disk=MiB)
FN = ("t", "fn")
LAYERS = (Layer(id="sha256:base", size=1000),)


def _service(nc: object, routes: NatsRoutes, state_dir: Path) -> NodeService:
    config = embedded_configs(1, runtime="fake", heartbeat_s=60.0)[0]
    return node_service(
        nc,  # type: ignore[arg-type]
        config,
        bucket=unique_name("nodes"),
        prefix=unique_name("node"),
        routes=routes,
        readings=IDLE,
        state_dir=state_dir / config.node.name,
    )


def test_a_node_rewrites_its_purged_routes_exactly_while_it_holds_them(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with client(nats_server.url) as nc:
            routes = await NatsRoutes(nc, bucket=unique_name("routes")).start()
            async with _service(nc, routes, tmp_path) as service:
                node, agent = service.name, service.agent
                runs = agent.admit(AdmitOrder(SMALL, 300.0))  # bound to a workload below
                leased = agent.admit(AdmitOrder(SMALL, 300.0))  # placed, not yet run: still held
                ends = agent.admit(AdmitOrder(SMALL, 300.0))
                gone = agent.admit(AdmitOrder(SMALL, 300.0))
                for replica, admission in enumerate((runs, leased, ends, gone)):
                    placement = Placement(worker_node=node, reservation_id=admission.reservation_id)
                    await routes.record(f"t/fn/{replica}", placement, SMALL, function=FN)
                await agent.try_run(
                    RunOrder(
                        SMALL,
                        LAYERS,
                        BootSpec(name="w", command=("sleep", "600")),
                        reservation=runs.reservation_id,
                    )
                )
                elsewhere = Placement(worker_node="elsewhere", reservation_id="r1.other")
                await routes.record("t/fn/9", elsewhere, SMALL, function=FN)
                assert await service.reconcile_routes() == (0, 0)  # all held: only read
                before = {route.workload: route for route in await routes.list(node)}
                assert len(before) == 4
                copy = json.loads((tmp_path / node / ROUTES_FILE).read_text())
                assert sorted(entry["workload"] for entry in copy["routes"]) == sorted(before)

                assert agent.release(ends.reservation_id)  # its workload ended
                await routes.remove("t/fn/3", node)  # released through a scheduler
                agent.release(gone.reservation_id)
                await routes.purge_node(node)  # the node left the schedulers' view
                assert await routes.list(node) == []
                assert await service.reconcile_routes() == (0, 2)
                kept = [before["t/fn/0"], before["t/fn/1"]]
                assert await routes.list(node) == kept  # placed_at and function included
                assert [route.node for route in await routes.list()] == [node, node, "elsewhere"]

                # a purge that lands after the rewrite (a scheduler lagging): the next beat
                await routes.purge_node(node)
                assert await service.reconcile_routes() == (0, 2)
                assert await routes.list(node) == kept
                assert await service.reconcile_routes() == (0, 0)  # nothing missing: a read

                # a route removed on purpose is not revived, even while its lease is held
                await routes.remove("t/fn/1", node)
                assert await service.reconcile_routes() == (0, 0)
                assert await routes.list(node) == [before["t/fn/0"]]
                copy = json.loads((tmp_path / node / ROUTES_FILE).read_text())
                assert [entry["workload"] for entry in copy["routes"]] == ["t/fn/0", "t/fn/1"]
            # a clean stop: its routes and its copy of them are gone
            assert await routes.list(node) == []
            assert json.loads((tmp_path / node / ROUTES_FILE).read_text())["routes"] == []

    asyncio.run(scenario())


def test_a_routes_file_rewrites_only_this_nodes_routes_of_held_reservations(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with client(nats_server.url) as nc:
            routes = await NatsRoutes(nc, bucket=unique_name("routes")).start()
            service = _service(nc, routes, tmp_path)
            node = service.name
            path = tmp_path / node / ROUTES_FILE
            path.parent.mkdir(parents=True)
            stale = Route("t/fn/0", node, "r1.0ld1ncar", SMALL, 1.0, *FN)  # a past incarnation
            foreign = Route("t/fn/1", "elsewhere", "r1.0ld1ncar", SMALL, 1.0, *FN)
            entries = [route_document(stale), route_document(foreign), {"v": 1, "node": node}]
            path.write_text(json.dumps({"v": 1, "routes": entries}))
            with caplog.at_level(logging.WARNING, logger="berth"):
                async with service:
                    assert await service.reconcile_routes() == (0, 0)
                    assert await routes.list() == []
                    assert json.loads(path.read_text())["routes"] == []
            assert "bad workload" in caplog.text
            path.write_text("not json")
            with caplog.at_level(logging.WARNING, logger="berth"):
                async with _service(nc, routes, tmp_path) as again:
                    assert await again.reconcile_routes() == (0, 0)
            assert f"ignores its routes file {path}" in caplog.text

    asyncio.run(scenario())
