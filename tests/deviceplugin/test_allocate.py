"""Pod selection and the Allocate answer (pure core), on the fixture pod and variations."""

from __future__ import annotations

import asyncio
import copy
import os
from typing import Any

import pytest
from vgpu_deviceplugin import allocate
from vgpu_deviceplugin.allocate import AllocateError, Mount
from vgpu_deviceplugin.config import Flags, resolve_settings
from vgpu_formats import annotations as ann

from tests.deviceplugin.kit import FIXTURE_NODE, fixture_node, fixture_pod

SETTINGS = resolve_settings(Flags(node_name=FIXTURE_NODE), None, None)
NODE_GPUS = {d.uuid: d.devmem for d in ann.decode_node_register(
    fixture_node()["metadata"]["annotations"][ann.NODE_REGISTER])}
GPU_A = "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c"
GPU_B = "GPU-5beec879-79c9-6252-3aaa-9f5e146ba220"
GPU_C = "GPU-3c8ce108-117a-aeae-a3e8-1c0c5dafebe7"
NAMES = SETTINGS.names


def plan_for(pods: list[dict[str, Any]], amount: int, init_served: dict[str, int] | None = None,
             settings: Any = SETTINGS) -> allocate.Plan:
    ref, pod, call = allocate.select(pods, FIXTURE_NODE, amount, settings.names, init_served or {})
    return allocate.plan(pod, ref, call, settings, NODE_GPUS, "/usr/local/vgpu", "/tmp/vgpu", "cache-id")


def gpu_pod(name: str, containers: list[dict[str, Any]], devices: str, *, vgpu_time: str = "100",
            init: list[dict[str, Any]] | None = None, node: str = FIXTURE_NODE) -> dict[str, Any]:
    pod = fixture_pod()
    pod["metadata"].update(name=name, uid=f"uid-{name}")
    pod["metadata"]["annotations"].update({ann.DEVICES_TO_ALLOCATE: devices, ann.VGPU_IDS_NEW: devices,
                                           ann.VGPU_TIME: vgpu_time, ann.VGPU_NODE: node})
    pod["spec"]["nodeName"] = node
    pod["spec"]["containers"] = containers
    if init:
        pod["spec"]["initContainers"] = init
    return pod


def ctr(name: str, count: int | None = 1, memory: int | str | None = None) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if count is not None:
        limits[NAMES.count] = str(count)
    if memory is not None:
        limits[NAMES.memory] = str(memory)
    out: dict[str, Any] = {"name": name, "image": "cuda", "resources": {"limits": limits}}
    return out


def test_fixture_pod_gets_exactly_the_upstream_answer() -> None:
    pod = fixture_pod()
    result = plan_for([pod], 2)
    assert result.envs == {
        "NVIDIA_VISIBLE_DEVICES": f"{GPU_A},{GPU_B}",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "50",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/vgpu/cache-id.cache",
    }
    cache = "/tmp/vgpu/containers/6f1d2c3b-8a4e-4c1f-9b7d-2e5a1f0c9d11_cuda-app"
    # Unlike upstream, no /tmp/vgpulock (nothing reads it) and only the region file, not its
    # host folder: the container cannot create files on the host. The settings file, read-only,
    # holds the hook's variables of the environment.
    assert result.mounts == (
        Mount("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True),
        Mount("/usr/local/vgpu/vgpu.env", f"{cache}/vgpu.env", True),
        Mount("/tmp/vgpu/cache-id.cache", f"{cache}/cache-id.cache", False),
        Mount("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", True),
    )
    assert result.cache_dir == cache and result.cache_file == f"{cache}/cache-id.cache"
    assert result.settings_file == f"{cache}/vgpu.env"
    assert result.settings_text.splitlines()[1:] == [
        f"NVIDIA_VISIBLE_DEVICES={GPU_A},{GPU_B}",
        "CUDA_DEVICE_MEMORY_LIMIT_0=3000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1=3000m",
        "CUDA_DEVICE_SM_LIMIT=50",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpu/cache-id.cache",
    ]
    assert result.settings_text.startswith("# vgpu-device-plugin: pod default/vgpu-test container cuda-app;")
    assert result.devices_to_allocate == ""  # consumed, as the seed shows after success
    assert result.done


def test_memory_limit_uses_the_memory_factor() -> None:
    settings = resolve_settings(Flags(node_name=FIXTURE_NODE, gpu_memory_factor=4), None, None)
    assert plan_for([fixture_pod()], 2, settings=settings).envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "12000m"


def test_disable_control_env_drops_the_preload_mount_where_the_admin_allows_it() -> None:
    pod = fixture_pod()
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    ref, pod, call = allocate.select([pod], FIXTURE_NODE, 2, NAMES, {})
    result = allocate.plan(pod, ref, call, SETTINGS, NODE_GPUS, "/usr/local/vgpu", "/tmp/vgpu",
                           "cache-id", allow_disable_control=True)
    paths = [m.container_path for m in result.mounts]
    assert "/etc/ld.so.preload" not in paths and "/usr/local/vgpu/libvgpu.so" in paths


def test_disable_control_env_is_refused_by_default() -> None:
    # Without the preload nothing loads libvgpu.so: one env line would lift the tenant's cap.
    pod = fixture_pod()
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DISABLE_CONTROL", "value": "false"}]
    with pytest.raises(AllocateError, match=r"container cuda-app sets CUDA_DISABLE_CONTROL, which "
                       r"would run it without libvgpu.so.*--allow-disable-control") as err:
        plan_for([pod], 2)
    assert err.value.pod is not None and err.value.pod.name == pod["metadata"]["name"]


def test_two_gpu_containers_are_served_in_order_and_sidecars_skipped() -> None:
    devices = f"{GPU_A},NVIDIA,3000,50:;{GPU_B},NVIDIA,2000,0:{GPU_C},NVIDIA,2000,0:"
    pod = gpu_pod("multi", [ctr("sidecar", count=None), ctr("a", 1), ctr("b", 2)], devices)
    first = plan_for([pod], 1)
    assert first.call.container == "a" and first.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert not first.done
    assert first.devices_to_allocate == f";{GPU_B},NVIDIA,2000,0:{GPU_C},NVIDIA,2000,0:"
    pod["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE] = first.devices_to_allocate
    second = plan_for([pod], 2)
    assert second.call.container == "b"
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_B},{GPU_C}"
    assert second.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "2000m"
    assert second.envs["CUDA_DEVICE_SM_LIMIT"] == "0"
    assert second.cache_dir.endswith("uid-multi_b")
    assert second.devices_to_allocate == ";" and second.done


def test_two_one_gpu_containers_match_per_container_not_pod_total() -> None:
    # Upstream HEAD compares the pod-wide total (2) with the kubelet's request (1): never matches.
    pod = gpu_pod("pair", [ctr("a"), ctr("b")], f"{GPU_A},NVIDIA,100,10:;{GPU_B},NVIDIA,100,10:")
    assert plan_for([pod], 1).call.container == "a"


def _waiting(name: str, containers: list[dict[str, Any]], devices: str, **kwargs: Any) -> dict[str, Any]:
    pod = gpu_pod(name, containers, devices, **kwargs)
    pod["metadata"]["annotations"][ann.BIND_PHASE] = ann.BIND_PHASE_ALLOCATING
    return pod


def _memory_world(tmp_path: Any, *pods: dict[str, Any]) -> tuple[Any, Any]:
    """A FakeKube holding `pods` (and the node, its lock held) and an Allocator on it."""
    from tests.deviceplugin.kit import FakeKube

    kube = FakeKube()
    kube.nodes[FIXTURE_NODE] = {"metadata": {"name": FIXTURE_NODE, "annotations": {ann.NODE_LOCK: "t"}}}
    for pod in pods:
        kube.add_pod(copy.deepcopy(pod))
    return kube, _allocator(kube, tmp_path)


def _annotations(kube: Any, name: str) -> dict[str, str]:
    found: dict[str, str] = kube.pods[("default", name)]["metadata"]["annotations"]
    return found


async def test_a_memory_only_container_is_served_by_its_memory_call(tmp_path: Any) -> None:
    # The scheduler gives a container asking only for memory one GPU and 0 cores; the kubelet
    # calls only the memory plugin for it. Upstream answered empty: the container ran with no
    # limit (and whatever GPUs its image's NVIDIA_VISIBLE_DEVICES named). Quantities as the API
    # server writes them back ("1k").
    devices = f"{GPU_A},NVIDIA,1000,0:;{GPU_B},NVIDIA,3000,0:"
    pod = _waiting("memonly", [ctr("mem", count=None, memory="1k"), ctr("gpu", 1, memory="3k")], devices)
    kube, allocator = _memory_world(tmp_path, pod)
    first = await allocator.allocate_memory(1000)
    assert first is not None and first.call.container == "mem"
    assert first.envs == {"NVIDIA_VISIBLE_DEVICES": GPU_A, "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m",
                          "CUDA_DEVICE_SM_LIMIT": "0",
                          "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/vgpu/id.cache"}
    assert first.cache_dir.endswith("uid-memonly_mem") and os.path.exists(first.settings_file)
    assert not first.done
    assert _annotations(kube, "memonly")[ann.DEVICES_TO_ALLOCATE] == f";{GPU_B},NVIDIA,3000,0:"
    # The next container's two calls, count first here: the count call answers it and finishes
    # the pod; its memory call, after, is counted and answered empty.
    second = await allocator.allocate(1)
    assert second.call.container == "gpu" and second.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B and second.done
    assert await allocator.allocate_memory(3000) is None
    assert _annotations(kube, "memonly")[ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS
    assert ann.NODE_LOCK not in kube.nodes[FIXTURE_NODE]["metadata"]["annotations"]
    assert allocator._state.memory_seen == {"uid-memonly": 2}


async def test_a_count_call_never_takes_a_memory_only_part_and_done_waits_for_it(tmp_path: Any) -> None:
    devices = f"{GPU_A},NVIDIA,3000,0:;{GPU_B},NVIDIA,1000,0:"
    pod = _waiting("mixed", [ctr("gpu", 1, memory=3000), ctr("mem", count=None, memory=1000)], devices)
    assert plan_for([pod], 1).call.container == "gpu"
    served = copy.deepcopy(pod)
    served["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE] = f";{GPU_B},NVIDIA,1000,0:"
    with pytest.raises(AllocateError, match="no pod on node"):
        plan_for([served], 1)  # "mem"'s part is the memory call's
    kube, allocator = _memory_world(tmp_path, pod)
    first = await allocator.allocate(1)
    assert first.call.container == "gpu" and not first.done  # "mem" still waits for its call
    assert _annotations(kube, "mixed")[ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING
    # The count call came first: the memory call after it is still "gpu"'s (the pod under
    # admission is asked first), then "mem"'s, which finishes the pod.
    assert await allocator.allocate_memory(3000) is None
    last = await allocator.allocate_memory(1000)
    assert last is not None and last.call.container == "mem" and last.done
    assert last.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B and last.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert _annotations(kube, "mixed")[ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS


async def test_the_trailing_memory_call_is_not_taken_for_a_waiting_pods(tmp_path: Any) -> None:
    # "done" and "next" ask alike; the count call finishes "done" (bind-phase success, no longer
    # waiting), and the kubelet's memory call for that container comes after it.
    done = _waiting("done", [ctr("gpu", 1, memory=1000)], f"{GPU_A},NVIDIA,1000,0:", vgpu_time="100")
    waiting = _waiting("next", [ctr("mem", count=None, memory=1000)], f"{GPU_B},NVIDIA,1000,0:",
                       vgpu_time="50")
    kube, allocator = _memory_world(tmp_path, done, waiting)
    assert (await allocator.allocate(1)).pod.name == "done"
    assert await allocator.allocate_memory(1000) is None
    assert _annotations(kube, "next")[ann.DEVICES_TO_ALLOCATE] == f"{GPU_B},NVIDIA,1000,0:"
    served = await allocator.allocate_memory(1000)  # "next"'s admission
    assert served is not None and served.pod.name == "next" and served.done
    assert await allocator.allocate_memory(999) is None  # no pod asks 999: empty, as upstream


async def test_after_a_failed_pod_the_next_pods_memory_call_is_its_own(tmp_path: Any) -> None:
    # "bad"'s second container is refused (a share of 0 MiB) and the kubelet gives up "bad"; that
    # container's memory call, never made, asks what the next pod's memory-only container asks.
    # The pod cache still shows "bad" allocating (its watch event is not in yet).
    bad = _waiting("bad", [ctr("a", 1, memory=2000), ctr("b", 1, memory=1000)],
                   f"{GPU_A},NVIDIA,2000,0:;{GPU_A},NVIDIA,0,0:", vgpu_time="1")
    good = _waiting("good", [ctr("m", count=None, memory=1000)], f"{GPU_B},NVIDIA,1000,0:", vgpu_time="2")
    kube, allocator = _memory_world(tmp_path, bad, good)
    allocator._cache = _synced_cache(bad, good)
    assert (await allocator.allocate(1)).call.container == "a"
    assert await allocator.allocate_memory(2000) is None
    with pytest.raises(AllocateError, match="usedmem 0"):
        await allocator.allocate(1)
    assert _annotations(kube, "bad")[ann.BIND_PHASE] == ann.BIND_PHASE_FAILED
    served = await allocator.allocate_memory(1000)
    assert served is not None and served.pod.name == "good" and served.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B


def _synced_cache(*pods: dict[str, Any]) -> Any:
    from vgpu_deviceplugin.pod_cache import PodCache

    cache = PodCache()
    for pod in pods:
        cache.apply("ADDED", copy.deepcopy(pod))
    cache.apply("SYNCED", {})
    return cache


async def test_a_swap_whose_reply_is_lost_is_read_back_never_taken_for_the_next_pods(tmp_path: Any) -> None:
    # The server applied the compare-and-swap of "first"'s part but the reply never came (a
    # timeout, a reset connection). Before, the call was decided again on a fresh list, where
    # "first"'s part was gone: "second"'s part was consumed and its GPU given to "first"'s
    # container, and "second" was rejected later with its share given away.
    first = _waiting("first", [ctr("gpu", 1, memory=1000)], f"{GPU_A},NVIDIA,1000,0:", vgpu_time="1")
    second = _waiting("second", [ctr("gpu", 1, memory=1000)], f"{GPU_B},NVIDIA,1000,0:", vgpu_time="2")
    kube, allocator = _memory_world(tmp_path, first, second)
    allocator._cache = _synced_cache(first, second)
    kube.lost_replies = 1
    served = await allocator.allocate(1)
    assert served.pod.name == "first" and served.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A and served.done
    assert _annotations(kube, "first")[ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS
    assert _annotations(kube, "second")[ann.DEVICES_TO_ALLOCATE] == f"{GPU_B},NVIDIA,1000,0:"
    assert _annotations(kube, "second")[ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING
    # The next call is "second"'s own.
    assert (await allocator.allocate(1)).pod.name == "second"


@pytest.mark.parametrize("late", [False, True])
async def test_a_timed_out_swap_read_back_untaken_is_made_again_for_the_same_pod(tmp_path: Any,
                                                                                 late: bool) -> None:
    # The swap timed out and the read-back still shows the part. It may never have reached
    # the server, or (late) the server applies it after the read-back: the same swap is made
    # again, which the compare lets take once, and never the next pod's part instead.
    first = _waiting("first", [ctr("gpu", 1, memory=1000)], f"{GPU_A},NVIDIA,1000,0:", vgpu_time="1")
    second = _waiting("second", [ctr("gpu", 1, memory=1000)], f"{GPU_B},NVIDIA,1000,0:", vgpu_time="2")
    kube, allocator = _memory_world(tmp_path, first, second)
    allocator._cache = _synced_cache(first, second)
    if late:
        kube.late_swaps = 1
    else:
        kube.fail_next("consume_devices", "Pod default/first: TimeoutError()")
    served = await allocator.allocate(1)
    assert served.pod.name == "first" and served.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A and served.done
    assert _annotations(kube, "first")[ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS
    assert _annotations(kube, "second")[ann.DEVICES_TO_ALLOCATE] == f"{GPU_B},NVIDIA,1000,0:"
    assert _annotations(kube, "second")[ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING


async def test_a_lost_swap_reply_that_cannot_be_read_back_fails_the_call_deciding_nothing_again(
        tmp_path: Any) -> None:
    first = _waiting("first", [ctr("gpu", 1, memory=1000)], f"{GPU_A},NVIDIA,1000,0:", vgpu_time="1")
    second = _waiting("second", [ctr("gpu", 1, memory=1000)], f"{GPU_B},NVIDIA,1000,0:", vgpu_time="2")
    kube, allocator = _memory_world(tmp_path, first, second)
    allocator._cache = _synced_cache(first, second)  # decided on the cache: the list is the read-back
    kube.lost_replies = 1
    kube.fail_next("list_pods_on_node", "HTTP 503 Service Unavailable")
    with pytest.raises(AllocateError, match="nor read it back"):
        await allocator.allocate(1)
    assert _annotations(kube, "first")[ann.BIND_PHASE] == ann.BIND_PHASE_FAILED
    assert _annotations(kube, "second")[ann.DEVICES_TO_ALLOCATE] == f"{GPU_B},NVIDIA,1000,0:"
    assert _annotations(kube, "second")[ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING


def _writes_success(namespace: str, name: str, patch: dict[str, Any]) -> bool:
    return bool(patch["metadata"]["annotations"].get(ann.BIND_PHASE) == ann.BIND_PHASE_SUCCESS)


def _stall_once(kube: Any, method: str, applied: bool, when: Any = None) -> asyncio.Event:
    """The next `method` call (for which `when(*args)` holds, if given) stalls for good, after it
    took effect (`applied`) or before; the event is set once it stalls. Later calls go through.
    (FakeKube's swap patches through patch_pod: `when` tells the success patch from it.)"""
    stalled = asyncio.Event()
    real = getattr(kube, method)

    async def stall(*args: Any) -> Any:
        if stalled.is_set() or (when is not None and not when(*args)):
            return await real(*args)
        if applied:
            await real(*args)
        stalled.set()
        await asyncio.Event().wait()

    setattr(kube, method, stall)
    return stalled


async def _give_up(kube: Any, method: str, applied: bool, call: Any, when: Any = None) -> None:
    """Runs the coroutine `call` until `method` stalls (`_stall_once`), then cancels it, as gRPC
    cancels the handler when the kubelet goes away."""
    stalled = _stall_once(kube, method, applied, when)
    task = asyncio.ensure_future(call)
    await asyncio.wait_for(stalled.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(("method", "applied"), [
    ("patch_pod", True),  # the swap took, the success patch was written: the reply is pending
    ("consume_devices", True),  # the swap took, its reply is pending
    ("consume_devices", False),  # the swap never reached the server
])
async def test_a_call_the_kubelet_gives_up_puts_its_part_back_for_its_next_call(
        tmp_path: Any, method: str, applied: bool) -> None:
    # The kubelet restarted while its Allocate call was waiting for the plugin: gRPC cancels the
    # handler. The restarted kubelet asks again for the container. Before, the part this call
    # had consumed was gone: the call failed with no pod waiting ("device request not found"),
    # and in a pod of two the container would have got the next container's part.
    first = _waiting("first", [ctr("gpu", 1, memory=1000)], f"{GPU_A},NVIDIA,1000,0:", vgpu_time="7")
    kube, allocator = _memory_world(tmp_path, first)
    when = _writes_success if method == "patch_pod" else None
    await _give_up(kube, method, applied, allocator.allocate(1), when)
    assert _annotations(kube, "first")[ann.DEVICES_TO_ALLOCATE] == f"{GPU_A},NVIDIA,1000,0:"
    assert _annotations(kube, "first")[ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING
    assert _annotations(kube, "first")[ann.VGPU_TIME] == "7"
    assert ann.NODE_LOCK not in kube.nodes[FIXTURE_NODE]["metadata"]["annotations"]
    # Its region file (written once the swap took) is gone: the monitor reads one a folder.
    assert not os.path.exists(f"{tmp_path}/containers/uid-first_gpu/id.cache")
    again = await allocator.allocate(1)
    assert again.pod.name == "first" and again.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A and again.done
    assert _annotations(kube, "first")[ann.DEVICES_TO_ALLOCATE] == ""
    assert _annotations(kube, "first")[ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS


async def test_a_given_up_memory_call_is_counted_again_by_its_next_call(tmp_path: Any) -> None:
    # A memory-only container's call, given up after its swap: the count of the pod's memory
    # calls goes back too, or the kubelet's next call would be taken for the next container's.
    devices = f"{GPU_A},NVIDIA,1000,0:;{GPU_B},NVIDIA,3000,0:"
    pod = _waiting("memonly", [ctr("mem", count=None, memory="1k"), ctr("gpu", 1, memory="3k")], devices)
    kube, allocator = _memory_world(tmp_path, pod)
    await _give_up(kube, "consume_devices", True, allocator.allocate_memory(1000))
    assert _annotations(kube, "memonly")[ann.DEVICES_TO_ALLOCATE] == devices
    again = await allocator.allocate_memory(1000)
    assert again is not None and again.call.container == "mem"
    assert again.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert (await allocator.allocate(1)).call.container == "gpu"


async def test_a_put_back_whose_reply_is_lost_is_read_back(tmp_path: Any) -> None:
    # The reverse swap took but its reply was lost: read back, the part is there, and the
    # bind-phase goes back to allocating (left at success, no call would find the pod).
    first = _waiting("first", [ctr("gpu", 1, memory=1000)], f"{GPU_A},NVIDIA,1000,0:")
    kube, allocator = _memory_world(tmp_path, first)
    stalled = _stall_once(kube, "patch_pod", applied=True, when=_writes_success)
    call = asyncio.create_task(allocator.allocate(1))
    await asyncio.wait_for(stalled.wait(), 5)
    kube.lost_replies = 1
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert _annotations(kube, "first")[ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING
    assert (await allocator.allocate(1)).envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A


async def test_a_given_up_call_is_put_back_before_the_next_call_decides(tmp_path: Any) -> None:
    # A second cancel (a restart's server stop) ends the handler while the put-back is still
    # under way; the next call, the restarted kubelet's, must not decide before it is done.
    first = _waiting("first", [ctr("gpu", 1, memory=1000)], f"{GPU_A},NVIDIA,1000,0:")
    kube, allocator = _memory_world(tmp_path, first)
    _stall_once(kube, "patch_pod", applied=True, when=_writes_success)
    swapped, consume = asyncio.Event(), kube.consume_devices
    release = asyncio.Event()

    async def slow_put_back(namespace: str, name: str, old: str, new: str, phase: str | None = None) -> Any:
        if old == "" and new != "":  # the reverse swap
            swapped.set()
            await release.wait()
        return await consume(namespace, name, old, new, phase)

    kube.consume_devices = slow_put_back
    call = asyncio.create_task(allocator.allocate(1))
    await asyncio.wait_for(_until(lambda: _annotations(kube, "first")[ann.BIND_PHASE] == "success"), 5)
    call.cancel()
    await asyncio.wait_for(swapped.wait(), 5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    again = asyncio.create_task(allocator.allocate(1))
    await asyncio.sleep(0.05)
    assert not again.done()  # waiting for the put-back, not failing on the consumed part
    release.set()
    served = await asyncio.wait_for(again, 5)
    assert served.pod.name == "first" and served.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.005)


async def test_a_given_up_call_whose_swap_was_refused_puts_back_nothing(tmp_path: Any) -> None:
    # On a stale cache the call named container a again (already answered) and its swap was
    # refused; it was given up while deciding again on a fresh list. Putting "its" part back
    # would give a's part to the pod again, and the kubelet's call for b would get a's GPU.
    pod = _waiting("two", [ctr("a"), ctr("b")], f"{GPU_A},NVIDIA,1000,10:;{GPU_B},NVIDIA,2000,20:")
    kube, allocator = _memory_world(tmp_path, pod)
    allocator._cache = cache = _synced_cache(pod)
    assert (await allocator.allocate(1)).call.container == "a"
    cache.apply("MODIFIED", copy.deepcopy(pod))  # the older version, after the plugin's write
    await _give_up(kube, "list_pods_on_node", False, allocator.allocate(1))
    assert _annotations(kube, "two")[ann.DEVICES_TO_ALLOCATE] == f";{GPU_B},NVIDIA,2000,20:"
    served = await allocator.allocate(1)
    assert served.call.container == "b" and served.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B


async def test_a_memory_call_given_up_after_its_pod_was_done_is_counted_again(tmp_path: Any) -> None:
    # A pod of one memory-only container: its call consumed the last part and was given up
    # while releasing the node lock, after its count had been taken. The count goes back too:
    # the kubelet's next call is then a first call again, of a pod none of whose calls came; left
    # counted, that call was explained by no pod and answered empty (the container uncapped).
    pod = _waiting("memonly", [ctr("mem", count=None, memory="1k")], f"{GPU_A},NVIDIA,1000,0:")
    kube, allocator = _memory_world(tmp_path, pod)
    await _give_up(kube, "patch_node", False, allocator.allocate_memory(1000))
    assert _annotations(kube, "memonly")[ann.DEVICES_TO_ALLOCATE] == f"{GPU_A},NVIDIA,1000,0:"
    assert _annotations(kube, "memonly")[ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING
    again = await allocator.allocate_memory(1000)
    assert again is not None and again.call.container == "mem" and again.done
    assert again.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A


async def test_a_first_memory_call_alike_for_two_pods_is_counted_by_the_count_call(tmp_path: Any) -> None:
    # "older" and "admitted" both start with a container asking 1000 units and the count
    # resource; the kubelet admits "admitted" first. Its memory call is counted for neither (a
    # guess for "older" made "admitted"'s next memory call look like its first container's,
    # answered empty: "m" ran uncapped), and the count call that follows counts it.
    older = _waiting("older", [ctr("x", 2, memory=1000)],
                     f"{GPU_A},NVIDIA,1000,0:{GPU_B},NVIDIA,1000,0:", vgpu_time="1")
    admitted = _waiting("admitted", [ctr("a", 1, memory=1000), ctr("m", count=None, memory=1000)],
                        f"{GPU_C},NVIDIA,1000,0:;{GPU_A},NVIDIA,1000,0:", vgpu_time="2")
    kube, allocator = _memory_world(tmp_path, older, admitted)
    assert await allocator.allocate_memory(1000) is None
    assert allocator._state.memory_seen == {}
    assert (await allocator.allocate(1)).pod.name == "admitted"
    served = await allocator.allocate_memory(1000)
    assert served is not None and served.pod.name == "admitted" and served.call.container == "m"
    assert served.done and _annotations(kube, "older")[ann.DEVICES_TO_ALLOCATE].count("NVIDIA") == 2
    # Then "older": its memory call is no longer taken for "admitted"'s.
    assert await allocator.allocate_memory(1000) is None
    assert (await allocator.allocate(2)).pod.name == "older"
    assert allocator._state.memory_seen == {"uid-admitted": 2, "uid-older": 1}


async def test_a_pod_the_kubelet_admitted_takes_no_more_calls(tmp_path: Any) -> None:
    # "stuck" runs (the kubelet wrote status.startTime after admitting it) with its part never
    # consumed, so it stays allocating; it must not make later pods' memory calls a guess, nor
    # take them.
    stuck = _waiting("stuck", [ctr("m", count=None, memory=1000)], f"{GPU_A},NVIDIA,1000,0:", vgpu_time="1")
    stuck["status"] = {"phase": "Running", "startTime": "2026-12-01T00:00:00Z"}
    new = _waiting("new", [ctr("a", 1, memory=1000)], f"{GPU_B},NVIDIA,1000,0:", vgpu_time="2")
    kube, allocator = _memory_world(tmp_path, stuck, new)
    assert await allocator.allocate_memory(1000) is None
    assert (await allocator.allocate(1)).pod.name == "new"
    alone = _waiting("alone", [ctr("m", count=None, memory=1000)], f"{GPU_C},NVIDIA,1000,0:", vgpu_time="3")
    kube.add_pod(copy.deepcopy(alone))
    served = await allocator.allocate_memory(1000)
    assert served is not None and served.pod.name == "alone"
    assert _annotations(kube, "stuck")[ann.DEVICES_TO_ALLOCATE] == f"{GPU_A},NVIDIA,1000,0:"


async def test_a_memory_only_container_is_served_only_when_a_fresh_list_agrees(tmp_path: Any) -> None:
    # The cache lags: it shows "alone" but not "both", which the kubelet is admitting. On the
    # cache alone "alone" looks like the one candidate, and "both"'s container got its share.
    alone = _waiting("alone", [ctr("m", count=None, memory=1000)], f"{GPU_A},NVIDIA,1000,0:", vgpu_time="1")
    both = _waiting("both", [ctr("a", 1, memory=1000)], f"{GPU_B},NVIDIA,1000,0:", vgpu_time="2")
    kube, allocator = _memory_world(tmp_path, alone, both)
    allocator._cache = _synced_cache(alone)
    with pytest.raises(AllocateError, match="cannot be told"):
        await allocator.allocate_memory(1000)
    assert _annotations(kube, "alone")[ann.DEVICES_TO_ALLOCATE] == f"{GPU_A},NVIDIA,1000,0:"
    assert kube.pod_writes("default/alone") == kube.pod_writes("default/both") == []


async def test_a_first_memory_call_is_decided_on_a_fresh_list(tmp_path: Any) -> None:
    # The cache shows "both" (its container asks both resources) but not "alone", bound a moment
    # ago, which the kubelet admits. On the cache the call looked like "both"'s, deferred and
    # answered empty: "alone"'s container ran uncapped.
    both = _waiting("both", [ctr("a", 1, memory=1000)], f"{GPU_B},NVIDIA,1000,0:", vgpu_time="1")
    alone = _waiting("alone", [ctr("m", count=None, memory=1000)], f"{GPU_A},NVIDIA,1000,0:", vgpu_time="2")
    kube, allocator = _memory_world(tmp_path, both)
    allocator._cache = _synced_cache(both)
    kube.add_pod(copy.deepcopy(alone))
    both["metadata"]["annotations"][ann.BIND_PHASE] = ann.BIND_PHASE_SUCCESS  # admitted earlier
    kube.pods[("default", "both")] = copy.deepcopy(both)
    served = await allocator.allocate_memory(1000)
    assert served is not None and served.pod.name == "alone" and served.done
    assert allocator._state.deferred is None


async def test_a_pod_failed_before_any_memory_call_takes_none(tmp_path: Any) -> None:
    # "bad" fails on its first call (a count call: usedmem 0) while a lagging list still shows
    # it allocating, its first container asking what "good"'s asks: "good"'s first memory call
    # must not look like a guess between the two (refused, "good" would fail too).
    bad = _waiting("bad", [ctr("a", 1, memory=1000)], f"{GPU_A},NVIDIA,0,0:", vgpu_time="1")
    good = _waiting("good", [ctr("m", count=None, memory=1000)], f"{GPU_C},NVIDIA,1000,0:", vgpu_time="2")
    kube, allocator = _memory_world(tmp_path, bad, good)
    with pytest.raises(AllocateError, match="usedmem 0"):
        await allocator.allocate(1)
    kube.pods[("default", "bad")] = copy.deepcopy(bad)  # the list lags behind the failure
    served = await allocator.allocate_memory(1000)
    assert served is not None and served.pod.name == "good"
    assert _annotations(kube, "bad")[ann.DEVICES_TO_ALLOCATE] == f"{GPU_A},NVIDIA,0,0:"


def test_a_count_call_skips_a_pod_the_kubelet_admitted() -> None:
    started = _waiting("started", [ctr("a", 1)], f"{GPU_A},NVIDIA,1000,0:", vgpu_time="1")
    started["status"] = {"phase": "Pending", "startTime": "2026-12-01T00:00:00Z"}
    waiting = _waiting("waiting", [ctr("a", 1)], f"{GPU_B},NVIDIA,1000,0:", vgpu_time="2")
    assert plan_for([started, waiting], 1).pod.name == "waiting"


def test_an_init_container_borrows_a_memory_only_part_when_no_other_holds_one() -> None:
    pod = _waiting("memonly-init", [ctr("m", count=None, memory=1000)], f"{GPU_A},NVIDIA,1000,0:",
                   init=[ctr("warm", 1)])
    result = plan_for([pod], 1)
    assert result.call.is_init and result.call.container == "warm"
    assert result.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A and result.devices_to_allocate is None


async def test_a_memory_call_two_waiting_pods_could_start_with_is_refused(tmp_path: Any) -> None:
    # The kubelet's first call for "both" may be its memory call, which "alone", older, would
    # take for its memory-only container's: serving either on a guess could give one pod's
    # share to the other's container. Nothing is patched; the kubelet rejects the pod it admits.
    alone = _waiting("alone", [ctr("m", count=None, memory=1000)], f"{GPU_A},NVIDIA,1000,0:", vgpu_time="1")
    both = _waiting("both", [ctr("a", 1, memory=1000)], f"{GPU_B},NVIDIA,1000,0:", vgpu_time="2")
    kube, allocator = _memory_world(tmp_path, alone, both)
    with pytest.raises(AllocateError, match=r"pods default/alone, default/both all wait .* cannot be told"):
        await allocator.allocate_memory(1000)
    assert kube.pod_writes("default/alone") == kube.pod_writes("default/both") == []
    # A pod whose first call is a count call (its first container asks no memory) is no candidate.
    count_first = _waiting("count-first", [ctr("a", 1), ctr("m", count=None, memory=1000)],
                           f"{GPU_A},NVIDIA,1000,0:;{GPU_B},NVIDIA,1000,0:", vgpu_time="1")
    kube, allocator = _memory_world(tmp_path, count_first, alone)
    served = await allocator.allocate_memory(1000)
    assert served is not None and served.pod.name == "alone"


async def test_a_memory_only_container_served_on_a_stale_cache_is_decided_again(tmp_path: Any) -> None:
    devices = f"{GPU_A},NVIDIA,1000,0:;{GPU_B},NVIDIA,1000,0:"
    pod = _waiting("twomem", [ctr("m1", count=None, memory=1000), ctr("m2", count=None, memory=1000)],
                   devices)
    _, allocator = _memory_world(tmp_path, pod)
    cache = _synced_cache(pod)
    allocator._cache = cache
    first = await allocator.allocate_memory(1000)
    assert first is not None and first.call.container == "m1"
    cache.apply("MODIFIED", copy.deepcopy(pod))  # the watch delivers the older version again
    second = await allocator.allocate_memory(1000)
    assert second is not None and second.call.container == "m2" and second.done
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B
    assert allocator._state.memory_seen == {"uid-twomem": 2}  # counted once, not per decision


async def test_a_memory_only_pod_whose_annotation_cannot_be_read_is_failed(tmp_path: Any) -> None:
    pod = _waiting("garbled", [ctr("m", count=None, memory=1000)],
                   f"{GPU_A},NVIDIA,1000,0:;{GPU_B},NVIDIA,1,0:")  # two parts, one container
    kube, allocator = _memory_world(tmp_path, pod)
    with pytest.raises(AllocateError,
                       match=r"pod default/garbled: annotation volcano\.sh/devices-to-allocate"):
        await allocator.allocate_memory(1000)
    assert _annotations(kube, "garbled")[ann.BIND_PHASE] == ann.BIND_PHASE_FAILED


def test_memory_counts_are_mended_by_the_count_calls() -> None:
    pod = gpu_pod("m", [ctr("a", 1, memory=10), ctr("b", 1, memory=10), ctr("c", count=None, memory=10)],
                  f"{GPU_A},NVIDIA,10,0:;{GPU_B},NVIDIA,10,0:;{GPU_C},NVIDIA,10,0:")
    b = allocate.Call("b", False, 1, ())
    # Answering "b": "a"'s memory call came (1 at least), "b"'s may have (2 at most).
    assert [allocate.memory_seen_after(pod, NAMES, b, seen, None) for seen in (0, 1, 2, 3)] == [1, 1, 2, 2]
    # The memory call just before, counted for no pod, asked what "b" asks and may be this
    # pod's: it was "b"'s.
    assert allocate.memory_seen_after(pod, NAMES, b, 0, allocate.Deferred(10, frozenset({"uid-m"}))) == 2
    assert allocate.memory_seen_after(pod, NAMES, b, 0, allocate.Deferred(11, frozenset({"uid-m"}))) == 1
    assert allocate.memory_seen_after(pod, NAMES, b, 0, allocate.Deferred(10, frozenset({"uid-x"}))) == 1
    no_memory = allocate.Call("x", False, 0, ())
    assert allocate.memory_seen_after(pod, NAMES, no_memory, 3, None) == 3


async def test_a_memory_only_init_container_is_refused_naming_the_fix(tmp_path: Any) -> None:
    pod = _waiting("initmem", [ctr("app", 1, memory=1000)], f"{GPU_A},NVIDIA,1000,0:",
                   init=[ctr("warm", count=None, memory=500)])
    kube, allocator = _memory_world(tmp_path, pod)
    with pytest.raises(AllocateError, match=r"init container warm asks for volcano\.sh/vgpu-memory "
                       r"without volcano\.sh/vgpu-number.*Add volcano\.sh/vgpu-number: 1") as caught:
        await allocator.allocate_memory(500)
    assert caught.value.pod is not None and caught.value.pod.name == "initmem"
    assert _annotations(kube, "initmem")[ann.BIND_PHASE] == ann.BIND_PHASE_FAILED


def test_init_containers_borrow_the_first_part_with_the_count_resource() -> None:
    # As before memory-only containers were served: their part is not lent.
    pod = gpu_pod("lend", [ctr("m", count=None, memory=1000), ctr("app", 2)],
                  f"{GPU_A},NVIDIA,1000,0:;{GPU_B},NVIDIA,3000,50:{GPU_C},NVIDIA,3000,50:",
                  init=[ctr("warm", 2)])
    result = plan_for([pod], 2)
    assert result.call.is_init and result.envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_B},{GPU_C}"


def test_init_container_reuses_the_first_part_without_consuming_it() -> None:
    pod = gpu_pod("init", [ctr("app", 1)], f"{GPU_A},NVIDIA,3000,50:", init=[ctr("prepare", 1)])
    first = plan_for([pod], 1)
    assert first.call.is_init and first.call.container == "prepare"
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert first.devices_to_allocate is None and not first.done
    second = plan_for([pod], 1, init_served={"uid-init": 1})
    assert second.call.container == "app" and not second.call.is_init and second.done


def test_an_init_container_asking_for_no_gpu_is_passed_over() -> None:
    # The kubelet makes no Allocate call for a container asking for 0 devices: waiting for one
    # left the pod's app container unserved for ever.
    pod = gpu_pod("init0", [ctr("app", 1)], f"{GPU_A},NVIDIA,3000,50:",
                  init=[ctr("setup", 0), ctr("prepare", 1)])
    first = plan_for([pod], 1)
    assert first.call.is_init and first.call.container == "prepare"
    second = plan_for([pod], 1, init_served={"uid-init0": 1})
    assert second.call.container == "app" and not second.call.is_init and second.done
    only_zero = gpu_pod("init00", [ctr("app", 1)], f"{GPU_A},NVIDIA,3000,50:", init=[ctr("setup", 0)])
    result = plan_for([only_zero], 1)
    assert result.call.container == "app" and result.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A


def test_oldest_pod_wins_and_other_nodes_are_never_picked() -> None:
    young = gpu_pod("young", [ctr("a")], f"{GPU_A},NVIDIA,1,1:", vgpu_time="200")
    old = gpu_pod("old", [ctr("a")], f"{GPU_B},NVIDIA,1,1:", vgpu_time="100")
    elsewhere = gpu_pod("elsewhere", [ctr("a")], f"{GPU_C},NVIDIA,1,1:", vgpu_time="1", node="other-node")
    done = gpu_pod("done", [ctr("a")], f"{GPU_C},NVIDIA,1,1:", vgpu_time="2")
    done["metadata"]["annotations"][ann.BIND_PHASE] = ann.BIND_PHASE_SUCCESS
    assert plan_for([young, elsewhere, done, old], 1).pod.name == "old"


def test_no_pending_pod_is_its_own_error_and_names_no_pod() -> None:
    unrelated = gpu_pod("unrelated", [ctr("a")], f"{GPU_A},NVIDIA,1,1:", node="other-node")
    with pytest.raises(AllocateError) as err:
        plan_for([unrelated], 1)
    assert err.value.pod is None
    assert "no pod on node dev-app-2-150-master-1 is waiting for 1 volcano.sh/vgpu-number" in str(err.value)
    with pytest.raises(AllocateError, match="waiting pods: default/vgpu-test \\(next container wants 2\\)"):
        plan_for([fixture_pod()], 3)


@pytest.mark.parametrize(
    "garbage",
    ["GPU-a,NVIDIA,3000", "\x00\x01", "GPU-a,NVIDIA,x,1:", f"{GPU_A},NVIDIA,1,1:;{GPU_B},NVIDIA,1,1:"],
)
def test_garbage_annotation_fails_that_pod_with_a_clear_message(garbage: str) -> None:
    pod = gpu_pod("broken", [ctr("a")], garbage)
    with pytest.raises(AllocateError) as err:
        plan_for([pod], 1)
    assert err.value.pod is not None and err.value.pod.name == "broken"
    assert ann.DEVICES_TO_ALLOCATE in str(err.value)


@pytest.mark.parametrize(
    ("memory", "cores", "bad"),
    [(0, 50, "usedmem 0"), (3000, 101, "usedcores 101"), (3000, 1000, "usedcores 1000")],
)
def test_an_entry_libvgpu_would_read_as_no_limit_fails_the_pod(memory: int, cores: int, bad: str) -> None:
    # usedmem 0 becomes CUDA_DEVICE_MEMORY_LIMIT_0=0m (no cap); usedcores over 100 an SM limit the
    # hook rejects (no SM cap): the container must not start with either.
    pod = gpu_pod("nolimit", [ctr("a")], f"{GPU_A},NVIDIA,{memory},{cores}:")
    with pytest.raises(AllocateError) as err:
        plan_for([pod], 1)
    assert err.value.pod is not None and err.value.pod.name == "nolimit"
    message = str(err.value)
    assert message.startswith("pod default/nolimit: ")
    assert f"annotation {ann.DEVICES_TO_ALLOCATE}" in message and bad in message and GPU_A in message


def test_garbage_on_one_pod_does_not_stop_a_good_one() -> None:
    broken = gpu_pod("broken", [ctr("a")], "nonsense", vgpu_time="1")
    good = gpu_pod("good", [ctr("a")], f"{GPU_A},NVIDIA,1,1:", vgpu_time="5")
    assert plan_for([broken, good], 1).pod.name == "good"


def test_gpu_not_on_this_node_fails_the_pod() -> None:
    pod = gpu_pod("wrong", [ctr("a")], "GPU-00000000-0000-0000-0000-000000000000,NVIDIA,1,1:")
    with pytest.raises(AllocateError, match="is not a healthy GPU of node dev-app-2-150-master-1") as err:
        plan_for([pod], 1)
    assert err.value.pod is not None


def test_dynamic_mig_is_refused_clearly() -> None:
    pod = gpu_pod("mig", [ctr("a")], f"{GPU_A}[group1-3],NVIDIA,1,1:")
    with pytest.raises(AllocateError, match="dynamic MIG"):
        plan_for([pod], 1)


def test_disable_core_limit_reaches_the_env() -> None:
    settings = SETTINGS.__class__(**{**SETTINGS.__dict__, "disable_core_limit": True})
    result = plan_for([fixture_pod()], 2, settings=settings)
    assert result.envs["GPU_CORE_UTILIZATION_POLICY"] == "disable"
    assert "GPU_CORE_UTILIZATION_POLICY=disable" in result.settings_text.splitlines()


def test_patches_touch_only_the_protocol_annotations() -> None:
    assert allocate.success_patch() == {"metadata": {"annotations": {
        "volcano.sh/bind-phase": "success", "volcano.sh/vgpu-time": "18446744073709551615"}}}
    assert allocate.failed_patch()["metadata"]["annotations"]["volcano.sh/bind-phase"] == "failed"
    assert allocate.release_lock_patch() == {"metadata": {"annotations": {"hamivgpu": None}}}


def test_select_does_not_modify_its_input() -> None:
    pod = fixture_pod()
    before = copy.deepcopy(pod)
    plan_for([pod], 2)
    assert pod == before


def test_a_pod_the_kubelet_already_rejected_never_takes_the_next_pods_share() -> None:
    # An admission check before Allocate (a forbidden sysctl, say) ends a pod as Failed while
    # its bind-phase stays allocating; it must not be served the next Allocate of that count.
    rejected = gpu_pod("rejected", [ctr("a")], f"{GPU_A},NVIDIA,20000,100:", vgpu_time="1")
    rejected["status"] = {"phase": "Failed", "reason": "SysctlForbidden"}
    small = gpu_pod("small", [ctr("a")], f"{GPU_B},NVIDIA,1000,10:", vgpu_time="2")
    result = plan_for([rejected, small], 1)
    assert result.pod.name == "small"
    assert result.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B
    assert result.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    rejected["status"] = {"phase": "Succeeded"}
    assert plan_for([rejected, small], 1).pod.name == "small"


def test_an_init_container_asking_more_than_the_first_share_is_refused_not_given_another_pod() -> None:
    pod = gpu_pod("greedy", [ctr("app", 1)], f"{GPU_A},NVIDIA,3000,50:", vgpu_time="1",
                  init=[ctr("prepare", 2)])
    other = gpu_pod("other", [ctr("app", 2)], f"{GPU_B},NVIDIA,1000,10:{GPU_C},NVIDIA,1000,10:",
                    vgpu_time="2")
    with pytest.raises(AllocateError, match=r"init container prepare asks for 2 .* has 1") as err:
        plan_for([pod, other], 2)
    assert err.value.pod is not None and err.value.pod.name == "greedy"


def test_a_sidecar_init_container_with_a_gpu_is_refused() -> None:
    sidecar = ctr("proxy", 1)
    sidecar["restartPolicy"] = "Always"
    pod = gpu_pod("sidecar", [ctr("app", 1)], f"{GPU_A},NVIDIA,3000,50:", init=[sidecar])
    with pytest.raises(AllocateError, match="pod default/sidecar: init container proxy is a sidecar"):
        plan_for([pod], 1)


def test_a_gpu_named_twice_in_a_part_is_refused() -> None:
    # NVIDIA_VISIBLE_DEVICES drops the repeat but the limits would not: B would get A's 20000m.
    devices = f"{GPU_A},NVIDIA,20000,10:{GPU_A},NVIDIA,20000,10:{GPU_B},NVIDIA,100,10:"
    pod = gpu_pod("twice", [ctr("app", 3)], devices)
    with pytest.raises(AllocateError, match=f"names GPU {GPU_A} twice for container app"):
        plan_for([pod], 3)


def test_a_memory_share_larger_than_the_gpu_is_refused() -> None:
    memory = NODE_GPUS[GPU_A]
    assert plan_for([gpu_pod("whole", [ctr("app")], f"{GPU_A},NVIDIA,{memory},10:")], 1).done
    pod = gpu_pod("huge", [ctr("app")], f"{GPU_A},NVIDIA,4294967295,10:")
    with pytest.raises(AllocateError, match=f"more than the GPU's {memory} MiB: no cap"):
        plan_for([pod], 1)


def test_more_gpus_than_the_hook_keeps_limits_for_is_refused() -> None:
    # libvgpu.so's region has 16 device records: a 17th GPU would run without a cap.
    uuids = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(17)]
    gpus = {u: 80000 for u in uuids}
    for count, refused in ((16, False), (17, True)):
        devices = "".join(f"{u},NVIDIA,1000,10:" for u in uuids[:count])
        pod = gpu_pod(f"gpus{count}", [ctr("app", count)], devices)
        ref, found, call = allocate.select([pod], FIXTURE_NODE, count, NAMES, {})
        if not refused:
            planned = allocate.plan(found, ref, call, SETTINGS, gpus, "/usr/local/vgpu", "/tmp/vgpu", "id")
            assert planned.envs["CUDA_DEVICE_MEMORY_LIMIT_15"] == "1000m"
            continue
        with pytest.raises(AllocateError, match=r"gives container app 17 GPUs; libvgpu\.so keeps the "
                           r"limits of 16 at most") as err:
            allocate.plan(found, ref, call, SETTINGS, gpus, "/usr/local/vgpu", "/tmp/vgpu", "id")
        assert err.value.pod is not None and err.value.pod.name == "gpus17"


def test_a_gpu_given_other_cores_than_the_first_gets_its_own_sm_limit() -> None:
    # CUDA_DEVICE_SM_LIMIT is the first GPU's (upstream's answer); libvgpu.so reads a per-GPU
    # CUDA_DEVICE_SM_LIMIT_<i> over it, so B's 50 is not lost to A's 0 (no limit).
    pod = gpu_pod("mixed", [ctr("app", 2)], f"{GPU_A},NVIDIA,3000,0:{GPU_B},NVIDIA,3000,50:")
    result = plan_for([pod], 2)
    assert result.envs["CUDA_DEVICE_SM_LIMIT"] == "0"
    assert result.envs["CUDA_DEVICE_SM_LIMIT_1"] == "50"
    assert "CUDA_DEVICE_SM_LIMIT_0" not in result.envs
    assert "CUDA_DEVICE_SM_LIMIT_1=50\n" in result.settings_text


def test_an_unhealthy_gpu_is_not_handed_out() -> None:
    pod = gpu_pod("xid", [ctr("app")], f"{GPU_A},NVIDIA,1000,10:")
    ref, found, call = allocate.select([pod], FIXTURE_NODE, 1, NAMES, {})
    healthy = {u: m for u, m in NODE_GPUS.items() if u != GPU_A}
    with pytest.raises(AllocateError, match=f"GPU {GPU_A} .* is not a healthy GPU"):
        allocate.plan(found, ref, call, SETTINGS, healthy, "/usr/local/vgpu", "/tmp/vgpu", "id")


def test_a_vgpu_time_of_non_ascii_digits_sorts_last_instead_of_failing_every_allocate() -> None:
    hostile = gpu_pod("hostile", [ctr("a")], f"{GPU_A},NVIDIA,1000,10:", vgpu_time="²")
    victim = gpu_pod("victim", [ctr("a")], f"{GPU_B},NVIDIA,1000,10:", vgpu_time="5")
    assert plan_for([hostile, victim], 1).pod.name == "victim"
    assert ann.decode_vgpu_time("²") == ann.decode_vgpu_time(None)


async def test_an_unexpected_error_is_this_calls_error_and_releases_the_node_lock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A value no check foresaw must not leave the node locked for every later pod.
    from vgpu_deviceplugin.allocator import Allocator
    from vgpu_deviceplugin.state import PluginState

    class Kube:
        patched: list[tuple[str, dict[str, Any]]] = []

        async def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
            return [fixture_pod()]

        async def patch_node(self, node: str, patch: dict[str, Any]) -> None:
            self.patched.append((node, patch))

    def broken(*args: Any) -> Any:
        raise ValueError("a value nobody foresaw")

    monkeypatch.setattr(allocate, "select", broken)
    kube = Kube()
    allocator = Allocator(kube, PluginState(SETTINGS, []), Flags(node_name=FIXTURE_NODE))  # type: ignore[arg-type]
    with pytest.raises(AllocateError, match=r"unexpected error while allocating 2 device.*nobody foresaw"):
        await allocator.allocate(2)
    assert kube.patched == [(FIXTURE_NODE, allocate.release_lock_patch())]


def _allocator(kube: Any, cache_root: Any, cache: Any = None, unhealthy: str | None = None) -> Any:
    from vgpu_deviceplugin.allocator import Allocator
    from vgpu_deviceplugin.gpus import GpuDevice
    from vgpu_deviceplugin.state import PluginState

    gpus = [GpuDevice(i, uuid, "NVIDIA A10", memory, i) for i, (uuid, memory) in enumerate(NODE_GPUS.items())]
    state = PluginState(SETTINGS, gpus)
    if unhealthy is not None:
        state.health[unhealthy] = False
    return Allocator(kube, state, Flags(node_name=FIXTURE_NODE, cache_root=str(cache_root)), cache=cache,
                     cache_id=lambda: "id")


async def test_a_pod_rejected_since_the_cache_saw_it_is_not_served(tmp_path: Any) -> None:
    # The kubelet writes a rejected pod's Failed status asynchronously: the plugin's cache may
    # still show it Pending. Its share must not go to the next pod all the same.
    from vgpu_deviceplugin.pod_cache import PodCache

    from tests.deviceplugin.kit import FakeKube

    rejected = gpu_pod("rejected", [ctr("a")], f"{GPU_A},NVIDIA,20000,100:", vgpu_time="1")
    small = gpu_pod("small", [ctr("a")], f"{GPU_B},NVIDIA,1000,10:", vgpu_time="2")
    for pod in (rejected, small):
        pod["metadata"]["annotations"][ann.BIND_PHASE] = ann.BIND_PHASE_ALLOCATING
        pod["status"] = {"phase": "Pending"}
    kube, cache = FakeKube(), PodCache()
    for pod in (rejected, small):
        kube.add_pod(copy.deepcopy(pod))
        cache.apply("ADDED", copy.deepcopy(pod))
    cache.apply("SYNCED", {})
    kube.pods[("default", "rejected")]["status"] = {"phase": "Failed", "reason": "SysctlForbidden"}
    plan = await _allocator(kube, tmp_path, cache).allocate(1)
    assert plan.pod.name == "small" and plan.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert kube.pods[("default", "rejected")]["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE] == \
        f"{GPU_A},NVIDIA,20000,100:"


async def test_a_stale_cache_never_rewrites_the_files_of_a_container_already_answered(
        tmp_path: Any) -> None:
    # The watch may deliver an older version of the pod after the plugin's own write, still
    # showing container a's part pending: the decision taken on it names a again, and its swap
    # fails. Before, a's settings file had been rewritten first, naming a region (a new cache id)
    # that a's answer does not mount.
    from vgpu_deviceplugin.pod_cache import PodCache

    from tests.deviceplugin.kit import FakeKube

    pod = gpu_pod("two", [ctr("a"), ctr("b")], f"{GPU_A},NVIDIA,1000,10:;{GPU_B},NVIDIA,2000,20:")
    pod["metadata"]["annotations"][ann.BIND_PHASE] = ann.BIND_PHASE_ALLOCATING
    kube, cache = FakeKube(), PodCache()
    kube.add_pod(copy.deepcopy(pod))
    cache.apply("ADDED", copy.deepcopy(pod))
    cache.apply("SYNCED", {})
    ids = iter(["first", "second", "third"])
    allocator = _allocator(kube, tmp_path, cache)
    allocator._cache_id = lambda: next(ids)
    first = await allocator.allocate(1)
    assert first.call.container == "a"
    with open(first.settings_file) as f:
        answered = f.read()
    folder = os.path.dirname(first.settings_file)
    files = sorted(os.listdir(folder))
    cache.apply("MODIFIED", copy.deepcopy(pod))  # the older version, after the plugin's write
    second = await allocator.allocate(1)
    assert second.call.container == "b" and second.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    with open(first.settings_file) as f:
        assert f.read() == answered
    assert sorted(os.listdir(folder)) == files


async def test_a_stale_cache_never_answers_another_pod_with_a_served_init_container(
        tmp_path: Any) -> None:
    # An init call takes no swap (it consumes no part): only the plugin's count of init
    # containers served tells it apart. Dropped once the pod was done, an older version of the
    # pod from the watch offered its init container again, and the next pod's Allocate got that
    # pod's GPU and limits.
    from vgpu_deviceplugin.pod_cache import PodCache

    from tests.deviceplugin.kit import FakeKube

    done = gpu_pod("done", [ctr("app", 1)], f"{GPU_A},NVIDIA,1000,10:", init=[ctr("prepare", 1)],
                   vgpu_time="1")
    later = gpu_pod("later", [ctr("app", 1)], f"{GPU_B},NVIDIA,2000,20:", vgpu_time="2")
    for pod in (done, later):
        pod["metadata"]["annotations"][ann.BIND_PHASE] = ann.BIND_PHASE_ALLOCATING
    kube, cache = FakeKube(), PodCache()
    kube.add_pod(copy.deepcopy(done))
    cache.apply("ADDED", copy.deepcopy(done))
    cache.apply("SYNCED", {})
    allocator = _allocator(kube, tmp_path, cache)
    assert (await allocator.allocate(1)).call.container == "prepare"
    served = await allocator.allocate(1)
    assert served.call.container == "app" and served.done
    kube.add_pod(copy.deepcopy(later))
    cache.apply("ADDED", copy.deepcopy(later))
    cache.apply("MODIFIED", copy.deepcopy(done))  # the older version, after the plugin's writes
    answer = await allocator.allocate(1)
    assert answer.pod.name == "later" and answer.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B
    assert allocator._state.init_served == {"uid-done": 1}  # kept while the pod is on the node
    # Nor is a count dropped because the cache has not seen its pod yet.
    fresh = gpu_pod("fresh", [ctr("app", 1)], f"{GPU_C},NVIDIA,500,5:", init=[ctr("prepare", 1)],
                    vgpu_time="3")
    fresh["metadata"]["annotations"][ann.BIND_PHASE] = ann.BIND_PHASE_ALLOCATING
    kube.add_pod(copy.deepcopy(fresh))
    assert (await allocator.allocate(1)).call.container == "prepare"  # from a fresh list
    app = await allocator.allocate(1)
    assert app.pod.name == "fresh" and app.call.container == "app" and app.done
    cache.apply("ADDED", kube.pods[("default", "fresh")])
    third = gpu_pod("third", [ctr("app", 1)], f"{GPU_C},NVIDIA,500,5:", vgpu_time="4")
    third["metadata"]["annotations"][ann.BIND_PHASE] = ann.BIND_PHASE_ALLOCATING
    kube.pods.pop(("default", "done"))
    cache.apply("DELETED", copy.deepcopy(done))
    kube.add_pod(copy.deepcopy(third))
    cache.apply("ADDED", copy.deepcopy(third))
    assert (await allocator.allocate(1)).pod.name == "third"
    assert allocator._state.init_served == {"uid-fresh": 1}  # uid-done forgotten: it left the node
    # The memory calls' counts too (every pod that had a call has one).
    assert set(allocator._state.memory_seen) == {"uid-later", "uid-fresh", "uid-third"}


async def test_a_file_that_cannot_be_written_after_the_swap_fails_that_pod_only(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The part is consumed by then: deciding again would answer this call with another pod's
    # (or container's) part, and leave this pod allocating with nothing left to serve.
    from vgpu_deviceplugin import allocator as allocator_module
    from vgpu_deviceplugin.pod_cache import PodCache

    from tests.deviceplugin.kit import FakeKube

    full = gpu_pod("full", [ctr("app", 1)], f"{GPU_A},NVIDIA,1000,10:", vgpu_time="1")
    other = gpu_pod("other", [ctr("app", 1)], f"{GPU_B},NVIDIA,2000,20:", vgpu_time="2")
    kube, cache = FakeKube(), PodCache()
    for pod in (full, other):
        pod["metadata"]["annotations"][ann.BIND_PHASE] = ann.BIND_PHASE_ALLOCATING
        kube.add_pod(copy.deepcopy(pod))
        cache.apply("ADDED", copy.deepcopy(pod))
    cache.apply("SYNCED", {})

    def no_space(path: str, text: str) -> None:
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(allocator_module, "write_settings_file", no_space)
    with pytest.raises(AllocateError, match=r"pod default/full: cannot create .*No space left"):
        await _allocator(kube, tmp_path, cache).allocate(1)
    annotations = kube.pods[("default", "other")]["metadata"]["annotations"]
    assert annotations[ann.DEVICES_TO_ALLOCATE] == f"{GPU_B},NVIDIA,2000,20:"
    assert annotations[ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING
    assert kube.pods[("default", "full")]["metadata"]["annotations"][ann.BIND_PHASE] == \
        ann.BIND_PHASE_FAILED


async def test_a_gpu_marked_unhealthy_is_refused_by_the_allocator(tmp_path: Any) -> None:
    from tests.deviceplugin.kit import FakeKube

    pod = gpu_pod("xid", [ctr("a")], f"{GPU_A},NVIDIA,1000,10:")
    pod["metadata"]["annotations"][ann.BIND_PHASE] = ann.BIND_PHASE_ALLOCATING
    kube = FakeKube()
    kube.add_pod(pod)
    with pytest.raises(AllocateError, match=f"GPU {GPU_A} .* is not a healthy GPU"):
        await _allocator(kube, tmp_path, unhealthy=GPU_A).allocate(1)
    assert kube.pods[("default", "xid")]["metadata"]["annotations"][ann.BIND_PHASE] == ann.BIND_PHASE_FAILED


async def test_a_put_back_that_cannot_remove_its_region_file_still_releases_the_node_lock(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from vgpu_deviceplugin import allocator as allocator_module

    first = _waiting("first", [ctr("gpu", 1, memory=1000)], f"{GPU_A},NVIDIA,1000,0:")
    kube, allocator = _memory_world(tmp_path, first)

    def refused(path: str) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(allocator_module.os, "unlink", refused)
    await _give_up(kube, "patch_pod", True, allocator.allocate(1), _writes_success)
    assert _annotations(kube, "first")[ann.DEVICES_TO_ALLOCATE] == f"{GPU_A},NVIDIA,1000,0:"
    assert ann.NODE_LOCK not in kube.nodes[FIXTURE_NODE]["metadata"]["annotations"]
    assert any("cannot remove" in r.getMessage() and "Permission denied" in r.getMessage()
               for r in caplog.records)
