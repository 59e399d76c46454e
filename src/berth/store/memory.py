"""The in-memory state store: the embedded default, for one process and for tests.

Readers and writers share one dictionary, so replication is immediate; liveness is by expiry
as in a real replicated store: a snapshot not re-published within ``ttl_s`` seconds (on the
store's clock) disappears, and subscribers see a ``delete``.  Expiry is checked whenever the
store is touched (:meth:`MemoryStore.expire` runs it explicitly), which keeps the driver free
of background tasks and lets tests drive time with a fake clock; nodes are kept in order of
last publication, so the check costs only the nodes it removes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from berth.state import NodeState
from berth.store.port import StateEvent, StateListener

__all__ = ["MemoryStore"]


class MemoryStore:
    """A ``StateStore`` held in this process (thread-safe)."""

    def __init__(self, *, ttl_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.RLock()
        self._states: dict[str, NodeState] = {}
        self._seen_at: dict[str, float] = {}
        self._listeners: list[StateListener] = []

    async def publish(self, state: NodeState) -> None:
        self.publish_now(state)

    def publish_now(self, state: NodeState) -> None:
        """Synchronous ``publish`` for in-process callers (node agents, the simulator)."""
        self.expire()
        with self._lock:
            current = self._states.get(state.node)
            if current is not None and current.generation > state.generation:
                return
            self._states[state.node] = state
            self._seen_at.pop(state.node, None)  # re-insert: the dict stays oldest-first
            self._seen_at[state.node] = self._clock()
            listeners = list(self._listeners)
        self._notify(listeners, StateEvent("put", state.node, state))

    async def remove(self, node: str) -> None:
        self.remove_now(node)

    def remove_now(self, node: str) -> None:
        with self._lock:
            if self._states.pop(node, None) is None:
                return
            self._seen_at.pop(node, None)
            listeners = list(self._listeners)
        self._notify(listeners, StateEvent("delete", node))

    async def states(self) -> dict[str, NodeState]:
        return self.states_now()

    def states_now(self) -> dict[str, NodeState]:
        self.expire()
        with self._lock:
            return dict(self._states)

    def subscribe(self, listener: StateListener) -> Callable[[], None]:
        self.expire()
        with self._lock:
            self._listeners.append(listener)
            current = list(self._states.values())
        for state in current:
            listener(StateEvent("put", state.node, state))

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def expire(self) -> list[str]:
        """Drop snapshots older than the time-to-live; the nodes that disappeared."""
        if self.ttl_s is None:
            return []
        deadline = self._clock() - self.ttl_s
        gone: list[str] = []
        with self._lock:
            for node, seen in self._seen_at.items():  # oldest first: stop at the first live one
                if seen >= deadline:
                    break
                gone.append(node)
        for node in gone:
            self.remove_now(node)
        return gone

    @staticmethod
    def _notify(listeners: list[StateListener], event: StateEvent) -> None:
        for listener in listeners:
            listener(event)
