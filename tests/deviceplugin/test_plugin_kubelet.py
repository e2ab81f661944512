"""The plugin against a kubelet simulator over real unix sockets, with an in-memory API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest
from vgpu_deviceplugin import registration
from vgpu_deviceplugin.api import deviceplugin_pb2 as pb
from vgpu_deviceplugin.config import Flags
from vgpu_deviceplugin.gpus import MockBackend
from vgpu_deviceplugin.monitor.region import FILE_SIZE as REGION_SIZE
from vgpu_deviceplugin.runner import Plugin, run_plugin
from vgpu_deviceplugin.testing.kubelet_sim import KubeletSim
from vgpu_formats import annotations as ann

from tests.deviceplugin.kit import FIXTURE_NODE, FakeKube, fixture_node, fixture_pod, load_docs
from tests.support.waiting import eventually

COUNT, MEMORY, CORES = "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"
REGISTER = fixture_node()["metadata"]["annotations"][ann.NODE_REGISTER]


def device_config_data(count_name: str = COUNT, split: int = 10, factor: int = 1) -> dict[str, str]:
    return {"device-config.yaml": f"nvidia:\n  resourceCountName: {count_name}\n"
            f"  resourceMemoryName: {MEMORY}\n  resourceCoreName: {CORES}\n"
            f"  deviceSplitCount: {split}\n  gpuMemoryFactor: {factor}\n"}


@contextlib.asynccontextmanager
async def running(flags: Flags, kube: FakeKube, backend: MockBackend | None = None,
                  resources: tuple[str, ...] = (COUNT, MEMORY, CORES),
                  plugins: list[Plugin] | None = None) -> AsyncIterator[KubeletSim]:
    """The plugin registered with a simulated kubelet; `plugins` receives the running Plugin."""
    sim = KubeletSim(flags.device_plugin_dir)
    await sim.start()
    stop = asyncio.Event()
    backend = backend or MockBackend.from_register_annotation(REGISTER)
    started = plugins.append if plugins is not None else None
    task = asyncio.create_task(run_plugin(flags, stop, kube=kube, backend=backend, started=started))
    try:
        await sim.wait_for(list(resources))
        yield sim
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await sim.stop()


async def test_registers_three_resources_and_advertises_the_gpus(flags: Flags, kube: FakeKube) -> None:
    kube.set_configmap("kube-system", "volcano-vgpu-device-config", device_config_data())
    async with running(flags, kube) as sim:
        assert sorted(r.resource_name for r in sim.registrations) == sorted([COUNT, MEMORY, CORES])
        assert all(r.version == "v1beta1" for r in sim.registrations)
        assert sim.plugins[COUNT].options == pb.DevicePluginOptions(get_preferred_allocation_available=True)
        # The fixture node's allocatable: 80 / 196512 / 800.
        assert len(sim.devices[COUNT]) == 80
        assert len(sim.devices[MEMORY]) == 196512
        assert len(sim.devices[CORES]) == 800
        assert "GPU-3c8ce108-117a-aeae-a3e8-1c0c5dafebe7-9" in sim.devices[COUNT]
        assert sim.plugins[MEMORY].last_list_bytes < 4 * 1024 * 1024
        # The node annotation is the scheduler's input: same text the fixture node carries.
        await eventually(lambda: ann.NODE_REGISTER in _annotations(kube))
        assert _annotations(kube)[ann.NODE_REGISTER] == REGISTER
        assert _annotations(kube)[ann.NODE_HANDSHAKE].startswith("Reported ")


async def test_allocate_fixture_pod_through_grpc(flags: Flags, kube: FakeKube) -> None:
    pod = kube.add_pod(fixture_pod())
    lock = {"hamivgpu": "2026-01-01T00:00:00Z"}
    kube.nodes[FIXTURE_NODE] = {"metadata": {"name": FIXTURE_NODE, "annotations": lock}}
    other = fixture_pod()
    other["metadata"].update(name="bystander", uid="uid-bystander")
    other["spec"]["nodeName"] = "other-node"
    kube.add_pod(other)
    async with running(flags, kube) as sim:
        response = await sim.allocate(COUNT, sim.free_ids(COUNT, 2))
        envs = dict(response.container_responses[0].envs)
        assert envs["NVIDIA_VISIBLE_DEVICES"] == (
            "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c,GPU-5beec879-79c9-6252-3aaa-9f5e146ba220")
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "3000m"
        assert envs["CUDA_DEVICE_SM_LIMIT"] == "50"
        assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith("/tmp/vgpu/")
        answer = response.container_responses[0]
        mounts = {m.container_path: (m.host_path, m.read_only) for m in answer.mounts}
        assert mounts["/etc/ld.so.preload"] == ("/usr/local/vgpu/ld.so.preload", True)
        region = envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
        cache_host, writable = mounts[region][0], not mounts[region][1]
        folder = f"{flags.cache_root}/containers/{pod['metadata']['uid']}_cuda-app"
        assert writable and cache_host == f"{folder}/{os.path.basename(region)}"
        assert not any(path.startswith(("/tmp/vgpulock", "/tmp/vgpu/")) for path in mounts if path != region)
        # Created before the answer, at the region's size, all zeros (libvgpu.so writes the header),
        # writable by any uid; its folder, never mounted, by the plugin only.
        assert stat.S_IMODE(os.stat(cache_host).st_mode) == 0o666
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o755
        with open(cache_host, "rb") as region_file:
            assert region_file.read() == bytes(REGION_SIZE)
        # libvgpu.so's settings, read-only in the container, 0644 on the host (the hook refuses
        # a file group or others could write), with the same values as the environment (the GPUs
        # included: the node monitor reports limits and GPUs from this file, not the region).
        settings_host, read_only = mounts["/usr/local/vgpu/vgpu.env"]
        assert read_only and settings_host == f"{folder}/vgpu.env"
        assert stat.S_IMODE(os.stat(settings_host).st_mode) == 0o644
        with open(settings_host) as settings_file:
            entries = dict(line.split("=", 1) for line in settings_file.read().splitlines()[1:])
        assert entries == envs
        assert sorted(os.listdir(folder)) == sorted([os.path.basename(region), "vgpu.env"])
        # The memory call of a container that asks for the count resource too is answered
        # empty, as upstream (cores' always are).
        empty = await sim.allocate(MEMORY, sim.free_ids(MEMORY, 3000))
        assert empty.container_responses[0] == pb.ContainerAllocateResponse()
    annotations = kube.pods[("default", "vgpu-test")]["metadata"]["annotations"]
    assert annotations[ann.BIND_PHASE] == "success"
    assert annotations[ann.DEVICES_TO_ALLOCATE] == ""
    assert annotations[ann.VGPU_TIME] == ann.VGPU_TIME_DONE
    assert annotations[ann.VGPU_IDS_NEW] == fixture_pod()["metadata"]["annotations"][ann.VGPU_IDS_NEW]
    assert "hamivgpu" not in _annotations(kube)  # node lock released
    assert kube.pod_writes("default/bystander") == []


async def test_init_and_two_app_containers_in_kubelet_order(flags: Flags, kube: FakeKube) -> None:
    gpu_a, gpu_b = "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c", "GPU-5beec879-79c9-6252-3aaa-9f5e146ba220"
    pod = fixture_pod()
    limits = {COUNT: "1", MEMORY: "1000"}
    pod["spec"]["initContainers"] = [{"name": "warmup", "resources": {"limits": limits}}]
    pod["spec"]["containers"] = [{"name": "sidecar"}, {"name": "a", "resources": {"limits": limits}},
                                 {"name": "b", "resources": {"limits": limits}}]
    devices = f"{gpu_a},NVIDIA,1000,30:;{gpu_b},NVIDIA,1000,60:"
    pod["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE] = devices
    kube.add_pod(pod)
    async with running(flags, kube) as sim:
        answers = [await sim.allocate(COUNT, sim.free_ids(COUNT, 1)) for _ in range(3)]
    visible = [a.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] for a in answers]
    cores = [a.container_responses[0].envs["CUDA_DEVICE_SM_LIMIT"] for a in answers]
    caches = [dict((m.container_path, m.host_path) for m in a.container_responses[0].mounts)[
        a.container_responses[0].envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"]] for a in answers]
    assert visible == [gpu_a, gpu_a, gpu_b] and cores == ["30", "30", "60"]
    assert [os.path.dirname(c).rsplit("_", 1)[1] for c in caches] == ["warmup", "a", "b"]
    annotations = kube.pods[("default", "vgpu-test")]["metadata"]["annotations"]
    assert annotations[ann.DEVICES_TO_ALLOCATE] == ";" and annotations[ann.BIND_PHASE] == "success"


@pytest.mark.parametrize("count_first", [True, False])
async def test_a_memory_only_container_gets_its_share_from_the_memory_call(
        flags: Flags, kube: FakeKube, count_first: bool) -> None:
    # Container "a" asks for both resources, "m" for memory only (one GPU to the scheduler). The
    # kubelet calls the plugins per container in order, a container's resources in either order.
    gpu_a, gpu_b = "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c", "GPU-5beec879-79c9-6252-3aaa-9f5e146ba220"
    pod = fixture_pod()
    # Quantities as the API server writes them back (canonical: 3000 is "3k").
    pod["spec"]["containers"] = [{"name": "a", "resources": {"limits": {COUNT: "1", MEMORY: "3k"}}},
                                 {"name": "m", "resources": {"limits": {MEMORY: "1k"}}}]
    devices = f"{gpu_a},NVIDIA,3000,50:;{gpu_b},NVIDIA,1000,0:"
    pod["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE] = devices
    uid = pod["metadata"]["uid"]
    kube.add_pod(pod)
    kube.nodes[FIXTURE_NODE] = {"metadata": {"name": FIXTURE_NODE, "annotations": {"hamivgpu": "x"}}}
    async with running(flags, kube) as sim:
        first = [(COUNT, 1), (MEMORY, 3000)] if count_first else [(MEMORY, 3000), (COUNT, 1)]
        answers = {resource: (await sim.allocate(resource, sim.free_ids(resource, n))).container_responses[0]
                   for resource, n in first}
        assert answers[MEMORY] == pb.ContainerAllocateResponse()
        assert answers[COUNT].envs["NVIDIA_VISIBLE_DEVICES"] == gpu_a
        assert "hamivgpu" in _annotations(kube)  # "m" still to come: the lock is kept
        memory_only = (await sim.allocate(MEMORY, sim.free_ids(MEMORY, 1000))).container_responses[0]
    envs = dict(memory_only.envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == gpu_b and envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    mounts = {m.container_path: m.host_path for m in memory_only.mounts}
    assert mounts["/etc/ld.so.preload"] == "/usr/local/vgpu/ld.so.preload"
    settings = mounts["/usr/local/vgpu/vgpu.env"]
    assert settings == f"{flags.cache_root}/containers/{uid}_m/vgpu.env" and os.path.exists(settings)
    annotations = kube.pods[("default", "vgpu-test")]["metadata"]["annotations"]
    assert annotations[ann.DEVICES_TO_ALLOCATE] == ";" and annotations[ann.BIND_PHASE] == "success"
    assert "hamivgpu" not in _annotations(kube)


async def test_a_memory_call_no_pod_explains_is_answered_empty(flags: Flags, kube: FakeKube) -> None:
    kube.add_pod(fixture_pod())  # waiting, its container asking 3000 memory units
    async with running(flags, kube) as sim:
        response = await sim.allocate(MEMORY, sim.free_ids(MEMORY, 7))
    assert response.container_responses[0] == pb.ContainerAllocateResponse()
    assert kube.pod_writes("default/vgpu-test") == []


async def test_preferred_allocation_and_prestart(flags: Flags, kube: FakeKube) -> None:
    async with running(flags, kube) as sim:
        stub = sim.plugins[COUNT].stub
        request = pb.PreferredAllocationRequest()
        request.container_requests.add(available_deviceIDs=["a", "b", "c"], must_include_deviceIDs=["c"],
                                       allocation_size=2)
        answer = await stub.GetPreferredAllocation(request)
        assert list(answer.container_responses[0].deviceIDs) == ["c", "a"]
        assert await stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["a"])) == \
            pb.PreStartContainerResponse()


async def test_node_register_comes_back_when_removed(flags: Flags, kube: FakeKube) -> None:
    fast = replace(flags, register_interval=0.1)
    async with running(fast, kube):
        await eventually(lambda: ann.NODE_REGISTER in _annotations(kube))
        await kube.patch_node(FIXTURE_NODE, {"metadata": {"annotations": {ann.NODE_REGISTER: None}}})
        await eventually(lambda: _annotations(kube).get(ann.NODE_REGISTER) == REGISTER)


async def test_allocate_errors_are_grpc_errors_and_touch_no_unrelated_pod(
    flags: Flags, kube: FakeKube
) -> None:
    other = fixture_pod()
    other["spec"]["nodeName"] = other["metadata"]["annotations"][ann.VGPU_NODE] = "other-node"
    kube.add_pod(other)
    broken = fixture_pod()
    broken["metadata"].update(name="broken", uid="uid-broken")
    broken["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE] = "GPU-bc94e532,NVIDIA,30"  # truncated
    async with running(flags, kube) as sim:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await sim.allocate(COUNT, sim.free_ids(COUNT, 1))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no pod on node dev-app-2-150-master-1 is waiting" in (err.value.details() or "")
        assert kube.pod_writes("default/vgpu-test") == []
        kube.add_pod(broken)
        lock = {"metadata": {"annotations": {"hamivgpu": "2026-01-01T00:00:00Z"}}}
        await kube.patch_node(FIXTURE_NODE, lock)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await sim.allocate(COUNT, sim.free_ids(COUNT, 1))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "hamivgpu" not in _annotations(kube)  # released on the failure path too
        assert "does not end with ':'" in (err.value.details() or "")
        assert kube.pods[("default", "broken")]["metadata"]["annotations"][ann.BIND_PHASE] == "failed"
        # The API failing: a clear error, the pod (if any) marked failed, the plugin keeps serving.
        kube.fail_next("list_pods_on_node", "HTTP 500 Internal Server Error")
        with pytest.raises(grpc.aio.AioRpcError, match="cannot list pods"):
            await sim.allocate(COUNT, sim.free_ids(COUNT, 2))
        kube.add_pod(fixture_pod())
        # Once from the cache, once after a fresh list: then it gives up.
        kube.fail_next("consume_devices", "HTTP 500 Internal Server Error", times=2)
        with pytest.raises(grpc.aio.AioRpcError, match="cannot update its annotations"):
            await sim.allocate(COUNT, sim.free_ids(COUNT, 2))
        assert kube.pods[("default", "vgpu-test")]["metadata"]["annotations"][ann.BIND_PHASE] == "failed"
    assert kube.pod_writes("default/vgpu-test") == [
        {"metadata": {"annotations": {ann.BIND_PHASE: "failed", ann.VGPU_TIME: ann.VGPU_TIME_DONE}}}]


async def test_a_share_libvgpu_would_read_as_no_limit_is_a_grpc_error(flags: Flags, kube: FakeKube) -> None:
    pod = fixture_pod()
    value = pod["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE].replace(",3000,", ",0,", 1)
    pod["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE] = value
    kube.add_pod(pod)
    async with running(flags, kube) as sim:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await sim.allocate(COUNT, sim.free_ids(COUNT, 2))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = err.value.details() or ""
        assert "pod default/vgpu-test" in details and ann.DEVICES_TO_ALLOCATE in details
        assert "usedmem 0" in details
        assert kube.pods[("default", "vgpu-test")]["metadata"]["annotations"][ann.BIND_PHASE] == "failed"
    assert not any(p.endswith(".cache") for _, _, files in os.walk(flags.cache_root) for p in files)


async def test_a_memory_only_init_container_is_a_grpc_error_naming_the_fix(flags: Flags,
                                                                         kube: FakeKube) -> None:
    pod = fixture_pod()
    pod["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": {MEMORY: "500"}}}]
    kube.add_pod(pod)
    kube.nodes[FIXTURE_NODE] = {"metadata": {"name": FIXTURE_NODE, "annotations": {"hamivgpu": "x"}}}
    async with running(flags, kube) as sim:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await sim.allocate(MEMORY, sim.free_ids(MEMORY, 500))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = err.value.details() or ""
    assert "pod default/vgpu-test: init container warm asks for volcano.sh/vgpu-memory" in details
    assert f"Add {COUNT}: 1" in details
    assert kube.pods[("default", "vgpu-test")]["metadata"]["annotations"][ann.BIND_PHASE] == "failed"
    assert "hamivgpu" not in _annotations(kube)


async def test_health_change_resends_the_list_and_the_annotation(flags: Flags, kube: FakeKube) -> None:
    backend = MockBackend.from_register_annotation(REGISTER)
    sick = "GPU-3c8ce108-117a-aeae-a3e8-1c0c5dafebe7"
    async with running(flags, kube, backend) as sim:
        await eventually(lambda: ann.NODE_REGISTER in _annotations(kube))
        backend.mark_unhealthy(sick)
        await sim.wait_for([COUNT, CORES], lists=2)
        assert sim.devices[COUNT][f"{sick}-0"] == "Unhealthy"
        assert sim.devices[COUNT]["GPU-41c5e13c-b480-c473-7a14-dd05a7c4cd43-0"] == "Healthy"
        await eventually(lambda: f"{sick},10,24564,NVIDIA-NVIDIA GeForce RTX 4090,false,hami-core:"
                     in _annotations(kube).get(ann.NODE_REGISTER, ""))


async def test_kubelet_restart_reregisters(flags: Flags, kube: FakeKube) -> None:
    """The time it takes (goal: under 2 s) is measured by `python -m bench deviceplugin_bench`;
    a timed assert here would fail on a busy CI machine without saying anything about the plugin."""
    async with running(flags, kube) as sim:
        before = len(sim.registrations)
        await sim.restart()
        await sim.wait_for([COUNT, MEMORY, CORES], timeout=20.0)
        assert len(sim.registrations) == before + 3
        response = await sim.allocate(MEMORY, sim.free_ids(MEMORY, 1))
        assert len(response.container_responses) == 1


async def test_a_call_the_kubelet_gave_up_is_answered_again_after_its_restart(
        flags: Flags, kube: FakeKube) -> None:
    # The kubelet went away while the plugin was writing bind-phase success: gRPC cancels the
    # handler on the plugin's side. Restarted, the kubelet asks again for that container (its
    # checkpoint holds no answer for it) and gets the same GPUs.
    kube.add_pod(fixture_pod())
    kube.nodes[FIXTURE_NODE] = {"metadata": {"name": FIXTURE_NODE, "annotations": {"hamivgpu": "t"}}}
    stalled, patch_pod = asyncio.Event(), kube.patch_pod

    async def stall_success(namespace: str, name: str, patch: dict[str, Any]) -> None:
        await patch_pod(namespace, name, patch)
        if patch["metadata"]["annotations"].get(ann.BIND_PHASE) == "success" and not stalled.is_set():
            stalled.set()
            await asyncio.Event().wait()

    kube.patch_pod = stall_success  # type: ignore[method-assign]
    async with running(flags, kube) as sim:
        call = asyncio.create_task(sim.allocate(COUNT, sim.free_ids(COUNT, 2)))
        await asyncio.wait_for(stalled.wait(), 10)
        call.cancel()  # the client side of the RPC goes: the server's handler is cancelled
        with contextlib.suppress(asyncio.CancelledError):
            await call
        def annotations() -> dict[str, str]:
            found: dict[str, str] = kube.pods[("default", "vgpu-test")]["metadata"]["annotations"]
            return found

        await eventually(lambda: annotations()[ann.BIND_PHASE] == "allocating")
        assert annotations()[ann.DEVICES_TO_ALLOCATE] == fixture_pod()["metadata"]["annotations"][
            ann.DEVICES_TO_ALLOCATE]
        await sim.restart()
        await sim.wait_for([COUNT, MEMORY, CORES], timeout=20.0)
        response = await sim.allocate(COUNT, sim.free_ids(COUNT, 2))
        assert dict(response.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"] == (
            "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c,GPU-5beec879-79c9-6252-3aaa-9f5e146ba220")
        assert annotations()[ann.BIND_PHASE] == "success" and annotations()[ann.DEVICES_TO_ALLOCATE] == ""


async def test_seed001_configmap_name_is_what_gets_registered(flags: Flags, kube: FakeKube) -> None:
    """seed-001: device-config says nvidia.com/gpu; a legacy flag says the old default. The
    ConfigMap wins, so the kubelet and the scheduler see the same name and Allocate finds the pod."""
    seed = next(d for d in load_docs("scenarios/seed001-resource-name-mismatch.yaml")
                if d["metadata"]["name"] == "volcano-vgpu-device-config")
    kube.set_configmap("kube-system", "volcano-vgpu-device-config", seed["data"])
    legacy = replace(flags, resource_name="volcano.sh/vgpu-number")
    pod = fixture_pod()
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "2", MEMORY: "3000"}
    kube.add_pod(pod)
    async with running(legacy, kube, resources=("nvidia.com/gpu", MEMORY, CORES)) as sim:
        assert COUNT not in sim.plugins
        response = await sim.allocate("nvidia.com/gpu", sim.free_ids("nvidia.com/gpu", 2))
        assert response.container_responses[0].envs["CUDA_DEVICE_SM_LIMIT"] == "50"


async def test_configmap_change_reregisters_and_bad_change_is_ignored(flags: Flags, kube: FakeKube) -> None:
    kube.set_configmap("kube-system", "volcano-vgpu-device-config", device_config_data(split=10))
    async with running(flags, kube) as sim:
        assert len(sim.devices[COUNT]) == 80
        kube.set_configmap("kube-system", "volcano-vgpu-device-config",
                           {"device-config.yaml": "nvidia:\n  deviceSplitCount: many\n"})
        await asyncio.sleep(0.3)
        assert len(sim.devices[COUNT]) == 80  # malformed: keeps serving the running settings
        kube.set_configmap("kube-system", "volcano-vgpu-device-config", device_config_data(split=4))
        await eventually(lambda: len(sim.devices.get(COUNT, {})) == 32)
        await eventually(lambda: ",4,24564," in _annotations(kube).get(ann.NODE_REGISTER, ""))


def _count_kubelet_polls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often the kubelet watcher has looked at kubelet.sock: a test that waits for two more
    looks knows the watcher has seen whatever the plugin did before (no sleep needed)."""
    polls = [0]
    real = registration.socket_identity

    def counting(path: str) -> object:
        polls[0] += 1
        return real(path)

    monkeypatch.setattr(registration, "socket_identity", counting)
    return polls


async def _listed_and_watcher_looked(sim: KubeletSim, polls: list[int], name: str, devices: int) -> None:
    await eventually(lambda: len(sim.devices.get(name, {})) == devices, what=f"{devices} {name} listed")
    seen = polls[0]
    await eventually(lambda: polls[0] >= seen + 3, what="the kubelet watcher looking again")


async def test_configmap_change_registers_each_resource_once(
    flags: Flags, kube: FakeKube, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config change restarts the endpoints exactly once: the kubelet watcher must not take the
    plugin's own re-created sockets for a kubelet restart, and the old servers' sockets go."""
    caplog.set_level(logging.INFO, logger="vgpu_deviceplugin")
    polls = _count_kubelet_polls(monkeypatch)
    kube.set_configmap("kube-system", "volcano-vgpu-device-config", device_config_data(split=10))
    plugins: list[Plugin] = []
    async with running(flags, kube, plugins=plugins) as sim:
        # Same names (sockets re-created at the same paths), then a new count name (old socket gone).
        for count_name, split in ((COUNT, 4), ("example.com/vgpu", 2)):
            before = len(sim.registrations)
            kube.set_configmap("kube-system", "volcano-vgpu-device-config",
                               device_config_data(count_name=count_name, split=split))
            await _listed_and_watcher_looked(sim, polls, count_name, 8 * split)
            assert sorted(r.resource_name for r in sim.registrations[before:]) == sorted(
                [count_name, MEMORY, CORES])
            wanted = {registration.socket_name(n) for n in (count_name, MEMORY, CORES)}
            assert set(os.listdir(flags.device_plugin_dir)) == wanted | {"kubelet.sock"}
            assert len(plugins[0].endpoints) == 3
    assert not [r for r in caplog.records if "kubelet restarted" in r.getMessage()]
    assert [r.getMessage() for r in caplog.records].count("configuration changed: re-registering") == 2


async def test_restarts_are_serialized(flags: Flags, kube: FakeKube) -> None:
    plugins: list[Plugin] = []
    async with running(flags, kube, plugins=plugins) as sim:
        before = len(sim.registrations)
        await asyncio.gather(plugins[0].restart(), plugins[0].restart())
        assert len(plugins[0].endpoints) == 3
        assert len(sim.registrations) == before + 6
        wanted = {registration.socket_name(n) for n in (COUNT, MEMORY, CORES)}
        assert set(os.listdir(flags.device_plugin_dir)) == wanted | {"kubelet.sock"}
        await sim.wait_for([COUNT, MEMORY, CORES])
        response = await sim.allocate(MEMORY, sim.free_ids(MEMORY, 1))
        assert len(response.container_responses) == 1


async def test_kubelet_watcher_reacts_to_kubelet_sock_only(
    flags: Flags, kube: FakeKube, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="vgpu_deviceplugin")
    polls = _count_kubelet_polls(monkeypatch)
    async with running(flags, kube) as sim:
        before = len(sim.registrations)
        # One of the plugin's sockets vanishing is not a kubelet restart.
        os.unlink(os.path.join(flags.device_plugin_dir, registration.socket_name(CORES)))
        seen = polls[0]
        await eventually(lambda: polls[0] >= seen + 3, what="the kubelet watcher looking again")
        assert len(sim.registrations) == before
        # A new kubelet.sock is.
        await sim.restart()
        await sim.wait_for([COUNT, MEMORY, CORES])
        assert sorted(r.resource_name for r in sim.registrations[before:]) == sorted([COUNT, MEMORY, CORES])
    assert [r.getMessage() for r in caplog.records if "kubelet restarted" in r.getMessage()] != []


async def test_a_failed_register_after_the_sockets_vanished_serves_anew(
    flags: Flags, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kubelet that restarts between our serving and our Register wipes the plugin sockets; the
    # Register fails. Registering the same (gone) sockets again would fail forever: serve anew.
    plugins: list[Plugin] = []
    async with running(flags, kube, plugins=plugins) as sim:
        plugin = plugins[0]
        real_register = registration.register
        failed: list[str] = []

        async def wiped_then_failed(directory: str, endpoint: registration.Endpoint) -> None:
            if not failed:
                failed.append(endpoint.resource_name)
                os.unlink(endpoint.path)
                raise ConnectionError("kubelet restarting")
            await real_register(directory, endpoint)

        monkeypatch.setattr(registration, "register", wiped_then_failed)
        before = len(sim.registrations)
        await plugin.restart()
        assert not plugin.registered and failed
        await eventually(lambda: plugin.registered, what="the retry that serves anew")
        assert all(os.path.exists(e.path) for e in plugin.endpoints)
        assert sorted(r.resource_name for r in sim.registrations[before:]) == sorted([COUNT, MEMORY, CORES])


async def test_malformed_configmap_at_start_runs_on_defaults(flags: Flags, kube: FakeKube) -> None:
    kube.set_configmap("kube-system", "volcano-vgpu-device-config", {"device-config.yaml": "nvidia: [1, 2"})
    async with running(flags, kube) as sim:
        assert len(sim.devices[COUNT]) == 80


async def test_api_down_at_start_is_waited_for(flags: Flags, kube: FakeKube,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from vgpu_deviceplugin import runner

    real = runner._first_config
    monkeypatch.setattr(runner, "_first_config", lambda k, f: real(k, f, retry=0.05))
    kube.fail_next("get_configmap", "HTTP 503 Service Unavailable", times=3)
    kube.set_configmap("kube-system", "volcano-vgpu-device-config", device_config_data(split=2))
    async with running(flags, kube) as sim:
        assert len(sim.devices[COUNT]) == 16


async def test_node_config_entry_for_this_node_applies(flags: Flags, kube: FakeKube) -> None:
    kube.set_configmap("kube-system", "volcano-vgpu-node-config", {"config.json": (
        '{"nodeconfig": [{"name": "dev-app-2-150-master-1", "devicesplitcount": 5,'
        ' "filterdevices": {"uuid": ["GPU-3c8ce108-117a-aeae-a3e8-1c0c5dafebe7"], "index": [7]}},'
        ' {"name": "someone-else", "devicesplitcount": 1}]}')})
    async with running(flags, kube) as sim:
        assert len(sim.devices[COUNT]) == 6 * 5
        assert not any(i.startswith("GPU-3c8ce108") for i in sim.devices[COUNT])


def _annotations(kube: FakeKube) -> dict[str, str]:
    return dict(kube.nodes.get(FIXTURE_NODE, {}).get("metadata", {}).get("annotations") or {})


