"""A mock GPU backend for tests, benches and the demo: `--mock-gpus 8xA100-80GB` and friends.

Spec grammar: items joined by ``,``; each item ``<count>x<model>`` with a known model below, or
``<count>x<any-name>:<MiB>``. UUIDs are derived from the node name and index, so they are stable
across restarts and different on each node. `MockBackend.from_register_annotation` rebuilds the
GPUs of an existing node (same UUIDs) from its `volcano.sh/node-vgpu-register` value.
"""

from __future__ import annotations

import asyncio
import re
import uuid

from vgpu_formats.annotations import DEVICE_TYPE_PREFIX, decode_node_register

from vgpu_deviceplugin.gpus.base import GpuDevice, GpuError, OnUnhealthy

# model -> (NVML name, total MiB as NVML reports it)
KNOWN_MODELS: dict[str, tuple[str, int]] = {
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", 81920),
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", 40960),
    "H100-80GB": ("NVIDIA H100 80GB HBM3", 81559),
    "H200": ("NVIDIA H200", 143771),
    "L4": ("NVIDIA L4", 23034),
    "A10": ("NVIDIA A10", 23028),
    "T4": ("Tesla T4", 15360),
    "V100-32GB": ("Tesla V100-SXM2-32GB", 32768),
    "RTX4090": ("NVIDIA GeForce RTX 4090", 24564),
}
_ITEM = re.compile(r"^(\d+)x([^:,]+?)(?::(\d+))?$")
_NAMESPACE = uuid.UUID("8c6a3d3e-0a5b-4f7e-9d55-7b1d8e1f0a42")


def parse_mock_spec(spec: str, node_name: str) -> list[GpuDevice]:
    """`8xA100-80GB` -> eight GpuDevice. Raises GpuError naming the bad item."""
    gpus: list[GpuDevice] = []
    for item in (part.strip() for part in spec.split(",")):
        match = _ITEM.match(item)
        if not match:
            raise GpuError(f"--mock-gpus item {item!r}: expected <count>x<model> or <count>x<name>:<MiB>, "
                           f"e.g. 8xA100-80GB or 2xMyGPU:16384")
        count, model, mib = int(match[1]), match[2], match[3]
        if mib is not None:
            name, memory = model, int(mib)
        elif model in KNOWN_MODELS:
            name, memory = KNOWN_MODELS[model]
        else:
            raise GpuError(f"--mock-gpus item {item!r}: unknown model {model!r}; known: "
                           f"{', '.join(sorted(KNOWN_MODELS))}, or give the size as {model}:<MiB>")
        for _ in range(count):
            index = len(gpus)
            gpu_uuid = f"GPU-{uuid.uuid5(_NAMESPACE, f'{node_name}/{index}')}"
            gpus.append(GpuDevice(index=index, uuid=gpu_uuid, name=name, memory_mib=memory, minor=index))
    if not gpus:
        raise GpuError("--mock-gpus is empty; give e.g. 2xRTX4090")
    return gpus


class MockBackend:
    """GPUs from a list; tests flip health with `mark_unhealthy`."""

    def __init__(self, gpus: list[GpuDevice]) -> None:
        self._gpus = list(gpus)
        self._events: asyncio.Queue[str] | None = None
        self._pending: list[str] = []

    @classmethod
    def from_register_annotation(cls, text: str, memory_factor: int = 1) -> MockBackend:
        gpus = [
            GpuDevice(index=i, uuid=d.uuid, name=d.type.removeprefix(DEVICE_TYPE_PREFIX),
                      memory_mib=d.devmem * memory_factor, minor=i)
            for i, d in enumerate(decode_node_register(text))
        ]
        return cls(gpus)

    def discover(self) -> list[GpuDevice]:
        return list(self._gpus)

    def mark_unhealthy(self, gpu_uuid: str) -> None:
        if self._events is None:
            self._pending.append(gpu_uuid)
        else:
            self._events.put_nowait(gpu_uuid)

    async def watch_health(self, on_unhealthy: OnUnhealthy, stop: asyncio.Event) -> None:
        self._events = asyncio.Queue()
        for gpu_uuid in self._pending:
            self._events.put_nowait(gpu_uuid)
        self._pending.clear()
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                got = asyncio.ensure_future(self._events.get())
                done, _ = await asyncio.wait({got, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if got in done:
                    on_unhealthy(got.result())
                else:
                    got.cancel()
        finally:
            stopped.cancel()
            self._events = None
