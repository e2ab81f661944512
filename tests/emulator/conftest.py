"""Fixtures: an emulator on a free port, loaded with the cluster fixtures, and an HTTP client."""

from __future__ import annotations

import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from vgpu_emulator import RunningEmulator, run_emulator

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"


class Api:
    """A tiny JSON client: returns (status, body) and never raises on HTTP errors."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/merge-patch+json"
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type if method == "PATCH" else "application/json"}
        async with self.session.request(method, self.url + path, data=data, headers=headers) as resp:
            return resp.status, await resp.json()

    async def watch(self, path: str, count: int, timeout: float = 3.0) -> list[dict[str, Any]]:
        """Read `count` events from a watch (or fewer if the server ends the stream)."""
        events: list[dict[str, Any]] = []
        sep = "&" if "?" in path else "?"
        timeout_cfg = aiohttp.ClientTimeout(total=timeout)
        async with self.session.get(f"{self.url}{path}{sep}watch=true", timeout=timeout_cfg) as resp:
            async for line in resp.content:
                if line.strip():
                    events.append(json.loads(line))
                if len(events) >= count:
                    break
        return events


@pytest.fixture
async def running() -> AsyncIterator[RunningEmulator]:
    async with run_emulator(FIXTURES / "cluster") as emulator:
        yield emulator


@pytest.fixture
async def api(running: RunningEmulator) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(session, running.url)
