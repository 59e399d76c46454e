"""Calling into an asyncio loop from wherever a callback runs.

An owner object's end, a process watcher's thread, a future's done callback: berth's
callbacks may run on the loop that owns the state they touch or on another thread.  The rule
for both is one: on the loop's own thread call at once, from anywhere else hand the call to
the loop (``call_soon_threadsafe``), and once the loop is gone do nothing — there is nobody
left to tell.  :func:`call_on` is that rule; the agent's wake-ups, the node client's settling
and a scheduler's replica count all use it.

:func:`to_thread_whole` is the other direction: blocking work (mounts, fsyncs) moved off the
loop to a thread, awaited so that a cancelled caller still finds it done — or failed — and
never half done while it cleans up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

__all__ = ["call_on", "to_thread_whole"]

Args = TypeVarTuple("Args")
T = TypeVar("T")


async def to_thread_whole(function: Callable[[*Args], T], *args: *Args) -> T:
    """``function(*args)`` in a thread (``asyncio.to_thread``); when the caller is cancelled
    meanwhile, the thread is waited for (its outcome dropped) before the cancellation goes
    on, so what it made is there for the caller's cleanup to undo."""
    work = asyncio.ensure_future(asyncio.to_thread(function, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await work
        raise


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
