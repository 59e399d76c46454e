"""The watched copy of the workload records (:meth:`berth.registry.nats.NatsWorkloads.watch`)
on a real nats-server, each test in a bucket of its own.

* the records stored before the watch are all in it once ``watch`` returns; an empty bucket
  is caught up at once; a stopped watch (or one never started) answers ``None``;
* a record stored or transitioned afterwards shows in it, as stored, within a moment;
* a key deleted or purged leaves it;
* a value that is not a record, or is a record under another id's key, is skipped and
  counted — before the watch or during it — and the other records stay;
* an older revision of a record never replaces a newer one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from berth.nats.wire import encode_model
from berth.registry.nats import DOCUMENT, NatsRecordWatch, NatsWorkloads
from berth.registry.port import StoredWorkload, new_workload_id
from berth.testing.nats import NatsServer, client, unique_name

pytestmark = pytest.mark.anyio

WITHIN_S = 5.0
"""How long a change may take to reach the watch (on a loaded machine)."""


@dataclass
class Watched:
    """A registry in a bucket of its own, the bucket itself, and the connection."""

    conn: Client
    workloads: NatsWorkloads
    kv: KeyValue
    bucket: str


@asynccontextmanager
async def registry(url: str) -> AsyncIterator[Watched]:
    bucket = unique_name("records")
    async with client(url) as conn:
        workloads = await NatsWorkloads(conn, bucket=bucket).start()
        kv = await conn.jetstream().key_value(bucket)
        yield Watched(conn, workloads, kv, bucket)


@asynccontextmanager
async def watching(workloads: NatsWorkloads) -> AsyncIterator[NatsRecordWatch]:
    watch = await workloads.watch(idle_heartbeat_s=0.5, sync_timeout_s=WITHIN_S)
    try:
        yield watch
    finally:
        await watch.stop()


def record(state: str = "running", workload_id: str | None = None) -> StoredWorkload:
    """A workload's record as the API keeps it."""
    workload_id = new_workload_id() if workload_id is None else workload_id
    return StoredWorkload.model_validate(
        {
            "id": workload_id,
            "namespace": "t",
            "name": "w",
            "replica": 0,
            "node": "n1",
            "node_workload_id": workload_id,
            "colocated_bytes": 0,
            "rank": 0,
            "state": state,
            "command": ["sleep", "600"],
            "restartable": False,
            "created_at": time.time(),
            "request": {"namespace": "t", "name": "w"},
        }
    )


def by_id(watch: NatsRecordWatch) -> dict[str, StoredWorkload]:
    records = watch.records()
    assert records is not None, "the watch has not caught up"
    return {r.id: r for r in records}


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition`` holds, at most :data:`WITHIN_S`."""
    deadline = time.monotonic() + WITHIN_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WITHIN_S:g}s: {what}"
        await asyncio.sleep(0.02)


async def test_the_records_stored_before_the_watch_are_all_in_it(nats_server: NatsServer) -> None:
    async with registry(nats_server.url) as r:
        stored = [record() for _ in range(20)]
        for workload in stored:
            await r.workloads.record(workload)
        async with watching(r.workloads) as watch:
            assert by_id(watch) == {w.id: w for w in stored}
            assert len(watch) == 20 and watch.rejected == 0
            # a fresh list each time, of the same (shared) records
            first, second = watch.records(), watch.records()
            assert first is not second and first is not None and second is not None
            assert all(a is b for a, b in zip(first, second, strict=True))


async def test_an_empty_bucket_is_caught_up_at_once(nats_server: NatsServer) -> None:
    async with registry(nats_server.url) as r:
        await r.kv.put("c.someone", b"{}")  # other documents of the bucket are not records
        started = time.monotonic()
        async with watching(r.workloads) as watch:
            assert time.monotonic() - started < WITHIN_S / 2
            assert watch.records() == [] and len(watch) == 0
        assert watch.records() is None  # stopped: no longer kept current


async def test_a_watch_not_started_is_not_caught_up(nats_server: NatsServer) -> None:
    async with registry(nats_server.url) as r:
        watch = NatsRecordWatch(r.workloads._bucket)
        assert watch.records() is None and len(watch) == 0


async def test_records_stored_and_transitioned_later_show_as_stored(
    nats_server: NatsServer,
) -> None:
    async with registry(nats_server.url) as r:
        early = record()
        await r.workloads.record(early)
        async with watching(r.workloads) as watch:
            late = record("pending")
            await r.workloads.record(late)
            await until(lambda: late.id in by_id(watch), "a new record")
            assert by_id(watch)[late.id] == late

            update: dict[str, object] = {"state": "exited", "exit_code": 3, "ended_at": 1.0}
            changed, done = await r.workloads.transition(early.id, update, expect={"running"})
            assert done and changed is not None
            await until(lambda: by_id(watch)[early.id].state == "exited", "a transition")
            assert by_id(watch)[early.id] == changed
            assert by_id(watch)[late.id] == late and len(watch) == 2


async def test_a_deleted_or_purged_key_leaves_the_watch(nats_server: NatsServer) -> None:
    async with registry(nats_server.url) as r:
        gone_before, kept = record(), record()
        for workload in (gone_before, kept):
            await r.workloads.record(workload)
        await r.kv.delete(f"w.{gone_before.id}")
        async with watching(r.workloads) as watch:
            assert set(by_id(watch)) == {kept.id}
            deleted, purged = record(), record()
            for workload in (deleted, purged):
                await r.workloads.record(workload)
            await until(lambda: len(watch) == 3, "the new records")

            await r.kv.delete(f"w.{deleted.id}")
            await until(lambda: deleted.id not in by_id(watch), "a deleted key gone")
            await r.kv.purge(f"w.{purged.id}")
            await until(lambda: purged.id not in by_id(watch), "a purged key gone")
            assert set(by_id(watch)) == {kept.id} and watch.rejected == 0


async def test_a_value_that_is_not_a_record_is_skipped_and_counted(
    nats_server: NatsServer,
) -> None:
    async with registry(nats_server.url) as r:
        first, overwritten = record(), record()
        for workload in (first, overwritten):
            await r.workloads.record(workload)
        await r.kv.put("w.w-000000000001", b"{not json")  # the last value the watch reads
        async with watching(r.workloads) as watch:
            assert by_id(watch) == {first.id: first, overwritten.id: overwritten}
            assert watch.rejected == 1

            await r.kv.put("w.w-000000000002", b'{"id": "w-000000000002"}')  # fields missing
            await until(lambda: watch.rejected == 2, "a second bad value counted")
            # a key that held a record and now holds none: the copy drops it too
            await r.kv.put(f"w.{overwritten.id}", b"[]")
            await until(lambda: watch.rejected == 3, "a third bad value counted")
            assert by_id(watch) == {first.id: first}


async def test_a_record_is_enveloped_and_one_the_previous_release_stored_bare_is_read(
    nats_server: NatsServer,
) -> None:
    async with registry(nats_server.url) as r:
        new, old = record(), record()
        await r.workloads.record(new)
        entry = await r.kv.get(f"w.{new.id}")
        assert json.loads(entry.value or b"") == {"v": 1, DOCUMENT: new.model_dump(mode="json")}
        # bare, as the previous release stored it
        await r.kv.put(f"w.{old.id}", old.model_dump_json().encode())
        assert await r.workloads.get(old.id) == old and await r.workloads.get(new.id) == new
        assert {w.id for w in await r.workloads.list()} == {old.id, new.id}
        async with watching(r.workloads) as watch:
            assert by_id(watch) == {old.id: old, new.id: new} and watch.rejected == 0
            # a record moved on is written in the envelope, whatever form it was read in
            ended = old.model_copy(update={"state": "exited", "exit_code": 0})
            await r.workloads.record(ended)
            await until(lambda: by_id(watch)[old.id].state == "exited", "the update")
        entry = await r.kv.get(f"w.{old.id}")
        assert json.loads(entry.value or b"")["v"] == 1


async def test_a_record_under_another_ids_key_is_rejected(nats_server: NatsServer) -> None:
    async with registry(nats_server.url) as r:
        kept, misplaced = record(), record()
        await r.workloads.record(kept)
        async with watching(r.workloads) as watch:
            other = new_workload_id()
            await r.kv.put(f"w.{other}", encode_model(DOCUMENT, misplaced))
            await until(lambda: watch.rejected == 1, "the misplaced record counted")
            assert by_id(watch) == {kept.id: kept}


async def test_an_older_revision_never_replaces_a_newer_one(nats_server: NatsServer) -> None:
    """What a redelivery would do (the ordered consumer makes it rare): the message of an
    older revision of the key, handed to the watch after the newer one, changes nothing."""
    async with registry(nats_server.url) as r:
        older = record()
        old_revision = await r.kv.put(f"w.{older.id}", encode_model(DOCUMENT, older))
        async with watching(r.workloads) as watch:
            newer = older.model_copy(update={"state": "exited", "exit_code": 0})
            await r.workloads.record(newer)
            await until(lambda: by_id(watch)[older.id].state == "exited", "the newer one")

            def replayed(revision: int, data: bytes, headers: dict[str, str] | None) -> Msg:
                reply = f"$JS.ACK.KV_{r.bucket}.replay.1.{revision}.1.{time.time_ns()}.0"
                return Msg(r.conn, f"$KV.{r.bucket}.w.{older.id}", reply, data, headers)

            watch._apply(replayed(old_revision, encode_model(DOCUMENT, older), None))
            watch._apply(replayed(old_revision, b"", {"KV-Operation": "DEL"}))
            assert by_id(watch) == {newer.id: newer} and watch.rejected == 0
