"""The one test owner: a reservation's owner whose end the test decides.

A reservation is held for an owner — anything with ``add_done_callback``
(:class:`~berth.ownership.Owner`): a task, a future, a process — and lives exactly as long as
it.  :class:`ManualOwner` is the owner a test ends by hand (:meth:`ManualOwner.end`), from
any thread: the budget's stress tests end owners while other threads admit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ManualOwner"]


class ManualOwner:
    """An owner whose end the test decides: callbacks run when :meth:`end` is called (at
    once, for a callback added after it ended), each with the owner, each once."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[Any], object]] = []
        self._lock = threading.Lock()
        self.ended = False

    def done(self) -> bool:
        return self.ended

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None:
        with self._lock:
            if not self.ended:
                self._callbacks.append(fn)
                return
        fn(self)

    def end(self) -> None:
        """End the owner (idempotent): every callback added so far runs now, in order."""
        with self._lock:
            self.ended = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)
