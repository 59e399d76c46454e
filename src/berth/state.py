"""``NodeState``: the snapshot a node publishes, and the seed's two formulas on it.

Every node advertises a ``NodeState``; snapshots are replicated to every scheduler and are
*approximate by design* — eventually consistent, possibly stale.  A scheduler uses them only
to filter and rank; the node's own admission (:mod:`berth.node.budget`) is the sole
authority, so a node that no longer fits simply refuses at confirmation time.

The snapshot carries load *and* ceilings, so fit is judged without the target's config: a
``NodeState`` is a :class:`berth.checks.NodeView` (its ``oc_*`` properties flatten the
optional β_max stage, docs/design.md §1.3, an absent ceiling reading ``+inf``), and

``fits(state, spec)`` — the seed's predicate — walks the one table of checks,
:data:`berth.checks.CHECKS` (platform, hard ``mem``/``disk``, β_max ceilings, soft load;
``<=`` everywhere, so an exact fill fits), the same table node admission and the engine walk.

``first_failed_check`` returns the reason code of the first check that fails (``mem_exhausted``
…), shared with node admission, so explanations and refusals speak the same language.

``colocation_score(state, layers) = Σ size(L)`` over the request's layers ``L`` whose id the
node advertises as mounted.

A snapshot arrives from the network, so it is validated with the bounded types of
:mod:`berth.model`: the node's and every layer's name is a ``Name`` (a NUL or a space in a
node name would corrupt the engine's name order), byte amounts are ``ByteCount`` (int64, as
the engine stores them), rates and loads finite ``ByteRate`` floats, cores ``Cores``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from typing import Annotated

from pydantic import Field, Strict, StrictBool, StrictInt

from berth.checks import CHECKS, Check, Demand, first_failed
from berth.model import (
    MAX_BYTES,
    ByteCount,
    ByteRate,
    Cores,
    Fraction,
    Labels,
    Layer,
    Name,
    Names,
    Spec,
)
from berth.platform import Platform
from berth.validation import BerthModel

__all__ = [
    "NodeState",
    "Overcommit",
    "colocation_score",
    "first_failed_check",
    "fits",
    "running_digest",
]

Counter = Annotated[StrictInt, Field(ge=0, le=MAX_BYTES)]  # int64, as the engine keeps it
Timestamp = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
Amount = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
MAX_SNAPSHOT_LAYERS = 1_000_000  # a node cannot hold more layers than this; bounds a bad peer
LayerIds = Annotated[Names, Field(max_length=MAX_SNAPSHOT_LAYERS)]
RunningDigest = Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{32}$")]


def running_digest(workload_ids: Iterable[str]) -> str:
    """The digest of a node's report of what it runs (its workload ids, in any order): 128
    bits of BLAKE2b over the sorted ids, each ended by a newline.  A node advertises it in
    every snapshot (:attr:`NodeState.running_digest`), so a reconciler that holds the report
    with that digest need not ask the node again (:mod:`berth.api.reconciler`)."""
    digest = hashlib.blake2b(digest_size=16)
    for workload_id in sorted(workload_ids):
        digest.update(workload_id.encode())
        digest.update(b"\n")
    return digest.hexdigest()


class Overcommit(BerthModel):
    """The β_max stage: soft amounts reserved by admitted workloads against their ceilings.

    ``ceiling = k_max * total`` per soft resource; a workload fits only while
    ``reserved + spec <= ceiling``.  Bounds cumulative over-commit, which the instantaneous
    load check alone cannot (a burst of admissions lands before the load rises).  A ceiling of
    ``None`` leaves that resource unbounded.
    """

    # Sums and products (k_max * cap, Σ reserved specs) may exceed any one value's bound:
    # finite and non-negative is the rule here.
    vcpus_reserved: Amount = 0.0
    vcpus_ceiling: Amount | None = None
    disk_bw_reserved: Amount = 0.0
    disk_bw_ceiling: Amount | None = None
    net_bw_reserved: Amount = 0.0
    net_bw_ceiling: Amount | None = None


class NodeState(BerthModel):
    """One node's advertised snapshot (see the module docstring for its meaning).

    Sizes are bytes, bandwidths bytes/s, ``cpu_load`` the smoothed busy fraction (0..1) of the
    whole machine, ``cpu_capacity`` cores.  ``generation`` increases with every publication of
    the same node, so a replica can drop out-of-order updates; ``admitted`` counts the
    reservations the node had taken when it published (a scheduler's assumed reservation with
    ``Admission.seq <= admitted`` is accounted for by this snapshot).  ``layers`` are the ids of
    mounted image layers; ``cached_layers`` those recently unmounted but still on local disk.
    ``mem_max``/``disk_max`` are the hard budget totals (for utilisation-aware policies).
    ``cordoned`` says an operator cordoned the node: it admits no new workloads (its own
    admission refuses them, ``cordoned``; the checks filter it out), running ones go on.
    ``running_digest`` is :func:`running_digest` of the ids the node runs when it published
    (its ``running`` report); ``None`` while a restarted agent still reconciles its journal,
    and from agents that predate it — then a reconciler asks the node.
    """

    node: Name
    platform: Platform
    generation: Counter = 0
    admitted: Counter = 0
    published_at: Timestamp = 0.0
    labels: Labels = Field(default_factory=dict)
    mem_free: ByteCount
    disk_free: ByteCount
    mem_max: ByteCount | None = None
    disk_max: ByteCount | None = None
    cpu_load: Fraction = 0.0
    cpu_capacity: Cores
    cpu_max_load: Fraction = 1.0
    disk_bw_load: ByteRate = 0.0
    disk_bw_ceiling: ByteRate
    net_bw_load: ByteRate = 0.0
    net_bw_ceiling: ByteRate
    layers: LayerIds = frozenset()
    cached_layers: LayerIds = frozenset()
    overcommit: Overcommit | None = None
    cordoned: StrictBool = False
    running_digest: RunningDigest | None = None

    @property
    def mem_total(self) -> int:
        """``mem_max`` when advertised, else the free memory (nothing known to be used)."""
        return self.mem_max if self.mem_max is not None else self.mem_free

    @property
    def disk_total(self) -> int:
        """``disk_max`` when advertised, else the free disk."""
        return self.disk_max if self.disk_max is not None else self.disk_free

    # The β_max stage flattened for the checks (berth.checks.NodeView): a node that does not
    # run the stage, or leaves a resource unbounded, has nothing reserved against +inf.
    @property
    def oc_vcpus_reserved(self) -> float:
        over = self.overcommit
        return 0.0 if over is None else over.vcpus_reserved

    @property
    def oc_vcpus_ceiling(self) -> float:
        over = self.overcommit
        return math.inf if over is None or over.vcpus_ceiling is None else over.vcpus_ceiling

    @property
    def oc_disk_bw_reserved(self) -> float:
        over = self.overcommit
        return 0.0 if over is None else over.disk_bw_reserved

    @property
    def oc_disk_bw_ceiling(self) -> float:
        over = self.overcommit
        return math.inf if over is None or over.disk_bw_ceiling is None else over.disk_bw_ceiling

    @property
    def oc_net_bw_reserved(self) -> float:
        over = self.overcommit
        return 0.0 if over is None else over.net_bw_reserved

    @property
    def oc_net_bw_ceiling(self) -> float:
        over = self.overcommit
        return math.inf if over is None or over.net_bw_ceiling is None else over.net_bw_ceiling


def first_failed_check(
    state: NodeState,
    spec: Spec | None,
    platforms: Sequence[Platform] = (),
    *,
    checks: Sequence[Check] = CHECKS,
) -> str | None:
    """The reason code of the first check ``state`` fails (``None`` if it fits).

    ``spec=None`` asks only about the platform; ``platforms`` empty accepts any.
    """
    failed = first_failed(state, Demand.of(spec, platforms), checks)
    return None if failed is None else failed.code


def fits(
    state: NodeState,
    spec: Spec | None,
    platforms: Sequence[Platform] = (),
    *,
    checks: Sequence[Check] = CHECKS,
) -> bool:
    """The seed's ``fits/2`` (and the platform): every check of the table passes."""
    return first_failed(state, Demand.of(spec, platforms), checks) is None


def colocation_score(state: NodeState, layers: Iterable[Layer]) -> int:
    """Bytes of ``layers`` already mounted on ``state``'s node."""
    mounted = state.layers
    return sum(layer.size for layer in layers if layer.id in mounted)
