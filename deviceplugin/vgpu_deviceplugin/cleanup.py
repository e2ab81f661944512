"""Keeping the host's shared-region folders bounded.

Allocate creates `<cache-root>/containers/<pod-uid>_<container>` per container; nothing else
removes them, so a busy node would collect one folder (and a 200 KB region file) per container
ever run. A folder goes when no pod on this node has its UID and it has not been touched for
`GRACE` seconds (a pod that is being created may not be in the watch yet). Upstream's monitor
does the same with the same grace.

A container has only its region file mounted (not the folder), so the one way it can hold more
of the host's disk is to grow that file: every `TRIM_SECONDS` a region file larger than the
region is cut back to the region's size (libvgpu.so maps exactly that much; what lies beyond is
nobody's). A hard cap needs `--cache-root` on a size-limited filesystem (the chart's
`devicePlugin.cacheRoot`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterable

from vgpu_deviceplugin.monitor.region import FILE_SIZE as REGION_SIZE
from vgpu_deviceplugin.monitor.scan import split_dir_name
from vgpu_deviceplugin.pod_cache import PodCache

log = logging.getLogger(__name__)
GRACE_SECONDS = 300.0
PERIOD_SECONDS = 300.0
TRIM_SECONDS = 10.0


def stale_folders(folders: Iterable[tuple[str, float]], live_uids: set[str], now: float,
                  grace: float = GRACE_SECONDS) -> list[str]:
    """Names of `(name, mtime)` folders to remove. Pure."""
    stale = []
    for name, mtime in folders:
        names = split_dir_name(name)  # the monitor's reading of the same folder names
        if names is not None and names[0] not in live_uids and now - mtime > grace:
            stale.append(name)
    return stale


def sweep(containers_dir: str, live_uids: set[str], now: float) -> list[str]:
    try:
        entries = [(e.name, e.stat().st_mtime) for e in os.scandir(containers_dir) if e.is_dir()]
    except FileNotFoundError:
        return []
    removed = []
    for name in stale_folders(entries, live_uids, now):
        try:
            shutil.rmtree(os.path.join(containers_dir, name))
            removed.append(name)
        except OSError as exc:
            log.warning("cannot remove %s/%s: %s", containers_dir, name, exc)
    return removed


def trim(containers_dir: str, limit: int = REGION_SIZE) -> list[str]:
    """Cut every region file longer than `limit` back to it; the paths cut, relative."""
    trimmed = []
    try:
        folders = [e.path for e in os.scandir(containers_dir) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue  # removed meanwhile
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_size > limit:
                    os.truncate(entry.path, limit)
                    trimmed.append(os.path.relpath(entry.path, containers_dir))
            except OSError as exc:
                log.warning("cannot trim %s: %s", entry.path, exc)
    return trimmed


async def cleanup_loop(cache_root: str, pods: PodCache, stop: asyncio.Event) -> None:
    """Every TRIM_SECONDS cut grown region files back; every PERIOD_SECONDS sweep gone containers."""
    containers_dir = os.path.join(cache_root, "containers")
    next_sweep = 0.0
    while not stop.is_set():
        trimmed = await asyncio.to_thread(trim, containers_dir)
        if trimmed:
            log.warning("region files grown past the region's %d bytes, cut back: %s", REGION_SIZE,
                        ", ".join(trimmed))
        if time.monotonic() >= next_sweep:
            next_sweep = time.monotonic() + PERIOD_SECONDS
            current = pods.pods()
            if current is not None:  # never decide from an unsynced cache
                live = {p.get("metadata", {}).get("uid", "") for p in current}
                removed = await asyncio.to_thread(sweep, containers_dir, live, time.time())
                if removed:
                    log.info("removed shared-region folders of gone containers: %s", ", ".join(removed))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), TRIM_SECONDS)
