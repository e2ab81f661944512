"""`vgpuctl demo` (filled in below as the chain lands)."""

from __future__ import annotations

import argparse

from vgpuctl.output import Style


def run_demo(args: argparse.Namespace, style: Style) -> int:
    from vgpuctl.main import UsageError

    raise UsageError("the demo is not assembled yet")
