"""Where a berth cluster lives on a NATS server: its two buckets and its subject prefixes.

One value names them all, so the services, the permissions ``berth up`` writes
(:mod:`berth.service.auth`) and the tests agree; :meth:`Names.namespaced` gives a cluster
names of its own, so several share one server (tests, the benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass

from berth.nodeclient.nats_wire import PREFIX
from berth.service.routes import ROUTES_BUCKET
from berth.service.scheduler import SCHEDULER_PREFIX
from berth.store.nats import DEFAULT_BUCKET

__all__ = ["Names"]


@dataclass(frozen=True)
class Names:
    """Where a cluster lives on the server: its buckets and subject prefixes."""

    nodes_bucket: str = DEFAULT_BUCKET
    routes_bucket: str = ROUTES_BUCKET
    node_prefix: str = PREFIX
    scheduler_prefix: str = SCHEDULER_PREFIX

    @classmethod
    def namespaced(cls, namespace: str) -> Names:
        """Names private to ``namespace`` (a valid bucket name and subject token)."""
        return cls(
            nodes_bucket=f"{namespace}_nodes",
            routes_bucket=f"{namespace}_routes",
            node_prefix=f"{namespace}.node",
            scheduler_prefix=f"{namespace}.scheduler",
        )
