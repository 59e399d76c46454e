"""Replica spreading across several NATS schedulers: the route registry feeds every
scheduler's replica index.

* the route record carries its function (optional version-1 fields; malformed ones refused);
* :class:`RouteReplicas` keys replicas by node and reservation, so a scheduler's own
  placement coming back through the watch is the same replica, and deletes end it;
* on a real ``nats-server`` with several scheduler services, each one counts the replicas
  the others placed, a hard per-node spread holds across them for requests that do not race,
  releases and a departed node decrement, and malformed peer routes are logged and ignored;
* a hard per-node spread that raced gives the node up (its route removed even when the
  node's release times out) and places again;
* the harness of ``benchmarks/spread_nats.py`` runs, and sharing removes the violations that
  schedulers counting only their own replicas make.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from functools import partial
from types import ModuleType

import pytest

from berth.boot import AdmitOrder
from berth.errors import Invalid, NoCapacity, Unavailable
from berth.model import Placement, Request, Spec, Spread
from berth.nats.connection import connect
from berth.nats.wire import MalformedMessage
from berth.registry.nats_routes import NatsRoutes, decode_route, encode_route
from berth.registry.port import Route, RouteEvent
from berth.scheduler.nats_server import RouteReplicas
from berth.scheduler.spread import Replicas
from berth.testing.clock import FakeClock
from berth.testing.nats import NatsServer, unique_name
from berth.units import MiB
from tests.helpers import load_benchmark

SMALL = Spec(vcpus=0.01, mem=16 * MiB, disk=16 * MiB)
HARD = Spread(hard=True)
FN = ("t", "fn")


def _harness() -> ModuleType:
    return load_benchmark("spread_nats")


# -- the route record --------------------------------------------------------------------------
def test_a_route_carries_its_function_and_older_routes_still_read() -> None:
    route = Route("t/fn/0", "node-1", "r1", SMALL, 12.5, "t", "fn")
    decoded = decode_route(encode_route(route), source="test")
    assert decoded == route and decoded.function == FN
    older = json.dumps({"v": 1, "workload": "t/fn/0", "node": "node-1", "reservation_id": "r1"})
    route = decode_route(older.encode(), source="test")
    assert route.function is None and route.reservation_id == "r1"


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"namespace": "t"}, "name", "both or neither"),
        ({"name": "fn"}, "namespace", "both or neither"),
        ({"namespace": "t", "name": "a b"}, "name", "whitespace"),
        ({"namespace": 7, "name": "fn"}, "namespace", "string"),
    ],
)
def test_a_malformed_function_is_a_malformed_route(
    extra: dict[str, object], field: str, message: str
) -> None:
    document = {"v": 1, "workload": "t/fn/0", "node": "node-1", "reservation_id": "r1", **extra}
    with pytest.raises(MalformedMessage, match=message) as caught:
        decode_route(json.dumps(document).encode(), source="test")
    assert caught.value.field == field


# -- the feed, without a network ---------------------------------------------------------------
def _put(
    workload: str,
    node: str,
    reservation: str | None,
    function: tuple[str, str] | None = FN,
    revision: int = 0,
) -> RouteEvent:
    namespace, name = (None, None) if function is None else function
    route = Route(workload, node, reservation, SMALL, 0.0, namespace, name)
    return RouteEvent("put", NatsRoutes.key(workload, node), route, revision)


def _delete(workload: str, node: str) -> RouteEvent:
    return RouteEvent("delete", NatsRoutes.key(workload, node))


def test_the_feed_counts_peer_routes_and_ends_them_on_delete() -> None:
    replicas = Replicas()
    feed = RouteReplicas(replicas)
    feed(_put("t/fn/0", "a", "r1"))
    feed(_put("t/fn/1", "b", "r2"))
    feed(_put("t/fn/1", "b", "r2"))  # delivered twice (a consumer reset): still one
    assert replicas.where(FN) == {"a": 1, "b": 1} and len(feed) == 2
    feed(_delete("t/fn/0", "a"))
    feed(_delete("t/fn/0", "a"))
    feed(_delete("t/other/0", "a"))  # never counted
    assert replicas.where(FN) == {"b": 1}
    # the same workload placed again on the same node: the old reservation ends
    feed(_put("t/fn/1", "b", "r3"))
    assert replicas.where(FN) == {"b": 1}
    feed(_delete("t/fn/1", "b"))
    assert replicas.where(FN) == {} and len(replicas) == 0


def test_the_feed_does_not_count_a_schedulers_own_replica_twice() -> None:
    clock = FakeClock(0.0)
    replicas = Replicas(lease_ttl_s=30.0, clock=clock)
    feed = RouteReplicas(replicas)
    token = replicas.hold(FN, "a")  # this scheduler is asking node a
    assert replicas.where(FN) == {"a": 1}
    replicas.confirm(token, "r1")
    feed(_put("t/fn/0", "a", "r1"))  # its own route comes back through the watch
    assert replicas.where(FN) == {"a": 1}
    clock.now = 60.0  # bound by its route: it outlives the unbound lease's time to live
    assert replicas.where(FN) == {"a": 1}
    replicas.ended("a", "r1")  # released by this scheduler; then the route's delete arrives
    feed(_delete("t/fn/0", "a"))
    assert replicas.where(FN) == {} and len(replicas) == 0


def test_the_feed_skips_routes_it_cannot_count_and_forgets_a_departed_node() -> None:
    replicas = Replicas()
    feed = RouteReplicas(replicas)
    feed(_put("t/fn/0", "a", "r1", function=None))  # written by an older scheduler
    feed(_put("t/fn/1", "a", None))  # no reservation: holds nothing
    assert replicas.where(FN) == {} and len(feed) == 0
    feed(_put("t/fn/2", "a", "r2"))
    feed(_put("t/fn/3", "b", "r3"))
    replicas.drop_node("a")  # what the scheduler does when the node leaves
    feed.drop_node("a")
    assert replicas.where(FN) == {"b": 1} and len(feed) == 1
    feed(_delete("t/fn/2", "a"))  # the purge was not seen; a late delete is harmless
    assert replicas.where(FN) == {"b": 1}


def test_the_feed_names_the_siblings_stored_before_a_revision() -> None:
    feed = RouteReplicas(Replicas())
    feed(_put("t/fn/0", "a", "r1", revision=3))
    feed(_put("t/fn/1", "a", "r2", revision=5))
    feed(_put("t/other/0", "a", "r3", function=("t", "other"), revision=1))
    feed(_put("t/fn/2", "b", "r4", revision=2))
    assert [r.workload for r in feed.earlier("a", FN, 5, "r2")] == ["t/fn/0"]
    assert feed.earlier("a", FN, 3, "r1") == []  # the first stays
    assert sorted(r.workload for r in feed.earlier("a", FN, 9, "r9")) == ["t/fn/0", "t/fn/1"]
    feed(_delete("t/fn/0", "a"))
    assert feed.earlier("a", FN, 5, "r2") == []


# -- on a real nats-server ---------------------------------------------------------------------
async def _eventually(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "did not happen in time"
        await asyncio.sleep(0.01)


def test_every_scheduler_counts_every_replica_and_a_hard_spread_holds_across_them(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    harness = _harness()

    async def scenario() -> None:
        async with harness.spread_cluster(
            nats_server.url, nodes=3, schedulers=3, mode="watch"
        ) as cluster:
            services = cluster.services

            def everyone_counts(expected: dict[str, int]) -> bool:
                return all(s.scheduler.replicas.where(FN) == expected for s in services)

            placements: list[Placement] = []
            for replica in range(3):
                request = Request(
                    namespace="t", name="fn", replica=replica, spec=SMALL, spread=HARD
                )
                placements.append(await cluster.caller.schedule(request))
                expected = {p.worker_node: 1 for p in placements}
                await _eventually(partial(everyone_counts, expected))
            assert len({p.worker_node for p in placements}) == 3
            # every scheduler knows all three nodes are taken, whichever gets the request
            for replica in range(3, 6):
                request = Request(
                    namespace="t", name="fn", replica=replica, spec=SMALL, spread=HARD
                )
                with pytest.raises(NoCapacity, match="spread") as caught:
                    await cluster.caller.schedule(request)
                assert set(caught.value.reasons.values()) == {"spread"}
            for service in services:
                explanation = service.scheduler.explain(
                    Request(namespace="t", name="fn", replica=9, spec=SMALL, spread=HARD)
                )
                assert {v.verdict for v in explanation.verdicts} == {"spread"}
            # a release through any scheduler ends the replica in every one
            await cluster.caller.release(placements[0], workload="t/fn/0")
            freed = placements[0].worker_node
            await _eventually(lambda: everyone_counts({p.worker_node: 1 for p in placements[1:]}))
            again = await cluster.caller.schedule(
                Request(namespace="t", name="fn", replica=0, spec=SMALL, spread=HARD)
            )
            assert again.worker_node == freed

            # malformed peer data in the routes bucket: logged, ignored, nothing changes
            routes = services[0].routes
            assert routes is not None
            bucket = routes._bucket()
            before = [s.scheduler.replicas.where(FN) for s in services]
            with caplog.at_level(logging.WARNING, logger="berth.registry.routes"):
                await bucket.put("x.y", b"not json")
                bad = {
                    "v": 1,
                    "workload": "t/fn/7",
                    "node": freed,
                    "reservation_id": "r",
                    "namespace": "t",
                    "name": "a b",
                }
                await bucket.put(NatsRoutes.key("t/fn/7", freed), json.dumps(bad).encode())
                elsewhere = encode_route(Route("t/fn/8", freed, "r8", None, 0.0, "t", "fn"))
                await bucket.put("other.key", elsewhere)  # a route under another's key
                await bucket.put("late", encode_route(Route("late", freed, "r9", None, 0.0)))
                await _eventually(
                    lambda: all(
                        s._route_watch is not None and s._route_watch.rejected >= 4
                        for s in services
                    )
                )
            assert [s.scheduler.replicas.where(FN) for s in services] == before
            assert "not JSON" in caplog.text and "whitespace" in caplog.text
            assert "belongs under another key" in caplog.text

    asyncio.run(scenario())


def test_a_release_with_a_malformed_workload_is_invalid_and_releases_nothing(
    nats_server: NatsServer,
) -> None:
    harness = _harness()

    async def scenario() -> None:
        async with harness.spread_cluster(nats_server.url, nodes=1, schedulers=1) as cluster:
            request = Request(namespace="t", name="fn", replica=0, spec=SMALL)
            placement = await cluster.caller.schedule(request)
            node = cluster.nodes[placement.worker_node]
            assert node.agent.budget.holds(placement.reservation_id)
            body = {"placement": placement.model_dump(mode="json"), "workload": 5}
            with pytest.raises(Invalid) as caught:
                await cluster.caller._call("release", body)
            assert caught.value.field == "workload"
            assert node.agent.budget.holds(placement.reservation_id)  # nothing released
            assert cluster.services[0].rejected == 1

    asyncio.run(scenario())


def test_a_raced_node_is_given_up_lease_and_route_even_when_its_release_times_out(
    nats_server: NatsServer,
) -> None:
    """The hard-spread settle: a sibling's route stored on the chosen node between ranking
    and recording makes the service give the node up — its route removed even though the
    node's release times out (the unbound lease expires by itself) — and place again."""
    harness = _harness()

    async def scenario() -> None:
        async with harness.spread_cluster(nats_server.url, nodes=2, schedulers=1) as cluster:
            service = cluster.services[0]
            routes, scheduler = service.routes, service.scheduler
            assert routes is not None
            place, release = scheduler.schedule, scheduler.nodes.release
            raced: list[Placement] = []

            async def racing(request: Request) -> Placement:
                placement: Placement = await place(request)
                if not raced:  # another scheduler's sibling lands first, on the same node
                    raced.append(placement)
                    node = cluster.nodes[placement.worker_node].agent
                    sibling = node.admit(AdmitOrder(SMALL, 30.0)).reservation_id
                    first = Placement(worker_node=placement.worker_node, reservation_id=sibling)
                    await routes.record("t/fn/1", first, SMALL, function=FN)
                return placement

            async def silent(node: str, reservation_id: str) -> bool:
                # meanwhile a retry of the caller's placed it there through another scheduler:
                # giving up removes only the route this service stored, not that one
                retried = cluster.nodes[node].agent.admit(AdmitOrder(SMALL, 30.0)).reservation_id
                again = Placement(worker_node=node, reservation_id=retried)
                await routes.record("t/fn/0", again, SMALL, function=FN)
                raise Unavailable(f"node {node!r} did not answer release (outcome unknown)")

            scheduler.schedule = racing
            scheduler.nodes.release = silent
            try:
                request = Request(namespace="t", name="fn", replica=0, spec=SMALL, spread=HARD)
                placement = await cluster.caller.schedule(request)
            finally:
                scheduler.schedule = place
                scheduler.nodes.release = release
            assert service.yielded == 1
            assert placement.worker_node != raced[0].worker_node
            route = await routes.whereis("t/fn/0")
            assert route is not None and route.node == placement.worker_node
            left = {r.workload: r.reservation_id for r in await routes.list(raced[0].worker_node)}
            assert set(left) == {"t/fn/0", "t/fn/1"}
            assert left["t/fn/0"] not in (None, raced[0].reservation_id)

    asyncio.run(scenario())


def test_a_stale_read_removes_only_the_route_it_read(nats_server: NatsServer) -> None:
    """A node drops the routes of reservations it no longer holds from a read of its routes:
    a route stored again under the same key since that read (the workload placed anew) stays."""

    async def scenario() -> None:
        client = await connect(nats_server.url, name="routes-test")
        try:
            routes = await NatsRoutes(client, bucket=unique_name("routes")).start()
            old = Placement(worker_node="n1", reservation_id="r1")
            await routes.record("t/fn/0", old, SMALL, function=FN)
            [(revision, read)] = await routes.on_node("n1")
            assert read.reservation_id == "r1"
            new = Placement(worker_node="n1", reservation_id="r2")
            await routes.record("t/fn/0", new, SMALL, function=FN)  # placed anew since
            await routes.remove("t/fn/0", "n1", revision=revision)  # the stale read's
            route = await routes.whereis("t/fn/0")
            assert route is not None and route.reservation_id == "r2"
            [(current, _)] = await routes.on_node("n1")
            await routes.remove("t/fn/0", "n1", revision=current)
            assert await routes.whereis("t/fn/0") is None
        finally:
            await client.close()

    asyncio.run(scenario())


def test_a_departed_node_leaves_every_schedulers_count(nats_server: NatsServer) -> None:
    harness = _harness()

    async def scenario() -> None:
        async with harness.spread_cluster(nats_server.url, nodes=3, schedulers=2) as cluster:

            def everyone_counts(n: int) -> bool:
                return all(
                    sum(s.scheduler.replicas.where(FN).values()) == n for s in cluster.services
                )

            placements = []
            for replica in range(3):
                request = Request(
                    namespace="t", name="fn", replica=replica, spec=SMALL, spread=HARD
                )
                placements.append(await cluster.caller.schedule(request))
                await _eventually(partial(everyone_counts, replica + 1))
            victim = placements[0].worker_node
            node = cluster.nodes[victim]
            await node.stop()
            await _eventually(
                lambda: all(victim not in s.scheduler.replicas.where(FN) for s in cluster.services)
            )
            for service in cluster.services:
                assert service.shared is not None
                assert all(route.node != victim for _, route in service.shared._keys.values())

    asyncio.run(scenario())


def test_sharing_and_settling_remove_the_violations_of_schedulers_counting_their_own(
    nats_server: NatsServer,
) -> None:
    """Four schedulers, four nodes, four replicas at once per trial.  Counting only their own
    replicas, schedulers put siblings together (the queue group spreads the requests over
    them); fed by the registry they do not when requests are paced far enough apart for
    routes to land in between (200 ms, on a loaded machine); settling the race, they do not
    even when the requests arrive together."""
    harness = _harness()

    async def scenario() -> None:
        own = await harness.measure(
            nats_server.url, nodes=4, schedulers=4, mode="own", gaps_s=[0.0], trials=4
        )
        assert own[0].violations > 0
        watch = await harness.measure(
            nats_server.url, nodes=4, schedulers=4, mode="watch", gaps_s=[0.2], trials=2
        )
        assert (watch[0].placed, watch[0].violations, watch[0].refused) == (8, 0, 0)
        settle = await harness.measure(
            nats_server.url, nodes=4, schedulers=4, mode="settle", gaps_s=[0.0], trials=6
        )
        assert (settle[0].placed, settle[0].violations, settle[0].refused) == (24, 0, 0)

    asyncio.run(scenario())
