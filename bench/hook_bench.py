"""libvgpu.so per-call overhead: runs hook's C benchmark (`make -C hook bench`) and prints it.

The figures are interposed vs direct calls into the fake driver, measured in the same run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HOOK = Path(__file__).resolve().parent.parent / "hook"


def main() -> None:
    if shutil.which("make") is None or shutil.which("cc") is None:
        print("hook bench skipped: it needs make and a C compiler")
        return
    result = subprocess.run(
        ["make", "-s", "-C", str(HOOK), "bench"], capture_output=True, text=True, check=False
    )
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stdout.write(result.stderr)
        print(f"hook bench failed (make exit status {result.returncode})")


if __name__ == "__main__":
    main()
