"""Output for people (tables, colour on a terminal) and for scripts (`-o json|yaml`).

Commands build plain data (dicts and lists); this module only formats it. Colour follows the
usual conventions: on only when the stream is a terminal, never when NO_COLOR is set.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

FORMATS = ("table", "json", "yaml")

_CODES = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "bold": "1", "dim": "2"}
# Severity words the commands use, and how they look.
SEVERITY_COLOUR = {"error": "red", "warning": "yellow", "info": "blue", "ok": "green"}


def use_colour(stream: TextIO, requested: bool | None = None) -> bool:
    """`requested` (from --color/--no-color) wins; else a terminal without NO_COLOR."""
    if requested is not None:
        return requested
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Style:
    """Wraps text in ANSI colour codes when enabled, and is a no-op otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, colour: str) -> str:
        code = _CODES.get(colour)
        if not self.enabled or code is None:
            return text
        return f"\x1b[{code}m{text}\x1b[0m"

    def severity(self, word: str) -> str:
        return self(word, SEVERITY_COLOUR.get(word.lower(), "bold"))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], style: Style | None = None) -> str:
    """A `kubectl get`-style table: upper-case headers, columns padded to the widest cell."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = ["   ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in cells:
        padded = [cell.ljust(w) for cell, w in zip(row, widths, strict=True)]
        if style is not None:
            # Colour after padding so escape codes do not upset the widths.
            padded = [
                style.severity(c.strip()) + " " * (len(c) - len(c.strip())) if c.strip().lower()
                in SEVERITY_COLOUR else c for c in padded
            ]
        lines.append("   ".join(padded).rstrip())
    return "\n".join(lines)


def dump(data: Any, fmt: str) -> str:
    """Machine output: stable key order as built, YAML block style, JSON indented."""
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=False, default=str)
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)
    raise ValueError(f"unknown output format {fmt!r}; use one of {', '.join(FORMATS)}")


def write(text: str, stream: TextIO | None = None) -> None:
    out = stream if stream is not None else sys.stdout
    out.write(text if text.endswith("\n") else text + "\n")
