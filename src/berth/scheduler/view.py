"""What a scheduler shows of the cluster to those who read it (the HTTP API).

A :class:`ClusterView` is a scheduler's replica of the node states, with its own confirmed
reservations applied, and its explanation of a request against them — what the API lists as
nodes, what decides a workload's node is gone, and what ``explain`` answers.  The API is
written against this port, not against the scheduler that implements it
(:class:`~berth.scheduler.multinode.ClusterScheduler`, in every scheduler process and in the
embedded cluster).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from berth.model import Request
from berth.scheduler.explain import Explanation
from berth.state import NodeState

__all__ = ["ClusterView"]


class ClusterView(Protocol):
    """A scheduler's view of the nodes, and its explanations."""

    def states(self) -> Mapping[str, NodeState]:
        """The latest state per live node, with this scheduler's own reservations applied."""
        ...

    def explain(self, request: Request) -> Explanation:
        """Every node's verdict on ``request`` and the ranking the placement would walk."""
        ...
