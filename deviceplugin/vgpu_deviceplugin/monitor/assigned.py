"""What the device plugin assigned a container, from the settings file it wrote (`vgpu.env`, 0644,
mounted read-only). Pure.

The region file is the container's to write (its processes keep their counts there), so its
limits and GPU UUIDs are whatever the container left in it. The monitor reports the limits the
plugin set, and only device records of GPUs the plugin assigned; usage figures can only come
from the region.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SIZE = re.compile(r"^([0-9]+)([kKmMgG]?)$")
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


@dataclass(frozen=True)
class Assigned:
    gpus: frozenset[str]  # the UUIDs of NVIDIA_VISIBLE_DEVICES
    memory_limits: dict[int, int] = field(default_factory=dict)  # CUDA ordinal -> bytes
    sm_limits: dict[int, int] = field(default_factory=dict)  # CUDA ordinal -> percent
    sm_limit: int | None = None  # CUDA_DEVICE_SM_LIMIT, for the ordinals without their own

    def memory_limit(self, index: int) -> int:
        return self.memory_limits.get(index, 0)

    def sm_limit_of(self, index: int) -> int:
        return self.sm_limits.get(index, self.sm_limit or 0)


def parse_size(text: str) -> int | None:
    """A limit as libvgpu.so reads it: bytes, or a number with k, m or g (KiB, MiB, GiB)."""
    found = _SIZE.match(text.strip())
    return int(found.group(1)) * _SCALE[found.group(2).lower()] if found else None


def parse_assigned(text: str) -> Assigned | None:
    """The assignment in a settings file, or None when it names no GPUs (an older plugin's file,
    or not the plugin's)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line:
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    gpus = frozenset(u for u in values.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u)
    if not gpus:
        return None
    memory: dict[int, int] = {}
    cores: dict[int, int] = {}
    for name, value in values.items():
        for prefix, into in (("CUDA_DEVICE_MEMORY_LIMIT_", memory), ("CUDA_DEVICE_SM_LIMIT_", cores)):
            index = name.removeprefix(prefix)
            if index != name and index.isascii() and index.isdigit():
                size = parse_size(value) if into is memory else _percent(value)
                if size is not None:
                    into[int(index)] = size
    return Assigned(gpus, memory, cores, _percent(values.get("CUDA_DEVICE_SM_LIMIT", "")))


def _percent(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None
