"""Workload events: a node's ends and restarts pushed to the API — the port and its drivers."""

from berth.events.memory import MemoryEvents
from berth.events.port import EventFeed, EventSink, WorkloadEvent

__all__ = ["EventFeed", "EventSink", "MemoryEvents", "WorkloadEvent"]
