"""Two pods asking different GPU counts, bound to one node at once (upstream
volcano-vgpu-device-plugin #93: the kubelet's Allocate is not always for the oldest pod, and
upstream, which serves the oldest pod, answers "device number not matched"). Each Allocate must go
to the pod whose next container asks for that many GPUs, whichever comes first."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from vgpu_deviceplugin import allocate
from vgpu_deviceplugin.config import Flags, resolve_settings
from vgpu_formats import annotations as ann

from tests.deviceplugin.kit import FIXTURE_NODE, FakeKube, fixture_pod
from tests.deviceplugin.test_plugin_kubelet import COUNT, MEMORY, running

GPU_A = "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c"
GPU_B = "GPU-5beec879-79c9-6252-3aaa-9f5e146ba220"
GPU_C = "GPU-3c8ce108-117a-aeae-a3e8-1c0c5dafebe7"
# The older pod wants 1 GPU, the younger 2: serving the oldest first is exactly upstream's bug.
PODS = {"one": (1, "100", f"{GPU_A},NVIDIA,1000,30:"),
        "two": (2, "200", f"{GPU_B},NVIDIA,2000,40:{GPU_C},NVIDIA,2000,40:")}
VISIBLE = {1: GPU_A, 2: f"{GPU_B},{GPU_C}"}


def bound_pod(name: str) -> dict[str, Any]:
    """A pod the scheduler has bound to the fixture node and left waiting for Allocate."""
    gpus, vgpu_time, devices = PODS[name]
    pod = fixture_pod()
    pod["metadata"].update(name=name, uid=f"uid-{name}")
    pod["metadata"]["annotations"].update({ann.DEVICES_TO_ALLOCATE: devices, ann.VGPU_IDS_NEW: devices,
                                           ann.VGPU_TIME: vgpu_time, ann.VGPU_NODE: FIXTURE_NODE,
                                           ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING})
    pod["spec"]["containers"][0]["resources"]["limits"] = {COUNT: str(gpus), MEMORY: "2000"}
    return pod


@pytest.mark.parametrize("order", [(2, 1), (1, 2)])
def test_each_allocate_gets_the_pod_asking_that_many_gpus(order: tuple[int, int]) -> None:
    settings = resolve_settings(Flags(node_name=FIXTURE_NODE), None, None)
    pods = {name: bound_pod(name) for name in PODS}
    gpus = {GPU_A: 81920, GPU_B: 81920, GPU_C: 81920}
    for amount in order:
        ref, pod, call = allocate.select(list(pods.values()), FIXTURE_NODE, amount, settings.names, {})
        plan = allocate.plan(pod, ref, call, settings, gpus, "/usr/local/vgpu", "/tmp/vgpu", "id")
        assert ref.name == ("one" if amount == 1 else "two")
        assert plan.envs["NVIDIA_VISIBLE_DEVICES"] == VISIBLE[amount] and plan.done
        # What the plugin writes: the part consumed, bind-phase success.
        done = copy.deepcopy(pods[ref.name])
        done["metadata"]["annotations"].update({ann.DEVICES_TO_ALLOCATE: plan.devices_to_allocate,
                                                ann.BIND_PHASE: ann.BIND_PHASE_SUCCESS})
        pods[ref.name] = done


@pytest.mark.parametrize("order", ["younger first", "older first", "at once"])
async def test_two_pods_through_grpc_in_any_order(flags: Flags, kube: FakeKube, order: str) -> None:
    for name in PODS:
        kube.add_pod(bound_pod(name))
    async with running(flags, kube) as sim:
        async def call(amount: int) -> str:
            response = await sim.allocate(COUNT, sim.free_ids(COUNT, amount))
            return str(response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"])

        if order == "at once":
            got = dict(zip((2, 1), await asyncio.gather(call(2), call(1)), strict=True))
        else:
            amounts = (2, 1) if order == "younger first" else (1, 2)
            got = {amount: await call(amount) for amount in amounts}
    assert got == VISIBLE
    for name in PODS:
        annotations = kube.pods[("default", name)]["metadata"]["annotations"]
        assert annotations[ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS
        assert annotations[ann.DEVICES_TO_ALLOCATE] == ""
