"""What the running plugin knows right now: settings, GPUs, their health. Shared by the servers."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from vgpu_deviceplugin.allocate import Deferred
from vgpu_deviceplugin.config import Settings
from vgpu_deviceplugin.gpus import GpuDevice
from vgpu_deviceplugin.gpus.base import ALL_GPUS

log = logging.getLogger(__name__)


@dataclass
class PluginState:
    settings: Settings
    gpus: list[GpuDevice]  # visible GPUs (node-config filters applied)
    health: dict[str, bool] = field(default_factory=dict)
    # Answered init-container calls per pod uid (see allocate.py); small, pruned when pods leave
    # the node (allocator.py), not before: an older version of a pod may still come.
    init_served: dict[str, int] = field(default_factory=dict)
    # Memory-resource calls counted per pod uid, and the pod of the last call answered (None
    # after a failed one): which container the next memory call is for (allocate.decide_memory).
    # A pod has an entry once any call of it was answered, or it failed. Pruned with init_served.
    memory_seen: dict[str, int] = field(default_factory=dict)
    last_pod: str | None = None
    # A memory call just answered empty for no pod yet: the count call that follows counts it
    # (allocate.memory_seen_after).
    deferred: Deferred | None = None
    # The put-back of a call the kubelet gave up (allocator.py), while it may still run: the
    # next call waits for it, whichever allocator makes it.
    putting_back: asyncio.Future[None] | None = None
    version: int = 0
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def served_uids(self) -> set[str]:
        """The pods whose calls are counted."""
        return set(self.init_served) | set(self.memory_seen)

    @property
    def gpu_uuids(self) -> frozenset[str]:
        return frozenset(g.uuid for g in self.gpus)

    @property
    def healthy_memory(self) -> dict[str, int]:
        """The GPUs Allocate may hand out (an Xid needs a human first), and their memory in MiB."""
        return {g.uuid: g.memory_mib for g in self.gpus if self.health.get(g.uuid, True)}

    async def mark_unhealthy(self, gpu_uuid: str) -> None:
        """Health never recovers without a restart (as upstream): an Xid needs a human."""
        visible = self.gpu_uuids
        targets = [g.uuid for g in self.gpus] if gpu_uuid == ALL_GPUS else [gpu_uuid]
        flipped = [u for u in targets if u in visible and self.health.get(u, True)]
        if not flipped:
            return
        for u in flipped:
            self.health[u] = False
        log.error("GPU(s) %s marked Unhealthy; ListAndWatch and the node annotation follow", flipped)
        await self.bump()

    async def bump(self) -> None:
        async with self._changed:
            self.version += 1
            self._changed.notify_all()

    async def wait_change(self, seen: int) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self.version != seen)
            return self.version
