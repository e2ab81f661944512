"""Find the containers' region files and read them (I/O: files and fcntl only).

Layout on the host: <containers-dir>/<pod-uid>_<container>/<something>.cache, the region file the
device plugin mounts at /tmp/vgpu in each container, and vgpu.env beside it, the settings file
the plugin wrote (what it assigned; see assigned.py).
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from vgpu_deviceplugin.allocate import SETTINGS_FILE_NAME
from vgpu_deviceplugin.monitor.assigned import Assigned, parse_assigned
from vgpu_deviceplugin.monitor.once import warn_once
from vgpu_deviceplugin.monitor.region import (
    Region,
    RegionError,
    RegionNotReady,
    consistent_copy,
    parse_region,
    slot_lock_offset,
)

log = logging.getLogger(__name__)
_FLOCK = "hhqqi4x"  # struct flock on Linux x86-64/arm64: type, whence, start, len, pid


@dataclass(frozen=True)
class ContainerRegion:
    pod_uid: str
    container: str
    path: str
    region: Region
    live_slots: frozenset[int]
    assigned: Assigned | None = None  # None: no settings file naming GPUs (an older plugin's)


SETTINGS_MAX_BYTES = 4096  # what libvgpu.so reads of it (hook/src/settings.h)


def read_assigned(directory: Path) -> Assigned | None:
    """The plugin's settings file in `directory`, if it is one: a regular file (never followed),
    writable by its owner alone, as the plugin writes it and libvgpu.so requires."""
    try:
        fd = os.open(directory / SETTINGS_FILE_NAME,
                     os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o022:
            return None
        return parse_assigned(os.pread(fd, SETTINGS_MAX_BYTES, 0).decode("utf-8", errors="replace"))
    except OSError:
        return None
    finally:
        os.close(fd)


def split_dir_name(name: str) -> tuple[str, str] | None:
    """`<pod-uid>_<container>` -> (uid, container); container names cannot contain '_'."""
    uid, sep, container = name.partition("_")
    return (uid, container) if sep and uid and container else None


def live_slots(fd: int, region: Region) -> frozenset[int]:
    """Slots whose owner still holds its lock byte (F_GETLK only: a reader must never lock)."""
    alive = set()
    for slot in region.slots:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, slot_lock_offset(slot.slot), 1, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        if struct.unpack(_FLOCK, answer)[0] != fcntl.F_UNLCK:
            alive.add(slot.slot)
    return frozenset(alive)


def read_container(directory: Path) -> ContainerRegion | None:
    names = split_dir_name(directory.name)
    if names is None:
        return None
    try:
        caches = sorted(p for p in directory.iterdir() if p.name.endswith(".cache") and p.is_file())
    except FileNotFoundError:
        return None  # removed since the scan listed it (the plugin's cleanup of gone pods)
    if not caches:
        return None  # no CUDA process has started yet
    path = caches[0]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        log.warning("cannot open %s: %s", path, exc)
        return None
    try:
        # No more than the region's size: a read of 1 MiB cost 82 us against 7 (the buffer).
        region = parse_region(consistent_copy(lambda at, size: os.pread(fd, size, at)))
        return ContainerRegion(names[0], names[1], str(path), region, live_slots(fd, region),
                               read_assigned(directory))
    except RegionNotReady:
        return None
    except RegionError as exc:
        # A tenant can write anything into its region file: said once, not at every scrape.
        warn_once(log, f"{path}: {exc}", f"{path}: {exc}")
        return None
    finally:
        os.close(fd)


def scan(containers_dir: str) -> list[ContainerRegion]:
    root = Path(containers_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            got = read_container(entry)
            if got is not None:
                found.append(got)
    return found
