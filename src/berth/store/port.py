"""The cluster state store port: every node's latest ``NodeState``, replicated to readers.

A node *publishes* its snapshot (on every reservation change and on a heartbeat); every
scheduler *reads* the latest snapshot per node, either all at once (:meth:`StateStore.states`)
or as a stream of changes it folds into its own index (:meth:`StateStore.subscribe`).  A node
that leaves — explicitly, or by not re-publishing within the store's time-to-live — disappears
for every reader.  The store is eventually consistent by contract: readers may see a node's
older snapshot for a while, never a mix of two, and never a generation older than one they
have already seen.

This module is the port; :mod:`berth.store.memory` is the embedded in-process driver, and
:mod:`berth.testing.store_contract` the suite every driver passes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from berth.state import NodeState

__all__ = ["StateEvent", "StateListener", "StateStore"]


@dataclass(frozen=True)
class StateEvent:
    """A change seen by readers: a node's new snapshot (``put``) or its departure."""

    kind: Literal["put", "delete"]
    node: str
    state: NodeState | None = None


StateListener = Callable[[StateEvent], None]


class StateStore(Protocol):
    """Replicated latest-snapshot-per-node storage."""

    async def publish(self, state: NodeState) -> None:
        """Make ``state`` the node's latest snapshot (older generations are ignored)."""
        ...

    async def remove(self, node: str) -> None:
        """The node leaves; idempotent."""
        ...

    async def states(self) -> dict[str, NodeState]:
        """The latest snapshot of every live node."""
        ...

    def subscribe(self, listener: StateListener) -> Callable[[], None]:
        """Call ``listener`` with every change from now on; returns an unsubscribe function.

        The listener first receives a ``put`` for every live node (the current view), so a
        reader that subscribes needs no separate initial load.
        """
        ...
