"""What only the NATS drivers of the API's registries do: NATS failing under a question is
``Unavailable`` naming the bucket (the API answers 503, never 500).

The claims' guarantees themselves — of concurrent claims exactly one wins, a holder that
still holds refuses naming itself, a holder that no longer does is taken over, only the
holder's own release frees it, a workload's end is recorded once — are the registry
contract (:mod:`berth.testing.registry_contract`), which these drivers pass on a real
nats-server in ``test_registry_nats.py``."""

from __future__ import annotations

import asyncio

import pytest

from berth.errors import Unavailable
from berth.registry.nats import NatsWorkloads
from berth.registry.port import Claim
from berth.testing.nats import NatsServer, client, unique_name

IDENTITY = "default/hello/0"


async def ended(claim: Claim) -> str | None:
    return None


def test_nats_failing_under_a_question_is_unavailable_naming_the_bucket(
    nats_server: NatsServer,
) -> None:
    async def scenario() -> None:
        bucket = unique_name("api")
        async with client(nats_server.url) as nc:
            registry = await NatsWorkloads(nc, bucket=bucket).start()
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
