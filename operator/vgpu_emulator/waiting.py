"""Polling until asynchronous components reach a state, without betting on the machine's speed.

One loop for everyone who drives components against the emulator: `vgpuctl demo` (through
`vgpuctl.chain.wait_until`, raising its ChainError) and the tests (`tests/support/waiting.py`,
raising AssertionError). Each caller names the exception that reads right where it fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

INTERVAL = 0.02


async def wait_until(check: Callable[[], Any], what: str, timeout: float,
                     error: type[Exception] = TimeoutError) -> Any:
    """Poll until `check()` is truthy and return its value; raise `error` naming `what` after
    `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if loop.time() > deadline:
            raise error(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(INTERVAL)
