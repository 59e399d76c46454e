"""Authentication as ``berth up`` sets it up, on a real nats-server: every party is its own
user; a node cannot overwrite another node's state, delete it, or answer for it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import pytest
from nats.aio.msg import Msg

from berth.boot import AdmitOrder
from berth.embedded import embedded_configs
from berth.errors import Invalid, Unavailable
from berth.model import Request, Spec
from berth.nats.auth import ClusterAuth, generate
from berth.nats.connection import Credentials, connect
from berth.nodeclient.nats import NatsNodes
from berth.ownership import Refused
from berth.registry.nats_routes import NatsRoutes
from berth.store.nats import encode_state
from berth.testing.cluster import nats_cluster
from berth.testing.nats import NatsServer, client
from berth.testing.store_contract import sample_state
from berth.units import MiB

SMALL = Spec(vcpus=0.01, mem=16 * MiB, disk=16 * MiB)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsServer, ClusterAuth]]:
    directory: Path = tmp_path_factory.mktemp("auth")
    auth = generate(["node-00", "node-01"])
    paths = auth.write(directory)
    with NatsServer(config_file=paths["server"]) as server:
        yield server, auth


def test_without_credentials_nothing_connects(secured: tuple[NatsServer, ClusterAuth]) -> None:
    server, auth = secured

    async def scenario() -> None:
        with pytest.raises(Unavailable, match="cannot connect"):
            await connect(server.url, first_connect_timeout_s=1.0)
        wrong = Credentials(auth.client.user, "not-the-password")
        with pytest.raises(Unavailable, match="cannot connect"):
            await connect(server.url, credentials=wrong, first_connect_timeout_s=1.0)

    asyncio.run(scenario())


def test_nodes_are_nkey_users_and_the_servers_file_holds_no_node_secret(
    secured: tuple[NatsServer, ClusterAuth], tmp_path: Path
) -> None:
    server, auth = secured
    node = auth.nodes["node-00"]
    assert node.seed is not None and node.password is None
    assert node.public_key is not None and node.public_key.startswith("U")
    config = auth.server_config()
    assert f'nkey: "{node.public_key}"' in config and node.seed not in config
    path = auth.write(tmp_path / "again")["node-node-00"]
    assert Credentials.load(path) == node  # the seed is in the node's own file only

    async def scenario() -> None:
        connection = await connect(server.url, credentials=node, first_connect_timeout_s=2.0)
        await connection.close()
        impostor = Credentials.nkey(node.user)  # the same name, another key: refused
        with pytest.raises(Unavailable, match="cannot connect"):
            await connect(server.url, credentials=impostor, first_connect_timeout_s=1.0)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('["user"]', "not a JSON object"),
        ('{"user": "u"}', "a password or an nkey seed"),
        ('{"user": "u", "password": "p", "seed": "s"}', "a password or an nkey seed"),
        ('{"user": "u", "seed": "SUnotaseed"}', "not an nkey user seed"),
    ],
)
def test_a_bad_credentials_file_is_refused_naming_the_flag(
    text: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.creds.json"
    path.write_text(text)
    with pytest.raises(Invalid, match=message) as refused:
        Credentials.load(path)
    assert refused.value.field == "--creds"


def test_a_node_cannot_speak_for_another(secured: tuple[NatsServer, ClusterAuth]) -> None:
    server, auth = secured
    configs = embedded_configs(2, runtime="fake", heartbeat_s=1.0)

    async def scenario() -> None:
        async with nats_cluster(server.url, configs, auth=auth) as running:
            placement = await running.scheduler.schedule(
                Request(namespace="t", name="fn", spec=SMALL)
            )
            route = await running.routes.whereis("t/fn/0")
            assert route is not None and route.node == placement.worker_node
            victim_state = running.scheduler_services[0].scheduler.states()["node-00"]
            async with client(server.url, credentials=auth.nodes["node-01"]) as intruder:
                js = intruder.jetstream()
                forged = sample_state("node-00", victim_state.generation + 100, mem_free=1)
                for attempt in (
                    js.publish("$KV.berth_nodes.node-00", encode_state(forged), timeout=0.5),
                    js.publish(
                        "$KV.berth_nodes.node-00", headers={"KV-Operation": "DEL"}, timeout=0.5
                    ),
                ):
                    with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
                        await attempt
                heard: list[Msg] = []

                async def answer(msg: Msg) -> None:
                    heard.append(msg)
                    await msg.respond(b'{"v":1,"ok":{"reservation_id":"fake","seq":1}}')

                await intruder.subscribe("berth.node.node-00.*", cb=answer)
                await intruder.flush()
                huge = Spec(vcpus=0.01, mem=64 * 2**30, disk=1)
                as_scheduler = running.scheduler_services[0].scheduler.nodes
                with pytest.raises(Refused) as caught:  # the real node-00 answers
                    await as_scheduler.admit("node-00", AdmitOrder(huge, 5))
                assert caught.value.node == "node-00"
                await asyncio.sleep(0.3)
                assert heard == []
                as_client = NatsNodes(running.client, timeout_s=0.3, admit_attempts=1)
                with pytest.raises(Unavailable):  # and a client may not admit at all
                    await as_client.admit("node-00", AdmitOrder(SMALL, 5))
            await asyncio.sleep(1.2)  # a heartbeat later: node-00 is itself, unforged
            for service in running.scheduler_services:
                state = service.scheduler.states()["node-00"]
                assert state.mem_free > 1 and state.generation < forged.generation

    asyncio.run(scenario())


def test_a_nodes_rollup_cannot_purge_the_other_nodes_keys(
    secured: tuple[NatsServer, ClusterAuth],
) -> None:
    """Finding 2 of the security review: a message on a node's own key with ``Nats-Rollup:
    all`` would purge every key of the bucket.  The scheduler closes both buckets nodes write
    to rollups — the node-states bucket too, whose expiry markers kept them on (issue 36)."""
    server, auth = secured
    configs = embedded_configs(2, runtime="fake", heartbeat_s=1.0)

    async def scenario() -> None:
        async with nats_cluster(server.url, configs, auth=auth) as running:
            placed = [
                await running.scheduler.schedule(Request(namespace="r", name=f"fn{i}", spec=SMALL))
                for i in range(6)
            ]
            before = len(await running.routes.list())
            assert before == len(placed)
            async with client(server.url, credentials=auth.nodes["node-01"]) as intruder:
                js = intruder.jetstream()
                rollup = {"KV-Operation": "DEL", "Nats-Rollup": "all"}
                with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
                    await js.publish("$KV.berth_routes.node-01.x", headers=rollup, timeout=1.0)
                with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
                    await js.publish("$KV.berth_nodes.node-01", headers=rollup, timeout=1.0)
            assert len(await running.routes.list()) == before  # nobody's routes went
            # nobody's snapshot went: the other node is still in the bucket itself, not only
            # in a replica its next heartbeat would have refilled
            async with client(server.url, credentials=auth.scheduler) as admin:
                nodes = await admin.jetstream().key_value("berth_nodes")
                assert {"node-00", "node-01"} <= set(await nodes.keys())
            states = running.scheduler_services[0].scheduler.states
            assert {"node-00", "node-01"} <= set(states())

    asyncio.run(scenario())


@pytest.mark.slow  # four refused requests, each waiting out the JetStream API's 5 s
def test_a_node_reads_its_own_routes_and_no_other_nodes(
    secured: tuple[NatsServer, ClusterAuth],
) -> None:
    """Finding 5 of the security review: a node's grant let it read every node's routes.  Its
    reads are now consumers filtered to its own keys; any other filter is refused."""
    server, auth = secured
    configs = embedded_configs(2, runtime="fake", heartbeat_s=1.0)

    async def scenario() -> None:
        async with nats_cluster(server.url, configs, auth=auth) as running:
            for i in range(6):  # half of them asked of node-00 last: they go to node-01
                avoid = ("node-00",) if i % 2 else ()
                request = Request(namespace="o", name=f"fn{i}", spec=SMALL, avoid_nodes=avoid)
                await running.scheduler.schedule(request)
            everyone = await running.routes.list()
            own = sorted(route.workload for route in everyone if route.node == "node-00")
            others = [route for route in everyone if route.node != "node-00"]
            assert own and others, everyone  # both nodes hold some
            async with client(server.url, credentials=auth.nodes["node-00"]) as node:
                routes = await NatsRoutes(node).start()
                assert sorted(r.workload for _, r in await routes.on_node("node-00")) == own
                with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
                    await routes.on_node("node-01")
                with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
                    await routes.list()  # every node's
                with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
                    await routes._bucket().get(NatsRoutes.key(others[0].workload, "node-01"))
                with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
                    await routes._bucket().watch(">")  # a KV watch: an unnamed consumer

    asyncio.run(scenario())
