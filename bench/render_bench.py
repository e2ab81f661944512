"""Render cost vs cluster size: 10, 1,000, 5,000 (and 10,000) GPU nodes with 50 selector overrides.

Reports the best-of-15 wall time of `render_all` (all five targets) per size, the ratio to the
10-node baseline, and the growth of the per-node cost above that baseline from 1,000 to 5,000
and from 5,000 to 10,000 nodes (1.0 = linear, > 1 = superlinear), then the
memory of the rendered state at 5,000 nodes (tracemalloc: peak while rendering, and what the
result keeps alive). Goal: under 50 ms at 5,000 nodes, close to linear growth.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

from vgpu_formats import annotations as ann
from vgpu_operator.api import parse_spec
from vgpu_operator.decide import render_all
from vgpu_operator.observed import Observed
from vgpu_operator.registry import RenderResult

SIZES = (10, 1000, 5000, 10000)
OVERRIDES = 50
REPEATS = 15
# 8 x A100-80GB split 10 ways, as the device plugin registers them (shared with operator_bench).
REGISTER = ann.encode_node_register([
    ann.DeviceInfo(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", count=10, devmem=81920,
                   type="NVIDIA-NVIDIA A100-SXM4-80GB", health=True) for i in range(8)])


def make_nodes(count: int) -> list[dict[str, Any]]:
    return [{"kind": "Node", "metadata": {
        "name": f"gpu-node-{i:05d}",
        "labels": {"kubernetes.io/hostname": f"gpu-node-{i:05d}", "pool": f"pool-{i % OVERRIDES}",
                   "zone": f"zone-{i % 3}", "gpu": "on", "node.kubernetes.io/instance-type": "p4d.24xlarge"},
        "annotations": {ann.NODE_REGISTER: REGISTER}}} for i in range(count)]


def make_spec() -> Any:
    return parse_spec({"nodeOverrides": [
        {"nodeSelector": {"matchLabels": {"pool": f"pool-{k}"},
                          "matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["zone-9"]}]},
         "deviceSplitCount": 1 + k % 20}
        for k in range(OVERRIDES)]})


def make_observed(nodes: int) -> Observed:
    conf = ("actions: \"enqueue, allocate, backfill\"\ntiers:\n- plugins:\n  - name: priority\n"
            "  - name: gang\n- plugins:\n  - name: predicates\n  - name: nodeorder\n")
    container = {"name": "volcano-device-plugin", "image": "projecthami/volcano-vgpu-device-plugin:v1.12.0"}
    scheduler = {"name": "volcano-scheduler", "image": "volcanosh/vc-scheduler:v1.13.0"}
    return Observed(
        scheduler_configmap={"kind": "ConfigMap", "metadata": {"name": "volcano-scheduler-configmap",
                                                               "namespace": "volcano-system"},
                             "data": {"volcano-scheduler.conf": conf}},
        scheduler_deployment={"kind": "Deployment", "metadata": {"name": "volcano-scheduler",
                                                                 "namespace": "volcano-system"},
                              "spec": {"template": {"spec": {"containers": [scheduler]}}}},
        device_plugin={"kind": "DaemonSet", "metadata": {"name": "volcano-device-plugin",
                                                         "namespace": "kube-system"},
                       "spec": {"template": {"spec": {"containers": [container]}}}},
        nodes=make_nodes(nodes),
    )


def time_render(nodes: int) -> float:
    spec, observed = make_spec(), make_observed(nodes)
    render_all(spec, observed)  # warm-up
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        render_all(spec, observed)
        samples.append(time.perf_counter() - start)
    return min(samples) * 1000  # the least disturbed run on a noisy machine


def memory_at(nodes: int) -> tuple[float, float]:
    spec, observed = make_spec(), make_observed(nodes)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    result: RenderResult = render_all(spec, observed)
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result.targets
    return (peak - before) / 2**20, (kept - before) / 2**20


def main() -> None:
    timings = {n: time_render(n) for n in SIZES}
    base = timings[SIZES[0]]
    for n, ms in timings.items():
        print(f"render_all nodes={n:5d} overrides={OVERRIDES}: {ms:8.2f} ms  "
              f"({ms / base:6.1f}x the 10-node run)")
    per_node_1k = (timings[1000] - base) / (1000 - SIZES[0])
    per_node_5k = (timings[5000] - base) / (5000 - SIZES[0])
    per_node_10k = (timings[10000] - base) / (10000 - SIZES[0])
    print(f"cost per node above the baseline: {per_node_1k * 1000:.1f} us at 1,000, "
          f"{per_node_5k * 1000:.1f} us at 5,000, {per_node_10k * 1000:.1f} us at 10,000 nodes "
          f"(growth 1k->5k {per_node_5k / per_node_1k:.2f}, 5k->10k {per_node_10k / per_node_5k:.2f}; "
          "1.00 = linear)")
    print(f"goal: < 50 ms at 5,000 nodes -> {'met' if timings[5000] < 50 else 'NOT met'}")
    peak, kept = memory_at(5000)
    print(f"memory at 5,000 nodes: peak {peak:.1f} MiB while rendering, {kept:.1f} MiB kept by the result")


if __name__ == "__main__":
    main()
