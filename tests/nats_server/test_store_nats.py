"""The NATS JetStream state store passes the store contract against a real nats-server;
then what only this driver does: malformed peer data, replicas that age out silent nodes
(the bucket without markers, closed to rollups), generation offsets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import nats.errors
import pytest
from nats.js.api import KeyValueConfig

from berth.errors import Invalid
from berth.model import Placement
from berth.nats.streams import forbid_rollups
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


def test_a_silent_node_leaves_a_second_readers_replica_within_the_ttl(
    nats_server: NatsServer,
) -> None:
    async def scenario() -> None:
        bucket = unique_name("ttl")
        async with (
            client(nats_server.url) as one,
            client(nats_server.url) as two,
            NatsStore(one, bucket=bucket, ttl_s=0.5) as writer,
            NatsStore(two, bucket=bucket, ttl_s=0.5) as reader,
        ):
            events: list[tuple[str, str, float]] = []
            reader.subscribe(lambda e: events.append((e.kind, e.node, time.monotonic())))
            await writer.publish(sample_state("gone"))
            await _eventually(lambda: ("put", "gone") in [(k, n) for k, n, _ in events])
            # the writer is silent from now on: the reader's sweep removes the node
            await _eventually(lambda: ("delete", "gone") in [(k, n) for k, n, _ in events], 3)
            assert await reader.states() == {}
            put = next(t for k, _, t in events if k == "put")
            gone = next(t for k, _, t in events if k == "delete")
            assert 0.5 <= gone - put <= 0.5 + 0.5  # the ttl, and a sweep or two
            # the stream has no markers (they would keep rollups on) and refuses rollups
            info = await one.jetstream().stream_info(f"KV_{bucket}")
            assert not info.config.subject_delete_marker_ttl

    asyncio.run(scenario())


def test_a_reader_started_after_a_node_went_silent_drops_it_on_time(
    nats_server: NatsServer,
) -> None:
    """The values a watch catches up on are aged from the server's timestamps: a node that
    died 0.6 s before a reader started leaves it 0.4 s later (a 1 s ttl), not 1 s later."""

    async def scenario() -> None:
        bucket = unique_name("late")
        async with client(nats_server.url) as nc:
            async with NatsStore(nc, bucket=bucket, ttl_s=1.0, watch=False) as writer:
                await writer.publish(sample_state("early"))
                await asyncio.sleep(0.6)
                await writer.publish(sample_state("fresh"))
            started = time.monotonic()
            async with NatsStore(nc, bucket=bucket, ttl_s=1.0) as reader:
                assert set(await reader.states()) == {"early", "fresh"}
                await _eventually(lambda: "early" not in reader._replica, 2)
                assert time.monotonic() - started < 0.8
                assert "fresh" in reader._replica
                await _eventually(lambda: "fresh" not in reader._replica, 2)

    asyncio.run(scenario())


def test_a_sweep_that_wakes_late_drops_nothing(nats_server: NatsServer) -> None:
    """An event loop held past the ttl (a long garbage collection) must not empty the
    replica before the snapshots that arrived meanwhile are read."""

    async def scenario() -> None:
        bucket = unique_name("held")
        async with (
            client(nats_server.url) as one,
            client(nats_server.url) as two,
            NatsStore(one, bucket=bucket, ttl_s=0.5) as writer,
            NatsStore(two, bucket=bucket, ttl_s=0.5) as reader,
        ):
            beating = True

            async def beat() -> None:
                generation = 1
                while beating:
                    await writer.publish(sample_state("alive", generation))
                    generation += 1
                    await asyncio.sleep(0.1)

            events: list[StateEvent] = []
            reader.subscribe(events.append)
            beater = asyncio.create_task(beat())
            await _eventually(lambda: "alive" in reader._replica)
            time.sleep(0.8)  # the loop is held past the ttl: nothing published, nothing read
            await asyncio.sleep(0.6)
            assert "alive" in reader._replica
            assert ("delete", "alive") not in [(e.kind, e.node) for e in events]
            beating = False
            await beater

    asyncio.run(scenario())


def test_a_replica_keeps_its_nodes_while_its_watch_is_made_again(nats_server: NatsServer) -> None:
    """The watch's consumer can go while the stream answers (it lived on the server that
    died, and nats-py makes another only after two missed heartbeats): the nodes publish, the
    replica hears none of it — and must drop none, then be current again, and still drop a
    node that really stops."""

    async def scenario() -> None:
        bucket = unique_name("rewatch")
        async with (
            client(nats_server.url) as one,
            client(nats_server.url) as two,
            NatsStore(one, bucket=bucket, ttl_s=0.5, watch=False) as writer,
            NatsStore(two, bucket=bucket, ttl_s=0.5) as reader,
        ):
            silent: set[str] = set()

            async def beat() -> None:
                generation = 1
                while True:
                    for node in {"a", "b"} - silent:
                        await writer.publish(sample_state(node, generation))
                    generation += 1
                    await asyncio.sleep(0.1)

            events: list[StateEvent] = []
            reader.subscribe(events.append)
            beater = asyncio.create_task(beat())
            try:
                await _eventually(lambda: {"a", "b"} <= set(reader._replica))
                follow = reader._follow
                assert follow is not None and follow.idle_heartbeat_s == 1.0
                consumer = (await follow._subscription.consumer_info()).name
                await one.jetstream().delete_consumer(f"KV_{bucket}", consumer)
                before = _generation(reader, "a") or 0
                # made again after two missed heartbeats (2 s, four ttls): nothing dropped
                await _eventually(lambda: (_generation(reader, "a") or 0) > before + 2, 10)
                assert [e for e in events if e.kind == "delete"] == []
                silent.add("b")
                await _eventually(lambda: "b" not in reader._replica, 2)
                assert "a" in reader._replica
            finally:
                beater.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beater

    asyncio.run(scenario())


def test_a_bucket_made_with_markers_is_closed_to_rollups(nats_server: NatsServer) -> None:
    """A node-states bucket created by an older berth (with limit markers, which keep rollups
    on): forbid_rollups turns both off, and a rollup on one key is refused."""

    async def scenario() -> None:
        bucket = unique_name("old")
        async with client(nats_server.url) as nc:
            js = nc.jetstream()
            config = KeyValueConfig(bucket=bucket, history=1, ttl=3.0, limit_marker_ttl=1.0)
            kv = await js.create_key_value(config)
            await kv.put("a", b"1")
            await kv.put("b", b"2")
            assert await forbid_rollups(nc, bucket)
            assert not await forbid_rollups(nc, bucket)  # closed already
            info = await js.stream_info(f"KV_{bucket}")
            assert not info.config.allow_rollup_hdrs and not info.config.subject_delete_marker_ttl
            rollup = {"KV-Operation": "PURGE", "Nats-Rollup": "all"}
            with pytest.raises(nats.errors.Error):
                await js.publish(f"$KV.{bucket}.a", b"", headers=rollup, timeout=1.0)
            assert sorted(await kv.keys()) == ["a", "b"]
            await kv.delete("a")  # a delete is no rollup
            assert await kv.keys() == ["b"]

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
