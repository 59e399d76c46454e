"""The NATS node client passes the node-client contract against agents answering over a real
nats-server; then what only the network adds: idempotent retries, typed transport errors,
malformed requests and replies."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from berth.boot import AdmitOrder, RunOrder
from berth.errors import Invalid, Unavailable
from berth.model import Spec
from berth.nats.wire import IDEMPOTENCY_HEADER, BadReply, encode, subject
from berth.node.agent import Agent
from berth.node.runtime import BootSpec, FakeRuntime, ProcessRuntime, Runtime
from berth.nodeclient.nats import NatsNodes
from berth.nodeclient.nats_server import NodeServer
from berth.nodeclient.port import NodeClient
from berth.store.memory import MemoryStore
from berth.testing.nats import NatsServer, client, unique_name
from berth.testing.nodeclient_contract import NodeClientContract, NodeShape
from berth.units import GiB, MiB

SPEC = Spec(vcpus=0.01, mem=MiB, disk=MiB)


@asynccontextmanager
async def served(
    url: str,
    shapes: Sequence[NodeShape],
    prefix: str,
    runtime: Callable[[], Runtime] = FakeRuntime,
) -> AsyncIterator[tuple[NatsNodes, dict[str, NodeServer], Client]]:
    """Agents for ``shapes``, each answering on NATS, and a client on its own connection."""
    async with AsyncExitStack() as stack:
        node_side = await stack.enter_async_context(client(url, name="nodes"))
        scheduler_side = await stack.enter_async_context(client(url, name="scheduler"))
        store = MemoryStore()
        servers = {}
        for shape in shapes:
            agent = Agent(shape.name, shape.platform, shape.budget(), store, runtime())
            servers[shape.name] = await stack.enter_async_context(
                NodeServer(node_side, agent, prefix=prefix)
            )
        yield NatsNodes(scheduler_side, prefix=prefix, timeout_s=2.0), servers, scheduler_side


class TestNatsNodesContract(NodeClientContract):
    runs_workloads = True

    @pytest.fixture(autouse=True)
    def _server(self, nats_server: NatsServer) -> None:
        self.url = nats_server.url

    def open_nodes(self, shapes: Sequence[NodeShape]) -> AbstractAsyncContextManager[NodeClient]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[NodeClient]:
            async with served(self.url, shapes, unique_name("node")) as (nodes, _, _):
                yield nodes

        return opened()

    async def start_workload(self, nodes: NodeClient, node: str) -> str:
        assert isinstance(nodes, NatsNodes)
        return await nodes.try_run(node, RunOrder(SPEC, [], BootSpec(name="w", command=("vm",))))

    async def stop_workload(self, nodes: NodeClient, node: str, workload_id: str) -> None:
        assert isinstance(nodes, NatsNodes)
        await nodes.stop(node, workload_id)


def test_a_retried_admit_gets_the_same_reservation(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        prefix = unique_name("node")
        async with served(nats_server.url, [NodeShape("n1", mem=4 * MiB)], prefix) as (
            nodes,
            servers,
            nc,
        ):
            body = encode({"v": 1, "spec": SPEC.model_dump(mode="json"), "lease_ttl_s": 30.0})
            where = subject("n1", "admit", prefix)
            replies = [
                json.loads((await nc.request(where, body, 2, headers={IDEMPOTENCY_HEADER: k})).data)
                for k in ("key-1", "key-1", "key-2")
            ]
            assert replies[0] == replies[1]
            assert replies[2]["ok"]["reservation_id"] != replies[0]["ok"]["reservation_id"]
            assert servers["n1"].agent.budget.admitted == 2  # the retry reserved nothing
            # two reservations of 1 MiB on a 4 MiB node: 2 MiB left, exactly
            await nodes.admit("n1", AdmitOrder(Spec(vcpus=0.01, mem=2 * MiB, disk=1), 30))

    asyncio.run(scenario())


def test_malformed_requests_are_invalid_named_and_reserve_nothing(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        prefix = unique_name("node")
        async with served(nats_server.url, [NodeShape("n1")], prefix) as (_, servers, nc):
            spec = SPEC.model_dump(mode="json")
            cases = {
                b"garbage": None,
                b'{"v": 7}': "v",
                encode({"v": 1, "lease_ttl_s": 5}): "spec",
                encode({"v": 1, "spec": {**spec, "mem": -1}, "lease_ttl_s": 5}): "spec.mem",
                encode({"v": 1, "spec": spec, "lease_ttl_s": "5"}): "lease_ttl_s",
                encode({"v": 1, "spec": spec, "lease_ttl_s": 5, "platforms": ["a b"]}): "platforms",
            }
            for body, field in cases.items():
                reply = json.loads((await nc.request(subject("n1", "admit", prefix), body, 2)).data)
                assert reply["error"]["kind"] == "invalid", reply
                assert "malformed message on" in reply["error"]["message"]
                if field is not None:
                    assert reply["error"]["field"] == field, reply
            reply = json.loads(
                (await nc.request(subject("n1", "frob", prefix), b'{"v":1}', 2)).data
            )
            assert reply["error"]["kind"] == "invalid"
            # the node's own operations: each field named, nothing done
            run = {
                "v": 1,
                "spec": spec,
                "boot": {"name": "w", "command": ["vm"]},
                "layers": [],
            }
            ops = {
                ("run", encode({**run, "workload_id": 5})): "workload_id",
                ("run", encode({**run, "workload_id": "a b"})): "workload_id",
                ("run", encode({**run, "workload_id": ""})): "workload_id",
                ("status", b'{"v":1}'): "workload_id",
                ("status", b'{"v":1,"workload_id":5}'): "workload_id",
                ("stop", b'{"v":1,"grace_s":1}'): "workload_id",
                ("cordon", b"[]"): None,
                ("uncordon", b'{"v":2}'): "v",
            }
            for (operation, body), field in ops.items():
                where = subject("n1", operation, prefix)
                reply = json.loads((await nc.request(where, body, 2)).data)
                assert reply["error"]["kind"] == "invalid", (operation, reply)
                assert reply["error"].get("field") == field, (operation, reply)
            assert not servers["n1"].agent.cordoned
            assert servers["n1"].rejected == len(cases) + 1 + len(ops)
            assert servers["n1"].agent.budget.admitted == 0
            assert servers["n1"].agent.workloads() == {}
            # malformed trace context from a peer is ignored: the request is still answered
            for headers in (
                {"traceparent": "garbage", "tracestate": "=,=,,", "baggage": "%%;=;"},
                {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"},
                {"traceparent": "ff-" + "a" * 600, "baggage": "k=" + "v" * 9000},
            ):
                where = subject("n1", "status", prefix)
                body = b'{"v":1,"workload_id":"nothing"}'
                reply = json.loads((await nc.request(where, body, 2, headers=headers)).data)
                assert reply["ok"]["state"] == "unknown", reply

    with caplog.at_level(logging.WARNING, logger="berth.nodeclient.nats"):
        asyncio.run(scenario())
    assert any("rejected: malformed message" in r.getMessage() for r in caplog.records)


def test_a_stop_over_nats_gives_a_workload_ignoring_sigterm_its_own_grace(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A process workload that traps SIGTERM, on a node whose runtime waits 30 s by default,
    stopped over NATS with ``grace_s`` 0.5: killed (SIGKILL) within a few seconds.  Malformed
    graces from a peer are answered ``invalid`` naming ``grace_s`` and stop nothing."""
    ready = tmp_path / "ready"

    async def scenario() -> None:
        prefix = unique_name("node")
        shapes = [NodeShape("n1", mem=GiB)]
        slow = lambda: ProcessRuntime(stop_grace_s=30.0)  # noqa: E731
        async with served(nats_server.url, shapes, prefix, slow) as (nodes, servers, nc):
            boot = BootSpec(
                name="stubborn",
                command=("sh", "-c", 'trap "" TERM; echo ready > "$READY"; sleep 60'),
                env={"READY": str(ready)},
            )
            workload_id = await nodes.try_run(
                "n1", RunOrder(Spec(vcpus=0.01, mem=64 * MiB, disk=MiB), [], boot)
            )
            for _ in range(500):  # the trap is set once the file is written
                if ready.exists() and ready.read_text().strip():
                    break
                await asyncio.sleep(0.01)
            where = subject("n1", "stop", prefix)
            for grace in (b"-1", b"1e999", b"3601", b"true", b'"5"', b"[0.5]"):
                body = b'{"v":1,"workload_id":"%s","grace_s":%s}' % (workload_id.encode(), grace)
                reply = json.loads((await nc.request(where, body, 2)).data)
                assert reply["error"]["kind"] == "invalid", (grace, reply)
                assert reply["error"]["field"] == "grace_s", (grace, reply)
                assert (await nodes.status("n1", workload_id)).state == "running"
            began = time.monotonic()
            await nodes.stop("n1", workload_id, grace_s=0.5)
            waited = time.monotonic() - began
            assert 0.45 <= waited < 10.0  # far below the node's 30 s default, even loaded
            status = await nodes.status("n1", workload_id)
            assert (status.state, status.stopped) == ("ended", True)
            assert status.reason == f"stopped (killed by {signal.SIGKILL.name})"
            assert servers["n1"].agent.workloads() == {}

    asyncio.run(asyncio.wait_for(scenario(), 30.0))


def test_silence_is_unavailable_after_retries_and_garbage_is_a_bad_reply(
    nats_server: NatsServer,
) -> None:
    async def scenario() -> None:
        prefix = unique_name("node")
        async with client(nats_server.url) as nc:
            heard: list[str | None] = []

            async def silent(msg: Msg) -> None:
                heard.append((msg.headers or {}).get(IDEMPOTENCY_HEADER))

            async def babbling(msg: Msg) -> None:
                await msg.respond(b"<html>")

            await nc.subscribe(subject("quiet", "admit", prefix), cb=silent)
            await nc.subscribe(subject("odd", "admit", prefix), cb=babbling)
            nodes = NatsNodes(nc, prefix=prefix, timeout_s=0.2, admit_attempts=3)
            with pytest.raises(Unavailable, match="outcome unknown"):
                await nodes.admit("quiet", AdmitOrder(SPEC, 5))
            assert len(heard) == 3 and len(set(heard)) == 1  # one key, three attempts
            with pytest.raises(BadReply):
                await nodes.admit("odd", AdmitOrder(SPEC, 5))
            with pytest.raises(Invalid):
                await nodes.admit("quiet", AdmitOrder(SPEC, float("inf")))

    asyncio.run(scenario())
