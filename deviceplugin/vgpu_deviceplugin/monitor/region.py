"""Parse a libvgpu.so shared region (layout versions 1 and 2). Pure: bytes in, a snapshot out
(consistent_copy takes the reads it needs as a function).

Offsets are copied from hook/include/vgpu_region.h, where each one is pinned by a _Static_assert.
The two versions share the offsets this parser reads (version 2 moved a slot's claim time, which
it does not read); a device's usage is the word at offset 8 of its record in version 1 and the
sum of the slots' ledgers in version 2 (the word is 0 there). A container
started before the plugin installed a library of version 2 keeps its version-1 region until it
restarts, so the monitor reads both.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

MAGIC = 0x3147455255504756  # "VGPUREG1"
VERSIONS = (1, 2)
HEADER_SIZE, DEVICE_SIZE, SLOT_SIZE = 128, 128, 192
MAX_DEVICES, MAX_SLOTS = 16, 1024
DEVICES_OFFSET = HEADER_SIZE
SLOTS_OFFSET = DEVICES_OFFSET + MAX_DEVICES * DEVICE_SIZE
FILE_SIZE = SLOTS_OFFSET + MAX_SLOTS * SLOT_SIZE  # 198784
UUID_SET = 2

_HEADER = struct.Struct("<QIIIIIIQQQIiQQ")  # magic .. reaped_slots (80 bytes)
_DEVICE = struct.Struct("<QQQII64sQ")  # limit, used (v1), peak, sm_limit, uuid_state, uuid, oom_refusals
# pid, host_pid, generation, (v1: claimed time; v2: announcements), last_launch, used_bytes[16]
_SLOT = struct.Struct("<iiQQQ16Q")
_SLOT_CONTEXT = struct.Struct("<Q")  # context_bytes, at offset 184 of a slot
_WORD = struct.Struct("<Q")
_HIGH_WATER = struct.Struct("<I")  # slot_high_water, at offset 56 of the header
GENERATION_OFFSET = 8  # of a slot: odd while it is being claimed or released
COPY_ATTEMPTS = 4


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


def consistent_copy(read: Callable[[int, int], bytes], attempts: int = COPY_ATTEMPTS) -> bytes | bytearray:
    """The region as hook/README.md "Taking a consistent snapshot" reads it, through
    read(offset, size): a slot's copy is taken from a read with a read on each side in which its
    generation was even and the same (generations only grow, so it did not move during the copy
    between them: within one read nothing orders the generation's load against the other
    fields'). A slot that was being claimed or released waits for the next reads. After
    `attempts` reads past the second the last copies stand (a writer killed mid-change leaves a
    generation odd until the slot's next claim). The reads after the first cover the slots in
    use alone."""
    data = read(0, FILE_SIZE)
    if len(data) < FILE_SIZE or _WORD.unpack_from(data, 0)[0] != MAGIC:
        return data  # parse_region says what is wrong with it
    (high_water,) = _HIGH_WATER.unpack_from(data, 56)
    size = min(high_water, MAX_SLOTS) * SLOT_SIZE
    if size == 0:
        return data
    before = data[SLOTS_OFFSET:SLOTS_OFFSET + size]
    copy = read(SLOTS_OFFSET, size)
    if len(copy) < size:
        return data
    taken: dict[int, bytes] = {}  # slot -> the read its copy comes from
    unsettled = set(range(size // SLOT_SIZE))
    for _ in range(attempts):
        after = read(SLOTS_OFFSET, size)
        if len(after) < size:
            break
        for s in sorted(unsettled):
            at = s * SLOT_SIZE
            (g1,) = _WORD.unpack_from(before, at + GENERATION_OFFSET)
            (g2,) = _WORD.unpack_from(after, at + GENERATION_OFFSET)
            if g1 % 2 == 0 and g1 == g2:
                taken[s] = copy
                unsettled.discard(s)
        if not unsettled:
            break
        before, copy = copy, after
    taken.update((s, copy) for s in unsettled)  # never settled: the last copy stands
    # Where the copies taken are the first read's bytes (a region nobody changed meanwhile), the
    # first read is the answer: a copy of the whole file cost 90 us here.
    first = memoryview(data)[SLOTS_OFFSET:SLOTS_OFFSET + size]
    changed = {s: src for s, src in taken.items()
               if first[s * SLOT_SIZE:(s + 1) * SLOT_SIZE] != src[s * SLOT_SIZE:(s + 1) * SLOT_SIZE]}
    first.release()
    if not changed:
        return data
    region = bytearray(data)
    for s, src in changed.items():
        at = SLOTS_OFFSET + s * SLOT_SIZE
        region[at:at + SLOT_SIZE] = src[s * SLOT_SIZE:(s + 1) * SLOT_SIZE]
    return region


def parse_region(data: bytes | bytearray) -> Region:
    if len(data) < _HEADER.size:
        raise RegionError(f"{len(data)} bytes is shorter than the header")
    (magic, version, header_size, device_size, slot_size, max_devices, max_slots, file_size,
     _devices_offset, _slots_offset, high_water, _creator, _created, reaped) = _HEADER.unpack_from(data, 0)
    if magic == 0:
        raise RegionNotReady("header not written yet")
    found = (magic, version, header_size, device_size, slot_size, max_devices, max_slots, file_size)
    sizes = (HEADER_SIZE, DEVICE_SIZE, SLOT_SIZE, MAX_DEVICES, MAX_SLOTS, FILE_SIZE)
    if magic != MAGIC or version not in VERSIONS or found[2:] != sizes:
        raise RegionError(f"unknown layout (magic, version, sizes) {found}; this monitor reads "
                          f"{(MAGIC, VERSIONS, *sizes)}")
    if len(data) < FILE_SIZE:
        raise RegionError(f"file has {len(data)} bytes, the layout needs {FILE_SIZE}")
    slots = []
    ledgers = [0] * MAX_DEVICES  # every slot's, a freed one's too (libvgpu counts them all)
    for s in range(min(high_water, MAX_SLOTS)):
        slot = _SLOT.unpack_from(data, slot_lock_offset(s))
        pid, host_pid, _generation, _unread, last_launch, *used = slot
        (context,) = _SLOT_CONTEXT.unpack_from(data, slot_lock_offset(s) + 184)
        ledgers = [total + held for total, held in zip(ledgers, used, strict=True)]
        if pid != 0:
            slots.append(ProcessSlot(s, pid, host_pid, last_launch, tuple(used), context))
    devices = []
    for d in range(MAX_DEVICES):
        record = _DEVICE.unpack_from(data, DEVICES_OFFSET + d * DEVICE_SIZE)
        limit, device_total, peak, sm, state, raw_uuid, oom = record
        if state != UUID_SET:
            continue
        uuid = raw_uuid.split(b"\0", 1)[0].decode("ascii", errors="replace")
        used_bytes = device_total if version == 1 else ledgers[d]
        devices.append(DeviceUsage(d, uuid, limit, used_bytes, peak, sm, oom))
    return Region(tuple(devices), tuple(slots), reaped)
