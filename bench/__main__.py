"""Run every benchmark module in this folder (files named `*_bench.py`), one after the other."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main() -> int:
    only = set(sys.argv[1:])
    here = Path(__file__).parent
    for info in sorted(pkgutil.iter_modules([str(here)]), key=lambda m: m.name):
        if not info.name.endswith("_bench") or (only and info.name not in only):
            continue
        print(f"== bench.{info.name}", flush=True)
        module = importlib.import_module(f"bench.{info.name}")
        module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
