"""``berth scheduler --policy`` / ``berth up --policy``: the service's schedulers rank with the
named policy (the seed's ordering by default), and a bad name is one line naming the flag.

On an empty three-node ``berth up`` cluster (node classes of 2, 4 and 8 GiB) nothing is
colocated anywhere, so the seed's ordering falls to its name tie-break (``node-00``) while
``berth`` prices room by scarcity and takes the node with the most free memory — so where one
placement lands tells which policy the scheduler process ranked with.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TypedDict

import pytest

from berth.errors import Invalid
from berth.processes.up import LocalCluster
from tests.api_helpers import api_client

REQUEST = {
    "namespace": "default",
    "name": "probe",
    "spec": "micro",
    "layers": [{"id": "sha256:base", "size": 1024}],
}


class PolicyFlag(TypedDict, total=False):
    """``LocalCluster``'s ``policy`` when given (absent: its default)."""

    policy: str


def _placed_on(policy: str | None) -> str:
    extra: PolicyFlag = {} if policy is None else {"policy": policy}
    with (
        LocalCluster(3, heartbeat_s=0.5, runtime="fake", http=("127.0.0.1", 0), **extra) as up,
        api_client(up) as client,
    ):
        answer = client.post("/v1/placements", json=REQUEST)
        assert answer.status_code == 200, answer.text
        node: str = answer.json()["worker_node"]
        return node


@pytest.mark.slow  # starts a whole berth up
def test_the_default_is_the_seeds_ordering_and_berth_is_opt_in() -> None:
    seed_node = _placed_on(None)
    berth_node = _placed_on("berth")
    assert seed_node == "node-00"  # nothing colocated: the name tie-break
    assert berth_node != seed_node  # room priced by scarcity: the largest node


def test_an_unknown_policy_is_refused_before_anything_starts() -> None:
    with pytest.raises(Invalid) as refused:
        LocalCluster(1, runtime="fake", policy="fastest")
    assert refused.value.field == "--policy" and "valid policies: seed" in str(refused.value)
    for command in ("up", "scheduler"):
        done = subprocess.run(
            [sys.executable, "-m", "berth.cli", command, "--policy", "fastest"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done
        assert done.stderr.strip().startswith("error: --policy: unknown policy 'fastest'")
        assert "Traceback" not in done.stderr
