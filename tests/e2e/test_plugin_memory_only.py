"""A container asking only for the memory resource, on the real API server: the scheduler gives it
one GPU (`vgpuctl.binder` and tests/vgpuctl/test_binder.py follow Volcano there), the kubelet
calls only the memory plugin for it, and that call must answer it with its share, consume its
part of the real pod's `devices-to-allocate` and, as the pod's last part, write bind-phase
success and release the node lock. Upstream answers it empty: the container ran with no limit.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import aiohttp
from vgpu_formats import annotations as ann
from vgpuctl import chain

from tests.deviceplugin.kit import fixture_node
from tests.support.waiting import eventually

from .cluster import Cluster

COUNT, MEMORY = "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory"
GPU_A = "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c"
GPU_B = "GPU-5beec879-79c9-6252-3aaa-9f5e146ba220"
FORCE = ("--ignore-not-found", "--grace-period=0", "--force")  # no kubelet to confirm a deletion


def _node(name: str) -> dict[str, Any]:
    """The fixture node's GPUs under another name, with the scheduler's node lock held."""
    source = fixture_node()
    register = source["metadata"]["annotations"][ann.NODE_REGISTER]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {ann.NODE_REGISTER: register,
                                                       ann.NODE_LOCK: "2026-01-01T00:00:00Z"}}}


def _pod(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "memory-only", "namespace": namespace},
            "spec": {"schedulerName": "volcano", "containers": [
                {"name": "both", "image": "cuda", "resources": {"limits": {COUNT: "1", MEMORY: "3000"}}},
                {"name": "mem", "image": "cuda", "resources": {"limits": {MEMORY: "1000"}}}]}}


async def test_a_memory_only_container_is_served_on_the_real_server(cluster: Cluster,
                                                                    tmp_path: pathlib.Path) -> None:
    node = "memory-only-node"
    namespace = cluster.namespace("memonly")
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(_node(node)))
    created = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-",
                                         stdin=json.dumps(_pod(namespace))).stdout)
    # The server keeps quantities in canonical form: the plugin reads "3k", not "3000".
    assert created["spec"]["containers"][1]["resources"]["limits"][MEMORY] == "1k"
    path = f"/api/v1/namespaces/{namespace}/pods/memory-only"
    # What Volcano writes for it: one part per container asking for either resource, the
    # memory-only one a single GPU with its memory and 0 cores; then the Binding.
    devices = f"{GPU_A},NVIDIA,3000,50:;{GPU_B},NVIDIA,1000,0:"
    placed = {ann.DEVICES_TO_ALLOCATE: devices, ann.VGPU_IDS_NEW: devices, ann.VGPU_NODE: node,
              ann.VGPU_TIME: "100", ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING}
    register = _node(node)["metadata"]["annotations"][ann.NODE_REGISTER]
    try:
        async with aiohttp.ClientSession() as session, chain.plugin_agent(
                str(cluster.state.kubeconfig), node, register, tmp_path) as agent:
            api = cluster.api(session)
            status, body = await api.call("PATCH", path, {"metadata": {"annotations": placed}})
            assert status == 200, body
            binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "memory-only"},
                       "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
            status, body = await api.call("POST", f"{path}/binding", binding)
            assert status == 201, body

            # The kubelet's order: "both" (its memory call, then its count call), then "mem".
            assert (await chain.allocate(agent, MEMORY, 3000))["envs"] == {}
            both = await chain.allocate(agent, COUNT, 1)
            assert both["envs"]["NVIDIA_VISIBLE_DEVICES"] == GPU_A
            mem = await chain.allocate(agent, MEMORY, 1000)
            assert mem["envs"]["NVIDIA_VISIBLE_DEVICES"] == GPU_B
            assert mem["envs"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
            assert mem["envs"]["CUDA_DEVICE_SM_LIMIT"] == "0"
            assert {"container": "/etc/ld.so.preload", "host": f"{tmp_path}/{node}/vgpu/ld.so.preload",
                    "readOnly": True} in mem["mounts"]
            uid = created["metadata"]["uid"]
            assert any(m["host"] == f"{tmp_path}/{node}/cache/containers/{uid}_mem/vgpu.env"
                       for m in mem["mounts"])

        def annotations() -> dict[str, str]:
            pod = cluster.get("pod", "memory-only", namespace) or {}
            found: dict[str, str] = pod.get("metadata", {}).get("annotations", {})
            return found

        await eventually(lambda: annotations().get(ann.BIND_PHASE) == ann.BIND_PHASE_SUCCESS,
                         timeout=30, what="bind-phase success on the real pod")
        assert annotations()[ann.DEVICES_TO_ALLOCATE] == ";"
        lock = ((cluster.get("node", node) or {}).get("metadata", {}).get("annotations", {})
                .get(ann.NODE_LOCK))
        assert lock is None, "the node lock is released once the last part is consumed"
    finally:
        cluster.kubectl("delete", "pod", "memory-only", "-n", namespace, *FORCE)
        cluster.kubectl("delete", "node", node, "--ignore-not-found")
