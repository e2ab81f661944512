"""Scan results -> Prometheus metrics. Pure: the scan and the pod names are passed in.

Upstream metric names (volcano-vgpu-monitor) where they exist, with its constant label
zone="vGPU" and its label names; `poduid` is added so containers are told apart before the pod
names are known. Per-GPU figures are sums over the containers' regions (what the vGPU layer has
handed out and what is in use through it), not NVML's view of the whole card.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vgpu_deviceplugin.monitor.scan import ContainerRegion, scan

CONTAINER_LABELS = ["zone", "poduid", "podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid"]
GPU_LABELS = ["zone", "deviceuuid"]
ZONE = "vGPU"


def metrics(
    containers: Iterable[ContainerRegion], pod_names: Mapping[str, tuple[str, str]], now_ns: int
) -> list[Metric]:
    usage = GaugeMetricFamily("vGPU_device_memory_usage_in_bytes",
                              "GPU memory a container uses through libvgpu, per device",
                              labels=CONTAINER_LABELS)
    limit = GaugeMetricFamily("vGPU_device_memory_limit_in_bytes",
                              "GPU memory cap of a container, per device (0 = none)", labels=CONTAINER_LABELS)
    peak = GaugeMetricFamily("vGPU_device_memory_peak_in_bytes",
                             "highest GPU memory use of a container, per device", labels=CONTAINER_LABELS)
    sm = GaugeMetricFamily("vGPU_device_sm_limit_percent",
                           "SM cap of a container, per device (0 = none)", labels=CONTAINER_LABELS)
    oom = CounterMetricFamily("vGPU_device_oom_refusals",
                              "allocations refused by the memory cap", labels=CONTAINER_LABELS)
    last_kernel = GaugeMetricFamily("Device_last_kernel_of_container",
                                    "seconds since the container last launched a kernel",
                                    labels=CONTAINER_LABELS)
    processes = GaugeMetricFamily("vGPU_container_processes", "live processes using the region",
                                  labels=CONTAINER_LABELS[:5])
    gpu_used = GaugeMetricFamily("vGPU_gpu_memory_usage_in_bytes",
                                 "sum of containers' GPU memory use per physical GPU", labels=GPU_LABELS)
    gpu_limit = GaugeMetricFamily("vGPU_gpu_memory_limit_in_bytes",
                                  "sum of containers' memory caps per physical GPU", labels=GPU_LABELS)
    per_gpu: dict[str, list[int]] = {}
    for c in containers:
        namespace, name = pod_names.get(c.pod_uid, ("", ""))
        base = [ZONE, c.pod_uid, namespace, name, c.container]
        processes.add_metric(base, len(c.live_slots))
        live = [s for s in c.region.slots if s.slot in c.live_slots]
        for dev in c.region.devices:
            labels = [*base, str(dev.index), dev.uuid]
            usage.add_metric(labels, dev.used_bytes)
            limit.add_metric(labels, dev.limit_bytes)
            peak.add_metric(labels, dev.peak_bytes)
            sm.add_metric(labels, dev.sm_limit_percent)
            oom.add_metric(labels, dev.oom_refusals)
            launched = max((s.last_launch_unix_ns for s in live if s.used_bytes[dev.index] > 0), default=0)
            if launched > 0:
                last_kernel.add_metric(labels, max(0.0, (now_ns - launched) / 1e9))
            sums = per_gpu.setdefault(dev.uuid, [0, 0])
            sums[0] += dev.used_bytes
            sums[1] += dev.limit_bytes
    for gpu_uuid, (used, capped) in sorted(per_gpu.items()):
        gpu_used.add_metric([ZONE, gpu_uuid], used)
        gpu_limit.add_metric([ZONE, gpu_uuid], capped)
    return [usage, limit, peak, sm, oom, last_kernel, processes, gpu_used, gpu_limit]


class RegionCollector(Collector):
    """Scans the containers directory on every scrape (a few reads of 200 KB files)."""

    def __init__(self, containers_dir: str, pod_names: dict[str, tuple[str, str]]) -> None:
        self._dir = containers_dir
        self.pod_names = pod_names

    def collect(self) -> Iterable[Metric]:
        return metrics(scan(self._dir), self.pod_names, time.time_ns())
