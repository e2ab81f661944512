"""Live scrapes of the two metrics endpoints, over HTTP, as Prometheus gets them: the operator's
`Metrics.serve` and the node monitor's `serve` on a container region and a fake NVML. The names
in them are what dashboards, alerts and docs may use (tests/charts/test_monitoring.py)."""

from __future__ import annotations

import asyncio
import re
import socket
import tempfile
import urllib.request
from pathlib import Path

from vgpu_deviceplugin.monitor.host import HostGpu
from vgpu_deviceplugin.monitor.main import serve
from vgpu_operator.metrics import Metrics
from vgpu_operator.plan import Restart

from tests.deviceplugin.test_monitor import GPU_A, GPU_B, MIB, region_bytes, write_container


class FakeHostGpus:
    """Two cards as NVML would report them, one of them without utilisation (as on some MIG)."""

    def sample(self) -> list[HostGpu]:
        return [HostGpu(0, GPU_A, "NVIDIA L4", 1500 * MIB, 23034 * MIB, 37),
                HostGpu(1, GPU_B, "NVIDIA L4", 200 * MIB, 23034 * MIB, None)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def operator_scrape() -> str:
    """/metrics of an operator that has reconciled, failed once and restarted a plugin pod."""
    metrics = Metrics()
    metrics.reconciles.labels(result="ok").inc()
    metrics.reconciles.labels(result="error").inc()
    metrics.duration.observe(0.02)
    metrics.drift_repairs.inc()
    metrics.record_restarts([Restart("plugin-pod", "n1", "config changed")])
    metrics.set_active(True)
    metrics.policy_ready.set(1)
    metrics.nodes_converged.set(2)
    port = _free_port()
    server = metrics.serve(port, "127.0.0.1")
    try:
        return _get(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
        server.server_close()


async def _monitor_scrape(containers: Path) -> str:
    port = _free_port()
    stop = asyncio.Event()
    task = asyncio.create_task(serve(port, "127.0.0.1", str(containers), None, None, stop, FakeHostGpus()))
    try:
        for _ in range(100):
            try:
                return await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
            except OSError:
                await asyncio.sleep(0.05)  # the server is still starting
        raise AssertionError(f"the monitor never answered on port {port}")
    finally:
        stop.set()
        await task


def monitor_scrape() -> str:
    """/metrics of a node monitor with one container using two GPUs."""
    with tempfile.TemporaryDirectory() as folder:
        devices = [(GPU_A, 3000 * MIB, 1000 * MIB), (GPU_B, 3000 * MIB, 200 * MIB)]
        write_container(Path(folder), "cuda-app", region_bytes(devices, [(41, [1000 * MIB, 200 * MIB], 5)]))
        return asyncio.run(_monitor_scrape(Path(folder)))


_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.MULTILINE)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", re.MULTILINE)
_SERIES_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def exported_names(text: str) -> set[str]:
    """Every series name a scrape of `text` stores, including families with no sample yet."""
    names = set(_SAMPLE.findall(text))
    for family, kind in _TYPE.findall(text):
        suffixes = _SERIES_SUFFIXES.get(kind)
        names |= {family + s for s in suffixes} if suffixes else {family}
    return names
