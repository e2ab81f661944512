"""The GPU backend interface the plugin is written against."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

# Callback for "this GPU (uuid) went unhealthy"; "*" means every GPU.
OnUnhealthy = Callable[[str], None]
ALL_GPUS = "*"


class GpuError(RuntimeError):
    """GPU discovery or health checking failed; the message says what to check."""


@dataclass(frozen=True)
class GpuDevice:
    """One physical GPU. `memory_mib` is the total; `index` is the NVML index (filters use it)."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    minor: int


class GpuBackend(Protocol):
    def discover(self) -> list[GpuDevice]:
        """All GPUs, ordered as upstream registers them (by minor number). Raises GpuError."""
        ...

    async def watch_health(self, on_unhealthy: OnUnhealthy, stop: asyncio.Event) -> None:
        """Call `on_unhealthy(uuid)` for each health event until `stop` is set."""
        ...
