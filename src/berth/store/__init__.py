"""Replicated node state: the state store port and its drivers."""

from berth.store.memory import MemoryStore
from berth.store.port import StateEvent, StateListener, StateStore

__all__ = ["MemoryStore", "StateEvent", "StateListener", "StateStore"]
