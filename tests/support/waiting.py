"""Waiting for something asynchronous to happen, without betting on how fast the machine is.

CI runs on a fresh, possibly busy machine: a test that sleeps a fixed time and then asserts that
something happened fails there. Tests poll for the state they need instead; the timeout is
generous because only a failing test ever waits it out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

TIMEOUT = 20.0


async def eventually(check: Callable[[], Any], timeout: float = TIMEOUT, what: str = "condition") -> Any:
    """Poll until `check()` is truthy and return its value; fail naming `what` after `timeout` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.02)
