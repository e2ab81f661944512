"""The whole-chain tests run the real operator, device plugin and binder against the emulator."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _quiet_components(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
