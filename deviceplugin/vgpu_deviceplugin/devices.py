"""The virtual devices each resource advertises to the kubelet, and the node register. Pure.

Per physical GPU:

* count: `split` devices ``<UUID>-<i>`` (upstream ids);
* memory: ``floor(MiB / gpuMemoryFactor)`` devices ``<index>-<i>`` (the short legacy ids: HEAD's
  ``<UUID>-memory-<i>`` is 3x longer and pushes 8 big GPUs past the kubelet's 4 MiB limit);
* cores: ``int(100 * deviceCoreScaling)`` devices ``<UUID>-core-<i>``.

The kubelet drops a ListAndWatch message over 4 MiB without a word and the resource stays at 0,
so the memory list is capped to fit, with a warning naming the gpuMemoryFactor that would fit.
The ids themselves carry no meaning: the real GPU choice comes from the pod annotations.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from vgpu_formats.annotations import DeviceInfo, device_type
from vgpu_formats.list_and_watch import HEALTHY, MESSAGE_LIMIT, UNHEALTHY, digit_ranges, numbered_list_bytes

from vgpu_deviceplugin.api import deviceplugin_pb2 as pb
from vgpu_deviceplugin.config import Settings
from vgpu_deviceplugin.gpus import GpuDevice


class ResourceKind(enum.Enum):
    COUNT = "count"
    MEMORY = "memory"
    CORES = "cores"

    def resource_name(self, settings: Settings) -> str:
        names = settings.names
        return {ResourceKind.COUNT: names.count, ResourceKind.MEMORY: names.memory,
                ResourceKind.CORES: names.cores}[self]


@dataclass(frozen=True)
class Advertised:
    """One ListAndWatch message, serialized (what goes on the wire), and what building it had to say.

    Kept as bytes: as a protobuf object, 200k memory entries would cost the plugin ~25 MB of RSS.
    """

    payload: bytes
    warning: str | None = None

    @property
    def size(self) -> int:
        return len(self.payload)

    @property
    def response(self) -> pb.ListAndWatchResponse:
        return pb.ListAndWatchResponse.FromString(self.payload)


def visible_gpus(gpus: list[GpuDevice], settings: Settings) -> list[GpuDevice]:
    """GPUs minus the node-config `filterdevices` (by UUID or NVML index)."""
    return [g for g in gpus if g.uuid not in settings.filter_uuids and g.index not in settings.filter_indexes]


def memory_units(gpu: GpuDevice, settings: Settings) -> int:
    return gpu.memory_mib // settings.memory_factor


def advertise(
    kind: ResourceKind, gpus: list[GpuDevice], health: Mapping[str, bool], settings: Settings
) -> Advertised:
    """The full device list for `kind`; `health` maps GPU uuid -> healthy (missing = healthy)."""
    warning = None
    per_gpu: list[tuple[GpuDevice, int]]
    if kind is ResourceKind.COUNT:
        per_gpu = [(g, settings.split_count) for g in gpus]
    elif kind is ResourceKind.CORES:
        per_gpu = [(g, settings.cores_per_gpu) for g in gpus]
    else:
        per_gpu = [(g, memory_units(g, settings)) for g in gpus]
        per_gpu, warning = _cap_memory(per_gpu, health, settings)
    chunks = [
        _encode_numbered(_id_prefix(kind, gpu), units, HEALTHY if health.get(gpu.uuid, True) else UNHEALTHY)
        for gpu, units in per_gpu
    ]
    return Advertised(payload=b"".join(chunks), warning=warning)


def _id_prefix(kind: ResourceKind, gpu: GpuDevice) -> str:
    """Device ids are this prefix + a number 0..units-1."""
    if kind is ResourceKind.COUNT:
        return f"{gpu.uuid}-"
    if kind is ResourceKind.CORES:
        return f"{gpu.uuid}-core-"
    return f"{gpu.index}-"


def _encode_numbered(prefix: str, units: int, health: str) -> bytes:
    """Wire bytes of repeated Device{ID=prefix+i, health}, field 1 of ListAndWatchResponse.

    Hand-encoded, one join per digit count so the loop runs in C: 650k `devices.add()` calls take
    ~0.8 s of the event loop, this ~50 ms. Every length is < 128 (ids <= 63 bytes), so each
    length is one byte.
    """
    tail = b"\x12" + bytes([len(health)]) + health.encode()
    raw_prefix = prefix.encode()
    out = []
    for digits, low, high in digit_ranges(units):
        id_len = len(raw_prefix) + digits
        head = b"\x0a" + bytes([id_len + 2 + len(tail)]) + b"\x0a" + bytes([id_len]) + raw_prefix
        numbers = " ".join(map(str, range(low, high))).encode().split(b" ")
        out.append(head + (tail + head).join(numbers) + tail)
    return b"".join(out)


def _cap_memory(
    per_gpu: list[tuple[GpuDevice, int]], health: Mapping[str, bool], settings: Settings
) -> tuple[list[tuple[GpuDevice, int]], str | None]:
    """Shrink the memory list to fit MESSAGE_LIMIT (sized without building it: 655k entries is slow)."""
    size = sum(numbered_list_bytes(len(_id_prefix(ResourceKind.MEMORY, g)), n,
                                   HEALTHY if health.get(g.uuid, True) else UNHEALTHY) for g, n in per_gpu)
    if size <= MESSAGE_LIMIT:
        return per_gpu, None
    ratio = MESSAGE_LIMIT / size
    capped = [(g, int(n * ratio)) for g, n in per_gpu]
    total_mib = sum(g.memory_mib for g, _ in per_gpu)
    fits = max(1, sum(n for _, n in capped))
    factor = -(-total_mib // fits)  # ceiling
    return capped, (
        f"memory resource {settings.names.memory}: {sum(n for _, n in per_gpu)} devices would exceed the "
        f"kubelet's 4 MiB ListAndWatch limit (it would then advertise 0); advertising "
        f"{sum(n for _, n in capped)}. Set gpuMemoryFactor to {factor} or more in the device-config "
        f"ConfigMap (now {settings.memory_factor})"
    )


def node_register(gpus: list[GpuDevice], health: Mapping[str, bool], settings: Settings) -> list[DeviceInfo]:
    """The `volcano.sh/node-vgpu-register` records (devmem not scaled, as upstream)."""
    return [
        DeviceInfo(
            uuid=g.uuid,
            count=settings.split_count,
            devmem=memory_units(g, settings),
            type=device_type(g.name),
            health=health.get(g.uuid, True),
            mode=settings.mode,
        )
        for g in gpus
    ]
