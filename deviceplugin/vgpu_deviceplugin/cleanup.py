"""Removing the shared-region folders of containers that are gone.

Allocate creates `<cache-root>/containers/<pod-uid>_<container>` per container; nothing else
removes them, so a busy node would collect one folder (and a 200 KB region file) per container
ever run. A folder goes when no pod on this node has its UID and it has not been touched for
`GRACE` seconds (a pod that is being created may not be in the watch yet). Upstream's monitor
does the same with the same grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterable

from vgpu_deviceplugin.monitor.scan import split_dir_name
from vgpu_deviceplugin.pod_cache import PodCache

log = logging.getLogger(__name__)
GRACE_SECONDS = 300.0
PERIOD_SECONDS = 300.0


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


async def cleanup_loop(cache_root: str, pods: PodCache, stop: asyncio.Event,
                       period: float = PERIOD_SECONDS) -> None:
    containers_dir = os.path.join(cache_root, "containers")
    while not stop.is_set():
        current = pods.pods()
        if current is not None:  # never decide from an unsynced cache
            live = {p.get("metadata", {}).get("uid", "") for p in current}
            removed = await asyncio.to_thread(sweep, containers_dir, live, time.time())
            if removed:
                log.info("removed shared-region folders of gone containers: %s", ", ".join(removed))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period)
