"""berth.nats.cluster: three real nats-servers, JetStream clustered, one killed under writes."""

from __future__ import annotations

import asyncio
import contextlib
import stat
from collections.abc import Callable
from pathlib import Path

import nats
import pytest
from nats.js.api import KeyValueConfig

from berth.errors import Invalid, Unavailable
from berth.nats.cluster import SYNC_INTERVAL, NatsCluster
from berth.pki import CertificateAuthority, write_pair
from berth.store.nats import NatsStore
from berth.testing.nats import client
from berth.testing.store_contract import sample_state


def test_cluster_sizes_are_bounded() -> None:
    for size in (0, 8, True, "3"):
        with pytest.raises(Invalid) as error:
            NatsCluster(size)  # type: ignore[arg-type]
        assert error.value.field == "nats_servers"


def test_configuration_routes_to_every_other_server_and_keeps_its_secret(tmp_path: Path) -> None:
    with NatsCluster(3, base_dir=tmp_path) as cluster:
        for index in range(3):
            config = tmp_path / cluster.server_name(index) / "cluster.conf"
            assert stat.S_IMODE(config.stat().st_mode) == 0o600
            text = config.read_text()
            assert f'server_name: "{cluster.server_name(index)}"' in text
            assert f'sync_interval: "{SYNC_INTERVAL}"' in text
            assert text.count("nats-route://") == 2
            assert f":{cluster.cluster_ports[index]}@" not in text  # never a route to itself
        assert len(cluster.url.split(",")) == 3


async def _writes(url: str, bucket: str, count: int, killed: asyncio.Event | None) -> list[int]:
    connection = await nats.connect(
        url.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.1
    )
    try:
        js = connection.jetstream(timeout=5)
        kv = await js.create_key_value(KeyValueConfig(bucket=bucket, replicas=3, history=1))
        revisions = []
        for i in range(count):
            if killed is not None and i == count // 2:
                killed.set()
                await asyncio.sleep(0.2)
            errors: list[str] = []
            for _ in range(100):  # a write during the failover is retried until acked
                try:
                    revisions.append(await kv.put(f"k{i}", str(i).encode()))
                    break
                except Exception as error:
                    errors.append(f"{type(error).__name__}: {error}")
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"write {i} never acknowledged: {errors[:3]} {errors[-3:]}")
        return revisions
    finally:
        await connection.close()


async def _read_all(url: str, bucket: str, count: int, timeout_s: float = 20.0) -> dict[str, bytes]:
    """Every key, read once the stream has a leader among the servers that run (an election
    after a server's loss takes a few seconds)."""
    connection = await nats.connect(url.split(","), max_reconnect_attempts=-1)
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        while True:
            try:
                kv = await connection.jetstream(timeout=2).key_value(bucket)
                return {f"k{i}": (await kv.get(f"k{i}")).value or b"" for i in range(count)}
            except Exception:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.2)
    finally:
        await connection.close()


@pytest.mark.slow
def test_an_r3_bucket_keeps_every_acknowledged_write_through_the_loss_of_a_server(
    tmp_path: Path,
) -> None:
    with NatsCluster(3, base_dir=tmp_path) as cluster:
        killed = asyncio.Event()

        async def scenario() -> list[int]:
            async def killer() -> None:
                await killed.wait()
                await asyncio.to_thread(cluster.kill, 0)  # the first URL clients try

            writes = asyncio.create_task(_writes(cluster.url, "r3", 40, killed))
            await killer()
            return await writes

        revisions = asyncio.run(scenario())
        assert len(revisions) == 40
        survivors = ",".join(cluster.urls[1:])
        assert asyncio.run(_read_all(survivors, "r3", 40)) == {
            f"k{i}": str(i).encode() for i in range(40)
        }
        cluster.restart(0)  # it rejoins and catches up from the other two …
        cluster.wait_ready()
        expected = {f"k{i}": str(i).encode() for i in range(40)}
        assert asyncio.run(_read_all(cluster.url, "r3", 40)) == expected
        cluster.kill(1)  # … so that with one of them gone it holds a majority's copy
        assert asyncio.run(_read_all(f"{cluster.urls[0]},{cluster.urls[2]}", "r3", 40)) == expected


@pytest.mark.slow
def test_routes_with_mutual_tls_form_a_cluster(tmp_path: Path) -> None:
    authority = CertificateAuthority.load_or_create(tmp_path / "pki")
    routes = write_pair(
        tmp_path / "pki", "route", authority.issue("route", names=("127.0.0.1",), server=True)
    )
    with NatsCluster(3, base_dir=tmp_path / "c", route_tls=routes) as cluster:
        text = (tmp_path / "c" / cluster.server_name(0) / "cluster.conf").read_text()
        assert "verify: true" in text and "authorization" not in text
        assert asyncio.run(_writes(cluster.url, "tls_r3", 3, None)) == [1, 2, 3]


@pytest.mark.slow
def test_the_single_server_configuration_is_included_on_every_server(tmp_path: Path) -> None:
    from berth.nats.auth import generate

    auth = generate(["node-1"])
    paths = auth.write(tmp_path / "auth")
    probe = {"user": auth.scheduler.user, "password": auth.scheduler.password}
    probe["inbox_prefix"] = auth.scheduler.inbox_prefix
    with NatsCluster(
        3, base_dir=tmp_path / "c", config_file=paths["server"], probe_options=probe
    ) as c:

        async def as_node_then_anonymous() -> tuple[bool, str]:
            node = auth.nodes["node-1"]
            assert node.seed is not None  # a node is an nkey user
            connection = await nats.connect(
                c.urls, nkeys_seed_str=node.seed, inbox_prefix=node.inbox_prefix
            )
            ok = connection.is_connected
            await connection.close()
            try:
                other = await nats.connect(c.urls, allow_reconnect=False, max_reconnect_attempts=0)
            except Exception as error:
                return ok, str(error)
            await other.close()
            return ok, "connected"

        connected, anonymous = asyncio.run(as_node_then_anonymous())
    assert connected
    assert anonymous != "connected"


@pytest.mark.slow
def test_berths_buckets_and_streams_are_r3_on_a_cluster_and_r1_on_one_server(
    tmp_path: Path,
) -> None:
    """``berth.nats.streams.stream_replicas``: a client of a three-server cluster — given
    every URL, or only one (the others announced by the server) — creates R3 buckets and
    streams; a client of one server, R1."""
    from berth.events.nats import NatsEvents
    from berth.nats.connection import connect
    from berth.nats.streams import stream_replicas
    from berth.registry.nats import NatsWorkloads
    from berth.registry.nats_routes import NatsRoutes
    from berth.store.nats import NatsStore
    from berth.testing.nats import NatsServer

    async def replicas_made(url: str, suffix: str) -> tuple[int, list[int]]:
        client = await connect(url, name="berth-test-replicas")
        try:
            known = stream_replicas(client)
            js = client.jetstream()
            await NatsStore(client, bucket=f"nodes_{suffix}").start()
            await NatsRoutes(client, bucket=f"routes_{suffix}").start()
            await NatsWorkloads(client, bucket=f"api_{suffix}").start()
            events = await NatsEvents(client).start()
            streams = [f"KV_nodes_{suffix}", f"KV_routes_{suffix}", f"KV_api_{suffix}"]
            made = [(await js.stream_info(name)).config.num_replicas or 1 for name in streams]
            made.append((await js.stream_info(events.stream)).config.num_replicas or 1)
            return known, made
        finally:
            await client.close()

    with NatsCluster(3, base_dir=tmp_path / "cluster") as cluster:
        assert asyncio.run(replicas_made(cluster.url, "all")) == (3, [3, 3, 3, 3])
        known, _ = asyncio.run(replicas_made(cluster.urls[1], "one"))
        assert known == 3  # its peers were announced to it
    with NatsServer(store_dir=tmp_path / "single") as server:
        assert asyncio.run(replicas_made(server.url, "single")) == (1, [1, 1, 1, 1])


def test_a_replica_keeps_its_nodes_while_the_node_buckets_leader_is_elected(
    tmp_path: Path,
) -> None:
    """Readers age their replicas themselves (berth.store.nats): while the server leading the
    nodes bucket is dead and its successor not yet elected (4-9 s), no node can publish —
    and none is dropped; once the stream answers again, a node that stays silent is."""
    ttl_s = 1.5
    with NatsCluster(3, base_dir=tmp_path) as cluster:

        async def scenario() -> None:
            async with (
                client(cluster.url) as writer_nc,
                client(cluster.url) as reader_nc,
                NatsStore(writer_nc, bucket="nodes", ttl_s=ttl_s, watch=False) as writer,
                NatsStore(reader_nc, bucket="nodes", ttl_s=ttl_s) as reader,
            ):
                silent: set[str] = set()
                beats = {"a": 0, "b": 0}

                async def beat() -> None:
                    while True:
                        for node in beats.keys() - silent:
                            beats[node] += 1
                            with contextlib.suppress(Unavailable):
                                await writer.publish(sample_state(node, beats[node]))
                        await asyncio.sleep(0.3)

                dropped: list[str] = []
                reader.subscribe(lambda e: dropped.append(e.node) if e.kind == "delete" else None)
                beater = asyncio.create_task(beat())
                try:
                    await _until(lambda: set(reader._replica) == {"a", "b"}, 10)
                    info = await writer_nc.jetstream().stream_info("KV_nodes")
                    assert info.cluster is not None and info.cluster.leader is not None
                    names = [cluster.server_name(i) for i in range(3)]
                    killed_at = asyncio.get_running_loop().time()
                    await asyncio.to_thread(cluster.kill, names.index(info.cluster.leader))
                    before = reader._replica["a"].generation
                    # the new leader takes snapshots again (the nodes publish through it)
                    await _until(lambda: reader._replica["a"].generation > before + 2, 20)
                    elected_s = asyncio.get_running_loop().time() - killed_at
                    print(f"snapshots stored again {elected_s:.1f}s after the kill")
                    assert dropped == [], f"dropped while no node could publish: {dropped}"
                    silent.add("b")
                    await _until(lambda: "b" not in reader._replica, ttl_s + 2)
                    assert "a" in reader._replica and dropped == ["b"]
                finally:
                    beater.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await beater

        asyncio.run(scenario())


async def _until(predicate: Callable[[], bool], limit_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"not within {limit_s:g}s"
        await asyncio.sleep(0.05)
