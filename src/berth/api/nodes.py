"""The nodes as the API shows and acts on them: list, read, cordon, drain.

:class:`NodeOperations` reads the nodes from the scheduler's replica of their states (with
the live workloads the records give each) and acts on a node through its client.  **Cordon**
is the node's own (authoritative); the replica shows it shortly after.  **Drain** cordons the
node, then stops its running workloads (concurrently, each with ``grace_s`` between its
``SIGTERM`` and its ``SIGKILL``: :meth:`berth.api.stops.Stops.stop`), reporting each;
``restartable`` ones are placed and booted again from their recorded request
(:meth:`berth.api.create.Creates.replace`, not counted as a reschedule) — the cordoned node
refuses them at its own admission, so they land elsewhere — and the old record gets
``replaced_by``.
"""

from __future__ import annotations

import asyncio

from berth.api import schemas
from berth.api.create import Creates
from berth.api.records import Records, not_found
from berth.api.stops import Stops
from berth.errors import Invalid, NoCapacity, Unavailable
from berth.ownership import Refused
from berth.registry.port import ENDED_STATES, LIVE_STATES, IdentityTaken, StoredWorkload
from berth.state import NodeState

__all__ = ["NodeOperations"]


class NodeOperations:
    """What the API shows of the nodes and does to them (see the module docstring)."""

    def __init__(self, records: Records, stops: Stops, creates: Creates) -> None:
        self.records = records
        self.stops = stops
        self.creates = creates
        self.ports = records.ports

    async def node_list(self) -> list[schemas.NodeInfo]:
        states = self.ports.view.states()
        counts = await self._live_by_node()
        return [_info(states[name], counts.get(name, 0)) for name in sorted(states)]

    async def node(self, name: str) -> schemas.NodeInfo:
        state = self._state(name)
        return _info(state, (await self._live_by_node()).get(name, 0))

    async def cordon(self, name: str, cordoned: bool) -> schemas.NodeInfo:
        """Cordon or uncordon ``name`` on the node itself (authoritative), then wait briefly
        for this scheduler's replica to show it."""
        self._state(name)
        if cordoned:
            await self.ports.nodes.cordon(name)
        else:
            await self.ports.nodes.uncordon(name)
        for _ in range(40):
            state = self.ports.view.states().get(name)
            if state is None or state.cordoned == cordoned:
                break
            await asyncio.sleep(0.05)
        state = self._state(name)
        return _info(state, (await self._live_by_node()).get(name, 0), cordoned)

    async def drain(self, name: str, grace_s: float) -> schemas.DrainReport:
        """Cordon, stop every running workload (``grace_s`` each, a
        :data:`~berth.node.runtime.port.StopGrace` the body's schema checked), place
        restartable ones again."""
        await self.cordon(name, True)
        running = await self.ports.workloads.list(node=name, state="running")
        # all at once: a drain takes about one grace period, not one per workload
        items = await asyncio.gather(*(self._drain_one(w, grace_s) for w in running))
        return schemas.DrainReport(node=name, items=list(items))

    async def _drain_one(self, workload: StoredWorkload, grace_s: float) -> schemas.DrainItem:
        try:
            stopped = await self.stops.stop(workload.id, grace_s)
        except (Unavailable, Refused) as error:
            return schemas.DrainItem(
                workload_id=workload.id, outcome="failed", detail=f"could not stop it: {error}"
            )
        if stopped.state in LIVE_STATES:  # its node did not answer: the stop is kept
            return schemas.DrainItem(
                workload_id=workload.id,
                outcome="failed",
                detail=f"not stopped yet ({stopped.detail}); the stop is delivered when "
                "its node answers",
            )
        if not workload.restartable:
            return schemas.DrainItem(
                workload_id=workload.id, outcome="stopped", detail=stopped.detail or "stopped"
            )
        try:
            replacement = await self.creates.replace(
                stopped, counted=False
            )  # a drain is no failure
        except (Invalid, NoCapacity, Unavailable, Refused, IdentityTaken) as error:
            return schemas.DrainItem(
                workload_id=workload.id,
                outcome="failed",
                detail=f"stopped; not placed again: {error}",
            )
        await self.records.replaced(stopped, replacement, "drained", ENDED_STATES)
        return schemas.DrainItem(
            workload_id=workload.id,
            outcome="replaced",
            detail=f"stopped; replaced by {replacement.id} on {replacement.node}",
            new_workload_id=replacement.id,
            new_node=replacement.node,
        )

    def _state(self, name: str) -> NodeState:
        state = self.ports.view.states().get(name)
        if state is None:
            raise not_found("node", name)
        return state

    async def _live_by_node(self) -> dict[str, int]:
        """Each node's live workloads (running, pending or unknown: all hold their place)."""
        counts: dict[str, int] = {}
        for workload in await self.ports.workloads.list():
            if workload.state in LIVE_STATES:
                counts[workload.node] = counts.get(workload.node, 0) + 1
        return counts


def _info(state: NodeState, workloads: int, cordoned: bool | None = None) -> schemas.NodeInfo:
    """A node as the API shows it: its state, with ``workloads`` live workloads."""
    return schemas.NodeInfo(
        name=state.node,
        platform=str(state.platform),
        labels=dict(state.labels),
        cordoned=state.cordoned if cordoned is None else cordoned,
        mem_max=state.mem_total,
        mem_reserved=state.mem_total - state.mem_free,
        disk_max=state.disk_total,
        disk_reserved=state.disk_total - state.disk_free,
        cpu_load=state.cpu_load,
        cpu_capacity=state.cpu_capacity,
        disk_bw_load=state.disk_bw_load,
        disk_bw_ceiling=state.disk_bw_ceiling,
        net_bw_load=state.net_bw_load,
        net_bw_ceiling=state.net_bw_ceiling,
        layers=len(state.layers),
        workloads=workloads,
        published_at=state.published_at,
    )
