"""What the API's parts work against: the ports its backend was given, as one value.

:class:`~berth.api.backend.ClusterBackend` is given a scheduler's view of the nodes, its node
client, the placement port with its release, the registries, a clock and where to count its
decisions; each of its parts (:mod:`~berth.api.decisions`, :mod:`~berth.api.records`,
:mod:`~berth.api.create`, :mod:`~berth.api.stops`, :mod:`~berth.api.nodes`) holds them as
one :class:`ApiPorts` rather than copying the ones it uses.  It is not a registry of
services: the backend builds it once, and the parts never replace what is in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from berth.nodeclient.port import AgentClient
from berth.observability.metrics import Metrics
from berth.registry.port import ImageRegistry, WorkloadRegistry
from berth.scheduler.port import ReleasingScheduler
from berth.scheduler.view import ClusterView

__all__ = ["ApiPorts"]


@dataclass(frozen=True, eq=False)
class ApiPorts:
    """The ports of one API process (see the module docstring)."""

    view: ClusterView
    """A scheduler's view: the nodes' states, its explanations."""
    nodes: AgentClient
    """The node client: admission and the workloads' operations on the nodes."""
    placements: ReleasingScheduler
    """The placement port (the queue group, or a scheduler in this process)."""
    workloads: WorkloadRegistry
    """The records, their identity claims and idempotency keys."""
    images: ImageRegistry
    clock: Callable[[], float]
    """Wall-clock seconds: the records' times, the claims' ages."""
    metrics: Metrics | None = None
    """Where the API's placements and applied events are counted (``None``: nowhere)."""
