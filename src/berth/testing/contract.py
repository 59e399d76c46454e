"""What the contract suites (``berth.testing.*_contract``) share: one check, run on what a
driver opened for it, in a fresh event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

__all__ = ["run_check"]

T = TypeVar("T")


def run_check(
    opening: Callable[[], AbstractAsyncContextManager[T]],
    check: Callable[[T], Awaitable[object]],
    timeout_s: float | None = None,
) -> None:
    """Enter what ``opening`` gives, in a fresh event loop, and run ``check`` on it — within
    ``timeout_s`` when given — before it is closed."""

    async def main() -> None:
        async with opening() as opened:
            await asyncio.wait_for(check(opened), timeout_s)

    asyncio.run(main())
