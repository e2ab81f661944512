"""Run every benchmark module in this folder (files named `*_bench.py`), one after the other.

    python -m bench                 # all of them
    python -m bench NAME_bench ...  # only these
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main() -> int:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.endswith("_bench"))
    only = sys.argv[1:]
    if any(arg in ("-h", "--help") for arg in only):
        print(f"{(__doc__ or '').strip()}\n\nbenchmarks: {' '.join(names)}")
        return 0
    # A misspelt name would otherwise run nothing and still exit 0.
    unknown = sorted(set(only) - set(names))
    if unknown:
        print(f"unknown benchmark(s): {' '.join(unknown)}; known: {' '.join(names)}", file=sys.stderr)
        return 2
    for name in names:
        if only and name not in only:
            continue
        print(f"== bench.{name}", flush=True)
        importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
