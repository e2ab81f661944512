"""Scan results and NVML samples -> Prometheus metrics. `metrics` is pure: its inputs are passed in.

Every family has a snake_case name that `promtool check metrics` accepts (`vgpu_*`, units as
suffixes, counters ending in `_total`). Where upstream's monitor (volcano-vgpu-monitor, HAMi's
vGPUmonitor) exports the same figure, it is exported a second time under upstream's name, label
for label (`LEGACY_NAMES`), so dashboards built for upstream keep working; HAMi did the same
when it added its snake_case names. Labels: upstream's (`zone="vGPU"`, `podnamespace`,
`podname`, `ctrname`, `vdeviceid`, `deviceuuid`, `deviceidx`), plus `poduid`, so containers are
told apart before the pod names are known. They stay clear of `namespace`/`pod`/`container`,
which Prometheus sets on every target and would rename to `exported_*`.

Per-GPU `vgpu_gpu_*` figures are sums over the regions of the containers that may still run
(what the vGPU layer has handed out and what is in use through it; pods.py says which have);
`vgpu_host_gpu_*` is NVML's view of the whole card.

A container can write its region file: where the plugin's settings file is there, limits come
from it, and a container whose device records cannot be what libvgpu.so wrote for what was
assigned (a GPU not assigned, one past the GPUs assigned, one out of the plugin's order) has none
reported (they would add its figures to another tenant's GPU); logged once per container.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from vgpu_formats.annotations import device_type
from vgpu_formats.cli import version

from vgpu_deviceplugin.monitor.assigned import records_fit
from vgpu_deviceplugin.monitor.host import HostGpu, HostGpuSource, NvmlHostGpus
from vgpu_deviceplugin.monitor.once import warn_once
from vgpu_deviceplugin.monitor.pods import PodView
from vgpu_deviceplugin.monitor.scan import ContainerRegion, scan

CONTAINER_LABELS = ["zone", "poduid", "podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid"]
GPU_LABELS = ["zone", "deviceuuid"]
HOST_LABELS = ["zone", "deviceidx", "deviceuuid", "devicetype"]  # HAMi's (upstream: all but devicetype)
ZONE = "vGPU"
log = logging.getLogger(__name__)

# snake_case name -> upstream's name for the same series. Only these may fail `promtool check
# metrics` (camelCase), and only because dashboards built for upstream query them.
LEGACY_NAMES: dict[str, str] = {
    "vgpu_container_memory_used_bytes": "vGPU_device_memory_usage_in_bytes",
    "vgpu_container_memory_limit_bytes": "vGPU_device_memory_limit_in_bytes",
    "vgpu_container_last_kernel_age_seconds": "Device_last_kernel_of_container",
    "vgpu_host_gpu_memory_used_bytes": "HostGPUMemoryUsage",
    "vgpu_host_gpu_utilization_percent": "HostCoreUtilization",
}
LEGACY_HELP: dict[str, str] = {  # upstream's help texts
    "vGPU_device_memory_usage_in_bytes": "vGPU device usage",
    "vGPU_device_memory_limit_in_bytes": "vGPU device limit",
    "Device_last_kernel_of_container": "Container device last kernel description",
    "HostGPUMemoryUsage": "GPU device memory usage",
    "HostCoreUtilization": "GPU core utilization",
}


def _gauge(name: str, documentation: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=list(labels))


def metrics(
    containers: Iterable[ContainerRegion], pods: PodView, now_ns: int,
    host_gpus: Iterable[HostGpu] = (), legacy: bool = True,
) -> list[Metric]:
    usage = _gauge("vgpu_container_memory_used_bytes",
                   "GPU memory a container uses through libvgpu, per device", CONTAINER_LABELS)
    limit = _gauge("vgpu_container_memory_limit_bytes",
                   "GPU memory cap of a container, per device (0 = none)", CONTAINER_LABELS)
    peak = _gauge("vgpu_container_memory_peak_bytes",
                  "highest GPU memory use of a container, per device", CONTAINER_LABELS)
    sm = _gauge("vgpu_container_sm_limit_percent",
                "SM cap of a container, per device, in percent (0 = none)", CONTAINER_LABELS)
    oom = CounterMetricFamily("vgpu_container_oom_refusals", "allocations refused by the memory cap",
                              labels=CONTAINER_LABELS)
    last_kernel = _gauge("vgpu_container_last_kernel_age_seconds",
                         "seconds since the container last launched a kernel", CONTAINER_LABELS)
    processes = _gauge("vgpu_container_processes", "live processes using the region", CONTAINER_LABELS[:5])
    context = _gauge("vgpu_container_context_memory_bytes",
                     "of the container's GPU memory use, what its CUDA contexts and driver hold beyond "
                     "allocations (measured through NVML, counted against the cap; all devices)",
                     CONTAINER_LABELS[:5])
    gpu_used = _gauge("vgpu_gpu_memory_used_bytes",
                      "sum of the GPU memory use per physical GPU of the containers that may still run",
                      GPU_LABELS)
    gpu_limit = _gauge("vgpu_gpu_memory_limit_bytes",
                       "sum of the memory caps per physical GPU of the containers that may still run "
                       "(not of init containers that completed, nor of containers that exited for good)",
                       GPU_LABELS)
    host_used = _gauge("vgpu_host_gpu_memory_used_bytes",
                       "GPU memory in use on the whole card, all processes (NVML)", HOST_LABELS)
    host_total = _gauge("vgpu_host_gpu_memory_total_bytes", "GPU memory of the card (NVML)", HOST_LABELS)
    host_util = _gauge("vgpu_host_gpu_utilization_percent",
                       "percent of the last sample period a kernel ran on the card (NVML)", HOST_LABELS)
    per_gpu: dict[str, list[int]] = {}
    for c in containers:
        namespace, name = pods.names.get(c.pod_uid, ("", ""))
        # Live processes count whatever the pod list says (it is up to 30 s old).
        ended = (c.pod_uid, c.container) in pods.finished and not c.live_slots
        base = [ZONE, c.pod_uid, namespace, name, c.container]
        processes.add_metric(base, len(c.live_slots))
        live = [s for s in c.region.slots if s.slot in c.live_slots]
        # A dead process's ledger stays in the device total until a process of the container
        # reaps it (hook/README.md "Live or dead"): counted against the cap, no longer in use.
        dead = [s for s in c.region.slots if s.slot not in c.live_slots]
        context.add_metric(base, sum(s.context_bytes for s in live))
        assigned = c.assigned
        unfit = records_fit(assigned, [(d.index, d.uuid) for d in c.region.devices]) if assigned else ""
        if unfit:
            warn_once(log, c.path, f"{c.path}: {unfit}; its device figures are not reported")
        for dev in () if unfit else c.region.devices:
            capped = assigned.memory_limit(dev.index) if assigned else dev.limit_bytes
            labels = [*base, str(dev.index), dev.uuid]
            in_use = max(0, dev.used_bytes - sum(s.used_bytes[dev.index] for s in dead))
            usage.add_metric(labels, in_use)
            limit.add_metric(labels, capped)
            peak.add_metric(labels, dev.peak_bytes)
            sm.add_metric(labels, assigned.sm_limit_of(dev.index) if assigned else dev.sm_limit_percent)
            oom.add_metric(labels, dev.oom_refusals)
            launched = max((s.last_launch_unix_ns for s in live if s.used_bytes[dev.index] > 0), default=0)
            if launched > 0:
                last_kernel.add_metric(labels, max(0.0, (now_ns - launched) / 1e9))
            if ended:  # its series stay (peak, refusals); it holds nothing on the GPU now
                continue
            sums = per_gpu.setdefault(dev.uuid, [0, 0])
            sums[0] += in_use
            sums[1] += capped
    for gpu_uuid, (used, capped) in sorted(per_gpu.items()):
        gpu_used.add_metric([ZONE, gpu_uuid], used)
        gpu_limit.add_metric([ZONE, gpu_uuid], capped)
    for gpu in host_gpus:
        labels = [ZONE, str(gpu.index), gpu.uuid, device_type(gpu.name)]  # the register annotation's type
        host_used.add_metric(labels, gpu.memory_used_bytes)
        host_total.add_metric(labels, gpu.memory_total_bytes)
        if gpu.utilization_percent is not None:
            host_util.add_metric(labels, gpu.utilization_percent)
    families: list[Metric] = [usage, limit, peak, sm, oom, last_kernel, processes, context, gpu_used,
                              gpu_limit, host_used, host_total, host_util]
    if legacy:
        families += [_renamed(f, LEGACY_NAMES[f.name]) for f in families if f.name in LEGACY_NAMES]
    return families



def _renamed(family: Metric, name: str) -> Metric:
    """The same gauge series under upstream's name and help."""
    twin = GaugeMetricFamily(name, LEGACY_HELP[name])
    twin.samples = [s._replace(name=name) for s in family.samples]
    return twin


def build_info() -> Metric:
    info = GaugeMetricFamily("vgpu_monitor_build_info", "always 1; the version of the running monitor",
                             labels=["version"])
    info.add_metric([version()], 1)
    return info


class RegionCollector(Collector):
    """Scans the containers directory (a few reads of 200 KB files) and asks NVML on every scrape."""

    def __init__(self, containers_dir: str, pods: PodView,
                 host: HostGpuSource | None = None, legacy: bool = True) -> None:
        self._dir = containers_dir
        self.pods = pods  # replaced whole by the monitor's refresh (main.py)
        self._host = host if host is not None else NvmlHostGpus()
        self._legacy = legacy

    def collect(self) -> Iterable[Metric]:
        return [*metrics(scan(self._dir), self.pods, time.time_ns(), self._host.sample(), self._legacy),
                build_info()]
