"""``berth.nats.streams.created``: a bucket's creation is asked again while JetStream cannot
place its replicas yet (a cluster just formed, or electing a leader), and any other error
is raised at once.  (That a real cluster creates R3 buckets:
tests/nats_server/test_nats_cluster.py.)"""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from nats.js.errors import BadRequestError, ServiceUnavailableError

from berth.nats.streams import NO_SUITABLE_PEERS, created


class Creations:
    """``create()`` failing with ``errors`` in turn, then answering ``"made"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.asked = 0

    async def create(self) -> str:
        self.asked += 1
        if self.errors:
            raise self.errors.pop(0)
        return "made"


def test_a_creation_is_asked_again_while_replicas_cannot_be_placed() -> None:
    creations = Creations(
        BadRequestError(code=400, err_code=NO_SUITABLE_PEERS, description="no suitable peers"),
        ServiceUnavailableError(code=503, err_code=10008, description="not ready"),
    )
    assert asyncio.run(created(creations.create, "b")) == "made"
    assert creations.asked == 3


def test_a_creation_is_asked_again_while_jetstream_does_not_answer() -> None:
    """A cluster electing its leaders, or a connection failing over, answers nothing: a
    timeout is not a refusal (the creation may even have happened: asked again, it succeeds)."""
    creations = Creations(nats.errors.TimeoutError(), nats.errors.NoRespondersError())
    assert asyncio.run(created(creations.create, "b")) == "made"
    assert creations.asked == 3


def test_any_other_error_is_raised_at_once() -> None:
    creations = Creations(BadRequestError(code=400, err_code=10058, description="name in use"))
    with pytest.raises(BadRequestError):
        asyncio.run(created(creations.create, "b"))
    assert creations.asked == 1
