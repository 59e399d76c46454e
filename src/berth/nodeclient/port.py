"""The node client port: how a scheduler reaches a node's authoritative admission.

A scheduler that has ranked the candidates confirms on the chosen node.  Over a network it
cannot hand the node a live owner object, so confirmation is two steps: ``admit`` reserves
under a *lease* that expires unless it is ``bind``-ed to the workload (or ``release``-d) in
time; an unbound lease simply runs out and frees what it held.  ``try_run``, ``stop`` and
``status`` (the node agent's part), and ``running`` (the ids of every workload the node runs:
what a reconciler compares the API's records with) extend this port as :class:`AgentClient`.  Node
maintenance — ``cordon`` and ``uncordon`` — is :class:`NodeMaintenance`, which every driver
in this repository implements (an agent client always does): a cordoned node refuses every
new admission (``cordoned``, the check of :data:`berth.checks.CHECKS`), advertises
``cordoned=True``, and keeps what it already holds.  Messages are plain serialisable
data (a ``Spec``, platforms, ids, reason codes), so a network driver can carry them unchanged;
an ``admit`` or a ``try_run`` is one value, an :class:`~berth.boot.AdmitOrder` or a
:class:`~berth.boot.RunOrder`, checked once when it is made (a malformed one is ``Invalid``
naming the field there), so no driver restates or re-checks its parameters.

The node is the authority for everything it is asked to hold: capacity *and* platform — a
spec for platforms the node does not run is refused (``platform_mismatch``), whatever the
scheduler's replica said.

Drivers, each beside this module: :mod:`~berth.nodeclient.local` (budgets in this process),
:mod:`~berth.nodeclient.agents` (node agents in this process) and
:mod:`~berth.nodeclient.recording` (any driver, with every refusal noted).  The suite every
driver passes is :mod:`berth.testing.nodeclient_contract`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from berth.boot import AdmitOrder, RunOrder, WorkloadLogs, WorkloadStatus
from berth.defaults import LOG_CHUNK_BYTES
from berth.ownership import Admission, Owner

__all__ = ["AgentClient", "NodeClient", "NodeMaintenance"]


class NodeClient(Protocol):
    """Admission on a named node."""

    async def admit(self, node: str, order: AdmitOrder) -> Admission:
        """Reserve ``order.spec`` on ``node`` under a lease of ``order.lease_ttl_s``, for an
        artifact built for ``order.platforms`` (empty: any) — the fields are
        :class:`~berth.boot.AdmitOrder`'s.  The reservation id, and the node's admission count
        it was taken at.

        Raises ``Refused`` (with the node's reason code — ``platform_mismatch`` when the node
        runs none of the platforms) and ``Unavailable`` when the node cannot be reached.  A
        malformed call (a non-positive ``lease_ttl_s``) is ``Invalid`` when the order is made,
        before any driver sees it.
        """
        ...

    async def bind(self, node: str, reservation_id: str, owner: Owner | str) -> None:
        """Tie the reservation's lease to ``owner`` (an owner object in-process, or a workload
        id on that node): the reservation is then released when the owner ends."""
        ...

    async def release(self, node: str, reservation_id: str) -> bool:
        """Release a reservation; idempotent (False when it was not held)."""
        ...


@runtime_checkable
class NodeMaintenance(Protocol):
    """Cordon and uncordon a named node."""

    async def cordon(self, node: str) -> bool:
        """Cordon ``node``: it admits nothing new until uncordoned (running workloads and held
        reservations stay).  Whether it changed anything (``False``: already cordoned).
        ``Unavailable`` when the node cannot be reached."""
        ...

    async def uncordon(self, node: str) -> bool:
        """Lift ``node``'s cordon; whether it changed anything."""
        ...


class AgentClient(NodeClient, NodeMaintenance, Protocol):
    """Admission plus the agent's workload operations."""

    async def try_run(self, node: str, order: RunOrder) -> str:
        """Boot ``order.boot`` on ``node`` owning a reservation of ``order.spec``; the workload
        id (the fields are :class:`~berth.boot.RunOrder`'s).

        With a ``reservation`` (a lease taken by ``admit``, e.g. a scheduler's placement) the
        workload is bound to it instead of admitted again; a refused boot releases it.

        With a ``workload_id`` (a :data:`~berth.model.Name`: the caller's record of it) the node
        boots it under that id, and the run is **idempotent by it**: asked again with an id it
        already runs or is booting, the node answers that id and boots nothing — so a caller
        whose answer was lost (``Unavailable``: the outcome is unknown) asks again safely.

        ``platforms`` as for :meth:`admit`: a node that runs none of them refuses
        (``platform_mismatch``) before it mounts or starts anything.  Raises ``Refused``
        (``boot_failed``, ``mem_exhausted``, ``platform_mismatch`` …) or ``Unavailable``.
        """
        ...

    async def stop(self, node: str, workload_id: str, *, grace_s: float | None = None) -> None:
        """Stop a workload: the graceful signal, then the kill ``grace_s`` seconds later if it
        still runs (``None``: the node runtime's configured grace); unknown or already stopped
        ids are harmless.  A malformed ``grace_s`` (not a finite number from 0 to
        :data:`~berth.node.runtime.port.MAX_STOP_GRACE_S`) is ``Invalid`` naming ``grace_s``
        and stops nothing."""
        ...

    async def status(self, node: str, workload_id: str) -> WorkloadStatus:
        """Whether ``workload_id`` runs on ``node``, ended there (and how), or is unknown."""
        ...

    async def logs(
        self, node: str, workload_id: str, offset: int = 0, limit: int = LOG_CHUNK_BYTES
    ) -> WorkloadLogs:
        """Up to ``limit`` bytes of ``workload_id``'s output on ``node`` from ``offset`` (kept
        after it ends; ``kept`` false where the node's runtime keeps none).  A malformed
        ``offset`` or ``limit`` is ``Invalid`` naming it; ``Unavailable`` when the node cannot
        be reached."""
        ...

    async def running(self, node: str) -> tuple[str, ...]:
        """The ids of every workload ``node`` runs now (booted and not yet ended), sorted: the
        node's own report, which a reconciler compares the API's records with.  A workload
        whose boot is still under way is not in it.  ``Unavailable`` when the node cannot be
        reached (the report is then unknown, never empty); ``Refused`` (``node_starting``)
        while a restarted agent is still reconciling its journal (its report would miss the
        workloads it is about to adopt)."""
        ...
