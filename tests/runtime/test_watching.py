"""The list-then-watch loop against a server that answers every watch badly: it backs off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu_operator.runtime.watching import list_and_watch

BACKOFF = (0.05, 0.1, 0.2)


class Server:
    """Lists fine; every watch ends at once, with an ERROR event or with nothing."""

    def __init__(self, error: bool) -> None:
        self.error = error
        self.lists = self.watches = 0

    async def relist(self) -> str:
        self.lists += 1
        return "7"

    async def watch(self, kind: str, version: str, **_: Any) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        if self.error:
            yield {"type": "ERROR", "object": {"code": 500, "message": "etcdserver: request timed out"}}


@pytest.mark.parametrize("error", [True, False])
async def test_a_watch_that_ends_at_once_backs_off_instead_of_spinning(error: bool) -> None:
    server = Server(error)
    stop = asyncio.Event()
    loop = asyncio.create_task(list_and_watch(
        server, "Node", "nodes", server.relist, lambda type_, obj: None, BACKOFF, stop=stop))  # type: ignore[arg-type]
    await asyncio.sleep(1.0)
    stop.set()
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
    # 0.05 + 0.1 + 0.2 + 0.2 ...: about 6 turns in a second; before, hundreds of thousands.
    assert 3 <= server.watches <= 8
    assert server.lists == (server.watches if error else 1)
