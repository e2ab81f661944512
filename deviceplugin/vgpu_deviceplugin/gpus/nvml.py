"""NVML backend (nvidia-ml-py): discovery and Xid health events, as upstream checks them."""

from __future__ import annotations

import asyncio
import os
import time
from types import ModuleType
from typing import Any

from vgpu_deviceplugin.gpus.base import ALL_GPUS, GpuDevice, GpuError, OnUnhealthy

# Xids that are application faults, not GPU faults (upstream list, HEAD adds 109).
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
_WAIT_MS = 5000


def _load_pynvml() -> ModuleType:
    import pynvml

    return pynvml


def _disabled_xids(env: str) -> tuple[bool, frozenset[int]]:
    """DP_DISABLE_HEALTHCHECKS: "all"/"xids" turns checks off; a comma list adds ignored Xids."""
    items = {x.strip() for x in env.split(",") if x.strip()}
    if items & {"all", "xids"}:
        return True, frozenset()
    return False, frozenset(int(x) for x in items if x.isdigit())


class NvmlBackend:
    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml
        self._uuids: list[str] = []

    def _lib(self) -> Any:
        if self._nvml is None:
            self._nvml = _load_pynvml()
        return self._nvml

    def discover(self) -> list[GpuDevice]:
        nvml = self._lib()
        try:
            nvml.nvmlInit()
            gpus = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpus.append(GpuDevice(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
                    minor=int(nvml.nvmlDeviceGetMinorNumber(handle)),
                ))
        except nvml.NVMLError as exc:
            raise GpuError(
                f"NVML: {exc}. Is the NVIDIA driver visible in the plugin container (runtimeClass "
                f"nvidia, NVIDIA_VISIBLE_DEVICES=all)? For a node without GPUs use --mock-gpus."
            ) from exc
        # The scheduler uses list positions as device ids: keep upstream's minor-number order.
        gpus.sort(key=lambda g: g.minor)
        self._uuids = [g.uuid for g in gpus]
        return gpus

    async def watch_health(self, on_unhealthy: OnUnhealthy, stop: asyncio.Event) -> None:
        disabled, extra = _disabled_xids(os.environ.get("DP_DISABLE_HEALTHCHECKS", ""))
        if disabled:
            await stop.wait()
            return
        loop = asyncio.get_running_loop()

        def report(gpu_uuid: str) -> None:
            loop.call_soon_threadsafe(on_unhealthy, gpu_uuid)

        # nvmlEventSetWait blocks, so the loop runs in a thread and checks `stop` every 5 s.
        await asyncio.to_thread(self._event_loop, report, stop, IGNORED_XIDS | extra)

    def _event_loop(self, report: OnUnhealthy, stop: asyncio.Event, ignored: frozenset[int]) -> None:
        nvml = self._lib()
        wanted = (nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
                  | nvml.nvmlEventTypeSingleBitEccError)
        event_set = nvml.nvmlEventSetCreate()
        try:
            for gpu_uuid in self._uuids:
                try:
                    handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
                    supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                    nvml.nvmlDeviceRegisterEvents(handle, wanted & supported, event_set)
                except nvml.NVMLError as exc:
                    if getattr(exc, "value", None) != nvml.NVML_ERROR_NOT_SUPPORTED:
                        report(gpu_uuid)
            while not stop.is_set():
                try:
                    event = nvml.nvmlEventSetWait(event_set, _WAIT_MS)
                except nvml.NVMLError as exc:
                    if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                        continue
                    report(ALL_GPUS)
                    time.sleep(_WAIT_MS / 1000)  # a broken event set must not spin a core
                    continue
                if event.eventType != nvml.nvmlEventTypeXidCriticalError:
                    continue
                if int(event.eventData) in ignored:
                    continue
                try:
                    report(_text(nvml.nvmlDeviceGetUUID(event.device)))
                except nvml.NVMLError:
                    # Xid 79 and the like: the GPU fell off the bus and has no UUID to give. The
                    # watcher must live on, and which GPU it was is unknown: all are marked.
                    report(ALL_GPUS)
        finally:
            nvml.nvmlEventSetFree(event_set)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
