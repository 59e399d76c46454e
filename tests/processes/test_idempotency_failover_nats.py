"""A create in flight through an API process that is ``kill -9``'d, repeated with its
``Idempotency-Key`` on another scheduler, gets the create's outcome (issue 36, part 2).

Real processes: a ``berth up`` with two schedulers serving the API and one agent.  The agent
is paused (``SIGSTOP``) so that the create sent to the first scheduler's API is caught
between its claims (the key, the identity) and its record; that scheduler is ``kill -9``'d
and the agent resumed; the client repeats the create with its key on the second endpoint.
Before, it was answered ``409 idempotency_in_progress`` for 30 s and then ``409
identity_taken`` — the workload never created, its creator told it exists.  Now the dead
process is out of the schedulers' census, so the repeat takes the key and the identity over
and creates at once (or, if the first attempt got as far as its record, is answered that
record): ``201``, and every later repeat the same workload.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import httpx
import pytest

from berth.processes.up import LocalCluster

pytestmark = pytest.mark.slow  # a whole berth up

KEY = "failover-create-1"
BODY = {"name": "once", "type": "micro", "command": ["sleep", "120"]}


def test_a_repeat_on_another_scheduler_after_a_kill_gets_the_creates_outcome() -> None:
    with LocalCluster(1, schedulers=2, heartbeat_s=0.5, http=("127.0.0.1", 0), tls=False) as up:
        headers = {"Authorization": f"Bearer {up.api_token}", "Idempotency-Key": KEY}
        first_url, second_url = up.api_urls
        agent = up.agent_processes[0]
        answers: list[Any] = []

        def in_flight() -> None:
            with httpx.Client(base_url=first_url, headers=headers, timeout=60.0) as api:
                try:
                    answers.append(api.post("/v1/workloads", json=BODY))
                except httpx.HTTPError as error:  # its process is killed under it
                    answers.append(error)

        os.kill(agent.pid, signal.SIGSTOP)
        try:
            sender = threading.Thread(target=in_flight, daemon=True)
            sender.start()
            time.sleep(1.5)  # claimed its key and identity; placing on the paused node
            assert not answers, answers
            up.scheduler_processes[0].kill()
            up.scheduler_processes[0].wait()
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        sender.join(10.0)
        assert answers and isinstance(answers[0], httpx.HTTPError), answers

        repeated_at = time.monotonic()
        with httpx.Client(base_url=second_url, headers=headers, timeout=60.0) as api:
            statuses = []
            while True:
                answer = api.post("/v1/workloads", json=BODY)
                statuses.append(answer.status_code)
                if answer.status_code != 409 or "idempotency_in_progress" not in answer.text:
                    break
                assert time.monotonic() - repeated_at < 20.0, statuses
                time.sleep(float(answer.headers.get("Retry-After", "1")))
            took_s = time.monotonic() - repeated_at
            print(f"the repeat was answered {answer.status_code} after {took_s:.2f} s: {statuses}")
            assert answer.status_code == 201, answer.text
            workload = answer.json()
            again = api.post("/v1/workloads", json=BODY)
            assert again.status_code == 201 and again.json()["id"] == workload["id"]
            assert again.headers["Idempotent-Replayed"] == "true"
            listed = api.get("/v1/workloads").json()["items"]
            live = [w for w in listed if w["state"] in ("pending", "running", "unknown")]
            assert [w["id"] for w in live] == [workload["id"]], listed
            assert took_s < 10.0, f"{took_s:.2f} s: waited as if the first were still up"
