"""Device plugin figures: Allocate latency, ListAndWatch payload, resident memory.

1. Allocate latency through the kubelet simulator (gRPC over a unix socket) with the plugin's real
   Kubernetes client against the emulated API server: p50/p99 over 1,000 calls, with 110 pods on
   the node and 10,000 in the cluster; baseline 110 / 1,000 and 10 / 1,000, to show how the pod
   lookup scales (a field-selected list: the plugin parses only this node's pods).
2. ListAndWatch for 8 GPUs x split 100: bytes and build time per resource.
3. Re-registration after a kubelet restart (target: within 2 s).
4. RSS of a `deviceplugin` process (8xA100-80GB mock, registered, after 200 Allocates): under 80 MB.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import psutil
from vgpu_deviceplugin.config import Flags, resolve_settings
from vgpu_deviceplugin.devices import ResourceKind, advertise
from vgpu_deviceplugin.gpus import MockBackend, parse_mock_spec
from vgpu_deviceplugin.kube import ApiKubeClient
from vgpu_deviceplugin.runner import run_plugin
from vgpu_deviceplugin.testing.kubelet_sim import KubeletSim
from vgpu_emulator import Emulator, run_emulator
from vgpu_formats import annotations as ann

NODE = "gpu-node-0"
COUNT = "volcano.sh/vgpu-number"
MEMORY = "volcano.sh/vgpu-memory"
CORES = "volcano.sh/vgpu-cores"
CALLS = int(os.environ.get("BENCH_CALLS", "1000"))
GPUS = parse_mock_spec("8xA100-80GB", NODE)


def _pod(name: str, node: str, pending: bool) -> dict[str, Any]:
    devices = f"{GPUS[0].uuid},NVIDIA,3000,50:{GPUS[1].uuid},NVIDIA,3000,50:"
    annotations = {
        ann.VGPU_NODE: node, ann.VGPU_TIME: "1764060249", ann.VGPU_IDS_NEW: devices,
        ann.DEVICES_TO_ALLOCATE: devices if pending else "",
        ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING if pending else ann.BIND_PHASE_SUCCESS,
    }
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": annotations,
                     "labels": {"app": "bench"}},
        "spec": {"nodeName": node, "containers": [{
            "name": "cuda", "image": "cuda",
            "resources": {"limits": {COUNT: "2", MEMORY: "3000"}}}]},
        "status": {"phase": "Pending" if pending else "Running"},
    }


def _cluster(on_node: int, total: int) -> Emulator:
    emulator = Emulator()
    emulator.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "annotations": {}}})
    for i in range(on_node - 1):
        emulator.apply(_pod(f"running-{i}", NODE, pending=False))
    for i in range(total - on_node):
        emulator.apply(_pod(f"elsewhere-{i}", f"node-{i % 90 + 1}", pending=False))
    return emulator


def _flags(folder: str) -> Flags:
    return Flags(node_name=NODE, device_plugin_dir=folder, cache_root=f"{folder}/vgpu",
                 register_interval=3600, handshake=False)


@contextlib.asynccontextmanager
async def _plugin_on(
    emulator: Emulator, backend: MockBackend, resources: list[str]
) -> AsyncIterator[KubeletSim]:
    """The plugin, in this process, on `emulator` and a kubelet simulator, registered."""
    with tempfile.TemporaryDirectory(prefix="dpb-", dir="/tmp") as folder:
        async with run_emulator(emulator=emulator) as cluster:
            kube = await ApiKubeClient.connect(str(cluster.kubeconfig))
            sim = KubeletSim(folder)
            await sim.start()
            stop = asyncio.Event()
            task = asyncio.create_task(run_plugin(_flags(folder), stop, kube=kube, backend=backend))
            try:
                await sim.wait_for(resources, timeout=30)
                yield sim
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)
                await sim.stop()
                await kube.close()


async def _allocate_latency(on_node: int, total: int, calls: int) -> list[float]:
    emulator = _cluster(on_node, total)
    pending = _pod("pending", NODE, pending=True)
    async with _plugin_on(emulator, MockBackend(GPUS), [COUNT]) as sim:
        ids = sim.free_ids(COUNT, 2)
        samples = []
        for _ in range(20):  # warm-up: connections, first watch events
            emulator.apply(copy.deepcopy(pending))
            await sim.allocate(COUNT, ids)
        for _ in range(calls):
            emulator.apply(copy.deepcopy(pending))  # a fresh pod waiting for Allocate
            started = time.perf_counter()
            await sim.allocate(COUNT, ids)
            samples.append(time.perf_counter() - started)
        return samples


MEMORY_FIRST, MEMORY_AFTER = "memory, first call", "memory, after count"


async def _memory_latency(on_node: int, total: int, calls: int) -> dict[str, list[float]]:
    """Per admitted pod (a new one each time, deleted after its calls), one container asking all
    three resources: a cores call (answered empty at once, as the memory call was before
    2026-12-02: the baseline), then the memory and count calls, memory first for even pods (the
    pod's first call: decided on a fresh list of the node's pods, counted by the count call)
    and after the count call for odd ones (the pod under admission's: from the cache)."""
    emulator = _cluster(on_node, total)
    async with _plugin_on(emulator, MockBackend(GPUS), [COUNT, MEMORY, CORES]) as sim:
        asked = ((COUNT, 2), (MEMORY, 3000), (CORES, 50))
        ids = {resource: sim.free_ids(resource, n) for resource, n in asked}
        samples: dict[str, list[float]] = {CORES: [], COUNT: [], MEMORY_FIRST: [], MEMORY_AFTER: []}
        for i in range(20 + 2 * calls):
            pod = _pod(f"pending-{i}", NODE, pending=True)
            emulator.apply(pod)
            order = (CORES, MEMORY, COUNT) if i % 2 == 0 else (CORES, COUNT, MEMORY)
            for resource in order:
                started = time.perf_counter()
                answer = await sim.allocate(resource, ids[resource])
                took = time.perf_counter() - started
                assert resource == COUNT or not answer.container_responses[0].envs
                if i >= 20:  # after the warm-up
                    key = resource if resource != MEMORY else MEMORY_FIRST if i % 2 == 0 else MEMORY_AFTER
                    samples[key].append(took)
            emulator.delete_object("Pod", "default", pod["metadata"]["name"])
        return samples


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def allocate_figures() -> None:
    print(f"Allocate latency through the kubelet simulator, {CALLS} calls each (ms):")
    runs = [(10, 1_000), (110, 1_000), (110, 10_000)]
    results = {}
    for on_node, total in runs:
        samples = asyncio.run(_allocate_latency(on_node, total, CALLS))
        results[(on_node, total)] = samples
        print(f"  {on_node:>4} pods on node, {total:>6} in cluster: p50 {_pct(samples, 0.5):6.2f}  "
              f"p99 {_pct(samples, 0.99):6.2f}  mean {statistics.mean(samples) * 1000:6.2f}")
    base = statistics.median(results[(110, 1_000)])
    big = statistics.median(results[(110, 10_000)])
    print(f"  ratio p50 110/10000 vs 110/1000 (cluster x10): {big / base:.2f}")
    print(f"  ratio p50 110/1000 vs 10/1000 (node x11):      "
          f"{base / statistics.median(results[(10, 1_000)]):.2f}")
    p99 = _pct(results[(110, 10_000)], 0.99)
    print(f"  target p99 < 20 ms at 110/10000: {'met' if p99 < 20 else 'NOT met'} ({p99:.2f} ms)")


def memory_figures() -> None:
    print(f"Allocate per resource for one container asking all three, {2 * CALLS} pods (ms):")
    samples = asyncio.run(_memory_latency(110, 1_000, CALLS))
    for key in (CORES, MEMORY_FIRST, MEMORY_AFTER, COUNT):
        what = "cores (empty at once)" if key == CORES else "count" if key == COUNT else key
        print(f"  {what:<22} p50 {_pct(samples[key], 0.5):6.2f}  p99 {_pct(samples[key], 0.99):6.2f}")
    for key in (MEMORY_FIRST, MEMORY_AFTER):
        ratio = statistics.median(samples[key]) / statistics.median(samples[CORES])
        print(f"  ratio p50 {key} / cores call: {ratio:.2f}")


def lookup_figures() -> None:
    """The plugin's own share of Allocate: choosing the pod among this node's pods (pure)."""
    from vgpu_deviceplugin import allocate

    settings = resolve_settings(Flags(node_name=NODE), None, None)
    print("Pod selection alone (allocate.select, pure), 1,000 calls (ms):")
    medians = {}
    for on_node in (10, 110, 1_100):
        pods = [_pod(f"running-{i}", NODE, pending=False) for i in range(on_node - 1)]
        pods.append(_pod("pending", NODE, pending=True))
        samples = []
        for _ in range(1_000):
            started = time.perf_counter()
            allocate.select(pods, NODE, 2, settings.names, {})
            samples.append(time.perf_counter() - started)
        medians[on_node] = statistics.median(samples)
        memory = []
        for _ in range(1_000):
            started = time.perf_counter()
            allocate.decide_memory(pods, NODE, 3000, settings.names, {}, None)
            memory.append(time.perf_counter() - started)
        print(f"  {on_node:>5} pods on node: p50 {_pct(samples, 0.5):.3f}  p99 {_pct(samples, 0.99):.3f}"
              f"  (decide_memory p50 {_pct(memory, 0.5):.3f})")
    ratio = medians[1_100] / medians[110]
    print(f"  ratio p50 1100 vs 110 pods on node: {ratio:.1f} (linear in pods on node)")


def _naive_list(devices: list[tuple[str, str]]) -> bytes:
    """Baseline: the same message built with protobuf's add(), as a straightforward plugin would."""
    from vgpu_deviceplugin.api import deviceplugin_pb2 as pb

    response = pb.ListAndWatchResponse()
    for device_id, health in devices:
        response.devices.add(ID=device_id, health=health)
    return bytes(response.SerializeToString())


def list_and_watch_figures() -> None:
    print("ListAndWatch message, 8 x A100-80GB:")
    for label, split, factor in [("split 100, factor 1", 100, 1), ("split 100, factor 16", 100, 16)]:
        settings = resolve_settings(Flags(node_name=NODE, device_split_count=split, gpu_memory_factor=factor),
                                    None, None)
        for kind in ResourceKind:
            started = time.perf_counter()
            adv = advertise(kind, GPUS, {}, settings)
            payload = adv.payload
            took = (time.perf_counter() - started) * 1000
            devices = [(d.ID, d.health) for d in adv.response.devices]
            started = time.perf_counter()
            naive = _naive_list(devices)
            naive_ms = (time.perf_counter() - started) * 1000
            assert naive == payload
            capped = "  (capped to fit 4 MiB)" if adv.warning else ""
            print(f"  {label:<21} {kind.value:<7} {len(adv.response.devices):>7} devices "
                  f"{len(payload):>9} bytes  {took:7.1f} ms  (protobuf add() baseline: {naive_ms:.1f} ms, "
                  f"ratio {naive_ms / max(took, 1e-6):.1f}){capped}")


async def _rss_of_process() -> float:
    with tempfile.TemporaryDirectory(prefix="dpr-", dir="/tmp") as folder:
        emulator = _cluster(110, 1_000)
        async with run_emulator(emulator=emulator) as cluster:
            sim = KubeletSim(folder)
            await sim.start()
            env = {**os.environ, "VGPU_MOCK_GPUS": "8xA100-80GB"}
            proc = subprocess.Popen(
                [sys.executable, "-m", "vgpu_deviceplugin.main", "--node-name", NODE, "--device-plugin-dir",
                 folder, "--kubeconfig", str(cluster.kubeconfig), "--cache-root", f"{folder}/vgpu",
                 "--log-level", "error"],
                env=env,
            )
            try:
                await sim.wait_for([COUNT, MEMORY, CORES], timeout=60)
                pending = _pod("pending", NODE, pending=True)
                ids = sim.free_ids(COUNT, 2)
                for _ in range(200):
                    emulator.apply(copy.deepcopy(pending))
                    await sim.allocate(COUNT, ids)
                return float(psutil.Process(proc.pid).memory_info().rss) / 2**20
            finally:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
                await sim.stop()


async def _restart_times(rounds: int) -> list[float]:
    resources = [COUNT, MEMORY, CORES]
    backend = MockBackend(parse_mock_spec("8xRTX4090", NODE))  # 196,512 memory devices
    async with _plugin_on(_cluster(10, 10), backend, resources) as sim:
        times = []
        for _ in range(rounds):
            await sim.restart()
            started = time.perf_counter()
            await sim.wait_for(resources, timeout=10)
            times.append(time.perf_counter() - started)
        return times


def restart_figure() -> None:
    times = asyncio.run(_restart_times(10))
    print(f"kubelet restart -> all 3 resources registered and listed again (8 x RTX 4090), 10 rounds: "
          f"median {statistics.median(times):.2f} s, max {max(times):.2f} s (target 2 s; poll period 0.25 s)")


def rss_figure() -> None:
    rss = asyncio.run(_rss_of_process())
    probe = "import psutil, vgpu_deviceplugin.main\nprint(psutil.Process().memory_info().rss)"
    floor = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    baseline = int(floor.stdout) / 2**20
    met = "met" if rss * 1.048576 < 80 else "NOT met"
    print(f"deviceplugin process RSS (8xA100-80GB mock, 3 endpoints, after 200 Allocates): {rss:.1f} MiB, "
          f"{rss * 1.048576:.1f} MB (target < 80 MB: {met}); baseline, same imports and nothing running: "
          f"{baseline:.1f} MiB (ratio {rss / baseline:.2f})")


def main() -> None:
    logging.getLogger("vgpu_deviceplugin").setLevel(logging.ERROR)  # expected warnings (capped list)
    list_and_watch_figures()
    lookup_figures()
    restart_figure()
    rss_figure()
    allocate_figures()
    memory_figures()


if __name__ == "__main__":
    main()
