"""The plugin with its real Kubernetes client against the emulated API server (fixture cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from vgpu_deviceplugin.config import Flags
from vgpu_deviceplugin.gpus import MockBackend
from vgpu_deviceplugin.kube import ApiKubeClient
from vgpu_deviceplugin.runner import Plugin, run_plugin
from vgpu_deviceplugin.testing.kubelet_sim import KubeletSim
from vgpu_emulator import Emulator, run_emulator
from vgpu_formats import annotations as ann

from tests.deviceplugin.kit import FIXTURE_NODE, FIXTURES, fixture_node, fixture_pod
from tests.support.waiting import eventually

COUNT = "volcano.sh/vgpu-number"
REGISTER = fixture_node()["metadata"]["annotations"][ann.NODE_REGISTER]


@dataclass
class Running:
    """The emulated cluster, a simulated kubelet, and the plugin registered with it."""

    emulator: Emulator
    sim: KubeletSim
    plugins: list[Plugin] = field(default_factory=list)

    def cached_pod_names(self) -> set[str]:
        return {p["metadata"]["name"] for p in self.plugins[0].pods.pods() or []}

    def add_pod(self, name: str) -> None:
        pod = copy.deepcopy(fixture_pod())
        pod["metadata"].update(name=name, uid=f"uid-{name}")
        pod["metadata"].pop("resourceVersion", None)
        self.emulator.apply(pod)

    def set_split(self, before: int, after: int) -> None:
        cm = self.emulator.get_object("ConfigMap", "kube-system", "volcano-vgpu-device-config")
        assert cm is not None
        cm["data"]["device-config.yaml"] = cm["data"]["device-config.yaml"].replace(
            f"deviceSplitCount: {before}", f"deviceSplitCount: {after}")
        self.emulator.apply(cm)


@contextlib.asynccontextmanager
async def plugin_on_emulator(flags: Flags, prepare: Callable[[Emulator], None] | None = None,
                             ) -> AsyncIterator[Running]:
    """The fixture cluster in the emulator and the plugin (mock GPUs of the fixture node) running
    against it until the `async with` ends; the count resource is registered on entry."""
    async with run_emulator(FIXTURES / "cluster") as cluster:
        if prepare is not None:
            prepare(cluster.emulator)
        kube = await ApiKubeClient.connect(str(cluster.kubeconfig))
        running = Running(cluster.emulator, KubeletSim(flags.device_plugin_dir))
        await running.sim.start()
        stop = asyncio.Event()
        task = asyncio.create_task(run_plugin(flags, stop, kube=kube, started=running.plugins.append,
                                              backend=MockBackend.from_register_annotation(REGISTER)))
        try:
            await running.sim.wait_for([COUNT])
            yield running
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            await running.sim.stop()
            await kube.close()


def _lock_the_node(emulator: Emulator) -> None:
    node = emulator.get_object("Node", None, FIXTURE_NODE)
    assert node is not None
    node["metadata"]["annotations"][ann.NODE_LOCK] = "2026-01-01T00:00:00Z"
    emulator.apply(node)


async def test_fixture_cluster_end_to_end(flags: Flags) -> None:
    async with plugin_on_emulator(flags, prepare=_lock_the_node) as running:
        emulator, sim = running.emulator, running.sim
        response = await sim.allocate(COUNT, sim.free_ids(COUNT, 2))
        envs = response.container_responses[0].envs
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "3000m"
        pod = emulator.get_object("Pod", "default", "vgpu-test")
        assert pod is not None
        assert pod["metadata"]["annotations"][ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS
        assert pod["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE] == ""
        node = emulator.get_object("Node", None, FIXTURE_NODE)
        assert node is not None and ann.NODE_LOCK not in node["metadata"]["annotations"]
        assert node["metadata"]["annotations"][ann.NODE_REGISTER] == REGISTER
        # Pods were read with a field selector, never cluster-wide.
        pod_lists = _pod_lists(emulator)
        assert pod_lists and all("fieldSelector=spec.nodeName" in w.query for w in pod_lists)
        # With the pod watch synced, the next Allocate reads no pod list at all.
        running.add_pod("second")
        await eventually(lambda: "second" in running.cached_pod_names())
        lists_before = len(_pod_lists(emulator))
        await sim.allocate(COUNT, sim.free_ids(COUNT, 2))
        assert len(_pod_lists(emulator)) == lists_before
        done = emulator.get_object("Pod", "default", "second")
        assert done is not None and done["metadata"]["annotations"][ann.BIND_PHASE] == "success"
        # A ConfigMap edit arrives through the watch and re-registers.
        running.set_split(10, 3)
        await eventually(lambda: len(sim.devices.get(COUNT, {})) == 24)
        assert len(sim.devices[COUNT]) == 24


def _pod_lists(emulator: Any) -> list[Any]:
    """Pod list requests (watches excluded) the emulator served."""
    return [w for w in emulator.served
            if w.method == "GET" and w.path == "/api/v1/pods" and "watch=true" not in w.query]


async def test_dropped_watches_resume(flags: Flags) -> None:
    """An API server ends watches whenever it likes: the plugin resumes and misses nothing."""
    async with plugin_on_emulator(flags) as running:
        emulator = running.emulator
        await eventually(lambda: emulator.open_watches("Pod") and emulator.open_watches("ConfigMap"),
                         what="the plugin watching pods and ConfigMaps")
        assert emulator.drop_watches() >= 2  # pods and ConfigMaps
        running.add_pod("after-drop")
        running.set_split(10, 5)
        await eventually(lambda: "after-drop" in running.cached_pod_names()
                    and len(running.sim.devices.get(COUNT, {})) == 40)
        assert "after-drop" in running.cached_pod_names()
        assert len(running.sim.devices[COUNT]) == 40
