"""How a process's run ends: SIGINT or SIGTERM, or a duration that runs out.

The agent and scheduler processes (:mod:`berth.processes.agent`,
:mod:`berth.processes.scheduler`) run until :func:`stop_event` is set, then stop gracefully:
what they promised is finished or handed back, never dropped.
"""

from __future__ import annotations

import asyncio
import signal

__all__ = ["stop_event"]


def stop_event(duration_s: float | None) -> asyncio.Event:
    """Set on SIGINT/SIGTERM or after ``duration_s`` seconds (``None``: no limit), checked
    where it entered (the CLI's ``--duration``); call inside the running loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if duration_s is not None:
        loop.call_later(duration_s, stop.set)
    return stop
