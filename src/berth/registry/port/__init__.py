"""The registry ports: what the API and the schedulers record beside the node states.

Small ports, a module each, each with an in-process driver (:mod:`berth.registry.memory`, the
embedded API and tests) and a NATS one (:mod:`berth.registry.nats`,
:mod:`berth.registry.nats_routes`), and one contract suite both pass
(:mod:`berth.testing.registry_contract`):

* :mod:`~berth.registry.port.workloads` — :class:`WorkloadRegistry`: every workload the API
  placed and booted, its states, the watched copy the reconciler reads (:class:`RecordIndex`);
* :mod:`~berth.registry.port.claims` — :class:`IdentityClaims` (one running workload per
  identity) and :class:`IdempotencyKeys` (one create per idempotency key);
* :mod:`~berth.registry.port.images` — :class:`ImageRegistry`: named images as layer chains;
* :mod:`~berth.registry.port.lease` — :class:`LeaderLease`: one holder at a time of a
  cluster-wide job;
* :mod:`~berth.registry.port.routes` — :class:`RouteRegistry`: which node holds each placed
  workload, followed by every scheduler.

Their names are gathered here, so a caller imports the vocabulary from
``berth.registry.port``; each rule is written once, in its own module.  The values are the
ports' vocabulary; the API's answers are built from them (:mod:`berth.api.schemas`).
"""

from berth.registry.port.claims import (
    CLAIM_PENDING_S,
    Claim,
    Holds,
    IdempotencyKeys,
    IdentityClaims,
    IdentityTaken,
    KeyClaim,
    Replaceable,
)
from berth.registry.port.images import Image, ImageLayer, ImageRegistry
from berth.registry.port.lease import LeaderLease
from berth.registry.port.routes import Route, RouteEvent, RouteListener, RouteRegistry, RouteWatch
from berth.registry.port.workloads import (
    ENDED_STATES,
    LIVE_STATES,
    MAX_HISTORY,
    WORKLOAD_ID,
    HistoryEvent,
    RecordIndex,
    StoredWorkload,
    Workload,
    WorkloadRegistry,
    WorkloadState,
    new_workload_id,
    with_event,
)

__all__ = [
    "CLAIM_PENDING_S",
    "ENDED_STATES",
    "LIVE_STATES",
    "MAX_HISTORY",
    "WORKLOAD_ID",
    "Claim",
    "HistoryEvent",
    "Holds",
    "IdempotencyKeys",
    "IdentityClaims",
    "IdentityTaken",
    "Image",
    "ImageLayer",
    "ImageRegistry",
    "KeyClaim",
    "LeaderLease",
    "RecordIndex",
    "Replaceable",
    "Route",
    "RouteEvent",
    "RouteListener",
    "RouteRegistry",
    "RouteWatch",
    "StoredWorkload",
    "Workload",
    "WorkloadRegistry",
    "WorkloadState",
    "new_workload_id",
    "with_event",
]
