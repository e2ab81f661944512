"""Fixtures every suite shares."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    # Tests call the commands' main() in-process, which sets the root logger's level and handler
    # for the whole process (`--log-level error` would hide a later test's warnings from caplog).
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
