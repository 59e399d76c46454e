"""The embedded cluster: N in-process node agents over the in-memory store, one scheduler.

berth's default needs no server: this module starts a heterogeneous set of agents (sizes and
platforms cycle through a few classes, so placement has real choices to make), each
publishing to one :class:`~berth.store.memory.MemoryStore`, with a
:class:`~berth.scheduler.multinode.ClusterScheduler` in front.  ``run(request, boot)`` places and
boots for real: the seed's walk over the ranked candidates, each attempt being the chosen
agent's ``try_run`` (mount, boot, admit owned by the workload, stop on refusal — the node
core's one lifecycle, :mod:`berth.node.core`).  Node sizes are
:data:`~berth.node.classes.EMBEDDED_CLASSES`, beside the simulator's in one module.

Agents here read load through fixed idle readings unless ``live_monitors=True``: N agents in
one process share one machine, so live monitors would all measure the same host.  The hard
budget — the part that must never be exceeded — is enforced for real either way.

A cluster has at most :data:`MAX_EMBEDDED_NODES` agents (they share one process), and its
constructor and ``run`` validate their arguments before starting anything.  When boots fail,
``run``'s ``NoCapacity`` says why per node — ``boot_failed: command not found: 'nope'`` —
not only the reason code.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal

from berth.boot import RunOrder
from berth.defaults import HEARTBEAT_S
from berth.errors import Invalid, NoCapacity
from berth.events.port import EventSink
from berth.model import Request, checked_platforms
from berth.node.agent import Agent
from berth.node.budget import IDLE
from berth.node.classes import EMBEDDED_CLASSES, NodeClass
from berth.node.config import AgentConfig, AgentSection, NodeSection
from berth.node.runtime import BootSpec, WorkloadHandle
from berth.nodeclient.agents import AgentNodes
from berth.ownership import Refused
from berth.scheduler.decision import Confirmed
from berth.scheduler.multinode import ClusterScheduler
from berth.scheduler.policy import Policy
from berth.store.memory import MemoryStore
from berth.validation import shown

__all__ = ["MAX_EMBEDDED_NODES", "NODE_CLASSES", "EmbeddedCluster", "embedded_configs"]

MAX_EMBEDDED_NODES = 1000
"""The most agents one embedded cluster runs (all in this process)."""

NODE_CLASSES: tuple[NodeClass, ...] = EMBEDDED_CLASSES
"""The embedded cluster's sizes, cycled in order (:data:`berth.node.classes.EMBEDDED_CLASSES`)."""
DEFAULT_PLATFORMS = ("linux/amd64", "linux/amd64", "linux/arm64")


def embedded_configs(
    nodes: int,
    *,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    runtime: Literal["process", "fake"] = "process",
    heartbeat_s: float = HEARTBEAT_S,
) -> list[AgentConfig]:
    """Configurations for ``nodes`` agents, cycling through sizes and ``platforms``."""
    if (
        isinstance(nodes, bool)
        or not isinstance(nodes, int)
        or not 1 <= nodes <= MAX_EMBEDDED_NODES
    ):
        raise Invalid(
            f"must be a whole number from 1 to {MAX_EMBEDDED_NODES}, got {shown(nodes)}",
            field="nodes",
        )
    if not checked_platforms(platforms):
        raise Invalid("must list at least one platform", field="platforms")
    if runtime not in ("process", "fake"):
        raise Invalid(f"must be 'process' or 'fake', got {shown(runtime)}", field="runtime")
    configs = []
    sizes = itertools.cycle(NODE_CLASSES)
    kinds = itertools.cycle(platforms)
    for index in range(nodes):
        size = next(sizes)
        configs.append(
            AgentConfig(
                node=NodeSection(
                    name=f"node-{index:02d}",
                    platform=next(kinds),
                    labels={"class": size.name},
                ),
                budget=size.budget_section(),
                agent=_agent_section(runtime, heartbeat_s),
            )
        )
    return configs


def _agent_section(runtime: Literal["process", "fake"], heartbeat_s: float) -> AgentSection:
    try:
        return AgentSection(runtime=runtime, heartbeat_s=heartbeat_s, stop_grace_s=1.0)
    except Invalid as error:  # name the argument, not the config key it sets
        raise Invalid(error.message, field=error.field) from None


class EmbeddedCluster:
    """In-process agents + memory store + scheduler.  ``async with EmbeddedCluster(...)``."""

    def __init__(
        self,
        configs: Sequence[AgentConfig],
        *,
        live_monitors: bool = False,
        policy: Policy | None = None,
        events: EventSink | None = None,
    ) -> None:
        if isinstance(configs, str | bytes) or not isinstance(configs, Sequence):
            raise Invalid(f"expected a list of AgentConfig, got {shown(configs)}", field="configs")
        if len(configs) > MAX_EMBEDDED_NODES:
            raise Invalid(
                f"at most {MAX_EMBEDDED_NODES} agents, got {len(configs)}", field="configs"
            )
        for index, config in enumerate(configs):
            if not isinstance(config, AgentConfig):
                raise Invalid(
                    f"expected an AgentConfig, got {shown(config)}", field=f"configs.{index}"
                )
        if not isinstance(live_monitors, bool):
            raise Invalid(
                f"expected true or false, got {shown(live_monitors)}", field="live_monitors"
            )
        if policy is not None and not callable(getattr(policy, "order", None)):
            raise Invalid(f"{shown(policy)} is not a placement policy", field="policy")
        names = [config.node.name for config in configs]
        if len(set(names)) != len(names):
            raise Invalid(f"node names must be unique, got {names}", field="nodes")
        self.store = MemoryStore()
        self.client = AgentNodes()
        self.agents: dict[str, Agent] = {}
        for config in configs:
            agent = Agent.from_config(
                config, self.store, readings=None if live_monitors else IDLE, events=events
            )
            self.agents[agent.name] = agent
            self.client.add(agent)
        self.scheduler = ClusterScheduler(self.store, self.client, policy=policy)

    @classmethod
    def of_size(cls, nodes: int, **options: object) -> EmbeddedCluster:
        """``nodes`` heterogeneous agents (see :func:`embedded_configs`)."""
        live = options.pop("live_monitors", False)
        unknown = set(options) - {"platforms", "runtime", "heartbeat_s"}
        if unknown:
            raise Invalid(f"unknown option(s) {', '.join(sorted(unknown))}", field="options")
        configs = embedded_configs(nodes, **options)  # type: ignore[arg-type]
        return cls(configs, live_monitors=live)  # type: ignore[arg-type]

    async def start(self) -> None:
        for agent in self.agents.values():
            await agent.start()

    async def stop(self) -> None:
        for agent in self.agents.values():
            await agent.stop()
        for agent in self.agents.values():
            aclose = getattr(agent.runtime, "aclose", None)
            if aclose is not None:
                await aclose()
        self.scheduler.close()

    async def __aenter__(self) -> EmbeddedCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def run(self, request: Request, boot: BootSpec) -> Confirmed[WorkloadHandle]:
        """Place ``request`` and boot ``boot`` on the first candidate that admits it.

        The result is the booted workload; ``node``, ``rank``, ``colocated_bytes`` and the
        ``refusals`` met on the way say how it was placed.  When every node refuses,
        ``NoCapacity`` gives each node's reason with its detail (``boot_failed: command not
        found: 'nope'``)."""
        if not isinstance(request, Request):
            raise Invalid(f"expected a Request, got {shown(request)}", field="request")
        if not isinstance(boot, BootSpec):
            raise Invalid(f"expected a BootSpec, got {shown(boot)}", field="boot")
        spec = request.spec
        if spec is None:
            raise Invalid("running a workload needs its resources (an instance type)", field="spec")
        details: dict[str, str] = {}
        order = RunOrder(spec, request.layers, boot, request.platforms)

        async def try_run(node: str) -> WorkloadHandle:
            try:
                return await self.agents[node].try_run(order)
            except Refused as refused:
                if refused.detail:
                    details[node] = f"{refused.reason}: {refused.detail}"
                raise

        try:
            return await self.scheduler.place(
                spec,
                request.layers,
                try_run,
                request.platforms,
                request.preferred_node,
                request.avoid_nodes,
            )
        except NoCapacity as error:
            if not details:
                raise
            reasons = {node: details.get(node, reason) for node, reason in error.reasons.items()}
            causes = "; ".join(sorted(set(details.values())))
            raise NoCapacity(f"{error}: {causes}", reasons) from None
