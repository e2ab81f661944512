"""The plugin with its real Kubernetes client against the emulated API server (fixture cluster)."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

from vgpu_deviceplugin.config import Flags
from vgpu_deviceplugin.gpus import MockBackend
from vgpu_deviceplugin.kube import ApiKubeClient
from vgpu_deviceplugin.runner import Plugin, run_plugin
from vgpu_deviceplugin.testing.kubelet_sim import KubeletSim
from vgpu_emulator import run_emulator
from vgpu_formats import annotations as ann

from tests.deviceplugin.kit import FIXTURE_NODE, FIXTURES, fixture_node, fixture_pod

COUNT = "volcano.sh/vgpu-number"


async def test_fixture_cluster_end_to_end(flags: Flags, tmp_path: Path) -> None:
    register = fixture_node()["metadata"]["annotations"][ann.NODE_REGISTER]
    async with run_emulator(FIXTURES / "cluster") as cluster:
        emulator = cluster.emulator
        node = emulator.get_object("Node", None, FIXTURE_NODE)
        assert node is not None
        node["metadata"]["annotations"][ann.NODE_LOCK] = "2026-01-01T00:00:00Z"
        emulator.apply(node)
        kube = await ApiKubeClient.connect(str(cluster.kubeconfig))
        sim = KubeletSim(flags.device_plugin_dir)
        await sim.start()
        stop = asyncio.Event()
        plugins: list[Plugin] = []
        task = asyncio.create_task(run_plugin(flags, stop, kube=kube, started=plugins.append,
                                              backend=MockBackend.from_register_annotation(register)))
        try:
            await sim.wait_for([COUNT])
            response = await sim.allocate(COUNT, sim.free_ids(COUNT, 2))
            envs = response.container_responses[0].envs
            assert envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "3000m"
            pod = emulator.get_object("Pod", "default", "vgpu-test")
            assert pod is not None
            assert pod["metadata"]["annotations"][ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS
            assert pod["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE] == ""
            node = emulator.get_object("Node", None, FIXTURE_NODE)
            assert node is not None and ann.NODE_LOCK not in node["metadata"]["annotations"]
            assert node["metadata"]["annotations"][ann.NODE_REGISTER] == register
            # Pods were read with a field selector, never cluster-wide.
            pod_lists = _pod_lists(emulator)
            assert pod_lists and all("fieldSelector=spec.nodeName" in w.query for w in pod_lists)
            # With the pod watch synced, the next Allocate reads no pod list at all.
            second = copy.deepcopy(fixture_pod())
            second["metadata"].update(name="second", uid="uid-second")
            second["metadata"].pop("resourceVersion", None)
            emulator.apply(second)
            for _ in range(100):
                cached = plugins[0].pods.pods() or []
                if any(p["metadata"]["name"] == "second" for p in cached):
                    break
                await asyncio.sleep(0.05)
            lists_before = len(_pod_lists(emulator))
            await sim.allocate(COUNT, sim.free_ids(COUNT, 2))
            assert len(_pod_lists(emulator)) == lists_before
            done = emulator.get_object("Pod", "default", "second")
            assert done is not None and done["metadata"]["annotations"][ann.BIND_PHASE] == "success"
            # A ConfigMap edit arrives through the watch and re-registers.
            cm = emulator.get_object("ConfigMap", "kube-system", "volcano-vgpu-device-config")
            assert cm is not None
            cm["data"]["device-config.yaml"] = cm["data"]["device-config.yaml"].replace(
                "deviceSplitCount: 10", "deviceSplitCount: 3")
            emulator.apply(cm)
            for _ in range(100):
                if len(sim.devices.get(COUNT, {})) == 24:
                    break
                await asyncio.sleep(0.05)
            assert len(sim.devices[COUNT]) == 24
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            await sim.stop()
            await kube.close()


def _pod_lists(emulator: Any) -> list[Any]:
    """Pod list requests (watches excluded) the emulator served."""
    return [w for w in emulator.served
            if w.method == "GET" and w.path == "/api/v1/pods" and "watch=true" not in w.query]


async def test_dropped_watches_resume(flags: Flags) -> None:
    """An API server ends watches whenever it likes: the plugin resumes and misses nothing."""
    register = fixture_node()["metadata"]["annotations"][ann.NODE_REGISTER]
    async with run_emulator(FIXTURES / "cluster") as cluster:
        emulator = cluster.emulator
        kube = await ApiKubeClient.connect(str(cluster.kubeconfig))
        sim = KubeletSim(flags.device_plugin_dir)
        await sim.start()
        stop = asyncio.Event()
        plugins: list[Plugin] = []
        task = asyncio.create_task(run_plugin(flags, stop, kube=kube, started=plugins.append,
                                              backend=MockBackend.from_register_annotation(register)))
        try:
            await sim.wait_for([COUNT])
            await asyncio.sleep(0.2)
            assert emulator.drop_watches() >= 2  # pods and ConfigMaps
            pod = copy.deepcopy(fixture_pod())
            pod["metadata"].update(name="after-drop", uid="uid-after-drop")
            pod["metadata"].pop("resourceVersion", None)
            emulator.apply(pod)
            cm = emulator.get_object("ConfigMap", "kube-system", "volcano-vgpu-device-config")
            assert cm is not None
            cm["data"]["device-config.yaml"] = cm["data"]["device-config.yaml"].replace(
                "deviceSplitCount: 10", "deviceSplitCount: 5")
            emulator.apply(cm)
            for _ in range(100):
                names = {p["metadata"]["name"] for p in plugins[0].pods.pods() or []}
                if "after-drop" in names and len(sim.devices.get(COUNT, {})) == 40:
                    break
                await asyncio.sleep(0.05)
            assert "after-drop" in names
            assert len(sim.devices[COUNT]) == 40
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            await sim.stop()
            await kube.close()
