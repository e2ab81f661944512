"""The running plugin: read config, discover GPUs, serve and register, keep everything current.

    stop = asyncio.Event()
    await run_plugin(flags, stop)                       # real cluster, NVML or --mock-gpus
    await run_plugin(flags, stop, kube=..., backend=...)  # tests and the demo, in-process

Six loops run until `stop` is set: GPU health, kubelet restarts, ConfigMap changes, node register,
the watch of this node's pods, and the removal of gone containers' shared-region folders.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field

from vgpu_formats import FormatError
from vgpu_formats import device_config as dc
from vgpu_formats import node_config as nc

from vgpu_deviceplugin import registration
from vgpu_deviceplugin.allocator import Allocator
from vgpu_deviceplugin.cleanup import cleanup_loop
from vgpu_deviceplugin.config import Flags, Settings, resolve_settings
from vgpu_deviceplugin.devices import ResourceKind, visible_gpus
from vgpu_deviceplugin.gpus import GpuBackend, GpuDevice, backend_for
from vgpu_deviceplugin.kube import ApiKubeClient, KubeClient, KubeError
from vgpu_deviceplugin.node_register import register_loop
from vgpu_deviceplugin.pod_cache import PodCache
from vgpu_deviceplugin.server import DevicePlugin
from vgpu_deviceplugin.state import PluginState

log = logging.getLogger(__name__)
REGISTER_RETRY_SECONDS = 1.0


class ConfigError(RuntimeError):
    """The ConfigMaps cannot be used; the message names the field."""


@dataclass
class LoadedConfig:
    settings: Settings
    texts: tuple[str | None, str | None]  # raw device-config and node-config, to spot changes


async def load_config(kube: KubeClient, flags: Flags) -> LoadedConfig:
    """Read both ConfigMaps the way the scheduler finds them. Raises ConfigError on bad content."""
    found_ns: str | None = None
    device_text: str | None = None
    for namespace in flags.device_config_namespaces():
        data = await kube.get_configmap(namespace, flags.device_config_name)
        if data is not None:
            found_ns = namespace
            device_text = data.get(dc.CONFIGMAP_KEY)
            if device_text is None:
                log.warning("ConfigMap %s/%s has no key %s; using upstream defaults", namespace,
                            flags.device_config_name, dc.CONFIGMAP_KEY)
            break
    else:
        log.warning("ConfigMap %s not found in %s; using upstream defaults (names volcano.sh/vgpu-*)",
                    flags.device_config_name, ", ".join(flags.device_config_namespaces()))
    node_ns = flags.node_config_namespace or found_ns or flags.device_config_namespaces()[0]
    node_data = await kube.get_configmap(node_ns, flags.node_config_name)
    node_text = node_data.get(nc.CONFIGMAP_KEY) if node_data is not None else None
    try:
        device_cfg = dc.parse_device_config(device_text) if device_text is not None else None
        node_cfg = nc.parse_node_config(node_text) if node_text is not None else None
    except FormatError as exc:
        raise ConfigError(str(exc)) from exc
    source = f"{found_ns}/{flags.device_config_name}" if found_ns else "defaults"
    return LoadedConfig(resolve_settings(flags, device_cfg, node_cfg, source), (device_text, node_text))


@dataclass
class Plugin:
    """The serving side: three endpoints over one shared state.

    Everything that stops, starts or registers endpoints holds `lock`: a config change and a
    kubelet restart at the same time must not interleave (two sets of servers on the same socket
    paths, the first set left running, every resource registered twice)."""

    flags: Flags
    kube: KubeClient
    state: PluginState
    pods: PodCache = field(default_factory=PodCache)
    endpoints: list[registration.Endpoint] = field(default_factory=list)
    registered: bool = False
    # kubelet.sock as it was when we last registered: the kubelet watcher compares with it.
    kubelet_seen: registration.SocketId | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.flags.device_plugin_dir, registration.KUBELET_SOCKET)

    async def start(self) -> None:
        async with self.lock:
            seen = registration.socket_identity(self.kubelet_socket)
            await self._start_endpoints()
            await self._register_all(seen)

    async def close(self) -> None:
        async with self.lock:
            await self._stop_endpoints()

    async def restart(self) -> None:
        """Stop the servers (their sockets removed), serve again and register: once, in turn."""
        async with self.lock:
            await self._restart()

    async def reconfigure(self, settings: Settings, gpus: list[GpuDevice]) -> None:
        """New settings: the endpoints restart once (names, ids and options may all change)."""
        async with self.lock:
            self.state.settings = settings
            self.state.gpus = gpus
            await self._restart()

    async def kubelet_restarted(self, now: registration.SocketId) -> None:
        """kubelet.sock is `now`: serve and register again, unless that already happened for it."""
        async with self.lock:
            if now == self.kubelet_seen and self.registered:
                return  # a restart for another reason registered with this kubelet meanwhile
            log.warning("kubelet restarted (new %s): serving and registering again",
                        registration.KUBELET_SOCKET)
            await self._restart()

    async def retry_register(self) -> None:
        """After a failed Register: again, or serve anew if the kubelet restarted meanwhile (it
        wipes the plugin sockets: registering them again would only fail again)."""
        async with self.lock:
            if self.registered:
                return
            now = registration.socket_identity(self.kubelet_socket)
            if now != self.kubelet_seen or not all(os.path.exists(e.path) for e in self.endpoints):
                await self._restart()
            else:
                await self._register_all(now)

    async def _restart(self) -> None:
        # kubelet.sock as it was before we served: a kubelet restart from here on is a change the
        # watcher sees, even one that wipes the sockets before our Register.
        seen = registration.socket_identity(self.kubelet_socket)
        await self._stop_endpoints()
        await self._start_endpoints()
        await self._register_all(seen)

    async def _start_endpoints(self) -> None:
        allocator = Allocator(self.kube, self.state, self.flags, cache=self.pods)
        for kind in ResourceKind:
            plugin = DevicePlugin(kind, self.state, allocator)
            name = kind.resource_name(self.state.settings)
            self.endpoints.append(await registration.serve(plugin, name, self.flags.device_plugin_dir))

    async def _stop_endpoints(self) -> None:
        await asyncio.gather(*(registration.stop(e) for e in self.endpoints))
        self.endpoints.clear()
        self.registered = False

    async def _register_all(self, seen: registration.SocketId | None) -> None:
        """Register every endpoint with the kubelet whose socket was `seen` before serving."""
        self.kubelet_seen = seen
        try:
            for endpoint in self.endpoints:
                await registration.register(self.flags.device_plugin_dir, endpoint)
            self.registered = True
            log.info("registered %s with the kubelet", ", ".join(e.resource_name for e in self.endpoints))
        except Exception as exc:  # kubelet down or restarting: the watcher tries again
            log.warning("Register with the kubelet failed (%s); retrying", exc)


def log_settings(settings: Settings) -> None:
    for warning in settings.warnings:
        log.warning("%s", warning)
    log.info("settings from %s: resources %s, %s, %s; split %d; memory factor %d; core scaling %s; mode %s",
             settings.source, settings.names.count, settings.names.memory, settings.names.cores,
             settings.split_count, settings.memory_factor, settings.core_scaling, settings.mode)


async def run_plugin(
    flags: Flags,
    stop: asyncio.Event,
    kube: KubeClient | None = None,
    backend: GpuBackend | None = None,
    started: Callable[[Plugin], Awaitable[None] | None] | None = None,
    reload: asyncio.Event | None = None,
) -> None:
    """Serve until `stop`; each time `reload` is set (SIGHUP), re-read the ConfigMaps and serve
    and register again."""
    backend = backend if backend is not None else backend_for(flags.mock_gpus, flags.node_name)
    all_gpus = backend.discover()
    own_kube = kube is None
    kube = kube if kube is not None else await ApiKubeClient.connect(flags.kubeconfig)
    try:
        loaded = await _first_config(kube, flags)
        log_settings(loaded.settings)
        state = PluginState(loaded.settings, visible_gpus(all_gpus, loaded.settings))
        plugin = Plugin(flags, kube, state)
        await plugin.start()
        if started is not None:
            maybe = started(plugin)
            if maybe is not None:
                await maybe
        loops = [
            backend.watch_health(lambda u: _spawn(state.mark_unhealthy(u)), stop),
            _kubelet_loop(plugin, stop),
            _config_loop(plugin, all_gpus, loaded, stop),
            register_loop(kube, state, flags.register_interval, flags.handshake, stop),
            plugin.pods.follow(kube, flags.node_name, stop),
            cleanup_loop(flags.cache_root, plugin.pods, stop),
        ]
        if reload is not None:
            loops.append(_reload_loop(plugin, all_gpus, reload))
        tasks = [asyncio.create_task(loop) for loop in loops]
        for task in tasks:
            task.add_done_callback(_report_crash)
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await plugin.close()
    finally:
        if own_kube:
            await kube.close()


async def _first_config(kube: KubeClient, flags: Flags, retry: float = 5.0) -> LoadedConfig:
    """Like load_config, but a broken ConfigMap falls back to the defaults, as the scheduler does,
    and an unreachable API is waited for (registering names before reading them is the bug)."""
    while True:
        try:
            return await load_config(kube, flags)
        except ConfigError as exc:
            log.error("the ConfigMap cannot be used, running on upstream defaults until it is fixed: %s", exc)
            settings = resolve_settings(flags, None, None, f"defaults (ConfigMap unusable: {exc})")
            return LoadedConfig(settings, (None, None))
        except KubeError as exc:
            log.error("cannot read the ConfigMaps (%s); retrying in %.0f s", exc, retry)
            await asyncio.sleep(retry)


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background loop %s stopped: %r", task.get_coro(), task.exception())


_background: set[asyncio.Task[None]] = set()


def _spawn(coro: Coroutine[None, None, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _kubelet_loop(plugin: Plugin, stop: asyncio.Event) -> None:
    """Register again after a kubelet restart (a new kubelet.sock), or after a failed Register,
    whenever that happened (at start, on a config change, on a kubelet restart). Only kubelet.sock
    counts: the plugin's own sockets are re-created by every restart."""
    while not stop.is_set():
        now = registration.socket_identity(plugin.kubelet_socket)
        if now is not None and now != plugin.kubelet_seen:
            await plugin.kubelet_restarted(now)
        elif not plugin.registered and now is not None:
            await plugin.retry_register()  # kubelet there but Register failed
        wait = registration.POLL_SECONDS if plugin.registered else REGISTER_RETRY_SECONDS
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)


async def _config_loop(plugin: Plugin, all_gpus: list[GpuDevice], loaded: LoadedConfig,
                       stop: asyncio.Event) -> None:
    flags = plugin.flags
    async for _ in plugin.kube.watch_configmaps(flags.watched_configmaps()):
        try:
            fresh = await load_config(plugin.kube, flags)
        except Exception as exc:  # keep serving what works; say loudly what does not
            log.error("ConfigMap change ignored, keeping the running settings: %s", exc)
            continue
        if fresh.texts == loaded.texts:
            continue
        loaded = fresh
        if fresh.settings == plugin.state.settings:
            continue
        log.warning("configuration changed: re-registering")
        log_settings(fresh.settings)
        await plugin.reconfigure(fresh.settings, visible_gpus(all_gpus, fresh.settings))
        await plugin.state.bump()


async def _reload_loop(plugin: Plugin, all_gpus: list[GpuDevice], reload: asyncio.Event) -> None:
    """Upstream's SIGHUP: restart the plugins without exiting. Here: re-read both ConfigMaps
    (even if no watch event came) and serve and register again, on the running settings when
    the ConfigMaps cannot be read, so a SIGHUP always re-registers."""
    while True:
        await reload.wait()
        reload.clear()
        log.warning("SIGHUP: re-reading the ConfigMaps and registering again")
        settings = plugin.state.settings
        try:
            settings = (await load_config(plugin.kube, plugin.flags)).settings
            log_settings(settings)
        except (ConfigError, KubeError) as exc:
            log.error("SIGHUP: ConfigMaps not read, keeping the running settings: %s", exc)
        await plugin.reconfigure(settings, visible_gpus(all_gpus, settings))
        await plugin.state.bump()
