"""A test that needs something built (the hook, promtool): under `make test` (VGPU_REQUIRE_E2E=1)
its absence fails the run; elsewhere the test is skipped with the reason."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(message: str) -> NoReturn:
    if os.environ.get("VGPU_REQUIRE_E2E"):
        pytest.fail(message)
    pytest.skip(message)
