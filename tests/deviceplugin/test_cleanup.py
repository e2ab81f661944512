"""Shared-region folders of gone containers are removed; live and young ones stay."""

from __future__ import annotations

import os
import time
from pathlib import Path

from vgpu_deviceplugin.cleanup import stale_folders, sweep


def test_stale_folders_needs_gone_pod_and_old_folder() -> None:
    folders = [("uid-live_a", 0.0), ("uid-gone_a", 0.0), ("uid-young_a", 950.0), ("junk", 0.0)]
    assert stale_folders(folders, {"uid-live"}, now=1000.0) == ["uid-gone_a"]


def test_sweep_removes_only_stale_folders(tmp_path: Path) -> None:
    old = time.time() - 3600
    for name in ("uid-live_a", "uid-gone_a", "uid-gone_b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.cache").write_bytes(b"0")
        os.utime(tmp_path / name, (old, old))
    (tmp_path / "uid-new_a").mkdir()
    removed = sweep(str(tmp_path), {"uid-live"}, time.time())
    assert sorted(removed) == ["uid-gone_a", "uid-gone_b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uid-live_a", "uid-new_a"]
    assert sweep(str(tmp_path / "missing"), set(), time.time()) == []
