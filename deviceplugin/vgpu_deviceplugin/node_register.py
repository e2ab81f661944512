"""Writing `volcano.sh/node-vgpu-register` (and the legacy handshake) on this node's Node.

The scheduler learns each GPU's UUID, split count and memory only from this annotation. It is
written every period (an unchanged value is a no-op for the API server, and a value someone
removed comes back) and at once when it changes (a GPU turned unhealthy, new settings). The
handshake `Reported <time>` goes with every period for Volcano <= v1.15.0, which ignores nodes
whose handshake is older than 60 s (newer schedulers ignore the key).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

from vgpu_formats import annotations as ann

from vgpu_deviceplugin import devices
from vgpu_deviceplugin.kube import KubeClient, KubeError
from vgpu_deviceplugin.state import PluginState

log = logging.getLogger(__name__)
RETRY_SECONDS = 5.0


def node_annotations(state: PluginState, handshake: bool, now: datetime) -> dict[str, str]:
    """The annotations to write now: the register value, and the handshake if enabled."""
    value = ann.encode_node_register(devices.node_register(state.gpus, state.health, state.settings))
    out = {ann.NODE_REGISTER: value}
    if handshake:
        out[ann.NODE_HANDSHAKE] = ann.encode_handshake_reported(now)
    return out


async def register_loop(kube: KubeClient, state: PluginState, interval: float, handshake: bool,
                        stop: asyncio.Event) -> None:
    version = state.version
    while not stop.is_set():
        wanted = node_annotations(state, handshake, datetime.now(UTC))
        delay = interval
        try:
            await kube.patch_node(state.settings.node_name, {"metadata": {"annotations": wanted}})
        except KubeError as exc:
            log.error("cannot write %s on node %s: %s", ann.NODE_REGISTER, state.settings.node_name, exc)
            delay = RETRY_SECONDS
        # Wake early on stop or on a health/settings change.
        waiter = asyncio.ensure_future(state.wait_change(version))
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({waiter, stopper}, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        for task in (waiter, stopper):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        version = state.version
