"""Helpers shared by the API tests that run against a real ``berth up`` cluster
(:class:`~berth.up.LocalCluster` with ``http=``): a client carrying the cluster's
token, polling until a condition holds, and checking a problem+json answer.

Imported by the test modules as ``api_helpers`` (``tests/`` is on ``sys.path`` under pytest's
default import mode, ``tests`` being no package).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from berth.up import LocalCluster

PROBLEM = "application/problem+json"


@contextmanager
def api_client(cluster: LocalCluster) -> Iterator[httpx.Client]:
    """An HTTP client on ``cluster``'s API, its bearer token set."""
    assert cluster.api_url is not None
    headers = {"Authorization": f"Bearer {cluster.api_token}"}
    with httpx.Client(base_url=cluster.api_url, headers=headers, timeout=20.0) as client:
        yield client


def until(check: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    """``check()``'s first truthy value, polled every 50 ms; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """``response`` as a problem+json body of ``status`` with a type, title and detail."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["type"] and body["title"] and body["detail"]
    return body
