"""Blocking work moved to a thread is never left half done by a cancelled caller."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from berth.loops import to_thread_whole


def test_a_cancelled_caller_waits_for_its_thread_before_it_goes_on() -> None:
    began, done = threading.Event(), threading.Event()

    def slow() -> str:
        began.set()
        time.sleep(0.3)
        done.set()
        return "made"

    async def scenario() -> None:
        task = asyncio.create_task(to_thread_whole(slow))
        while not began.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert done.is_set()  # the thread finished before the cancellation reached here
        assert await to_thread_whole(slow) == "made"

    asyncio.run(scenario())


def test_the_threads_error_reaches_the_caller() -> None:
    def failing() -> None:
        raise OSError("no space")

    with pytest.raises(OSError, match="no space"):
        asyncio.run(to_thread_whole(failing))
