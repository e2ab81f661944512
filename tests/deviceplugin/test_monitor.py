"""vgpu-monitor on region files written by the test in the layout of hook/include/vgpu_region.h."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vgpu_deviceplugin.monitor import region as layout
from vgpu_deviceplugin.monitor.exporter import LEGACY_NAMES, build_info, metrics
from vgpu_deviceplugin.monitor.host import HostGpu, NvmlHostGpus
from vgpu_deviceplugin.monitor.main import serve
from vgpu_deviceplugin.monitor.pods import PodView
from vgpu_deviceplugin.monitor.region import RegionError, RegionNotReady, parse_region
from vgpu_deviceplugin.monitor.scan import read_container, scan
from vgpu_emulator import run_emulator
from vgpu_formats.cli import version

GPU_A = "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c"
GPU_B = "GPU-5beec879-79c9-6252-3aaa-9f5e146ba220"
POD_UID = "6f1d2c3b-8a4e-4c1f-9b7d-2e5a1f0c9d11"
MIB = 1024 * 1024


def region_bytes(devices: list[tuple[str, int, int]], slots: list[tuple[int, list[int], int]],
                 magic: int = layout.MAGIC, version: int = 1) -> bytearray:
    """devices: (uuid, limit, used); slots: (pid, used per device, last launch ns)."""
    data = bytearray(layout.FILE_SIZE)
    struct.pack_into("<QIIIIIIQQQIiQQ", data, 0, magic, version, 128, 128, 192, 16, 1024, layout.FILE_SIZE,
                     128, 2176, len(slots), 1, 0, 3)
    for i, (uuid, limit, used) in enumerate(devices):
        struct.pack_into("<QQQII64sQ", data, 128 + 128 * i, limit, used, used + MIB, 50, 2, uuid.encode(), 7)
    for s, (pid, used_per_device, launched) in enumerate(slots):
        used16 = (used_per_device + [0] * 16)[:16]
        struct.pack_into("<iiQQQ16Q", data, 2176 + 192 * s, pid, 0, 2, 0, launched, *used16)
    return data


def write_container(root: Path, container: str, data: bytes, uid: str = POD_UID) -> Path:
    folder = root / f"{uid}_{container}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "0b2d.cache"
    path.write_bytes(data)
    return path


def test_parse_reads_devices_and_slots() -> None:
    data = region_bytes([(GPU_A, 3000 * MIB, 1000 * MIB), (GPU_B, 3000 * MIB, 0)], [(41, [1000 * MIB, 0], 5)])
    parsed = parse_region(bytes(data))
    assert [(d.index, d.uuid, d.limit_bytes, d.used_bytes) for d in parsed.devices] == [
        (0, GPU_A, 3000 * MIB, 1000 * MIB), (1, GPU_B, 3000 * MIB, 0)]
    assert parsed.slots[0].pid == 41 and parsed.slots[0].used_bytes[0] == 1000 * MIB
    assert parsed.devices[0].oom_refusals == 7 and parsed.devices[0].sm_limit_percent == 50


def test_parse_sums_the_ledgers_in_layout_2() -> None:
    """Version 2 keeps no device total (offset 8 is 0; garbage here, to show it is not read): a
    device's usage is every slot's ledger, a freed slot's left for a reaper included."""
    data = region_bytes([(GPU_A, 3000 * MIB, 999 * MIB), (GPU_B, 3000 * MIB, 999 * MIB)],
                        [(41, [1000 * MIB, 0], 5), (42, [24 * MIB, 10 * MIB], 0), (0, [0, 5 * MIB], 0)],
                        version=2)
    parsed = parse_region(bytes(data))
    assert [(d.uuid, d.used_bytes) for d in parsed.devices] == [(GPU_A, 1024 * MIB), (GPU_B, 15 * MIB)]
    assert [s.pid for s in parsed.slots] == [41, 42]


def _with_generation(data: bytearray, slot: int, generation: int) -> bytes:
    struct.pack_into("<Q", data, layout.slot_lock_offset(slot) + layout.GENERATION_OFFSET, generation)
    return bytes(data)


def _reads(*copies: bytes) -> tuple[list[int], Any]:
    """A read(offset, size) function that reads `copies` in turn (the last one from then on), and
    its count."""
    count = [0]

    def read(at: int, size: int) -> bytes:
        count[0] += 1
        return copies[min(count[0], len(copies)) - 1][at:at + size]
    return count, read


def test_consistent_copy_reads_a_slot_being_claimed_again() -> None:
    """The first read catches slot 1 mid-claim (generation odd): the dead owner's pid 41 and its
    1000 MiB beside the new owner's generation. One pread, as the monitor read before, reports
    pid 41 as the slot's process; the rule of hook/README.md copies the slot again once its
    generation is even and has not moved."""
    other = (42, [8 * MIB, 0], 0)
    mid_claim = _with_generation(region_bytes([(GPU_A, 3000 * MIB, 0)], [other, (41, [1000 * MIB, 0], 0)],
                                              version=2), 1, 3)
    claimed = _with_generation(region_bytes([(GPU_A, 3000 * MIB, 0)], [other, (43, [0, 0], 0)],
                                            version=2), 1, 4)
    assert [s.pid for s in parse_region(mid_claim).slots] == [42, 41]
    count, read = _reads(mid_claim, claimed, claimed)
    parsed = parse_region(layout.consistent_copy(read))
    assert [(s.pid, s.used_bytes[0]) for s in parsed.slots] == [(42, 8 * MIB), (43, 0)]
    assert parsed.devices[0].used_bytes == 8 * MIB
    assert count[0] == 4, "read again until a read of slot 1 had reads on each side with one even generation"


def test_consistent_copy_ends_on_a_generation_left_odd() -> None:
    """A writer killed mid-claim leaves the generation odd until the slot's next claim: the copy
    ends after its attempts with the last read, rather than wait for ever."""
    stuck = _with_generation(region_bytes([(GPU_A, 3000 * MIB, 0)], [(41, [5 * MIB], 0)], version=2), 0, 7)
    count, read = _reads(stuck)
    assert parse_region(layout.consistent_copy(read)).slots[0].pid == 41
    assert count[0] == 2 + layout.COPY_ATTEMPTS
    steady = bytes(region_bytes([(GPU_A, 3000 * MIB, 0)], [(41, [5 * MIB], 0)], version=2))
    count, read = _reads(steady)
    assert layout.consistent_copy(read) is steady, "nothing changed: the first read is the answer"
    assert count[0] == 3, "a settled region costs two reads of its slots more"


@pytest.mark.parametrize(
    ("first_generation", "why"),
    [(6, "torn: the first read took pid 41, then the slot was reaped and claimed again (4 -> 6) "
         "before the same read reached its generation"),
     (4, "claimed again (4 -> 6) between the first read and the next, both even")],
)
def test_consistent_copy_takes_a_slot_from_a_read_between_two_that_agree(first_generation: int,
                                                                         why: str) -> None:
    first = _with_generation(region_bytes([(GPU_A, 3000 * MIB, 0)], [(41, [1000 * MIB], 0)], version=2),
                             0, first_generation)
    claimed = _with_generation(region_bytes([(GPU_A, 3000 * MIB, 0)], [(43, [0], 0)], version=2), 0, 6)
    _, read = _reads(first, claimed)
    assert [s.pid for s in parse_region(layout.consistent_copy(read)).slots] == [43], why


def test_read_container_reads_the_slots_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan reads a region through consistent_copy, from the file: its first read is the
    region's size, the later ones the slots in use."""
    path = write_container(tmp_path, "cuda-app", region_bytes([(GPU_A, 3000 * MIB, 0)], [(41, [MIB], 0)],
                                                              version=2))
    asked: list[tuple[int, int]] = []
    real = layout.consistent_copy

    def spy(read: Any, attempts: int = layout.COPY_ATTEMPTS) -> bytes | bytearray:
        def logged(at: int, size: int) -> bytes:
            asked.append((at, size))
            return bytes(read(at, size))
        return real(logged, attempts)
    monkeypatch.setattr("vgpu_deviceplugin.monitor.scan.consistent_copy", spy)
    found = read_container(path.parent)
    assert found is not None and [s.pid for s in found.region.slots] == [41]
    assert asked == [(0, layout.FILE_SIZE), (layout.SLOTS_OFFSET, layout.SLOT_SIZE),
                     (layout.SLOTS_OFFSET, layout.SLOT_SIZE)]


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        (bytes(region_bytes([], []))[:60], RegionError, "shorter than the header"),
        (bytes(region_bytes([], [], magic=0)), RegionNotReady, "not written"),
        (bytes(region_bytes([], [], magic=19920718)), RegionError, "unknown layout"),
        (bytes(region_bytes([], [], version=3)), RegionError, "unknown layout"),
        (bytes(region_bytes([], []))[:5000], RegionError, "the layout needs 198784"),
    ],
)
def test_parse_rejects_what_it_does_not_know(data: bytes, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        parse_region(data)


def test_scan_and_metrics_name_the_container_and_sum_per_gpu(tmp_path: Path) -> None:
    devices = [(GPU_A, 3000 * MIB, 1000 * MIB), (GPU_B, 3000 * MIB, 200 * MIB)]
    write_container(tmp_path, "cuda-app", region_bytes(devices, []))
    write_container(tmp_path, "other", region_bytes([(GPU_A, 2000 * MIB, 500 * MIB)], []))
    (tmp_path / f"{POD_UID}_empty").mkdir()  # no CUDA process yet
    write_container(tmp_path, "garbage", b"\x01" * 300)  # logged and skipped
    (tmp_path / "not-a-container-dir").mkdir()
    found = scan(str(tmp_path))
    assert sorted(c.container for c in found) == ["cuda-app", "other"]
    families = {m.name: m for m in metrics(found, PodView({POD_UID: ("default", "vgpu-test")}), now_ns=0)}
    usage = {(s.labels["ctrname"], s.labels["vdeviceid"]): s.value
             for s in families["vgpu_container_memory_used_bytes"].samples}
    assert usage == {("cuda-app", "0"): 1000 * MIB, ("cuda-app", "1"): 200 * MIB, ("other", "0"): 500 * MIB}
    sample = families["vgpu_container_memory_limit_bytes"].samples[0]
    assert sample.labels == {"zone": "vGPU", "poduid": POD_UID, "podnamespace": "default",
                             "podname": "vgpu-test", "ctrname": "cuda-app", "vdeviceid": "0",
                             "deviceuuid": GPU_A}
    per_gpu = {s.labels["deviceuuid"]: s.value for s in families["vgpu_gpu_memory_used_bytes"].samples}
    assert per_gpu == {GPU_A: 1500 * MIB, GPU_B: 200 * MIB}
    limits = {s.labels["deviceuuid"]: s.value for s in families["vgpu_gpu_memory_limit_bytes"].samples}
    assert limits == {GPU_A: 5000 * MIB, GPU_B: 3000 * MIB}
    assert {s.value for s in families["vgpu_container_processes"].samples} == {0}


def test_a_dead_process_is_counted_against_the_cap_not_reported_in_use(tmp_path: Path) -> None:
    # Its slot's owner is not alive (nobody holds its lock byte): libvgpu keeps its 1000 MiB in
    # the device total until a process of the container reaps the slot; nothing uses them.
    devices = [(GPU_A, 3000 * MIB, 1200 * MIB)]
    write_container(tmp_path, "cuda-app", region_bytes(devices, [(41, [1000 * MIB], 5)]))
    families = {m.name: m for m in metrics(scan(str(tmp_path)), PodView(), now_ns=0)}
    assert [s.value for s in families["vgpu_container_memory_used_bytes"].samples] == [200 * MIB]
    assert _by_gpu(families, "vgpu_gpu_memory_used_bytes") == {GPU_A: 200 * MIB}
    assert {s.value for s in families["vgpu_container_processes"].samples} == {0}
    assert families["vgpu_container_last_kernel_age_seconds"].samples == []


def _state(state: str) -> dict[str, Any]:
    """"running", "waiting", or "exited N"."""
    if state.startswith("exited "):
        return {"terminated": {"exitCode": int(state.split()[1])}}
    return {state: {}}


def _pod(phase: str, init_state: str, main_state: str, policy: str = "Always",
         sidecar: bool = False) -> dict[str, Any]:
    """The fixture pod's uid with an init container `fetch` and a container `train` (GPU both)."""
    init: dict[str, Any] = {"name": "fetch"}
    if sidecar:
        init["restartPolicy"] = "Always"
    return {"metadata": {"uid": POD_UID, "namespace": "team-a", "name": "trainer"},
            "spec": {"restartPolicy": policy, "initContainers": [init], "containers": [{"name": "train"}]},
            "status": {"phase": phase,
                       "initContainerStatuses": [{"name": "fetch", "state": _state(init_state)}],
                       "containerStatuses": [{"name": "train", "state": _state(main_state)}]}}


@pytest.mark.parametrize(("pod", "ended"), [
    (_pod("Pending", "running", "waiting"), set()),
    (_pod("Running", "exited 0", "running"), {"fetch"}),
    (_pod("Pending", "exited 1", "waiting"), set()),  # a failed init container is run again
    (_pod("Running", "running", "running", sidecar=True), set()),
    (_pod("Running", "exited 0", "running", sidecar=True), set()),  # a sidecar restarts
    (_pod("Running", "exited 0", "waiting"), {"fetch"}),  # CrashLoopBackOff: it runs again
    (_pod("Running", "exited 0", "exited 0"), {"fetch"}),  # Always: restarted
    (_pod("Running", "exited 0", "exited 1", policy="OnFailure"), {"fetch"}),
    (_pod("Running", "exited 0", "exited 0", policy="OnFailure"), {"fetch", "train"}),
    (_pod("Running", "exited 0", "exited 1", policy="Never"), {"fetch", "train"}),
    (_pod("Succeeded", "exited 0", "exited 0", policy="Never"), {"fetch", "train"}),
    (_pod("Failed", "exited 0", "running"), {"fetch", "train"}),  # statuses not updated yet
])
def test_pod_view_names_the_containers_that_will_not_run_again(pod: dict[str, Any], ended: set[str]) -> None:
    view = PodView.of([pod, {"metadata": {"name": "no-uid-yet"}}])
    assert view.names == {POD_UID: ("team-a", "trainer")}
    assert view.finished == {(POD_UID, name) for name in ended}


def test_a_finished_init_container_is_not_summed_into_its_gpu(tmp_path: Path) -> None:
    # The init container's region stays until the pod is deleted; it holds nothing now. Summed, the
    # GPU showed 7000 MiB of caps handed out to a pod that can only ever use 4000 at once.
    write_container(tmp_path, "fetch", region_bytes([(GPU_A, 3000 * MIB, 40 * MIB)], []))
    write_container(tmp_path, "train", region_bytes([(GPU_A, 4000 * MIB, 900 * MIB)], []))
    found = scan(str(tmp_path))
    view = PodView.of([_pod("Running", "exited 0", "running")])
    families = {m.name: m for m in metrics(found, view, now_ns=0)}
    assert _by_gpu(families, "vgpu_gpu_memory_limit_bytes") == {GPU_A: 4000 * MIB}
    assert _by_gpu(families, "vgpu_gpu_memory_used_bytes") == {GPU_A: 900 * MIB}
    # Its own series stay: what it peaked at and was refused is still worth reading.
    limits = {s.labels["ctrname"]: s.value for s in families["vgpu_container_memory_limit_bytes"].samples}
    assert limits == {"fetch": 3000 * MIB, "train": 4000 * MIB}
    # Without the pods (no API access) every region counts, as before.
    families = {m.name: m for m in metrics(found, PodView(), now_ns=0)}
    assert _by_gpu(families, "vgpu_gpu_memory_limit_bytes") == {GPU_A: 7000 * MIB}
    # A process still alive in it (the list is up to 30 s old; a Failed pod's containers during
    # their grace period) keeps it counted.
    alive = [dataclasses.replace(c, live_slots=frozenset({0})) if c.container == "fetch" else c
             for c in found]
    families = {m.name: m for m in metrics(alive, view, now_ns=0)}
    assert _by_gpu(families, "vgpu_gpu_memory_limit_bytes") == {GPU_A: 7000 * MIB}


def _assigned_container(root: Path, devices: list[tuple[str, int, int]], settings: str) -> Path:
    folder = write_container(root, "cuda-app", region_bytes(devices, [])).parent
    path = folder / "vgpu.env"
    path.write_text("# vgpu-device-plugin: pod default/vgpu-test container cuda-app\n" + settings)
    path.chmod(0o644)
    return path


def _by_gpu(families: dict[str, Any], name: str) -> dict[str, float]:
    return {s.labels["deviceuuid"]: s.value for s in families[name].samples}


def test_limits_come_from_the_plugins_settings_not_the_containers_region(tmp_path: Path) -> None:
    # The container can write its region: a cap shown as 0 ("none"). The plugin's settings file
    # (0644, read-only in the container) says what was assigned, as libvgpu.so applies it.
    settings = _assigned_container(tmp_path, [(GPU_A, 0, 1000 * MIB), (GPU_B, 0, 10 * MIB)],
                                   f"NVIDIA_VISIBLE_DEVICES={GPU_A},{GPU_B}\nCUDA_DEVICE_MEMORY_LIMIT_0=3000m\n"
                                   "CUDA_DEVICE_MEMORY_LIMIT_1=1g\nCUDA_DEVICE_SM_LIMIT=25\n")
    families = {m.name: m for m in metrics(scan(str(tmp_path)), PodView(), now_ns=0)}
    assert _by_gpu(families, "vgpu_container_memory_limit_bytes") == {GPU_A: 3000 * MIB, GPU_B: 1024 * MIB}
    assert _by_gpu(families, "vgpu_container_sm_limit_percent") == {GPU_A: 25, GPU_B: 25}
    assert _by_gpu(families, "vgpu_gpu_memory_used_bytes") == {GPU_A: 1000 * MIB, GPU_B: 10 * MIB}
    # A settings file the container could have written is not trusted: the region's figures stay.
    settings.chmod(0o666)
    families = {m.name: m for m in metrics(scan(str(tmp_path)), PodView(), now_ns=0)}
    assert _by_gpu(families, "vgpu_container_memory_limit_bytes") == {GPU_A: 0, GPU_B: 0}


@pytest.mark.parametrize("settings", [
    f"NVIDIA_VISIBLE_DEVICES={GPU_A}\nCUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_SM_LIMIT=100\n",
    f"NVIDIA_VISIBLE_DEVICES={GPU_A}\nCUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_SM_LIMIT=30\n"
    "GPU_CORE_UTILIZATION_POLICY=DISABLE\n",
])
def test_an_sm_limit_the_library_does_not_apply_is_reported_as_none(tmp_path: Path, settings: str) -> None:
    # libvgpu.so applies no SM limit at 100 or more, nor with the utilization policy disabled.
    _assigned_container(tmp_path, [(GPU_A, 0, 0)], settings)
    families = {m.name: m for m in metrics(scan(str(tmp_path)), PodView(), now_ns=0)}
    assert _by_gpu(families, "vgpu_container_sm_limit_percent") == {GPU_A: 0}


@pytest.mark.parametrize(("assigned", "devices", "why"), [
    (GPU_A, [(GPU_A, 0, 1000 * MIB), (GPU_B, 0, 70000 * MIB)],
     f"names GPU '{GPU_B}', which the device plugin did not"),
    (GPU_A, [(GPU_A, 0, 1000 * MIB), (GPU_A, 0, 1000 * MIB)], "device 1 is past the 1 GPU(s) assigned"),
    (f"{GPU_A},{GPU_B}", [(GPU_B, 0, 1000 * MIB), (GPU_A, 0, 1000 * MIB)],
     f"device 0 names GPU '{GPU_B}', but the device plugin assigned '{GPU_A}' there"),
])
def test_device_records_that_cannot_be_the_libraries_are_not_reported(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, assigned: str,
        devices: list[tuple[str, int, int]], why: str) -> None:
    # A container adding its usage to another tenant's GPU, counting one GPU twice, or under
    # another GPU's limits (libvgpu.so keeps the plugin's order: hook/src/devices.c).
    _assigned_container(tmp_path, devices,
                        f"NVIDIA_VISIBLE_DEVICES={assigned}\nCUDA_DEVICE_MEMORY_LIMIT_0=3000m\n")
    with caplog.at_level(logging.WARNING):
        families = {m.name: m for m in metrics(scan(str(tmp_path)), PodView(), now_ns=0)}
        metrics(scan(str(tmp_path)), PodView(), now_ns=0)
    assert families["vgpu_gpu_memory_used_bytes"].samples == []
    assert families["vgpu_container_memory_used_bytes"].samples == []
    assert caplog.text.count(why) == 1  # once, not at every scrape


def test_a_region_of_another_layout_is_said_once_not_at_every_scrape(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A tenant can write anything into its region file (or run HAMi-core's own library).
    write_container(tmp_path, "foreign", bytes(region_bytes([], [], magic=19920718)))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert scan(str(tmp_path)) == []
    assert caplog.text.count("unknown layout") == 1


def test_folder_removed_during_a_scan_is_skipped(tmp_path: Path) -> None:
    # The plugin's cleanup may remove a gone pod's folder between the listing and the read.
    assert read_container(tmp_path / f"{POD_UID}_gone") is None


def test_live_process_is_seen_through_its_lock(tmp_path: Path) -> None:
    now = time.time_ns()
    path = write_container(tmp_path, "cuda-app", region_bytes([(GPU_A, 3000 * MIB, 10)],
                                                             [(41, [10], now - 3 * 10**9), (42, [0], 0)]))
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR)\n"
        f"fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {layout.slot_lock_offset(0)}, os.SEEK_SET)\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        found = scan(str(tmp_path))
        assert found[0].live_slots == frozenset({0})
        families = {m.name: m for m in metrics(found, PodView(), now_ns=now)}
        assert families["vgpu_container_processes"].samples[0].value == 1
        age = families["vgpu_container_last_kernel_age_seconds"].samples[0].value
        assert 2.9 < age < 3.1
    finally:
        holder.kill()
        holder.wait()
    assert scan(str(tmp_path))[0].live_slots == frozenset()  # the kernel dropped the lock


class NoGpus:
    """A node where NVML sees no card (on a machine that has one too)."""

    def sample(self) -> list[HostGpu]:
        return []


@pytest.mark.parametrize("legacy", [True, False])  # False: --no-legacy-metrics
async def test_metrics_endpoint_serves_the_upstream_names(tmp_path: Path, legacy: bool) -> None:
    write_container(tmp_path, "cuda-app", region_bytes([(GPU_A, 3000 * MIB, 1000 * MIB)], []))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    stop = asyncio.Event()
    task = asyncio.create_task(serve(port, "127.0.0.1", str(tmp_path), None, None, stop, NoGpus(), legacy))
    try:
        for _ in range(50):
            try:
                async with aiohttp.ClientSession() as session, \
                        session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    text = await resp.text()
                    break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.05)
        assert "# TYPE vgpu_container_memory_used_bytes gauge" in text
        assert ("# TYPE vGPU_device_memory_usage_in_bytes gauge" in text) == legacy
        assert ("# TYPE Device_last_kernel_of_container gauge" in text) == legacy
        # No card: the whole-card series are empty, the rest is served.
        assert "\nHostGPUMemoryUsage{" not in text and "vgpu_monitor_build_info{version=" in text
        assert f'deviceuuid="{GPU_A}"' in text and "1.048576e+09" in text
    finally:
        stop.set()
        await task


async def test_the_monitor_reads_names_and_ended_containers_from_its_nodes_pods(tmp_path: Path) -> None:
    # Through the real client and a pod list selected by node, as the DaemonSet runs it.
    pod = _pod("Running", "exited 0", "running")
    pod.update(apiVersion="v1", kind="Pod")
    pod["spec"]["nodeName"] = "gpu-1"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with run_emulator() as cluster:
        uid = cluster.emulator.apply(pod)["metadata"]["uid"]  # the server's, not ours
        write_container(tmp_path, "fetch", region_bytes([(GPU_A, 3000 * MIB, 40 * MIB)], []), uid)
        write_container(tmp_path, "train", region_bytes([(GPU_A, 4000 * MIB, 900 * MIB)], []), uid)
        stop = asyncio.Event()
        task = asyncio.create_task(serve(port, "127.0.0.1", str(tmp_path), "gpu-1", str(cluster.kubeconfig),
                                         stop, NoGpus(), legacy=False))
        try:
            text = ""
            for _ in range(100):
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with aiohttp.ClientSession() as session, \
                            session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                        text = await resp.text()
                if 'podname="trainer"' in text:
                    break
                await asyncio.sleep(0.05)
            families = {f.name: f for f in text_string_to_metric_families(text)}
            assert _by_gpu(families, "vgpu_gpu_memory_limit_bytes") == {GPU_A: 4000 * MIB}
            assert {s.labels["podname"] for s in families["vgpu_container_memory_limit_bytes"].samples} == {
                "trainer"}
        finally:
            stop.set()
            await task


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(**overrides: Any) -> SimpleNamespace:
    """pynvml over two cards: h1 has no utilisation counter (NVML_ERROR_NOT_SUPPORTED = 3)."""

    def utilization(handle: str) -> SimpleNamespace:
        if handle == "h1":
            raise FakeNvmlError(3)
        return SimpleNamespace(gpu=42, memory=7)

    base: dict[str, Any] = dict(
        NVMLError=FakeNvmlError, NVML_ERROR_NOT_SUPPORTED=3, nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUUID=lambda h: {"h0": GPU_A.encode(), "h1": GPU_B}[h],
        nvmlDeviceGetName=lambda h: "NVIDIA L4",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=1500 * MIB, total=23034 * MIB),
        nvmlDeviceGetUtilizationRates=utilization)
    base.update(overrides)
    return SimpleNamespace(**base)


def test_host_gpus_come_from_nvml() -> None:
    gpus = NvmlHostGpus(fake_nvml()).sample()  # type: ignore[arg-type]
    assert gpus == [HostGpu(0, GPU_A, "NVIDIA L4", 1500 * MIB, 23034 * MIB, 42),
                    HostGpu(1, GPU_B, "NVIDIA L4", 1500 * MIB, 23034 * MIB, None)]
    families = {m.name: m for m in metrics([], PodView(), 0, gpus)}
    used = families["HostGPUMemoryUsage"].samples
    assert [s.labels for s in used] == [
        {"zone": "vGPU", "deviceidx": "0", "deviceuuid": GPU_A, "devicetype": "NVIDIA-NVIDIA L4"},
        {"zone": "vGPU", "deviceidx": "1", "deviceuuid": GPU_B, "devicetype": "NVIDIA-NVIDIA L4"}]
    assert [s.value for s in used] == [1500 * MIB] * 2
    # NVML has no utilisation for the second card: no sample rather than a made-up 0.
    assert [(s.labels["deviceidx"], s.value) for s in families["HostCoreUtilization"].samples] == [("0", 42)]
    assert families["vgpu_host_gpu_memory_total_bytes"].samples[0].value == 23034 * MIB


def test_a_card_nvml_cannot_read_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    def broken(handle: str) -> SimpleNamespace:
        if handle == "h0":
            raise FakeNvmlError(15)  # GPU is lost
        return SimpleNamespace(used=1, total=2)

    gpus = NvmlHostGpus(fake_nvml(nvmlDeviceGetMemoryInfo=broken)).sample()  # type: ignore[arg-type]
    assert [g.uuid for g in gpus] == [GPU_B]
    assert "NVML cannot read GPU 0" in caplog.text


def test_without_nvml_the_host_series_are_left_out_and_come_back(caplog: pytest.LogCaptureFixture) -> None:
    working = {"yes": False}

    def init() -> None:
        if not working["yes"]:
            raise FakeNvmlError(12)  # library not found

    caplog.set_level(logging.INFO, logger="vgpu_deviceplugin.monitor.host")
    host = NvmlHostGpus(fake_nvml(nvmlInit=init))  # type: ignore[arg-type]
    assert host.sample() == [] and host.sample() == []
    assert caplog.text.count("NVML not usable") == 1  # once, not on every scrape
    working["yes"] = True
    assert len(host.sample()) == 2 and "NVML usable again" in caplog.text


def test_upstream_names_are_twins_of_the_snake_case_series(tmp_path: Path) -> None:
    write_container(tmp_path, "cuda-app", region_bytes([(GPU_A, 3000 * MIB, 1000 * MIB)], []))
    host = [HostGpu(0, GPU_A, "NVIDIA L4", 5, 10, 30)]
    families = {m.name: m for m in metrics(scan(str(tmp_path)), PodView(), 0, host)}
    for snake, legacy in LEGACY_NAMES.items():
        assert [(s.labels, s.value) for s in families[legacy].samples] == \
            [(s.labels, s.value) for s in families[snake].samples], legacy
        assert all(s.name == legacy for s in families[legacy].samples)
    assert families["HostGPUMemoryUsage"].documentation == "GPU device memory usage"  # upstream's help
    without = {m.name for m in metrics(scan(str(tmp_path)), PodView(), 0, host, legacy=False)}
    assert not without & set(LEGACY_NAMES.values())
    assert set(LEGACY_NAMES) <= without


def test_build_info_names_the_version() -> None:
    sample = build_info().samples[0]
    assert sample.name == "vgpu_monitor_build_info" and sample.value == 1
    assert sample.labels["version"] == version()


@pytest.mark.parametrize(("flags", "legacy"), [([], True), (["--no-legacy-metrics"], False)])
def test_no_legacy_metrics_reaches_the_server(monkeypatch: pytest.MonkeyPatch, flags: list[str],
                                             legacy: bool) -> None:
    from vgpu_deviceplugin.monitor import main as entry

    seen: list[bool] = []

    async def fake_serve(*_: Any, legacy: bool = True, **__: Any) -> None:
        seen.append(legacy)

    monkeypatch.setattr(entry, "serve", fake_serve)
    assert entry.main(["--port", "0", *flags]) == 0
    assert seen == [legacy]
