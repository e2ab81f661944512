"""A tiny async JSON client for the Kubernetes API, used by the emulator's tests and the e2e suite."""

from __future__ import annotations

import json
import ssl
from typing import Any

import aiohttp


class Api:
    """A tiny async JSON client: returns (status, body) and never raises on HTTP errors. The same
    class talks to the real server and to the emulator, so one test suite runs against both."""

    def __init__(self, session: aiohttp.ClientSession, url: str,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.session = session
        self.url = url
        self.ssl = ssl_context if ssl_context is not None else False

    async def call(self, method: str, path: str, body: Any = None,
                   content_type: str = "application/merge-patch+json") -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type if method == "PATCH" else "application/json"}
        async with self.session.request(method, self.url + path, data=data, headers=headers,
                                        ssl=self.ssl) as resp:
            return resp.status, await resp.json(content_type=None)

    async def watch(self, path: str, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Read `count` events from a watch (fewer if the server ends the stream first)."""
        events: list[dict[str, Any]] = []
        sep = "&" if "?" in path else "?"
        async with self.session.get(f"{self.url}{path}{sep}watch=true", ssl=self.ssl,
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                return [{"type": "HTTP", "object": {"code": resp.status}}]
            async for line in resp.content:
                if line.strip():
                    events.append(json.loads(line))
                if len(events) >= count:
                    break
        return events
