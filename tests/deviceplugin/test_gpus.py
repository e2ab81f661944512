"""GPU backends: the mock spec, and NVML errors turned into clear messages (fake pynvml)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from vgpu_deviceplugin.gpus import GpuError, MockBackend, backend_for, parse_mock_spec
from vgpu_deviceplugin.gpus.base import ALL_GPUS
from vgpu_deviceplugin.gpus.nvml import NvmlBackend


def test_mock_spec_models_and_custom_sizes() -> None:
    gpus = parse_mock_spec("2xA100-80GB, 1xMyCard:16384", "node-a")
    assert [(g.index, g.name, g.memory_mib) for g in gpus] == [
        (0, "NVIDIA A100-SXM4-80GB", 81920), (1, "NVIDIA A100-SXM4-80GB", 81920), (2, "MyCard", 16384)]
    assert gpus[0].uuid.startswith("GPU-") and len(gpus[0].uuid) == 40
    assert parse_mock_spec("2xA100-80GB", "node-a")[1].uuid == gpus[1].uuid  # stable across restarts
    assert parse_mock_spec("2xA100-80GB", "node-b")[0].uuid != gpus[0].uuid  # different per node


@pytest.mark.parametrize(("spec", "message"), [
    ("8xB9000", "unknown model 'B9000'"), ("A100-80GB", "expected <count>x<model>"), ("0xT4", "is empty"),
    ("2xT4:lots", "expected <count>x<model>"),
])
def test_mock_spec_errors_name_the_item(spec: str, message: str) -> None:
    with pytest.raises(GpuError, match=message):
        parse_mock_spec(spec, "n")


def test_backend_for_picks_the_mock_when_a_spec_is_given() -> None:
    assert isinstance(backend_for("1xT4", "n"), MockBackend)


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(**overrides: Any) -> SimpleNamespace:
    handles = {0: "h0", 1: "h1"}
    base: dict[str, Any] = dict(
        NVMLError=FakeNvmlError, NVML_ERROR_TIMEOUT=10, NVML_ERROR_NOT_SUPPORTED=3,
        nvmlEventTypeXidCriticalError=8, nvmlEventTypeDoubleBitEccError=2, nvmlEventTypeSingleBitEccError=1,
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: handles[i],
        nvmlDeviceGetUUID=lambda h: {"h0": b"GPU-b", "h1": "GPU-a"}[h],
        nvmlDeviceGetName=lambda h: "NVIDIA L4",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=23034 * 1024 * 1024),
        nvmlDeviceGetMinorNumber=lambda h: {"h0": 5, "h1": 2}[h],
    )
    base.update(overrides)
    return SimpleNamespace(**base)


def test_nvml_discovery_orders_by_minor_number() -> None:
    gpus = NvmlBackend(fake_nvml()).discover()  # type: ignore[arg-type]
    assert [(g.uuid, g.index, g.minor, g.memory_mib) for g in gpus] == [
        ("GPU-a", 1, 2, 23034), ("GPU-b", 0, 5, 23034)]


def test_nvml_failure_is_a_clear_error() -> None:
    def broken() -> None:
        raise FakeNvmlError(9)

    with pytest.raises(GpuError, match=r"NVML: NVML error 9\. Is the NVIDIA driver visible"):
        NvmlBackend(fake_nvml(nvmlInit=broken)).discover()  # type: ignore[arg-type]


async def _reported(events: list[SimpleNamespace], **nvml_overrides: Any) -> list[str]:
    """What the NVML health watcher reports for `events` (then the event set times out)."""
    stop = asyncio.Event()
    seen: list[str] = []

    def wait(_set: object, _ms: int) -> object:
        if events:
            return events.pop(0)
        stop.set()
        raise FakeNvmlError(10)

    nvml = fake_nvml(nvmlEventSetCreate=lambda: "set", nvmlEventSetFree=lambda s: None,
                     nvmlDeviceGetHandleByUUID=lambda u: {"GPU-b": "h0", "GPU-a": "h1"}[u],
                     nvmlDeviceGetSupportedEventTypes=lambda h: 0xFF,
                     nvmlDeviceRegisterEvents=lambda h, mask, s: None, nvmlEventSetWait=wait)
    backend = NvmlBackend(nvml)  # type: ignore[arg-type]
    backend.discover()
    for name, value in nvml_overrides.items():  # after discovery, which reads the real names
        setattr(nvml, name, value)
    await backend.watch_health(seen.append, stop)
    await asyncio.sleep(0)
    return seen


async def test_nvml_xid_events_mark_only_real_faults() -> None:
    events = [SimpleNamespace(eventType=8, eventData=43, device="h0"),  # application fault: ignored
              SimpleNamespace(eventType=1, eventData=0, device="h0"),  # not an Xid: ignored
              SimpleNamespace(eventType=8, eventData=79, device="h1")]  # fell off the bus
    assert await _reported(events) == ["GPU-a"]


async def test_nvml_xid_of_a_gpu_that_lost_its_uuid_marks_all_and_the_watcher_lives_on() -> None:
    # Xid 79: the GPU fell off the bus, and NVML cannot name it any more (GPU_IS_LOST).
    events = [SimpleNamespace(eventType=8, eventData=79, device="lost"),
              SimpleNamespace(eventType=8, eventData=48, device="h0")]

    def uuid_of(handle: str) -> str | bytes:
        if handle == "lost":
            raise FakeNvmlError(15)
        return {"h0": b"GPU-b", "h1": "GPU-a"}[handle]

    assert await _reported(events, nvmlDeviceGetUUID=uuid_of) == [ALL_GPUS, "GPU-b"]


async def test_mock_health_events_reach_the_callback() -> None:
    backend = MockBackend(parse_mock_spec("2xT4", "n"))
    stop = asyncio.Event()
    seen: list[str] = []
    backend.mark_unhealthy("early")  # before watching: queued
    task = asyncio.create_task(backend.watch_health(seen.append, stop))
    await asyncio.sleep(0.01)
    backend.mark_unhealthy("late")
    await asyncio.sleep(0.01)
    stop.set()
    await task
    assert seen == ["early", "late"]
