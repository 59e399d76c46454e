"""The conformance suite of the registry ports, shipped for every driver.

Subclass :class:`RegistryContract` next to a driver's tests and implement
:meth:`~RegistryContract.open_registries` (fresh, empty registries of the driver: a
:class:`Registries`); pytest collects the inherited tests.  They state what
:mod:`berth.registry.port` promises — a workload's end recorded once and never over a change
written meanwhile, a transition only from the states it expects, one winner among concurrent
claims of an identity, a takeover only from a holder that no longer holds it, a release only
by the holder; one winner among concurrent claims of an idempotency key, a takeover only of a
claim judged replaceable, a holder's renewal and a takeover never both holding, old claims
expired and no others; images by name, routes by workload and node with their revisions, and a
follower that sees the routes stored, then every change, in order.  The in-process drivers
run it in ``tests/unit/test_registry.py``, the NATS drivers on a real nats-server in
``tests/nats_server/test_registry_nats.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

import pytest

from berth.model import Placement, ReschedulePolicy, RestartPolicy, Spec
from berth.registry.port import (
    Claim,
    IdentityTaken,
    Image,
    ImageLayer,
    ImageRegistry,
    KeyClaim,
    Route,
    RouteEvent,
    RouteRegistry,
    StoredWorkload,
    WorkloadRegistry,
    with_event,
)
from berth.testing.contract import run_check
from berth.units import MiB

__all__ = ["Registries", "RegistryContract", "sample_workload"]

IDENTITY = "default/hello/0"
KEY = "5f2b" * 16  # a key claim's name: the API's hash of the caller's key
SPEC = Spec(vcpus=0.5, mem=MiB, disk=MiB)
FUNCTION = ("default", "hello")


@dataclass
class Registries:
    """One driver's registries, fresh and empty (the claims are ``workloads.claims``)."""

    workloads: WorkloadRegistry
    images: ImageRegistry
    routes: RouteRegistry


def sample_workload(workload_id: str, **changes: object) -> StoredWorkload:
    """A running workload's complete record, for tests."""
    fields: dict[str, object] = {
        "id": workload_id,
        "namespace": "default",
        "name": "hello",
        "replica": 0,
        "node": "node-00",
        "node_workload_id": "hello-1",
        "colocated_bytes": 0,
        "rank": 0,
        "state": "running",
        "command": ["sleep", "60"],
        "restartable": True,
        "created_at": 1.0,
        "env": {"SECRET": "s"},
        "request": {"namespace": "default", "name": "hello", "spec": "micro"},
    }
    fields.update(changes)
    return StoredWorkload.model_validate(fields)


def _placement(node: str, reservation_id: str) -> Placement:
    return Placement(worker_node=node, reservation_id=reservation_id)


async def running(claim: Claim) -> str | None:
    return f"running ({claim.workload_id})"


async def ended(claim: Claim) -> str | None:
    return None


def _key_claim(workload_id: str, *, key: str = KEY, claimed_at: float = 1.0) -> KeyClaim:
    return KeyClaim(key=key, workload_id=workload_id, request_hash="r1", claimed_at=claimed_at)


async def never(held: KeyClaim) -> bool:
    return False


async def always(held: KeyClaim) -> bool:
    return True


class RegistryContract:
    """Base class of a registry driver's conformance tests."""

    def open_registries(self) -> AbstractAsyncContextManager[Registries]:
        """Fresh, empty registries of the driver under test."""
        raise NotImplementedError

    def _run(self, check: Callable[[Registries], Awaitable[None]]) -> None:
        run_check(self.open_registries, check)

    # -- workloads ---------------------------------------------------------------------------
    def test_a_recorded_workload_is_read_back_equal_and_listed_by_filters(self) -> None:
        async def check(registries: Registries) -> None:
            workloads = registries.workloads
            first = sample_workload("w-000000000002", created_at=1.0)
            second = sample_workload("w-000000000001", created_at=1.0, namespace="team-a")
            third = sample_workload(
                "w-000000000003", created_at=0.5, node="node-01", state="exited", exit_code=0
            )
            for workload in (first, second, third):
                await workloads.record(workload)
            assert await workloads.get(first.id) == first
            assert [w.id for w in await workloads.list()] == [third.id, second.id, first.id]
            assert [w.id for w in await workloads.list(namespace="team-a")] == [second.id]
            assert [w.id for w in await workloads.list(node="node-01")] == [third.id]
            assert [w.id for w in await workloads.list(state="running")] == [second.id, first.id]
            assert await workloads.list(namespace="team-a", node="node-01") == []
            replaced = first.model_copy(update={"replaced_by": "w-000000000009"})
            await workloads.record(replaced)
            assert await workloads.get(first.id) == replaced

        self._run(check)

    def test_unknown_and_malformed_workload_ids_are_none(self) -> None:
        async def check(registries: Registries) -> None:
            workloads = registries.workloads
            await workloads.record(sample_workload("w-000000000001"))
            assert await workloads.get("w-0000000000ff") is None
            for malformed in ("", "nope", "w-1", "w-000000000001.x", "w-00000000000G", ">"):
                assert await workloads.get(malformed) is None, malformed

        self._run(check)

    def test_a_read_record_is_a_copy(self) -> None:
        async def check(registries: Registries) -> None:
            workloads = registries.workloads
            stored = sample_workload("w-000000000001")
            await workloads.record(stored)
            stored.env["CHANGED"] = "after"
            read = await workloads.get(stored.id)
            assert read is not None and "CHANGED" not in read.env
            read.command.append("more")
            again = await workloads.get(stored.id)
            assert again is not None and again.command == ["sleep", "60"]

        self._run(check)

    def test_an_end_is_recorded_once_and_never_over_a_change_written_meanwhile(self) -> None:
        """A reader that saw a workload running and then learnt it ended must not overwrite
        what was written meanwhile (a drain's ``replaced_by``, another reader's end): the end
        is a compare-and-set on the record, and of concurrent readers exactly one records it."""

        async def check(registries: Registries) -> None:
            registry = registries.workloads
            wid = "w-000000000001"
            await registry.record(sample_workload(wid))
            outcomes = await asyncio.gather(
                *(registry.end(wid, {"state": "exited", "exit_code": code}) for code in range(6))
            )
            recorded = [ended for ended, mine in outcomes if mine]
            assert len(recorded) == 1, outcomes
            stored = await registry.get(wid)
            assert stored == recorded[0] and stored is not None and stored.state == "exited"
            # every other reader gets the record as it is, not its own view of the end
            assert all(ended == stored for ended, _ in outcomes)

            # a drain stopped and replaced another one; a reader that still thought it
            # running learns of an exit afterwards: the drain's record stands
            other = "w-000000000002"
            await registry.record(sample_workload(other))
            drained = sample_workload(other, state="stopped", replaced_by="w-000000000003")
            await registry.record(drained)
            ended, mine = await registry.end(other, {"state": "exited", "exit_code": 0})
            assert not mine and ended == drained
            assert await registry.get(other) == drained
            assert await registry.end("w-0000000000ff", {"state": "exited"}) == (None, False)

        self._run(check)

    def test_a_transition_holds_only_from_the_expected_states_and_has_one_winner(
        self,
    ) -> None:
        """``pending`` → ``running`` (the node answered), ``running`` → ``unknown`` (it did
        not) and back: each a compare-and-set from named states; of concurrent ones exactly
        one moves the record, and an ended record is moved by none (``end`` included)."""

        async def check(registries: Registries) -> None:
            registry = registries.workloads
            wid = "w-000000000001"
            await registry.record(sample_workload(wid, state="pending"))
            outcomes = await asyncio.gather(
                *(
                    registry.transition(wid, {"state": "running"}, expect=("pending",))
                    for _ in range(5)
                )
            )
            assert [mine for _, mine in outcomes].count(True) == 1, outcomes
            moved, mine = await registry.transition(
                wid, {"state": "unknown", "unknown_since": 5.0}, expect=("running",)
            )
            assert mine and moved is not None and moved.unknown_since == 5.0
            kept, mine = await registry.transition(
                wid, {"stop_requested": True, "stop_grace_s": 1.5}, expect=("unknown",)
            )
            assert mine and kept is not None and kept.stop_requested and kept.state == "unknown"
            # an unknown workload is live: its end is recorded, once
            ended, mine = await registry.end(wid, {"state": "lost", "ended_at": 9.0})
            assert mine and ended is not None and ended.state == "lost"
            assert ended.stop_requested and ended.stop_grace_s == 1.5  # nothing lost on the way
            again, mine = await registry.transition(wid, {"state": "running"}, expect=("lost",))
            assert mine  # the caller names what it expects: the registry checks only that
            stale, mine = await registry.transition(wid, {"state": "unknown"}, expect=("pending",))
            assert not mine and stale == again
            assert await registry.transition(
                "w-0000000000ff", {"state": "running"}, expect=("pending",)
            ) == (None, False)
            assert await registry.transition("nope", {}, expect=("pending",)) == (None, False)

        self._run(check)

    # -- identity claims ---------------------------------------------------------------------
    def test_policies_restarts_and_history_survive_transitions_and_the_end(self) -> None:
        """A record's restart and reschedule policies, its counts and its history are stored
        whole; a transition and an end that add to them lose nothing written before."""

        async def check(registries: Registries) -> None:
            registry = registries.workloads
            wid = "w-000000000001"
            restart = RestartPolicy(mode="on-failure", attempts=2, delay_s=0.5)
            created = with_event((), 1.0, "created", None, "node-00")
            first = sample_workload(
                wid,
                restart=restart,
                reschedule=ReschedulePolicy(attempts=1),
                reschedules=1,
                history=created,
            )
            await registry.record(first)
            assert await registry.get(wid) == first
            restarted = with_event(created, 2.0, "restarted", "restart 1", "node-00")
            update = {"restarts": 1, "history": [event.model_dump() for event in restarted]}
            moved, mine = await registry.transition(wid, update, expect=("running",))
            assert mine and moved is not None and moved.restarts == 1
            failed = with_event(restarted, 3.0, "failed", "restarts exhausted", "node-00")
            ended, mine = await registry.end(
                wid,
                {"state": "failed", "history": [event.model_dump() for event in failed]},
            )
            assert mine and ended is not None
            assert [event.event for event in ended.history] == ["created", "restarted", "failed"]
            assert (ended.restart, ended.restarts, ended.reschedules) == (restart, 1, 1)
            assert ended.reschedule == ReschedulePolicy(attempts=1)
            assert await registry.get(wid) == ended

        self._run(check)

    def test_concurrent_claims_of_one_identity_have_one_winner(self) -> None:
        async def check(registries: Registries) -> None:
            claims = registries.workloads.claims
            ids = [f"w-{i:012x}" for i in range(8)]
            outcomes = await asyncio.gather(
                *(claims.claim(IDENTITY, wid, holds=running, now=1.0) for wid in ids),
                return_exceptions=True,
            )
            won = [wid for wid, outcome in zip(ids, outcomes, strict=True) if outcome is None]
            assert len(won) == 1, outcomes
            assert await claims.holder(IDENTITY) == won[0]
            for outcome in outcomes:
                if outcome is not None:
                    assert isinstance(outcome, IdentityTaken), outcome
                    assert (outcome.identity, outcome.workload_id) == (IDENTITY, won[0])
                    assert IDENTITY in str(outcome) and won[0] in str(outcome)

        self._run(check)

    def test_a_holder_that_no_longer_runs_is_taken_over_and_release_is_the_holders(
        self,
    ) -> None:
        async def check(registries: Registries) -> None:
            claims = registries.workloads.claims
            await claims.claim(IDENTITY, "w-000000000001", holds=running, now=1.0)
            await claims.claim(IDENTITY, "w-000000000001", holds=running, now=2.0)  # its own
            with pytest.raises(IdentityTaken, match="w-000000000001"):
                await claims.claim(IDENTITY, "w-000000000002", holds=running, now=3.0)
            await claims.claim(IDENTITY, "w-000000000002", holds=ended, now=4.0)
            assert await claims.holder(IDENTITY) == "w-000000000002"
            await claims.release(IDENTITY, "w-000000000001")  # not the holder: nothing
            assert await claims.holder(IDENTITY) == "w-000000000002"
            await claims.release(IDENTITY, "w-000000000002")
            assert await claims.holder(IDENTITY) is None
            await claims.claim(IDENTITY, "w-000000000003", holds=running, now=5.0)  # released
            assert await claims.holder(IDENTITY) == "w-000000000003"
            # other identities are other claims, whatever their characters
            await claims.claim("default/hello/1", "w-000000000004", holds=running, now=6.0)
            await claims.claim("a.b/hello/0", "w-000000000005", holds=running, now=6.0)
            assert await claims.holder("a=2Eb/hello/0") is None
            assert await claims.holder(IDENTITY) == "w-000000000003"

        self._run(check)

    def test_a_release_racing_a_takeover_keeps_the_new_holder(self) -> None:
        async def check(registries: Registries) -> None:
            claims = registries.workloads.claims
            await claims.claim(IDENTITY, "w-000000000001", holds=running, now=1.0)

            async def ended_and_released(claim: Claim) -> str | None:
                if claim.workload_id != "w-000000000001":
                    return "running"
                # as the API does: seeing the holder ended releases its claim; meanwhile
                # another create takes the identity
                await claims.release(IDENTITY, claim.workload_id)
                await claims.claim(IDENTITY, "w-000000000009", holds=ended, now=2.0)
                return None

            with pytest.raises(IdentityTaken, match="w-000000000009"):
                await claims.claim(IDENTITY, "w-000000000002", holds=ended_and_released, now=2.0)
            # its compare-and-set failed: it looked again and found the new holder running
            assert await claims.holder(IDENTITY) == "w-000000000009"

        self._run(check)

    # -- idempotency keys --------------------------------------------------------------------
    def test_concurrent_claims_of_one_key_have_one_winner_that_all_are_answered(self) -> None:
        async def check(registries: Registries) -> None:
            keys = registries.workloads.keys
            assert await keys.holder(KEY) is None
            claims = [_key_claim(f"w-{i:012x}") for i in range(8)]
            held = await asyncio.gather(*(keys.claim(claim, replaceable=never) for claim in claims))
            (winner,) = {claim.workload_id for claim in held}
            assert winner in {claim.workload_id for claim in claims}
            assert held[0] == next(claim for claim in claims if claim.workload_id == winner)
            assert await keys.holder(KEY) == held[0]
            again = await keys.claim(_key_claim(winner, claimed_at=9.0), replaceable=never)
            assert again == held[0]  # its own claim: kept as it is
            other = await keys.claim(_key_claim("w-000000000009", key="ab" * 32), replaceable=never)
            assert other.workload_id == "w-000000000009"  # another key is another claim

        self._run(check)

    def test_a_replaceable_key_claim_is_taken_over_once_and_release_is_the_holders(
        self,
    ) -> None:
        async def check(registries: Registries) -> None:
            keys = registries.workloads.keys
            first = await keys.claim(_key_claim("w-000000000001"), replaceable=never)
            asked: list[KeyClaim] = []

            async def judged(held: KeyClaim) -> bool:  # the first holder's create died
                asked.append(held)
                return held.workload_id == first.workload_id

            takers = [_key_claim(f"w-{i:012x}", claimed_at=5.0) for i in range(2, 6)]
            held = await asyncio.gather(*(keys.claim(t, replaceable=judged) for t in takers))
            (winner,) = {claim.workload_id for claim in held}
            assert winner != first.workload_id and asked[0] == first
            await keys.release(KEY, "w-000000000001")  # not the holder: nothing
            assert (await keys.holder(KEY) or first).workload_id == winner
            await keys.release(KEY, winner)
            assert await keys.holder(KEY) is None

        self._run(check)

    def test_a_holders_renewal_and_a_takeover_never_both_hold(self) -> None:
        async def check(registries: Registries) -> None:
            keys = registries.workloads.keys
            await keys.claim(_key_claim("w-000000000001"), replaceable=never)
            assert await keys.confirm(KEY, "w-000000000001", now=3.0)
            renewed = await keys.holder(KEY)
            assert renewed is not None and renewed.claimed_at == 3.0
            assert not await keys.confirm(KEY, "w-000000000002", now=3.0)  # not its claim

            async def renewed_meanwhile(held: KeyClaim) -> bool:
                # the holder renews while the taker judges it abandoned
                if held.workload_id == "w-000000000001" and held.claimed_at < 4.0:
                    assert await keys.confirm(KEY, "w-000000000001", now=4.0)
                    return True
                return False

            taker = _key_claim("w-000000000002", claimed_at=4.0)
            held = await keys.claim(taker, replaceable=renewed_meanwhile)
            assert held.workload_id == "w-000000000001" and held.claimed_at == 4.0
            # taken over for good: the old holder's renewal fails, and it must not record
            assert (await keys.claim(taker, replaceable=always)).workload_id == taker.workload_id
            assert not await keys.confirm(KEY, "w-000000000001", now=5.0)
            assert await keys.confirm(KEY, taker.workload_id, now=5.0)
            await keys.release(KEY, "w-000000000001")
            assert (await keys.holder(KEY) or taker).workload_id == taker.workload_id
            assert not await keys.confirm("cd" * 32, "w-000000000001", now=5.0)  # absent

        self._run(check)

    def test_key_claims_older_than_the_bound_are_expired_and_no_others(self) -> None:
        async def check(registries: Registries) -> None:
            keys = registries.workloads.keys
            assert await keys.expire(100.0) == 0
            names = {"old": "0a" * 32, "renewed": "0b" * 32, "new": "0c" * 32}
            for name, key in names.items():
                at = 50.0 if name == "new" else 1.0
                await keys.claim(
                    _key_claim(f"w-{len(name):012x}", key=key, claimed_at=at), replaceable=never
                )
            assert await keys.confirm(names["renewed"], f"w-{len('renewed'):012x}", now=60.0)
            assert await keys.expire(10.0) == 1
            assert await keys.holder(names["old"]) is None
            assert await keys.holder(names["renewed"]) is not None
            assert await keys.holder(names["new"]) is not None
            assert await keys.expire(100.0) == 2 and await keys.expire(100.0) == 0

        self._run(check)

    # -- images ------------------------------------------------------------------------------
    def test_images_are_kept_by_name(self) -> None:
        async def check(registries: Registries) -> None:
            images = registries.images
            base = Image(
                name="base", layers=[ImageLayer(id="sha256:b", size=10)], size=10, created_at=1.0
            )
            app = Image(
                name="app",
                platform="linux/amd64",
                size=14,
                command=["sh"],
                layers=[ImageLayer(id="sha256:b", size=10), ImageLayer(id="sha256:a", size=4)],
                created_at=2.0,
            )
            assert await images.list() == [] and await images.get("base") is None
            await images.add(base)
            await images.add(app)
            assert await images.get("app") == app
            assert [image.name for image in await images.list()] == ["app", "base"]
            bigger = base.model_copy(update={"size": 20, "created_at": 3.0})
            await images.add(bigger)  # replaces the one of the same name
            assert await images.get("base") == bigger and len(await images.list()) == 2
            assert await images.get("a.b") is None

        self._run(check)

    # -- routes ------------------------------------------------------------------------------
    def test_a_recorded_route_is_found_by_workload_and_node(self) -> None:
        async def check(registries: Registries) -> None:
            routes = registries.routes
            first = await routes.record("t/fn/0", _placement("n1", "r0"), SPEC, function=FUNCTION)
            second = await routes.record("t/fn/1", _placement("n2", "r1"))
            assert second > first > 0
            found = await routes.whereis("t/fn/0")
            assert found is not None
            assert (found.workload, found.node, found.reservation_id) == ("t/fn/0", "n1", "r0")
            assert found.spec == SPEC and found.function == FUNCTION and found.placed_at > 0
            plain = await routes.whereis("t/fn/1")
            assert plain is not None and plain.function is None and plain.spec is None
            assert await routes.whereis("t/fn/9") is None
            assert [(r.workload, r.node) for r in await routes.list()] == [
                ("t/fn/0", "n1"),
                ("t/fn/1", "n2"),
            ]
            assert [r.workload for r in await routes.list("n2")] == ["t/fn/1"]
            assert await routes.list("n3") == []

        self._run(check)

    def test_a_remove_at_a_revision_spares_a_route_stored_again_since(self) -> None:
        async def check(registries: Registries) -> None:
            routes = registries.routes
            await routes.record("t/fn/0", _placement("n1", "old"), SPEC, function=FUNCTION)
            [(revision, read)] = await routes.on_node("n1")
            assert read.reservation_id == "old"
            await routes.record("t/fn/0", _placement("n1", "new"), SPEC, function=FUNCTION)
            await routes.remove("t/fn/0", "n1", revision=revision)  # the stale read's
            route = await routes.whereis("t/fn/0")
            assert route is not None and route.reservation_id == "new"
            [(current, _)] = await routes.on_node("n1")
            assert current > revision
            await routes.remove("t/fn/0", "n1", revision=current)
            assert await routes.whereis("t/fn/0") is None
            await routes.remove("t/fn/0", "n1")  # idempotent
            await routes.remove("t/fn/0", "n1", revision=current)

        self._run(check)

    def test_a_repair_writes_only_where_no_route_is_stored(self) -> None:
        async def check(registries: Registries) -> None:
            routes = registries.routes
            revision = await routes.record(
                "t/fn/0", _placement("n1", "r0"), SPEC, function=FUNCTION
            )
            [(listed, stored)] = await routes.entries()
            assert listed == revision and stored.reservation_id == "r0"
            other = Route("t/fn/0", "n1", "r9", SPEC, 5.0, *FUNCTION)
            assert await routes.repair(other) is None  # a stored route is never overwritten
            assert (await routes.whereis("t/fn/0")) == stored
            await routes.remove("t/fn/0", "n1")  # deleted (a tombstone on NATS): written again
            repaired = await routes.repair(other)
            assert repaired is not None and repaired > revision
            assert await routes.whereis("t/fn/0") == other
            never = Route("t/fn/1", "n2", "r1", None, 6.0)  # never written: written
            assert await routes.repair(never) is not None
            assert [(r.workload, r.node) for _, r in await routes.entries()] == [
                ("t/fn/0", "n1"),
                ("t/fn/1", "n2"),
            ]
            await routes.purge_node("n2")  # purged: written again
            assert await routes.repair(never) is not None
            assert await routes.whereis("t/fn/1") == never

        self._run(check)

    def test_a_nodes_routes_are_cleared_or_purged_and_no_others(self) -> None:
        async def check(registries: Registries) -> None:
            routes = registries.routes
            for index, node in enumerate(("n1", "n1", "n2", "n3", "n3", "n3")):
                await routes.record(f"t/fn/{index}", _placement(node, f"r{index}"))
            assert await routes.clear_node("n1") == 2
            assert await routes.purge_node("n3") == 3
            assert await routes.purge_node("n3") == 0 and await routes.clear_node("n9") == 0
            assert [(r.workload, r.node) for r in await routes.list()] == [("t/fn/2", "n2")]

        self._run(check)

    def test_a_follower_sees_the_routes_stored_then_every_change_in_order(self) -> None:
        async def check(registries: Registries) -> None:
            routes = registries.routes
            await routes.record("t/fn/0", _placement("n1", "r0"), function=FUNCTION)
            events: list[RouteEvent] = []
            watch = await routes.follow(events.append, idle_heartbeat_s=0.2, sync_timeout_s=5.0)
            try:
                assert [(e.kind, e.route and e.route.workload) for e in events] == [
                    ("put", "t/fn/0")
                ]
                first_key = events[0].key
                revision = await routes.record("t/fn/1", _placement("n2", "r1"))
                assert await watch.reached(revision, 5.0)
                await routes.remove("t/fn/0", "n1")
                later = await routes.record("t/fn/2", _placement("n2", "r2"))
                assert await watch.reached(later, 5.0)
                seen = [(e.kind, e.route and e.route.workload) for e in events]
                assert seen == [
                    ("put", "t/fn/0"),
                    ("put", "t/fn/1"),
                    ("delete", None),
                    ("put", "t/fn/2"),
                ], seen
                assert events[2].key == first_key  # a delete names the key of the route
                revisions = [e.revision for e in events]
                assert revisions == sorted(revisions) and revisions[-1] == later
                assert not await watch.reached(later + 1000, 0.1)
                assert watch.rejected == 0
            finally:
                await watch.stop()
            count = len(events)
            last = await routes.record("t/fn/3", _placement("n2", "r3"))
            await asyncio.sleep(0.2)
            assert len(events) == count and last > later

        self._run(check)
