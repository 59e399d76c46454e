"""Calling into an asyncio loop from wherever a callback runs.

An owner object's end, a process watcher's thread, a future's done callback: berth's
callbacks may run on the loop that owns the state they touch or on another thread.  The rule
for both is one: on the loop's own thread call at once, from anywhere else hand the call to
the loop (``call_soon_threadsafe``), and once the loop is gone do nothing — there is nobody
left to tell.  :func:`call_on` is that rule; the agent's wake-ups, the node client's settling
and a scheduler's replica count all use it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeVarTuple

__all__ = ["call_on"]

Args = TypeVarTuple("Args")


def call_on(
    loop: asyncio.AbstractEventLoop | None,
    callback: Callable[[*Args], object],
    *args: *Args,
) -> None:
    """``callback(*args)`` on ``loop``: at once when the caller runs on it, else scheduled
    thread-safely; nothing when the loop is gone (``None``, closed, or closing meanwhile)."""
    if loop is None or loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        callback(*args)
        return
    with contextlib.suppress(RuntimeError):  # closed since the check: nothing to do
        loop.call_soon_threadsafe(callback, *args)
