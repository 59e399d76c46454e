"""A schemathesis run over the committed OpenAPI document against a live service: a local
cluster (nats-server with authentication, agents with the fake runtime, a scheduler serving
the API).  Every generated call — valid and invalid bodies, odd query and path values — must
get an answer the document describes: no 5xx, a documented status and content type, a body
that matches its schema.  The number of examples is bounded so the run stays short."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from berth.processes.up import LocalCluster

pytestmark = pytest.mark.slow  # starts a whole berth up

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
schema = schemathesis.openapi.from_dict(json.loads(DOCUMENT.read_text(encoding="utf-8")))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def service() -> Iterator[tuple[str, dict[str, str]]]:
    with LocalCluster(2, heartbeat_s=0.5, runtime="fake", http=("127.0.0.1", 0)) as up:
        assert up.api_url is not None
        yield up.api_url, {"Authorization": f"Bearer {up.api_token}"}


@schema.parametrize()
@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_service_keeps_its_document(
    case: schemathesis.Case[Any],  # an OpenAPI operation's case (its type is private)
    service: tuple[str, dict[str, str]],
) -> None:
    base_url, headers = service
    case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS, timeout=20)
