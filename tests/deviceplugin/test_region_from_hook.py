"""The monitor reads a region that libvgpu.so wrote, not one this test packed: the Python reader
(monitor/region.py + scan.py) and the exporter must show exactly what the hook put in the file.

Two processes of one container run under libvgpu.so over the fake driver (hook/build/fake), with
Allocate's HAMi-core variables (CUDA_DEVICE_MEMORY_LIMIT_<i>, CUDA_DEVICE_SM_LIMIT,
CUDA_DEVICE_MEMORY_SHARED_CACHE), allocate and free known amounts and stay alive while the monitor
reads. hook/build/vgpu-region (the C reference reader of hook/include/vgpu_region.h) reads the
same file, as a second opinion. Without the hook the test skips; with VGPU_REQUIRE_E2E set it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from vgpu_deviceplugin.allocator import make_region_file
from vgpu_deviceplugin.monitor.exporter import LEGACY_NAMES, metrics
from vgpu_deviceplugin.monitor.pods import PodView
from vgpu_deviceplugin.monitor.scan import ContainerRegion, scan

from tests.support.hook import FAKE_DRIVER, LIBVGPU, REGION_READER, ensure_built
from tests.support.required import unavailable

MIB = 1 << 20
POD_UID = "6f1d2c3b-8a4e-4c1f-9b7d-2e5a1f0c9d11"
CONTAINER = "cuda-app"
# fake_cuda_uuid(dev): bytes 0x10 * (dev + 1) + i, as libvgpu writes them into the region.
UUIDS = ["GPU-10111213-1415-1617-1819-1a1b1c1d1e1f", "GPU-20212223-2425-2627-2829-2a2b2c2d2e2f"]
LIMITS = [1000 * MIB, 500 * MIB]  # CUDA_DEVICE_MEMORY_LIMIT_0=1000m, _1=500m
SM_LIMIT = 40

# A CUDA program with no header needed: each argument is one step on one device.
PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned flags);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, int dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, void *stream, void **params, void **extra);
/* DEV:+MIB allocates, DEV:-N frees the Nth allocation made, DEV:launch launches a kernel; then
 * "ready" and the process waits for its stdin to close. */
int main(int argc, char **argv)
{
    CUdeviceptr held[64];
    int n = 0;
    if (cuInit(0) != 0)
        return 2;
    for (int i = 1; i < argc && n < 64; i++) {
        const char *op = strchr(argv[i], ':');
        CUcontext ctx;
        CUresult rc = op == NULL ? 1 : cuDevicePrimaryCtxRetain(&ctx, atoi(argv[i]));
        if (rc == 0)
            rc = cuCtxSetCurrent(ctx);
        if (rc == 0 && op[1] == '+') {
            rc = cuMemAlloc_v2(&held[n], (size_t)strtoull(op + 2, NULL, 10) << 20);
            n += rc == 0;
        } else if (rc == 0 && op[1] == '-') {
            rc = cuMemFree_v2(held[atoi(op + 2)]);
        } else if (rc == 0) {
            rc = cuLaunchKernel((void *)1, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        }
        printf("%s %d\n", argv[i], rc);
    }
    printf("ready\n");
    fflush(stdout);
    while (getchar() != EOF) {
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    """(libvgpu.so, fake driver dir, the test program, vgpu-region), built when missing."""
    ensure_built()
    lib, fake, reference = LIBVGPU, FAKE_DRIVER, REGION_READER
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        unavailable("needs the hook: no C compiler (cc) for the test program")
    folder = tmp_path_factory.mktemp("prog")
    (folder / "alloc.c").write_text(PROGRAM)
    program = folder / "alloc"
    command = [str(compiler), "-std=c11", "-O2", "-Wall", "-o", str(program), str(folder / "alloc.c"),
               f"-L{fake}", "-lcuda", f"-Wl,-rpath,{fake}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return lib, fake, program, reference


class Container:
    """Processes sharing one region file, laid out as the plugin's containers directory."""

    def __init__(self, hook: tuple[Path, Path, Path, Path], root: Path) -> None:
        self.lib, self.fake, self.program, self.reference = hook
        self.root = root / "containers"
        self.region = self.root / f"{POD_UID}_{CONTAINER}" / "0b2d.cache"
        make_region_file(str(self.region))  # as Allocate does before the container starts
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_PRELOAD": str(self.lib),
            "LD_LIBRARY_PATH": str(self.fake),
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(self.region),
            "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m",
            "CUDA_DEVICE_MEMORY_LIMIT_1": "500m",
            "CUDA_DEVICE_SM_LIMIT": str(SM_LIMIT),
        }

    def start(self, stack: ExitStack, *steps: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([str(self.program), *steps], env=self.env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stack.callback(self.stop, proc)
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = proc.stdout.readline().strip()
            if line == "ready" or not line:
                break
            lines.append(line)
        else:
            pytest.fail(f"{steps}: no 'ready' in 20 s")
        assert line == "ready", (lines, proc.poll(), proc.stderr.read() if proc.stderr else "")
        self.results = dict(line.rsplit(" ", 1) for line in lines)
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen[str]) -> None:
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def scanned(self) -> ContainerRegion:
        [found] = scan(str(self.root))
        return found

    def reference_reading(self) -> Any:
        done = subprocess.run([str(self.reference), str(self.region)], capture_output=True, text=True,
                              timeout=10, check=True)
        return json.loads(done.stdout)


@pytest.fixture
def container(hook: tuple[Path, Path, Path, Path], tmp_path: Path) -> Iterator[Container]:
    yield Container(hook, tmp_path)


def _exported(found: ContainerRegion, now_ns: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The exporter's families as Prometheus text, parsed back: (name, labels) -> value."""

    class Fixed:
        def collect(self) -> list[object]:
            return list(metrics([found], PodView({POD_UID: ("team-a", "trainer")}), now_ns))

    registry = CollectorRegistry()
    registry.register(Fixed())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _labels(device: int | None = None) -> tuple[tuple[str, str], ...]:
    labels = {"zone": "vGPU", "poduid": POD_UID, "podnamespace": "team-a", "podname": "trainer",
              "ctrname": CONTAINER}
    if device is not None:
        labels |= {"vdeviceid": str(device), "deviceuuid": UUIDS[device]}
    return tuple(sorted(labels.items()))


def test_the_monitor_reads_what_libvgpu_wrote(container: Container) -> None:
    with ExitStack() as stack:
        # A: 300 + 200 MiB on GPU 0 (peak 500), frees the 200, 100 MiB on GPU 1, asks 2000 MiB
        # over GPU 0's 1000 MiB cap (refused: one OOM refusal) and launches a kernel.
        before = time.time_ns()
        first = container.start(stack, "0:+300", "0:+200", "0:-1", "1:+100", "0:+2000", "0:launch")
        assert container.results == {"0:+300": "0", "0:+200": "0", "0:-1": "0", "1:+100": "0",
                                     "0:+2000": "2", "0:launch": "0"}  # 2 = CUDA_ERROR_OUT_OF_MEMORY
        second = container.start(stack, "0:+50")  # B: 50 MiB on GPU 0, no launch
        after = time.time_ns()

        found = container.scanned()
        assert (found.pod_uid, found.container, found.path) == (POD_UID, CONTAINER, str(container.region))
        region = found.region
        devices = [(d.index, d.uuid, d.limit_bytes, d.used_bytes, d.peak_bytes, d.sm_limit_percent,
                    d.oom_refusals) for d in region.devices]
        assert devices == [
            (0, UUIDS[0], LIMITS[0], 350 * MIB, 500 * MIB, SM_LIMIT, 1),
            (1, UUIDS[1], LIMITS[1], 100 * MIB, 100 * MIB, SM_LIMIT, 0),
        ]
        assert [(s.slot, s.pid) for s in region.slots] == [(0, first.pid), (1, second.pid)]
        # The host pid is learnt from the process NVML lists new when a context is made (NVML
        # lists every process with one, whatever it holds): no pid namespace here, its own.
        assert [s.host_pid for s in region.slots] == [first.pid, second.pid]
        assert [s.used_bytes for s in region.slots] == [
            (300 * MIB, 100 * MIB, *[0] * 14), (50 * MIB, *[0] * 15)]
        assert before < region.slots[0].last_launch_unix_ns < after, "A launched a kernel"
        assert region.slots[1].last_launch_unix_ns == 0, "B launched none"
        assert found.live_slots == {0, 1} and region.reaped_slots == 0
        for device in region.devices:  # the header's rule: a device's use is the sum of its slots'
            assert device.used_bytes == sum(s.used_bytes[device.index] for s in region.slots)

        # The C reference reader of the layout sees the same file the same way.
        reference = container.reference_reading()
        assert [(d["index"], d["uuid"], d["limit_bytes"], d["used_bytes"], d["peak_bytes"],
                 d["sm_limit_percent"], d["oom_refusals"])
                for d in reference["devices"] if d["uuid"]] == devices
        assert [(p["slot"], p["pid"], p["live"], p["last_launch_unix_ns"],
                 [p["used_bytes"].get(str(i), 0) for i in range(16)])
                for p in reference["processes"]] == [
            (s.slot, s.pid, True, s.last_launch_unix_ns, list(s.used_bytes)) for s in region.slots]

        # The exporter's text carries the same figures, under both names where upstream has one.
        now = region.slots[0].last_launch_unix_ns + 2_000_000_000
        exported = _exported(found, now)
        for d, (used, peak, oom) in enumerate([(350 * MIB, 500 * MIB, 1), (100 * MIB, 100 * MIB, 0)]):
            labels = _labels(d)
            assert exported["vgpu_container_memory_used_bytes", labels] == used
            assert exported["vgpu_container_memory_limit_bytes", labels] == LIMITS[d]
            assert exported["vgpu_container_memory_peak_bytes", labels] == peak
            assert exported["vgpu_container_sm_limit_percent", labels] == SM_LIMIT
            assert exported["vgpu_container_oom_refusals_total", labels] == oom
            # A launched on GPU 0 and holds memory on both: its launch counts for both.
            assert exported["vgpu_container_last_kernel_age_seconds", labels] == pytest.approx(2.0)
            gpu = (("deviceuuid", UUIDS[d]), ("zone", "vGPU"))
            assert exported["vgpu_gpu_memory_used_bytes", gpu] == used
            assert exported["vgpu_gpu_memory_limit_bytes", gpu] == LIMITS[d]
            for name, legacy in LEGACY_NAMES.items():
                if (name, labels) in exported:
                    assert exported[legacy, labels] == exported[name, labels]
        assert exported["vgpu_container_processes", _labels()] == 2

        # B exits: its slot is no longer live. Its 50 MiB stay counted against the cap until a
        # process of the container reaps the slot (libvgpu gives nothing back while a process may
        # still hold it), and are no longer reported in use.
        container.stop(second)
        found = container.scanned()
        assert [(d.index, d.used_bytes, d.peak_bytes) for d in found.region.devices] == [
            (0, 350 * MIB, 500 * MIB), (1, 100 * MIB, 100 * MIB)]
        assert found.live_slots == {0}
        assert [s.pid for s in found.region.slots if s.slot in found.live_slots] == [first.pid]
        exported = _exported(found, now)
        assert exported["vgpu_container_processes", _labels()] == 1
        assert exported["vgpu_container_memory_used_bytes", _labels(0)] == 300 * MIB
        gpu_0 = (("deviceuuid", UUIDS[0]), ("zone", "vGPU"))
        assert exported["vgpu_gpu_memory_used_bytes", gpu_0] == 300 * MIB


def test_the_monitor_shows_the_counted_context_memory(container: Container, tmp_path: Path) -> None:
    # The fake driver gives each process's context 64 MiB on the device, and NVML lists it: the
    # library charges it against the cap, and the region, the reader and the exporter show it.
    container.env |= {"FAKE_GPU_SHARED": str(tmp_path / "gpu.shm"), "FAKE_CUDA_CONTEXT_MIB": "64"}
    with ExitStack() as stack:
        first = container.start(stack, "0:+100")
        assert container.results == {"0:+100": "0"}
        found = container.scanned()
        [device, _] = found.region.devices
        assert device.used_bytes == 164 * MIB, "100 MiB allocated + the 64 MiB context"
        [slot] = found.region.slots
        assert (slot.pid, slot.host_pid, slot.context_bytes) == (first.pid, first.pid, 64 * MIB)
        reference = container.reference_reading()
        assert [(p["pid"], p["host_pid"], p["context_bytes"]) for p in reference["processes"]] == [
            (first.pid, first.pid, 64 * MIB)]
        assert reference["devices"][0]["context_bytes"] == 64 * MIB
        now = time.time_ns()
        assert _exported(found, now)["vgpu_container_context_memory_bytes", _labels()] == 64 * MIB
        assert _exported(found, now)["vgpu_container_memory_used_bytes", _labels(0)] == 164 * MIB
