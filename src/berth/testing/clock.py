"""The one fake clock of berth's tests: time that moves only when the test moves it.

berth's timed parts take their clock as an argument (``clock: Callable[[], float]`` — lease
deadlines in the budget, the assume cache's and the replica index's time to live, the memory
store's expiry, the monitor's filter), so a test passes a :class:`FakeClock` and sets or
advances it instead of sleeping or patching ``time``.  It reads as a number of seconds, like
``time.monotonic`` or ``time.time``: which one it stands for is the caller's choice of start.
"""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A clock reading ``now`` (seconds) until the test sets it or calls :meth:`advance`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
