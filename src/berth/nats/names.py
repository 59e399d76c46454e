"""Where a berth cluster lives on a NATS server: its buckets, its stream and its subjects.

One value names them all (the API's two buckets, ``berth_api`` and ``berth_leases``, are
not namespaced: one API per server), so the services, the permissions ``berth up`` writes
(:mod:`berth.nats.auth`) and the tests agree; :meth:`Names.namespaced` gives a cluster
names of its own, so several share one server (tests, the benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "API_BUCKET",
    "EVENTS_PREFIX",
    "EVENTS_STREAM",
    "LEASE_BUCKET",
    "NODES_BUCKET",
    "NODE_PREFIX",
    "ROUTES_BUCKET",
    "SCHEDULER_PREFIX",
    "Names",
]

NODES_BUCKET = "berth_nodes"  # every node's NodeState (berth.store.nats)
ROUTES_BUCKET = "berth_routes"  # which node holds each workload (berth.registry.nats_routes)
API_BUCKET = "berth_api"  # the API's workloads, images and identity claims (berth.registry)
LEASE_BUCKET = (
    "berth_leases"  # who does a cluster-wide job now, e.g. reconcile (registry.nats_lease)
)
NODE_PREFIX = "berth.node"  # berth.node.<node>.<operation> (berth.nodeclient.nats_server)
SCHEDULER_PREFIX = "berth.scheduler"  # the placement port's queue group (scheduler.nats_server)
EVENTS_STREAM = "berth_events"  # the nodes' workload events (berth.events.nats)
EVENTS_PREFIX = "berth.events"  # berth.events.<node>: where a node publishes its events


@dataclass(frozen=True)
class Names:
    """Where a cluster lives on the server: its buckets and subject prefixes."""

    nodes_bucket: str = NODES_BUCKET
    routes_bucket: str = ROUTES_BUCKET
    node_prefix: str = NODE_PREFIX
    scheduler_prefix: str = SCHEDULER_PREFIX
    events_stream: str = EVENTS_STREAM
    events_prefix: str = EVENTS_PREFIX

    @classmethod
    def namespaced(cls, namespace: str) -> Names:
        """Names private to ``namespace`` (a valid bucket name and subject token)."""
        return cls(
            nodes_bucket=f"{namespace}_nodes",
            routes_bucket=f"{namespace}_routes",
            node_prefix=f"{namespace}.node",
            scheduler_prefix=f"{namespace}.scheduler",
            events_stream=f"{namespace}_events",
            events_prefix=f"{namespace}.events",
        )
