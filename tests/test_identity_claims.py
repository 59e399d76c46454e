"""One running workload per identity (``namespace/name/replica``): the API's claims in
JetStream KV (:class:`berth.registry.workloads.IdentityClaims`) against a real nats-server —
of concurrent claims exactly one wins, a holder that still holds refuses naming itself, a
holder that no longer does is taken over, and only the holder's own release frees it."""

from __future__ import annotations

import asyncio

import pytest

from berth.errors import Unavailable
from berth.registry.workloads import (
    Claim,
    IdentityClaims,
    IdentityTaken,
    StoredWorkload,
    WorkloadRegistry,
)
from berth.testing.nats import NatsServer, client, unique_name

IDENTITY = "default/hello/0"


async def running(claim: Claim) -> str | None:
    return f"running ({claim.workload_id})"


async def ended(claim: Claim) -> str | None:
    return None


def test_concurrent_claims_of_one_identity_have_one_winner(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        async with client(nats_server.url) as nc:
            claims = await IdentityClaims(nc, bucket=unique_name("api")).start()
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

    asyncio.run(scenario())


def test_a_holder_that_no_longer_runs_is_taken_over_and_release_is_the_holders(
    nats_server: NatsServer,
) -> None:
    async def scenario() -> None:
        async with client(nats_server.url) as nc:
            claims = await IdentityClaims(nc, bucket=unique_name("api")).start()
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
            await claims.claim(IDENTITY, "w-000000000003", holds=running, now=5.0)  # deleted key
            assert await claims.holder(IDENTITY) == "w-000000000003"
            # other identities are other keys, whatever their characters
            await claims.claim("default/hello/1", "w-000000000004", holds=running, now=6.0)
            await claims.claim("a.b/hello/0", "w-000000000005", holds=running, now=6.0)
            assert await claims.holder("a=2Eb/hello/0") is None
            assert await claims.holder(IDENTITY) == "w-000000000003"

    asyncio.run(scenario())


def test_a_release_racing_a_takeover_keeps_the_new_holder(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        async with client(nats_server.url) as nc:
            claims = await IdentityClaims(nc, bucket=unique_name("api")).start()
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
                await claims.claim(IDENTITY, "w-000000000002", holds=ended_and_released,
                                   now=2.0)  # fmt: skip
            # its compare-and-set failed: it looked again and found the new holder running
            assert await claims.holder(IDENTITY) == "w-000000000009"

    asyncio.run(scenario())


def test_nats_failing_under_a_question_is_unavailable_naming_the_bucket(
    nats_server: NatsServer,
) -> None:
    async def scenario() -> None:
        bucket = unique_name("api")
        async with client(nats_server.url) as nc:
            registry = await WorkloadRegistry(nc, bucket=bucket).start()
            await nc.close()  # every question after this fails in nats-py
            for question in (
                registry.get("w-000000000001"),
                registry.list(),
                registry.claims.claim(IDENTITY, "w-000000000001", holds=ended, now=1.0),
                registry.claims.release(IDENTITY, "w-000000000001"),
            ):
                with pytest.raises(Unavailable, match=f"the {bucket} bucket did not answer"):
                    await question

    asyncio.run(scenario())


def _running_record(workload_id: str) -> StoredWorkload:
    return StoredWorkload(
        id=workload_id, namespace="default", name="hello", replica=0, node="node-00",
        node_workload_id="hello-1", colocated_bytes=0, rank=0, state="running",
        command=["sleep", "60"], restartable=True, created_at=1.0,
        request={"namespace": "default", "name": "hello", "spec": "micro"},
    )  # fmt: skip


def test_an_end_is_recorded_once_and_never_over_a_change_written_meanwhile(
    nats_server: NatsServer,
) -> None:
    """A reader that saw a workload running and then learnt it ended must not overwrite what
    was written meanwhile (a drain's ``replaced_by``, another reader's end): the end is a
    compare-and-set on the record, and of concurrent readers exactly one records it."""

    async def scenario() -> None:
        async with client(nats_server.url) as nc:
            registry = await WorkloadRegistry(nc, bucket=unique_name("api")).start()
            wid = "w-000000000001"
            await registry.record(_running_record(wid))
            outcomes = await asyncio.gather(
                *(registry.end(wid, {"state": "exited", "exit_code": code}) for code in range(6))
            )
            recorded = [ended for ended, mine in outcomes if mine]
            assert len(recorded) == 1, outcomes
            stored = await registry.get(wid)
            assert stored is not None and stored == recorded[0] and stored.state == "exited"
            # every other reader gets the record as it is, not its own view of the end
            assert all(ended == stored for ended, _ in outcomes)

            # a drain stopped and replaced another one; a reader that still thought it
            # running learns of an exit afterwards: the drain's record stands
            other = "w-000000000002"
            await registry.record(_running_record(other))
            drained = _running_record(other).model_copy(
                update={"state": "stopped", "replaced_by": "w-000000000003"}
            )
            await registry.record(drained)
            ended, mine = await registry.end(other, {"state": "exited", "exit_code": 0})
            assert not mine and ended == drained
            assert await registry.get(other) == drained
            assert await registry.end("w-0000000000ff", {"state": "exited"}) == (None, False)

    asyncio.run(scenario())
