"""The NATS JetStream state store passes the store contract against a real nats-server;
then what only this driver does: malformed peer data, expiry markers, generation offsets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from berth.errors import Invalid
from berth.model import Placement
from berth.nats.wire import MAX_TOKEN, MalformedMessage, node_token
from berth.registry.nats_routes import NatsRoutes
from berth.store.nats import NatsStore, decode_state, encode_state
from berth.store.port import StateEvent, StateStore
from berth.testing.nats import NatsServer, client, unique_name
from berth.testing.store_contract import StateStoreContract, sample_state


class TestNatsStoreContract(StateStoreContract):
    settle_s = 3.0
    ttl_s = 0.5

    @pytest.fixture(autouse=True)
    def _server(self, nats_server: NatsServer) -> None:
        self.url = nats_server.url

    def open_store(self, *, ttl_s: float | None = None) -> AbstractAsyncContextManager[StateStore]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[StateStore]:
            bucket = unique_name("store")
            async with client(self.url) as nc, NatsStore(nc, bucket=bucket, ttl_s=ttl_s) as store:
                yield store

        return opened()


async def _eventually(predicate: object, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "did not happen in time"
        await asyncio.sleep(0.01)


def _generation(store: NatsStore, node: str) -> int | None:
    state = store._replica.get(node)
    return None if state is None else state.generation


def test_round_trip_and_schema_errors_name_the_problem() -> None:
    state = sample_state("node.1", 4)
    assert decode_state(encode_state(state), key=node_token("node.1")) == state
    assert node_token("node.1") == "node=2E1"
    cases = {
        b"not json": None,
        b"[1, 2]": None,
        b'{"v": 2, "state": {}}': "v",
        b'{"v": 1, "state": {"node": "a"}}': "state.platform",
        encode_state(state.model_copy(update={"mem_free": -1})): "state.mem_free",
    }
    for data, field in cases.items():
        with pytest.raises(MalformedMessage) as caught:
            decode_state(data, source="$KV.x.y")
        assert isinstance(caught.value, Invalid)
        assert "$KV.x.y" in str(caught.value)
        if field is not None:
            assert caught.value.field == field, caught.value
    with pytest.raises(MalformedMessage, match="stored under key"):
        decode_state(encode_state(state), key="other")


def test_malformed_peer_data_is_logged_and_changes_nothing(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        bucket = unique_name("bad")
        async with client(nats_server.url) as nc, NatsStore(nc, bucket=bucket) as store:
            events: list[StateEvent] = []
            store.subscribe(events.append)
            await store.publish(sample_state("n1", 1))
            await _eventually(lambda: "n1" in store._replica)
            js = nc.jetstream()
            for data in (b"garbage", b'{"v": 9}', encode_state(sample_state("n2"))):
                await js.publish(f"$KV.{bucket}.n1", data)  # n2's state under n1's key
            await _eventually(lambda: store.rejected == 3)
            assert (await store.states())["n1"] == sample_state("n1", 1)
            assert [(e.kind, e.node) for e in events] == [("put", "n1")]

    with caplog.at_level(logging.WARNING, logger="berth.store.nats"):
        asyncio.run(scenario())
    assert sum("malformed message on $KV." in r.getMessage() for r in caplog.records) == 3


def test_expiry_reaches_a_second_reader_by_the_servers_marker(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        bucket = unique_name("ttl")
        async with (
            client(nats_server.url) as one,
            client(nats_server.url) as two,
            NatsStore(one, bucket=bucket, ttl_s=0.5) as writer,
            NatsStore(two, bucket=bucket, ttl_s=0.5) as reader,
        ):
            events: list[StateEvent] = []
            reader.subscribe(events.append)
            await writer.publish(sample_state("gone"))
            await _eventually(lambda: ("put", "gone") in [(e.kind, e.node) for e in events])
            # the writer is silent from now on: the server's expiry marker removes the node
            await _eventually(lambda: ("delete", "gone") in [(e.kind, e.node) for e in events], 3)
            assert await reader.states() == {}

    asyncio.run(scenario())


def test_a_restarted_publisher_continues_the_generation(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        bucket = unique_name("gen")
        async with client(nats_server.url) as nc, NatsStore(nc, bucket=bucket) as reader:
            async with NatsStore(nc, bucket=bucket) as first:
                for generation in range(1, 6):
                    await first.publish(sample_state("n1", generation))
            await _eventually(lambda: _generation(reader, "n1") == 5)
            async with NatsStore(nc, bucket=bucket) as second:  # the agent restarted
                await second.publish(sample_state("n1", 1, mem_free=7))
            await _eventually(lambda: _generation(reader, "n1") == 6)
            assert reader._replica["n1"].mem_free == 7

    asyncio.run(scenario())


def test_a_token_that_would_be_too_long_is_a_digest_and_works_on_the_server(
    nats_server: NatsServer,
) -> None:
    """Security finding 1: 253 x U+1F600 as a namespace and a name made a route key of over
    4 KiB; the server closed the connection for good on it."""
    huge = "\U0001f600" * 253
    token = node_token(huge)
    assert len(token) <= MAX_TOKEN and token.startswith("=H")
    assert node_token(huge[:-1]) != token and node_token("a" * 200) == "a" * 200
    assert node_token("a" * 201).startswith("=H")
    workload = f"{huge}/{huge}/0"

    async def scenario() -> None:
        async with client(nats_server.url) as nc:
            routes = await NatsRoutes(nc, bucket=unique_name("routes")).start()
            placement = Placement(worker_node=huge, reservation_id="r1", colocated_bytes=0, rank=0)
            await routes.record(workload, placement)
            found = await routes.whereis(workload)
            assert found is not None and found.node == huge
            assert [route.workload for route in await routes.list(huge)] == [workload]
            assert nc.is_connected  # and the connection is still up
            await routes.remove(workload, huge)
            assert await routes.whereis(workload) is None

    asyncio.run(scenario())
