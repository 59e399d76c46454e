"""The leader lease port: one holder at a time of a cluster-wide job (the reconciler).

:class:`LeaderLease` — **one holder at a time** of a cluster-wide job (the reconciler): taken
create-if-absent, kept by renewing it before its TTL runs out (a compare-and-set on what
the holder last wrote), lost by a holder that fails to renew in time — which then stops
acting — and taken by another once it has expired.

Its drivers: :class:`~berth.registry.memory.MemoryLease`,
:class:`~berth.registry.nats_lease.NatsLease`; its contract suite
:mod:`berth.testing.lease_contract`.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["LeaderLease"]


class LeaderLease(Protocol):
    """One holder at a time of one named job (see the module docstring).  ``ttl_s`` is how
    long a holder keeps it without renewing; a holder renews well within it (a third)."""

    @property
    def ttl_s(self) -> float: ...

    async def hold(self, holder: str) -> bool:
        """Take the lease for ``holder`` if nobody holds it, or renew it if ``holder`` does;
        whether ``holder`` holds it now (for ``ttl_s`` from this call).  ``False`` when another
        holder's lease has not expired — including after ``holder`` failed to renew in time
        and another took it.  ``Unavailable`` when the store cannot be asked: the caller
        then acts as if it did not hold it."""
        ...

    async def release(self, holder: str) -> None:
        """Give the lease up if ``holder`` holds it (a stopping service: another takes over at
        once instead of after the TTL); harmless otherwise."""
        ...
