"""``berth scheduler --policy`` / ``berth up --policy``: the service's schedulers rank with the
named policy (``berth up``'s default: ``berth``, what the demo sells), and a bad name is one
line naming the flag; ``berth up``'s nodes carry the labels and zones it is given.

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
def test_berth_up_ranks_with_berth_by_default_and_the_seed_on_request() -> None:
    default_node = _placed_on(None)
    seed_node = _placed_on("seed")
    assert seed_node == "node-00"  # nothing colocated: the name tie-break
    assert default_node != seed_node  # berth: room priced by scarcity, the largest node


@pytest.mark.slow  # starts a whole berth up
def test_nodes_carry_the_labels_and_zones_berth_up_is_given() -> None:
    with (
        LocalCluster(
            3,
            heartbeat_s=0.5,
            runtime="fake",
            http=("127.0.0.1", 0),
            zones=2,
            labels={"rack": "r1"},
        ) as up,
        api_client(up) as client,
    ):
        nodes = {node["name"]: node["labels"] for node in client.get("/v1/nodes").json()["items"]}
    zones = {name: labels["zone"] for name, labels in nodes.items()}
    assert zones == {"node-00": "a", "node-01": "b", "node-02": "a"}  # dealt out in turn
    assert all(labels["rack"] == "r1" for labels in nodes.values())


def test_bad_zones_or_labels_are_refused_naming_the_flag() -> None:
    for options, field, words in (
        ({"zones": 4}, "--zones", "from 0 to the number of nodes (3), got 4"),
        ({"zones": 2, "labels": {"zone": "x"}}, "--label", "both set the 'zone' label"),
        ({"labels": {"bad key": "v"}}, "--label", "whitespace"),
    ):
        with pytest.raises(Invalid) as refused:
            LocalCluster(3, runtime="fake", **options)
        assert refused.value.field == field and words in str(refused.value), refused.value


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


def test_a_label_without_a_value_is_one_line_naming_the_flag() -> None:
    for flags, words in (
        (["--label", "rack"], "error: --label: expected KEY=VALUE, got 'rack'"),
        (["--label", "a=1", "--label", "a=2"], "error: --label: 'a' is given twice"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "berth.cli", "up", "--runtime", "fake", *flags],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2 and done.stderr.strip() == words, done
