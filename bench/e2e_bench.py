"""Operator figures on the REAL control plane (e2e/controlplane.py), the chart installed with
default values and the operator under the chart's ServiceAccount token:

1. apply -> Ready: 20 spec changes, each from the PATCH to the watch event that shows Ready for
   the new generation (median, max). Baseline: one GET of the policy in the same run.
2. Writes over 100 steady-state resyncs (operator at --resync 0.1), counted in the audit log;
   reconciles are counted there too (one GET of the device-config each). Target: 0 writes.
3. Operator RSS with 5,000 real Node objects (every node counted in status) against the same
   operator with the 2 fixture nodes.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.operator_bench import make_nodes
from e2e import controlplane
from tests.e2e.cluster import Cluster
from tests.e2e.release import Release, installed
from tests.support.api import Api

POLICY = "/apis/vgpu.io/v1alpha1/vgpupolicies/default"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}


async def _ready_after(api: Api, cores: int) -> float:
    """Seconds from a spec change to the watch event saying Ready for its generation."""
    _, before = await api.call("GET", POLICY)
    started = time.perf_counter()
    _, patched = await api.call("PATCH", POLICY, {"spec": {"device": {"defaults": {"cores": cores}}}})
    generation = patched["metadata"]["generation"]
    path = (f"/apis/vgpu.io/v1alpha1/vgpupolicies?fieldSelector=metadata.name%3Ddefault"
            f"&resourceVersion={patched['metadata']['resourceVersion']}&watch=true")
    async with api.session.get(api.url + path, ssl=api.ssl, timeout=aiohttp.ClientTimeout(total=60)) as resp:
        async for line in resp.content:
            obj = json.loads(line)["object"]
            status = obj.get("status") or {}
            ready = [c for c in status.get("conditions", []) if c["type"] == "Ready"]
            if status.get("observedGeneration") == generation and ready and ready[0]["status"] == "True":
                return time.perf_counter() - started
    raise RuntimeError(f"no Ready for generation {generation} (was {before['metadata']['generation']})")


async def latency(cluster: Cluster) -> None:
    async with aiohttp.ClientSession() as session:
        api = cluster.api(session)
        gets = []
        for _ in range(20):
            started = time.perf_counter()
            await api.call("GET", POLICY)
            gets.append(time.perf_counter() - started)
        times = [await _ready_after(api, cores) for cores in range(1, 21)]
    get = statistics.median(gets)
    print(f"apply -> Ready over {len(times)} spec changes: median {statistics.median(times) * 1000:.0f} ms, "
          f"max {max(times) * 1000:.0f} ms ({statistics.median(times) / get:.0f}x one GET of "
          f"{get * 1000:.1f} ms)")


def steady_state(release: Release) -> None:
    cluster = release.cluster
    release.stop_operator()
    release.start_operator("--resync=0.1")
    release.ready()
    time.sleep(3)  # the restart's own first pass is over
    since = time.time()

    def reconciles() -> list[dict[str, Any]]:
        return [a for a in cluster.audit(release.user, since=since) if a["verb"] == "get"
                and a.get("objectRef", {}).get("name") == "volcano-vgpu-device-config"]

    deadline = time.monotonic() + 120
    while len(reconciles()) < 100 and time.monotonic() < deadline:
        time.sleep(1)
    audited = cluster.audit(release.user, since=since)
    writes = [(a["verb"], a["requestURI"]) for a in audited if a["verb"] in WRITES]
    print(f"steady state: {len(reconciles())} resyncs, {len(writes)} writes, "
          f"{len(audited)} requests in all (audit log)")
    for write in writes[:5]:
        print(f"  write: {write}")


async def _post_nodes(cluster: Cluster, nodes: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession() as session:
        api = cluster.api(session)
        queue = list(nodes)

        async def worker() -> None:
            while queue:
                node = queue.pop()
                status, body = await api.call("POST", "/api/v1/nodes", node)
                if status not in (201, 409):
                    raise RuntimeError(f"creating {node['metadata']['name']}: {status} {body}")
        await asyncio.gather(*(worker() for _ in range(8)))


def _rss_when_counted(release: Release, total: int, cores: int) -> tuple[float, float]:
    """Restart the operator, change the spec, and measure once that generation is Ready with
    every node counted: a status the new process wrote, not one left by the previous."""
    release.stop_operator()
    started = time.monotonic()
    release.start_operator()
    patched = json.loads(release.cluster.kubectl(
        "patch", "vgpupolicy", "default", "--type=merge", "-o", "json",
        "-p", json.dumps({"spec": {"device": {"defaults": {"cores": cores}}}})).stdout)
    generation = patched["metadata"]["generation"]

    def counted() -> bool:
        status = (release.policy() or {}).get("status") or {}
        return status.get("observedGeneration") == generation and \
            (status.get("nodes") or {}).get("total") == total

    deadline = time.monotonic() + 300
    while not counted():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the status never counted {total} nodes")
        time.sleep(0.5)
    elapsed = time.monotonic() - started
    time.sleep(2)
    assert release.process is not None
    return psutil.Process(release.process.pid).memory_info().rss / 2**20, elapsed


def memory(release: Release) -> None:
    cluster = release.cluster
    base, base_time = _rss_when_counted(release, 2, cores=30)
    nodes = make_nodes(5000)
    started = time.monotonic()
    asyncio.run(_post_nodes(cluster, nodes))
    print(f"  (created 5,000 Node objects in {time.monotonic() - started:.0f} s)")
    try:
        big, big_time = _rss_when_counted(release, 5002, cores=40)
    finally:
        cluster.kubectl("delete", "nodes", "-l", "pool", "--wait=false")
    print("operator RSS (own process, under the chart's ServiceAccount, every node in status):")
    print(f"  2 nodes      {base:6.1f} MiB  (baseline; counted {base_time:.1f} s after start)")
    print(f"  5,002 nodes  {big:6.1f} MiB  (counted {big_time:.1f} s after start)  ratio {big / base:.2f}x, "
          f"{(big - base) * 1024 / 5000:.1f} KiB per node")


def main() -> None:
    was_running = controlplane.load_state() is not None
    try:
        state = controlplane.up()
    except controlplane.BuildError as exc:  # no Go here: say so instead of a traceback
        print(f"e2e_bench skipped: {exc}")
        return
    try:
        cluster = Cluster(state)
        cluster.kubectl("apply", "-f", str(Path(__file__).resolve().parents[1] / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "crd/vgpupolicies.vgpu.io")
        with tempfile.TemporaryDirectory() as tmp, installed(cluster, Path(tmp)) as release:
            release.ready()
            asyncio.run(latency(cluster))
            steady_state(release)
            memory(release)
    finally:
        if not was_running:
            controlplane.down()


if __name__ == "__main__":
    main()
