"""The Volcano-compatible binder against the fixture cluster (docs/upstream.md §6)."""

from __future__ import annotations

import copy
from typing import Any

from vgpu_formats import annotations as ann
from vgpu_formats.device_config import parse_device_config, scheduler_view
from vgpuctl.binder import (
    Placement,
    SchedulerSettings,
    Unschedulable,
    bind,
    container_requests,
    settings_from_view,
)

NOW = 1764060249
V100 = "test-app-64-46-msxf"
RTX = "dev-app-2-150-master-1"
TOLERATE_VGPU_TAINT = [{"key": "volcano.sh/vgpu", "operator": "Exists", "effect": "NoSchedule"}]


def _on_rtx(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["tolerations"] = TOLERATE_VGPU_TAINT
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": RTX}
    return pod


def _limits(pod: dict[str, Any], **limits: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["containers"][0]["resources"] = {"limits": dict(limits)}
    return pod


def _placed(result: Placement | Unschedulable) -> Placement:
    assert isinstance(result, Placement), result
    return result


def test_fixture_pod_goes_to_the_untainted_node_highest_gpu_index_first(fixture_pod, nodes):
    placement = _placed(bind(fixture_pod, nodes, [], SchedulerSettings(), NOW))
    assert placement.node == V100  # the RTX node's vgpu taint is not tolerated
    expected = (
        "GPU-f7219cd7-e3ef-3b1b-4fa2-e84e8d5d4ce5,NVIDIA,3000,50:"
        "GPU-8cae1965-8e72-af03-1f8c-2e64646392bf,NVIDIA,3000,50:"
    )
    assert placement.annotations == {
        ann.VGPU_NODE: V100,
        ann.DEVICES_TO_ALLOCATE: expected,
        ann.VGPU_IDS_NEW: expected,
        ann.BIND_PHASE: "allocating",
        ann.VGPU_TIME: str(NOW),
        ann.BIND_TIME: str(NOW),
    }


def test_running_pods_take_their_share_of_the_gpus(fixture_pod, nodes, cluster_objects):
    running = [p for p in cluster_objects if p["kind"] == "Pod"]  # holds GPU 7 and 4 at 50 cores
    pod = _limits(_on_rtx(fixture_pod), **{"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-cores": "60"})
    placement = _placed(bind(pod, nodes, running, SchedulerSettings(), NOW))
    assert placement.node == RTX
    # GPU 7 has only 50 cores left, so the next two by index (6 and 5) are taken.
    assert [d.uuid for d in placement.devices[0]] == [
        "GPU-bc47d475-3538-d3eb-f4ba-e46e2639c54c",
        "GPU-aa336186-301a-bc80-5121-a9a2e430811a",
    ]
    # Without the running pod, GPU 7 is first again.
    alone = _placed(bind(pod, nodes, [], SchedulerSettings(), NOW))
    assert alone.devices[0][0].uuid == "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c"


def test_finished_pods_free_their_gpus(fixture_pod, nodes, cluster_objects):
    running = [p for p in cluster_objects if p["kind"] == "Pod"]
    running[0]["status"] = {"phase": "Succeeded"}
    pod = _limits(_on_rtx(fixture_pod), **{"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-cores": "60"})
    placement = _placed(bind(pod, nodes, running, SchedulerSettings(), NOW))
    assert placement.devices[0][0].uuid == "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c"


def test_request_resolution_follows_volcano():
    settings = SchedulerSettings(memory_percentage_name="volcano.sh/vgpu-memory-percentage")
    pod = {
        "spec": {
            "containers": [
                {"name": "count-only", "resources": {"limits": {"volcano.sh/vgpu-number": "1"}}},
                {"name": "no-gpu", "resources": {"limits": {"cpu": "1"}}},
                {"name": "memory-only", "resources": {"limits": {"volcano.sh/vgpu-memory": "2000"}}},
                {
                    "name": "percent-wins",
                    "resources": {
                        "limits": {
                            "volcano.sh/vgpu-number": "1",
                            "volcano.sh/vgpu-memory": "2000",
                            "volcano.sh/vgpu-memory-percentage": "50",
                        },
                        "requests": {"volcano.sh/vgpu-cores": "30"},
                    },
                },
            ]
        }
    }
    requests = container_requests(pod, settings)
    got = [(r.container, r.nums, r.memreq, r.mem_percentage, r.coresreq) for r in requests]
    assert got == [
        ("count-only", 1, 0, 100, 0),  # nothing asked: the whole card
        ("memory-only", 1, 2000, 101, 0),  # memory only means one GPU
        ("percent-wins", 1, 2000, 50, 30),
    ]


def test_percentage_is_per_card_and_ignored_in_the_scheduler_fallback(fixture_pod, nodes):
    pod = _limits(
        _on_rtx(fixture_pod),
        **{"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory-percentage": "50"},
    )
    with_name = SchedulerSettings(memory_percentage_name="volcano.sh/vgpu-memory-percentage")
    assert _placed(bind(pod, nodes, [], with_name, NOW)).devices[0][0].usedmem == 24564 // 2
    fallback = settings_from_view(scheduler_view(None))
    assert _placed(bind(pod, nodes, [], fallback, NOW)).devices[0][0].usedmem == 24564


def test_containers_are_joined_with_semicolons_and_see_each_others_usage(fixture_pod, nodes):
    pod = _on_rtx(fixture_pod)
    second = copy.deepcopy(pod["spec"]["containers"][0])
    second["name"] = "second"
    second["resources"] = {"limits": {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-cores": "60"}}
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-cores": "50"}
    }
    pod["spec"]["containers"].append(second)
    placement = _placed(bind(pod, nodes, [], SchedulerSettings(), NOW))
    text = placement.annotations[ann.DEVICES_TO_ALLOCATE]
    first_part, second_part = text.split(";")
    assert first_part == "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c,NVIDIA,24564,50:"
    # GPU 7 now has its whole memory taken, so the second container lands on GPU 6.
    assert second_part == "GPU-bc47d475-3538-d3eb-f4ba-e46e2639c54c,NVIDIA,24564,60:"


def test_binpack_prefers_the_fullest_gpu(fixture_pod, nodes, cluster_objects):
    running = [p for p in cluster_objects if p["kind"] == "Pod"]  # GPUs 7 and 4 hold 3000 MiB
    pod = _limits(_on_rtx(fixture_pod), **{"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1000"})
    binpack = SchedulerSettings(schedule_policy="binpack")
    assert _placed(bind(pod, nodes, running, binpack, NOW)).devices[0][0].uuid.startswith("GPU-5beec879")
    spread = SchedulerSettings(schedule_policy="spread")  # fewest tasks, then lowest index
    assert _placed(bind(pod, nodes, running, spread, NOW)).devices[0][0].uuid.startswith("GPU-3c8ce108")


def test_full_cores_want_an_empty_card_and_split_count_limits_sharing(fixture_pod, nodes, cluster_objects):
    running = [p for p in cluster_objects if p["kind"] == "Pod"]
    zero_cores = copy.deepcopy(running)  # the same pod, but asking no cores: GPUs 7 and 4 keep 100
    zero_cores[0]["metadata"]["annotations"][ann.VGPU_IDS_NEW] = (
        "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c,NVIDIA,3000,0:GPU-5beec879-79c9-6252-3aaa-9f5e146ba220,NVIDIA,3000,0:"
    )
    exclusive = {"volcano.sh/vgpu-memory": "1000", "volcano.sh/vgpu-cores": "100"}
    pod = _limits(_on_rtx(fixture_pod), **{"volcano.sh/vgpu-number": "6"}, **exclusive)
    assert isinstance(bind(pod, nodes, zero_cores, SchedulerSettings(), NOW), Placement)
    pod = _limits(_on_rtx(fixture_pod), **{"volcano.sh/vgpu-number": "7"}, **exclusive)
    result = bind(pod, nodes, zero_cores, SchedulerSettings(), NOW)
    assert isinstance(result, Unschedulable)
    assert "GPU 7: 100 cores asks for an empty card" in result.reasons[RTX]

    one_slot = copy.deepcopy(nodes)
    rtx = next(n for n in one_slot if n["metadata"]["name"] == RTX)
    rtx["metadata"]["annotations"][ann.NODE_REGISTER] = (
        "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c,1,24564,NVIDIA-NVIDIA GeForce RTX 4090,true,hami-core:"
    )
    pod = _limits(_on_rtx(fixture_pod), **{"volcano.sh/vgpu-number": "1"})
    result = bind(pod, one_slot, running, SchedulerSettings(), NOW)
    assert isinstance(result, Unschedulable)
    assert "split count used up" in result.reasons[RTX]


def test_unschedulable_says_why_per_node(fixture_pod, nodes):
    pod = _limits(fixture_pod, **{"volcano.sh/vgpu-number": "9"})
    bare = copy.deepcopy(nodes)
    del bare[1]["metadata"]["annotations"]
    result = bind(pod, bare, [], SchedulerSettings(), NOW)
    assert isinstance(result, Unschedulable)
    assert "taint volcano.sh/vgpu=hami:NoSchedule not tolerated" in result.reasons[RTX]
    assert "no volcano.sh/node-vgpu-register annotation" in result.reasons[V100]
    result = bind(_on_rtx(pod), nodes, [], SchedulerSettings(), NOW)
    assert isinstance(result, Unschedulable)
    assert "wants 9 GPUs, node has 8" in result.reasons[RTX]
    assert "nodeSelector" in result.reasons[V100]


def test_a_pod_the_scheduler_does_not_recognise_is_not_placed(fixture_pod, nodes):
    """Seed 001: the pod asks for nvidia.com/gpu while the scheduler knows volcano.sh/vgpu-number."""
    pod = _limits(fixture_pod, **{"nvidia.com/gpu": "2"})
    result = bind(pod, nodes, [], SchedulerSettings(), NOW)
    assert isinstance(result, Unschedulable)
    assert "not a vGPU pod" in result.message and "volcano.sh/vgpu-number" in result.message
    renamed = settings_from_view(
        scheduler_view(parse_device_config("nvidia:\n  resourceCountName: nvidia.com/gpu\n"))
    )
    # The scheduler now knows the name, but no plugin registered it: Volcano's generic check fails.
    result = bind(pod, nodes, [], renamed, NOW)
    assert isinstance(result, Unschedulable)
    assert result.reasons[V100] == "Insufficient nvidia.com/gpu (allocatable 0, asked 2)"
    v100 = next(n for n in nodes if n["metadata"]["name"] == V100)
    v100["status"]["allocatable"]["nvidia.com/gpu"] = "80"  # the plugin registers it
    # With only resourceCountName set the other names are Go zero values: count alone still works.
    placement = _placed(bind(pod, nodes, [], renamed, NOW))
    assert [d.usedmem for d in placement.devices[0]] == [32607, 32607]
    off = SchedulerSettings(vgpu_enable=False)
    result = bind(_limits(fixture_pod, **{"volcano.sh/vgpu-number": "1"}), nodes, [], off, NOW)
    assert isinstance(result, Unschedulable) and "VGPUEnable is off" in result.message


def test_volcano_1_15_1_ignores_nodes_without_the_hard_coded_allocatable(fixture_pod, nodes):
    pod = _limits(_on_rtx(fixture_pod), **{"volcano.sh/vgpu-number": "1"})
    rtx = next(n for n in nodes if n["metadata"]["name"] == RTX)
    rtx["status"]["allocatable"]["volcano.sh/vgpu-cores"] = "0"
    result = bind(pod, nodes, [], SchedulerSettings(require_allocatable=True), NOW)
    assert isinstance(result, Unschedulable)
    assert "allocatable lacks volcano.sh/vgpu-cores" in result.reasons[RTX]
    assert isinstance(bind(pod, nodes, [], SchedulerSettings(), NOW), Placement)
