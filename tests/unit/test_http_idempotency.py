"""A create's ``Idempotency-Key`` (:mod:`berth.api.idempotency`): the HTTP API in this process
over the embedded cluster (real process workloads) and its in-memory registries.

A repeat with the same key and body answers the first attempt's workload and boots nothing;
another body is ``422`` naming the header; a malformed key is ``400`` naming it and changes
nothing; a repeat while the first attempt has recorded nothing is ``409`` with
``Retry-After`` — until that claim is abandoned, when the repeat takes it over.  A create that
fails gives its key back unless its workload may run: a run never answered keeps it, and the
repeat answers that record instead of booting again."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from berth.api import idempotency
from berth.api.backend import ClusterBackend
from berth.api.client import ApiClient, ApiLocation
from berth.api.create import RUN_ATTEMPTS
from berth.api.idempotency import CreateKeys, key_name, request_hash
from berth.api.problems import Problem
from berth.api.reconciler import KEYS_EXPIRE_EVERY_S, Reconciler
from berth.api.schemas import Workload, WorkloadCreate
from berth.api.testing import ApiUnderTest, embedded_api
from berth.embedded import EmbeddedCluster, embedded_configs
from berth.errors import Invalid, Unavailable
from berth.model import Placement, Request
from berth.registry.memory import MemoryImages, MemoryWorkloads
from berth.registry.port import IdempotencyKeys, KeyClaim, new_workload_id
from berth.scheduler.multinode import ClusterScheduler
from berth.testing.clock import FakeClock
from tests.api_helpers import problem

pytestmark = pytest.mark.anyio

BODY: dict[str, Any] = {"name": "job", "type": "micro", "command": ["sleep", "60"]}
KEY = "2f1c9a7e5b3d4c6f8a0b1c2d3e4f5a6b"


@contextlib.asynccontextmanager
async def api_and_client(
    nodes: int = 2, **options: Any
) -> AsyncIterator[tuple[ApiUnderTest, httpx.AsyncClient]]:
    async with embedded_api(nodes, **options) as under_test, under_test.client() as api:
        yield under_test, api


def keyed(key: str | bytes = KEY) -> dict[str, Any]:
    return {"headers": {"Idempotency-Key": key}}


def reservations(under_test: ApiUnderTest) -> int:
    assert under_test.cluster is not None
    return sum(len(agent.budget.reservations()) for agent in under_test.cluster.agents.values())


async def workloads(api: httpx.AsyncClient) -> list[dict[str, Any]]:
    listed = await api.get("/v1/workloads")
    assert listed.status_code == 200, listed.text
    items: list[dict[str, Any]] = listed.json()["items"]
    return items


async def test_the_same_key_twice_is_one_workload_answered_twice() -> None:
    async with api_and_client() as (under_test, api):
        first = await api.post("/v1/workloads", json=BODY, **keyed())
        assert first.status_code == 201, first.text
        assert idempotency.REPLAYED_HEADER not in first.headers
        again = await api.post("/v1/workloads", json=dict(reversed(BODY.items())), **keyed())
        assert again.status_code == 201, again.text  # the create's own status
        assert again.headers[idempotency.REPLAYED_HEADER] == "true"
        created, repeated = Workload(**first.json()), Workload(**again.json())
        assert repeated.id == created.id and repeated.state == "running"
        assert [item["id"] for item in await workloads(api)] == [created.id]
        assert reservations(under_test) == 1  # nothing placed again
        assert under_test.faults is not None and len(under_test.faults.runs) == 1
        assert under_test.backend is not None
        assert [r.outcome for r in under_test.backend.recent(10)] == ["placed"]
        # another key is another create: here the identity is taken (not a repeat)
        other = problem(await api.post("/v1/workloads", json=BODY, **keyed("other")), 409)
        assert other["type"].endswith("/identity_taken")


async def test_the_same_key_with_another_body_is_422_naming_the_header() -> None:
    async with api_and_client() as (under_test, api):
        first = await api.post("/v1/workloads", json=BODY, **keyed())
        assert first.status_code == 201, first.text
        changed = {**BODY, "command": ["sleep", "61"]}
        refused = problem(await api.post("/v1/workloads", json=changed, **keyed()), 422)
        assert refused["type"].endswith("/idempotency_key_reused")
        assert refused["field"] == "Idempotency-Key" and "another request" in refused["detail"]
        assert [item["id"] for item in await workloads(api)] == [first.json()["id"]]
        assert reservations(under_test) == 1


@pytest.mark.parametrize(
    "key",
    ["", "k" * 256, "é".encode(), "tab\there", "\x7f"],
    ids=["empty", "256 characters", "not ascii", "a tab", "DEL"],
)
async def test_a_malformed_key_is_400_naming_the_header_and_changes_nothing(
    key: str | bytes,
) -> None:
    async with api_and_client(1) as (under_test, api):
        answer = problem(await api.post("/v1/workloads", json=BODY, **keyed(key)), 400)
        assert answer["field"] == "Idempotency-Key", answer
        assert await workloads(api) == [] and reservations(under_test) == 0
        assert under_test.backend is not None
        assert await under_test.backend.workloads.claims.holder("default/job/0") is None
        # the longest key, and any printable ASCII, are keys
        longest = "~ !" * 85
        assert (await api.post("/v1/workloads", json=BODY, **keyed(longest))).status_code == 201


async def plant(under_test: ApiUnderTest, key: str, body: dict[str, Any], at: float) -> str:
    """A claim of ``key`` for a create of ``body`` that has recorded nothing (yet)."""
    assert under_test.backend is not None
    workload_id = new_workload_id()
    claim = KeyClaim(
        key=key_name(key),
        workload_id=workload_id,
        request_hash=request_hash(WorkloadCreate.model_validate(body)),
        claimed_at=at,
    )
    keys = under_test.backend.workloads.keys
    assert (await keys.claim(claim, replaceable=_never)).workload_id == workload_id
    return workload_id


async def _never(claim: KeyClaim) -> bool:
    return False


async def test_a_repeat_while_the_first_attempt_records_nothing_is_409_then_takes_it_over() -> None:
    clock = FakeClock(now=1000.0)
    async with api_and_client(idempotency_abandoned_after_s=30.0, clock=clock) as (
        under_test,
        api,
    ):
        first_id = await plant(under_test, KEY, BODY, clock())
        clock.advance(29.0)
        busy = await api.post("/v1/workloads", json=BODY, **keyed())
        answer = problem(busy, 409)
        assert answer["type"].endswith("/idempotency_in_progress") and "retry" in answer["detail"]
        assert busy.headers["Retry-After"] == str(idempotency.RETRY_AFTER_S)
        assert answer["workload_id"] == first_id
        assert await workloads(api) == [] and reservations(under_test) == 0
        clock.advance(1.0)  # abandoned: its create died before recording anything
        taken = await api.post("/v1/workloads", json=BODY, **keyed())
        assert taken.status_code == 201, taken.text
        created = Workload(**taken.json())
        assert created.id != first_id and idempotency.REPLAYED_HEADER not in taken.headers
        assert under_test.backend is not None
        held = await under_test.backend.workloads.keys.holder(key_name(KEY))
        assert held is not None and held.workload_id == created.id
        again = await api.post("/v1/workloads", json=BODY, **keyed())
        assert again.json()["id"] == created.id and again.headers[idempotency.REPLAYED_HEADER]


async def test_an_abandoned_claim_of_another_body_is_still_422() -> None:
    clock = FakeClock(now=1000.0)
    async with api_and_client(1, idempotency_abandoned_after_s=1.0, clock=clock) as (
        under_test,
        api,
    ):
        await plant(under_test, KEY, {**BODY, "name": "other"}, clock())
        clock.advance(5.0)
        problem(await api.post("/v1/workloads", json=BODY, **keyed()), 422)
        assert await workloads(api) == []


class TakenOverWhilePlacing:
    """Placements whose every placement takes long enough for a repeat to take the
    create's key over meanwhile (as one would after the abandon bound)."""

    def __init__(self, scheduler: ClusterScheduler, keys: IdempotencyKeys) -> None:
        self.scheduler = scheduler
        self.keys = keys
        self.takers: list[str] = []

    async def schedule(self, request: Request) -> Placement:
        placement = await self.scheduler.schedule(request)
        held = await self.keys.holder(key_name(KEY))
        assert held is not None
        taker = held.model_copy(update={"workload_id": new_workload_id()})
        await self.keys.claim(taker, replaceable=_always)
        self.takers.append(taker.workload_id)
        return placement

    async def release(self, placement: Placement, *, workload: str | None = None) -> bool:
        return await self.scheduler.release(placement, workload=workload)


async def test_a_first_attempt_whose_key_was_taken_over_records_nothing() -> None:
    """The renewal before the record: a create slower than the bound finds its key taken
    over, gives back its placement and identity, and answers 409 — the taker creates."""
    async with EmbeddedCluster(embedded_configs(1, runtime="fake")) as cluster:
        registry = MemoryWorkloads()
        placements = TakenOverWhilePlacing(cluster.scheduler, registry.keys)
        backend = ClusterBackend(
            cluster.scheduler, cluster.client, placements, registry, MemoryImages()
        )
        with pytest.raises(Problem) as lost:
            await backend.create(WorkloadCreate.model_validate(BODY), idempotency_key=KEY)
        assert lost.value.status == 409 and lost.value.kind == "idempotency_in_progress"
        assert placements.takers[0] in lost.value.detail
        assert await registry.list() == []
        (agent,) = cluster.agents.values()
        assert agent.workloads() == {} and agent.budget.reservations() == []
        assert await registry.claims.holder("default/job/0") is None
        held = await registry.keys.holder(key_name(KEY))
        assert held is not None and held.workload_id == placements.takers[0]  # the taker's


async def _always(claim: KeyClaim) -> bool:
    return True


@pytest.mark.parametrize("first_is_up", [False, True])
async def test_a_repeat_after_its_api_process_died_creates_at_once(first_is_up: bool) -> None:
    """Issue 36: the API process serving a create is ``kill -9``'d after claiming the key and
    the identity, before recording anything; the client fails over and repeats with its key.
    The claim names its owner: once that process is out of the census the repeat takes the
    key *and* the dead attempt's identity claim over, and creates (``201``) — not ``409`` in
    progress for 30 s, then ``409`` identity taken.  While the owner is up it is in progress."""
    async with EmbeddedCluster(embedded_configs(1, runtime="fake")) as cluster:
        registry = MemoryWorkloads()
        members = {"api-b", "api-a"} if first_is_up else {"api-b"}

        async def alive() -> set[str]:
            return members

        backend = ClusterBackend(
            cluster.scheduler,
            cluster.client,
            cluster.scheduler,
            registry,
            MemoryImages(),
            owner="api-b",
            members=alive,
        )
        body = WorkloadCreate.model_validate(BODY)
        dead = new_workload_id()  # what api-a took before it died
        now = backend.clock()
        claim = KeyClaim(
            key=key_name(KEY),
            workload_id=dead,
            request_hash=request_hash(body),
            claimed_at=now,
            owner="api-a",
        )
        assert (await registry.keys.claim(claim, replaceable=_never)).workload_id == dead
        await registry.claims.claim("default/job/0", dead, holds=_no_holder, now=now)
        if first_is_up:
            with pytest.raises(Problem) as busy:
                await backend.create(body, idempotency_key=KEY)
            assert busy.value.kind == "idempotency_in_progress"
            assert await registry.list() == []
            return
        created, repeated = await backend.create_or_repeat(body, KEY)
        assert not repeated and created.id != dead and created.state == "running"
        holder = await registry.claims.holder("default/job/0")
        assert holder == created.id
        held = await registry.keys.holder(key_name(KEY))
        assert held is not None and (held.workload_id, held.owner) == (created.id, "api-b")
        again, repeated = await backend.create_or_repeat(body, KEY)
        assert repeated and again.id == created.id
        assert [record.id for record in await registry.list()] == [created.id]


async def _no_holder(claim: object) -> str | None:
    return None


async def test_a_create_that_fails_gives_its_key_back_and_a_retry_tries_again() -> None:
    async with api_and_client(1) as (under_test, api):
        assert under_test.backend is not None
        huge = {**BODY, "spec": {"vcpus": 1, "mem": "64TiB", "disk": "1MiB"}, "type": None}
        huge.pop("type")
        full = problem(await api.post("/v1/workloads", json=huge, **keyed()), 409)
        assert full["type"].endswith("/no_capacity")
        assert await under_test.backend.workloads.keys.holder(key_name(KEY)) is None
        again = problem(await api.post("/v1/workloads", json=huge, **keyed()), 409)
        assert again["type"].endswith("/no_capacity")  # tried again, not "in progress"
        refused = {**BODY, "command": ["no-such-command-anywhere"]}
        problem(await api.post("/v1/workloads", json=refused, **keyed("refused")), 409)
        assert await under_test.backend.workloads.keys.holder(key_name("refused")) is None


async def test_a_run_never_answered_keeps_its_key_and_the_repeat_answers_its_record() -> None:
    async with api_and_client(1) as (under_test, api):
        assert under_test.faults is not None and under_test.backend is not None
        under_test.faults.lose_run_answers(RUN_ATTEMPTS)
        unknown = problem(await api.post("/v1/workloads", json=BODY, **keyed()), 503)
        (record,) = await under_test.backend.workloads.list()
        assert record.id in unknown["detail"]  # unknown, never failed: the key is kept
        again = await api.post("/v1/workloads", json=BODY, **keyed())
        assert again.status_code == 201, again.text
        assert again.json()["id"] == record.id and again.json()["state"] == "running"
        assert len(under_test.faults.runs) == RUN_ATTEMPTS  # booted by the first attempt only


async def test_an_expired_key_names_a_new_create_and_old_claims_are_deleted() -> None:
    """:class:`CreateKeys` over the in-memory registries and a fake clock."""
    clock = FakeClock(now=0.0)
    registry = MemoryWorkloads()
    keys = CreateKeys(registry.keys, registry, clock, abandoned_after_s=30.0, retention_s=100.0)
    body = WorkloadCreate.model_validate(BODY)
    other = WorkloadCreate.model_validate({**BODY, "name": "other"})
    assert await keys.take(KEY, "w-000000000001", body) == (None, None)
    await keys.confirm(KEY, "w-000000000001")
    clock.advance(99.0)
    with pytest.raises(Problem, match="another request"):
        await keys.take(KEY, "w-000000000002", other)
    assert await keys.expire() == 0
    clock.advance(1.0)
    assert await keys.take(KEY, "w-000000000002", other) == (None, None)  # expired: new
    assert await keys.take("second", "w-000000000003", body) == (None, None)
    clock.advance(100.5)
    assert await keys.expire() == 2 and await registry.keys.holder(key_name(KEY)) is None


@pytest.mark.parametrize("field", ["abandoned_after_s", "retention_s"])
async def test_the_bounds_must_be_positive_seconds(field: str) -> None:
    registry = MemoryWorkloads()
    options: dict[str, Any] = {field: 0.0}
    with pytest.raises(Invalid, match="idempotency"):
        CreateKeys(registry.keys, registry, FakeClock(), **options)


async def test_the_reconciler_deletes_expired_key_claims_hourly() -> None:
    async with embedded_api(1, runtime="fake") as under_test:
        assert under_test.backend is not None
        backend = under_test.backend
        now = backend.clock()
        await plant(under_test, "old", BODY, now - backend.keys.retention_s - 1.0)
        await plant(under_test, "new", BODY, now)
        monotonic = FakeClock(now=0.0)
        reconciler = Reconciler(backend, monotonic=monotonic)
        assert (await reconciler.reconcile()).keys_expired == 1
        assert await backend.workloads.keys.holder(key_name("old")) is None
        assert await backend.workloads.keys.holder(key_name("new")) is not None
        await plant(under_test, "older", BODY, now - backend.keys.retention_s - 1.0)
        assert (await reconciler.reconcile()).keys_expired == 0  # not again within the hour
        monotonic.advance(KEYS_EXPIRE_EVERY_S)
        assert (await reconciler.reconcile()).keys_expired == 1


def answering(status: int, problem_body: dict[str, Any]) -> ApiClient:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Idempotency-Key"]
        return httpx.Response(
            status, json=problem_body, headers={"content-type": "application/problem+json"}
        )

    location = ApiLocation("http://api", "t", "test")
    return ApiClient(location, transport=httpx.MockTransport(handler))


def test_the_cli_client_says_in_progress_is_unavailable_and_a_reused_key_invalid() -> None:
    busy = {"type": "https://berth.dev/problems/idempotency_in_progress", "status": 409}
    in_progress = answering(409, {**busy, "detail": "in progress; retry"})
    with in_progress as client, pytest.raises(Unavailable, match="in progress"):
        client.create_workload(BODY)
    reused = {"type": "https://berth.dev/problems/idempotency_key_reused", "status": 422}
    reuse = answering(422, {**reused, "detail": "reused", "field": "Idempotency-Key"})
    with reuse as client, pytest.raises(Invalid) as error:
        client.create_workload(BODY)
    assert error.value.field == "Idempotency-Key"
