"""Parse a libvgpu.so shared region (layout version 1). Pure: bytes in, a snapshot out.

Offsets are copied from hook/include/vgpu_region.h, where each one is pinned by a _Static_assert.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0x3147455255504756  # "VGPUREG1"
VERSION = 1
HEADER_SIZE, DEVICE_SIZE, SLOT_SIZE = 128, 128, 192
MAX_DEVICES, MAX_SLOTS = 16, 1024
DEVICES_OFFSET = HEADER_SIZE
SLOTS_OFFSET = DEVICES_OFFSET + MAX_DEVICES * DEVICE_SIZE
FILE_SIZE = SLOTS_OFFSET + MAX_SLOTS * SLOT_SIZE  # 198784
UUID_SET = 2

_HEADER = struct.Struct("<QIIIIIIQQQIiQQ")  # magic .. reaped_slots (80 bytes)
_DEVICE = struct.Struct("<QQQII64sQ")  # limit, used, peak, sm_limit, uuid_state, uuid, oom_refusals
_SLOT = struct.Struct("<iiQQQ16Q")  # pid, host_pid, generation, claimed, last_launch, used_bytes[16]
_SLOT_CONTEXT = struct.Struct("<Q")  # context_bytes, at offset 184 of a slot


class RegionError(ValueError):
    """The file is not a region this monitor understands; the message says what differs."""


class RegionNotReady(RegionError):
    """The creator has not finished writing the header yet (magic still 0): try again later."""


@dataclass(frozen=True)
class DeviceUsage:
    index: int  # the container's i-th GPU (the <i> of CUDA_DEVICE_MEMORY_LIMIT_<i>)
    uuid: str
    limit_bytes: int
    used_bytes: int
    peak_bytes: int
    sm_limit_percent: int
    oom_refusals: int


@dataclass(frozen=True)
class ProcessSlot:
    slot: int
    pid: int
    host_pid: int
    last_launch_unix_ns: int
    used_bytes: tuple[int, ...]
    # Of used_bytes, the context and driver memory libvgpu measured through NVML (all devices).
    context_bytes: int = 0


@dataclass(frozen=True)
class Region:
    devices: tuple[DeviceUsage, ...]
    slots: tuple[ProcessSlot, ...]  # slots with a pid (live or dead; see scan.live_slots)
    reaped_slots: int


def slot_lock_offset(slot: int) -> int:
    """The byte whose fcntl write lock says the slot's owner is alive."""
    return SLOTS_OFFSET + slot * SLOT_SIZE


def parse_region(data: bytes) -> Region:
    if len(data) < _HEADER.size:
        raise RegionError(f"{len(data)} bytes is shorter than the header")
    (magic, version, header_size, device_size, slot_size, max_devices, max_slots, file_size,
     _devices_offset, _slots_offset, high_water, _creator, _created, reaped) = _HEADER.unpack_from(data, 0)
    if magic == 0:
        raise RegionNotReady("header not written yet")
    expected = (MAGIC, VERSION, HEADER_SIZE, DEVICE_SIZE, SLOT_SIZE, MAX_DEVICES, MAX_SLOTS, FILE_SIZE)
    found = (magic, version, header_size, device_size, slot_size, max_devices, max_slots, file_size)
    if found != expected:
        raise RegionError(f"unknown layout (magic, version, sizes) {found}; this monitor reads {expected}")
    if len(data) < FILE_SIZE:
        raise RegionError(f"file has {len(data)} bytes, the layout needs {FILE_SIZE}")
    devices = []
    for d in range(MAX_DEVICES):
        record = _DEVICE.unpack_from(data, DEVICES_OFFSET + d * DEVICE_SIZE)
        limit, used, peak, sm, state, raw_uuid, oom = record
        if state != UUID_SET:
            continue
        uuid = raw_uuid.split(b"\0", 1)[0].decode("ascii", errors="replace")
        devices.append(DeviceUsage(d, uuid, limit, used, peak, sm, oom))
    slots = []
    for s in range(min(high_water, MAX_SLOTS)):
        slot = _SLOT.unpack_from(data, slot_lock_offset(s))
        pid, host_pid, _generation, _claimed, last_launch, *used = slot
        (context,) = _SLOT_CONTEXT.unpack_from(data, slot_lock_offset(s) + 184)
        if pid != 0:
            slots.append(ProcessSlot(s, pid, host_pid, last_launch, tuple(used), context))
    return Region(tuple(devices), tuple(slots), reaped)
