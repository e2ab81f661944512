"""Operator runtime figures against the emulator.

1. Apply-to-consistent latency (median of 20 spec changes): from the policy write to the last
   target write, and to the status saying Ready for the new generation. Breakdown: policy write ->
   first target write (watch delivery, kopf dispatch, reads, validate, render) -> last target
   write -> status written. Baseline: one bare emulator round trip (GET) in the same run.
2. Operator RSS with 5,000 GPU nodes (operator in its own process, emulator in this one), against
   the same operator with 10 nodes. Goals: <= 65 MiB with 10 nodes, <= 90 MiB with 5,000.
3. Writes at steady state over 100 resyncs (target: 0).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from vgpu_emulator import Emulator, iter_manifests, load_manifests, run_emulator
from vgpu_formats import annotations as ann
from vgpu_formats import yamlio
from vgpu_operator.api import VGPUPolicy
from vgpu_operator.decide import render_all
from vgpu_operator.metrics import Metrics
from vgpu_operator.registry import load_observed_from_manifests
from vgpu_operator.runtime.run import run_operator
from vgpu_operator.runtime.worker import Tuning
from vgpu_operator.validate import validate

from bench.render_bench import REGISTER

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "cluster"
CHANGES = 20
STEADY_RESYNCS = 100


def policy(split: int) -> dict[str, Any]:
    return {"apiVersion": "vgpu.io/v1alpha1", "kind": "VGPUPolicy", "metadata": {"name": "bench"},
            "spec": {"device": {"deviceSplitCount": split}}}


def set_default_cores(emulator: Emulator, cores: int) -> None:
    current = emulator.get_object("VGPUPolicy", None, "bench")
    assert current is not None
    emulator.apply({**current, "spec": {"device": {"defaults": {"cores": cores}}}})


def ready_for(emulator: Emulator, generation: int) -> bool:
    status = (emulator.get_object("VGPUPolicy", None, "bench") or {}).get("status") or {}
    ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
    return status.get("observedGeneration") == generation and ready.get("status") == "True"


async def wait(check: Any, timeout: float = 30.0) -> None:
    # Polls every 2 ms, not the tests' 20 ms: "Ready observed" below is timed by this loop.
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the operator did not get there in time")
        await asyncio.sleep(0.002)


async def latency() -> None:
    async with run_emulator(FIXTURES) as running:
        emulator = running.emulator
        stop = asyncio.Event()
        task = asyncio.create_task(run_operator(str(running.kubeconfig), stop, metrics=Metrics(),
                                                tuning=Tuning(resync_seconds=60)))
        emulator.apply(policy(10))
        await wait(lambda: ready_for(emulator, 1))
        async with aiohttp.ClientSession() as session:
            round_trips = []
            for _ in range(50):
                started = time.monotonic()
                async with session.get(f"{running.url}/api/v1/namespaces/kube-system/configmaps") as resp:
                    await resp.read()
                round_trips.append(time.monotonic() - started)
        rows: list[tuple[float, float, float, float]] = []
        for index in range(CHANGES):
            await asyncio.sleep(0.2)  # let the previous change's echoes settle
            mark = len(emulator.served)
            started = time.monotonic()
            set_default_cores(emulator, 10 + index % 2 * 10)  # 10, 20, 10...: rewrites device-config
            generation = emulator.get_object("VGPUPolicy", None, "bench")["metadata"]["generation"]  # type: ignore[index]
            await wait(lambda generation=generation: ready_for(emulator, generation))
            done = time.monotonic()
            served = list(emulator.served)[mark:]
            targets = [s.at for s in served if s.is_write and "/vgpupolicies/" not in s.path
                       and "/events" not in s.path]
            status = [s.at for s in served if s.is_write and s.path.endswith("/status")]
            rows.append((targets[0] - started, targets[-1] - started, status[-1] - started, done - started))
        stop.set()
        await task
    core, cold = core_seconds(), core_seconds(cold=True)
    baseline = statistics.median(round_trips)
    first, last, status_at, total = (statistics.median(column) for column in zip(*rows, strict=True))
    print(f"apply-to-consistent latency, median of {CHANGES} changes (device-config defaultCores 10 <-> 20):")
    print(f"  policy write -> first target write   {first * 1000:7.1f} ms")
    print(f"  policy write -> last target write    {last * 1000:7.1f} ms  (consistent)")
    print(f"  policy write -> status written       {status_at * 1000:7.1f} ms")
    print(f"  policy write -> Ready observed       {total * 1000:7.1f} ms  (target < 1000 ms)")
    print(f"  of which the pure core per reconcile: validate {core[0] * 1000:.1f} ms + render "
          f"{core[1] * 1000:.1f} ms (two reconciles per change: the change, then its echo); "
          f"{(cold[0] + cold[1]) * 1000:.1f} ms together with the YAML cache empty")
    slowest = max(row[3] for row in rows)
    print(f"  baseline: one emulator GET round trip {baseline * 1000:.2f} ms; "
          f"consistent = {last / baseline:.0f}x a round trip; slowest Ready {slowest * 1000:.0f} ms")


VGPU = {"volcano.sh/vgpu-number": "80", "volcano.sh/vgpu-memory": "655360", "volcano.sh/vgpu-cores": "800"}


def core_seconds(cold: bool = False) -> tuple[float, float]:
    """Median time of validate() and render_all() on the fixture cluster (no I/O). `cold`: the
    YAML cache emptied first (the ConfigMap texts changed since the last reconcile)."""
    policy_model = VGPUPolicy.from_object(policy(10))
    observed = load_observed_from_manifests(list(iter_manifests(FIXTURES)), policy_model.spec)
    timings: list[tuple[float, float]] = []
    for _ in range(11):
        if cold:
            yamlio.clear_cache()
        started = time.perf_counter()
        validate(policy_model, observed)
        middle = time.perf_counter()
        render_all(policy_model, observed)
        timings.append((middle - started, time.perf_counter() - middle))
    return statistics.median(t[0] for t in timings), statistics.median(t[1] for t in timings)


def make_nodes(count: int) -> list[dict[str, Any]]:
    """Nodes as the kubelet and the plugin leave them (labels, register annotation, status)."""
    nodes = []
    for i in range(count):
        name = f"gpu-node-{i:05d}"
        nodes.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "p4d.24xlarge",
                "topology.kubernetes.io/zone": f"z{i % 3}", "gpu": "on", "pool": f"pool-{i % 50}"},
                "annotations": {ann.NODE_REGISTER: REGISTER,
                                "node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24"},
            "status": {
                "capacity": {"cpu": "96", "memory": "1152Gi", "pods": "110", **VGPU},
                "allocatable": {"cpu": "95", "memory": "1150Gi", "pods": "110", **VGPU},
                "conditions": [{"type": t, "status": "False", "reason": f"Kubelet{t}",
                                "lastHeartbeatTime": "2026-01-01T00:00:00Z"}
                               for t in ("MemoryPressure", "DiskPressure", "PIDPressure")],
                "nodeInfo": {"kubeletVersion": "v1.29.4", "containerRuntimeVersion": "containerd://1.7.13",
                             "osImage": "Ubuntu 22.04.4 LTS", "kernelVersion": "5.15.0-105-generic"},
            },
        })
    return nodes


async def operator_rss(nodes: int) -> tuple[float, float]:
    """(RSS MiB of an operator process once the policy is Ready over `nodes` nodes, seconds to Ready)."""
    emulator = Emulator()
    load_manifests(emulator, FIXTURES)
    for node in make_nodes(nodes):
        emulator.apply(node)
    with tempfile.TemporaryDirectory() as folder:
        kubeconfig = Path(folder) / "kubeconfig"
        async with run_emulator(kubeconfig=kubeconfig, emulator=emulator):
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "vgpu_operator.main", "--kubeconfig", str(kubeconfig),
                "--liveness-port", "0", "--metrics-port", "0",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            try:
                started = time.monotonic()
                emulator.apply(policy(10))

                def counted() -> bool:
                    status = (emulator.get_object("VGPUPolicy", None, "bench") or {}).get("status") or {}
                    return (status.get("nodes") or {}).get("total") == nodes + 2  # + the 2 fixture nodes

                await wait(counted, timeout=240)
                elapsed = time.monotonic() - started
                await asyncio.sleep(1.0)  # let the post-apply echo reconcile finish
                rss = psutil.Process(process.pid).memory_info().rss / 2**20
            finally:
                process.terminate()
                await process.wait()
    return rss, elapsed


async def memory() -> None:
    base, base_time = await operator_rss(10)
    big, big_time = await operator_rss(5000)
    print("operator RSS (own process, policy Ready, every node counted in status):")
    print(f"  10 nodes     {base:6.1f} MiB  (baseline, goal <= 65 MiB; Ready after {base_time:.1f} s)")
    print(f"  5,000 nodes  {big:6.1f} MiB  (goal <= 90 MiB; Ready after {big_time:.1f} s)  "
          f"ratio {big / base:.2f}x, {(big - base) * 1024 / 4990:.1f} KiB per node")


async def steady_writes() -> None:
    resync = 0.05
    async with run_emulator(FIXTURES) as running:
        emulator = running.emulator
        metrics = Metrics()
        stop = asyncio.Event()
        task = asyncio.create_task(run_operator(str(running.kubeconfig), stop, metrics=metrics,
                                                tuning=Tuning(resync_seconds=resync)))
        emulator.apply(policy(10))
        await wait(lambda: ready_for(emulator, 1))
        await asyncio.sleep(1.0)
        writes = len(emulator.writes())
        reconciles = metrics.reconciles.labels(result="ok")._value.get()
        while metrics.reconciles.labels(result="ok")._value.get() < reconciles + STEADY_RESYNCS:
            await asyncio.sleep(resync)
        done = metrics.reconciles.labels(result="ok")._value.get() - reconciles
        extra = emulator.writes()[writes:]
        stop.set()
        await task
    print(f"steady state: {len(extra)} writes over {done:.0f} resync reconciles (target 0); "
          f"baseline: the initial apply made {writes} writes")


def main() -> None:
    if "--rss-only" in sys.argv[1:]:  # the memory figures alone (item 2), a minute instead of several
        asyncio.run(memory())
        return
    asyncio.run(latency())
    asyncio.run(steady_writes())
    asyncio.run(memory())


if __name__ == "__main__":
    main()
