"""The node's GPUs as NVML sees them (whole cards, every process): what upstream's monitor
exports as HostGPUMemoryUsage and HostCoreUtilization, read on each scrape."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostGpu:
    index: int  # NVML index, upstream's `deviceidx`
    uuid: str
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_percent: int | None  # None where NVML does not support it (some MIG / unified memory)


class HostGpuSource(Protocol):
    def sample(self) -> list[HostGpu]:
        """The node's GPUs now; [] when NVML is not usable (logged, never raised)."""
        ...


class NvmlHostGpus:
    """pynvml, loaded and initialised on the first scrape (the monitor starts without a driver
    too); a failed init is retried on the next scrape and logged once until it works again."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml
        self._initialised = False
        self._failing = False
        self._lock = threading.Lock()  # scrapes run in threads (asyncio.to_thread)

    def sample(self) -> list[HostGpu]:
        with self._lock:
            try:
                nvml = self._init()
                return [gpu for index in range(nvml.nvmlDeviceGetCount())
                        if (gpu := self._read(nvml, index)) is not None]
            except Exception as exc:  # NVMLError, or no pynvml / libnvidia-ml: a scrape never fails
                if not self._failing:
                    log.warning("NVML not usable (%s): HostGPUMemoryUsage and HostCoreUtilization "
                                "are left out until it is", exc)
                self._failing = True
                return []

    def _init(self) -> Any:
        if self._nvml is None:
            import pynvml  # only where the monitor runs: a scrape on a node without GPUs skips it

            self._nvml = pynvml
        if not self._initialised:
            self._nvml.nvmlInit()
            self._initialised = True
        if self._failing:
            log.info("NVML usable again: host GPU metrics are back")
            self._failing = False
        return self._nvml

    @staticmethod
    def _read(nvml: Any, index: int) -> HostGpu | None:
        """One card; a card NVML cannot read is skipped (logged), as upstream does."""
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                utilization: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != nvml.NVML_ERROR_NOT_SUPPORTED:
                    raise
                utilization = None
            uuid, name = _text(nvml.nvmlDeviceGetUUID(handle)), _text(nvml.nvmlDeviceGetName(handle))
            return HostGpu(index, uuid, name, int(memory.used), int(memory.total), utilization)
        except nvml.NVMLError as exc:
            log.warning("NVML cannot read GPU %d: %s", index, exc)
            return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
