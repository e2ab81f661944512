"""Warnings said once per key: the monitor is scraped every few seconds, and a line per
container per scrape would bury everything else in the log."""

from __future__ import annotations

import logging

_said: set[str] = set()
LIMIT = 10_000  # containers come and go: bounded, forgotten all at once past it


def warn_once(log: logging.Logger, key: str, message: str) -> None:
    """Log `message` at warning level unless a message under `key` was logged already."""
    if key in _said:
        return
    if len(_said) >= LIMIT:
        _said.clear()
    _said.add(key)
    log.warning("%s", message)
