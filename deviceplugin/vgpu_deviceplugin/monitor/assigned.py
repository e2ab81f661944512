"""What the device plugin assigned a container, from the settings file it wrote (`vgpu.env`, 0644,
mounted read-only). Pure.

The region file is the container's to write (its processes keep their counts there), so its
limits and GPU UUIDs are whatever the container left in it. The monitor reports the limits the
plugin set, and a container's device records only when they are believable (`records_fit`);
usage figures can only come from the region.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SIZE = re.compile(r"^([0-9]+)([kKmMgG]?)$")
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


@dataclass(frozen=True)
class Assigned:
    """Limits as libvgpu.so applies them (hook/src/limits.c): per GPU (its index in gpus), else the
    all-device value; an SM limit of 100 or more, or GPU_CORE_UTILIZATION_POLICY=disable, is none
    (0)."""

    gpus: tuple[str, ...]  # the UUIDs of NVIDIA_VISIBLE_DEVICES
    memory_limits: dict[int, int] = field(default_factory=dict)  # GPU index -> bytes
    sm_limits: dict[int, int] = field(default_factory=dict)  # GPU index -> percent
    memory_all: int = 0  # CUDA_DEVICE_MEMORY_LIMIT
    sm_all: int = 0  # CUDA_DEVICE_SM_LIMIT
    sm_disabled: bool = False  # GPU_CORE_UTILIZATION_POLICY=disable

    def memory_limit(self, index: int) -> int:
        return self.memory_limits.get(index, self.memory_all)

    def sm_limit_of(self, index: int) -> int:
        percent = self.sm_limits.get(index, self.sm_all)
        return 0 if self.sm_disabled or percent >= 100 else percent


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
    gpus = tuple(u for u in values.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u)
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
    return Assigned(gpus, memory, cores, parse_size(values.get("CUDA_DEVICE_MEMORY_LIMIT", "")) or 0,
                    _percent(values.get("CUDA_DEVICE_SM_LIMIT", "")) or 0,
                    values.get("GPU_CORE_UTILIZATION_POLICY", "").lower() == "disable")


def _percent(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def records_fit(assigned: Assigned, records: list[tuple[int, str]]) -> str:
    """Why a container's device records (index, GPU UUID) cannot be what libvgpu.so wrote for
    this assignment, or "": record i names the i-th GPU assigned (hook/src/devices.c keeps the
    settings file's order whatever order CUDA gives the GPUs)."""
    gpus = [gpu.lower() for gpu in assigned.gpus]
    for index, uuid in records:
        if uuid.lower() not in gpus:
            return f"device {index} names GPU {uuid!r}, which the device plugin did not assign"
        if index >= len(gpus):
            return f"device {index} is past the {len(gpus)} GPU(s) assigned"
        if uuid.lower() != gpus[index]:
            return (f"device {index} names GPU {uuid!r}, but the device plugin assigned "
                    f"{assigned.gpus[index]!r} there")
    return ""
