"""libvgpu.so, the fake driver and the demo program, as `make -C hook all fakes` builds them, for
tests that run real processes under the hook. Built when missing; where they cannot be, the test
is unavailable (tests.support.required: skipped, or failed under `make test`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support.required import unavailable

ROOT = Path(__file__).resolve().parents[2]
# Where `make -C hook all fakes` builds (vgpuctl.chain.HOOK_BUILD, not imported: it pulls in the operator).
HOOK_BUILD = Path(os.environ.get("VGPU_HOOK_BUILD", ROOT / "hook" / "build"))
LIBVGPU = HOOK_BUILD / "libvgpu.so"
FAKE_DRIVER = HOOK_BUILD / "fake"
REGION_READER = HOOK_BUILD / "vgpu-region"
DEMO = HOOK_BUILD / "vgpu-demo-alloc"


def ensure_built() -> None:
    """Builds the hook's outputs when any is missing (only into the repository's hook/build)."""
    missing = [str(p) for p in (LIBVGPU, FAKE_DRIVER / "libcuda.so", REGION_READER, DEMO) if not p.exists()]
    if not missing:
        return
    if HOOK_BUILD != ROOT / "hook" / "build" or shutil.which("make") is None:
        unavailable(f"{', '.join(missing)} missing (`make -C hook all fakes` builds them)")
    built = subprocess.run(["make", "-C", str(ROOT / "hook"), "all", "fakes"],
                           capture_output=True, text=True, timeout=300, check=False)
    if built.returncode != 0:
        unavailable(f"`make -C hook all fakes` failed: {built.stderr.strip()[-2000:]}")
