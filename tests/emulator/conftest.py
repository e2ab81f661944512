"""Fixtures: an emulator on a free port, loaded with the cluster fixtures, and an HTTP client."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from vgpu_emulator import RunningEmulator, run_emulator

from tests.support.api import Api

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
async def running() -> AsyncIterator[RunningEmulator]:
    async with run_emulator(FIXTURES / "cluster") as emulator:
        yield emulator


@pytest.fixture
async def api(running: RunningEmulator) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(session, running.url)
