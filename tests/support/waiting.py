"""Waiting for something asynchronous to happen, without betting on how fast the machine is.

CI runs on a fresh, possibly busy machine: a test that sleeps a fixed time and then asserts that
something happened fails there. Tests poll for the state they need instead; the timeout is
generous because only a failing test ever waits it out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vgpu_emulator import wait_until

TIMEOUT = 20.0


async def eventually(check: Callable[[], Any], timeout: float = TIMEOUT, what: str = "condition") -> Any:
    """Poll until `check()` is truthy and return its value; fail naming `what` after `timeout` s."""
    return await wait_until(check, what, timeout, AssertionError)


def eventually_sync(check: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
                    interval: float = 0.2) -> Any:
    """`eventually` for synchronous tests (kubectl, helm, files): the e2e suite on a real server."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


async def eventually_awaited(check: Callable[[], Awaitable[bool]], timeout: float = TIMEOUT,
                             what: str = "condition", interval: float = 0.2) -> None:
    """`eventually` for a check that is itself a coroutine (one that talks to a server)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)
