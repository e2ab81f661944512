"""vgpu_formats.annotations: exact upstream wire formats, strict decoding."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from vgpu_formats import FormatError
from vgpu_formats import annotations as ann

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cluster"


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((FIXTURES / name).read_text()) if d]


def test_node_register_round_trips_the_fixture_nodes() -> None:
    for node in _docs("nodes.yaml"):
        text = node["metadata"]["annotations"][ann.NODE_REGISTER]
        devices = ann.decode_node_register(text)
        assert len(devices) == 8
        assert ann.encode_node_register(devices) == text


def test_node_register_fields() -> None:
    node = _docs("nodes.yaml")[0]
    first = ann.decode_node_register(node["metadata"]["annotations"][ann.NODE_REGISTER])[0]
    assert first == ann.DeviceInfo(
        uuid="GPU-3c8ce108-117a-aeae-a3e8-1c0c5dafebe7",
        count=10,
        devmem=24564,
        type="NVIDIA-NVIDIA GeForce RTX 4090",
        health=True,
        mode="hami-core",
    )


def test_node_register_encodes_exact_upstream_text() -> None:
    devices = [
        ann.DeviceInfo("GPU-a", 10, 32768, "NVIDIA-Tesla V100-SXM2-32GB", True),
        ann.DeviceInfo("GPU-b", 10, 32768, "NVIDIA-Tesla V100-SXM2-32GB", False, "mig"),
    ]
    assert ann.encode_node_register(devices) == (
        "GPU-a,10,32768,NVIDIA-Tesla V100-SXM2-32GB,true,hami-core:"
        "GPU-b,10,32768,NVIDIA-Tesla V100-SXM2-32GB,false,mig:"
    )
    assert ann.encode_node_register([]) == ""
    assert ann.decode_node_register("") == []


def test_pod_devices_round_trip_the_fixture_pod() -> None:
    pod = _docs("pods.yaml")[0]
    text = pod["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE]
    decoded = ann.decode_pod_devices(text)
    assert decoded == [
        [
            ann.ContainerDevice("GPU-bc94e532-1820-8ee8-ceaa-704166369c7c", "NVIDIA", 3000, 50),
            ann.ContainerDevice("GPU-5beec879-79c9-6252-3aaa-9f5e146ba220", "NVIDIA", 3000, 50),
        ]
    ]
    assert ann.encode_pod_devices(decoded) == text
    assert pod["metadata"]["annotations"][ann.VGPU_IDS_NEW] == text


def test_pod_devices_keep_consumed_parts_and_mig_suffix() -> None:
    text = "GPU-a,NVIDIA,3000,50:;;GPU-b[group1-3],NVIDIA,2000,0:GPU-c,NVIDIA,2000,0:"
    decoded = ann.decode_pod_devices(text)
    assert [len(part) for part in decoded] == [1, 0, 2]
    assert decoded[2][0].uuid == "GPU-b[group1-3]"
    assert ann.encode_pod_devices(decoded) == text
    assert ann.decode_pod_devices("") == []
    assert ann.decode_pod_devices(";") == [[], []]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("GPU-a,10,24564,NVIDIA-x,true,hami-core", "device 0 (char 0)"),  # truncated: no ':'
        ("GPU-a,10,24564,NVIDIA-x,true,hami-core:GPU-b,10,2", "device 1 (char 39)"),
        ("GPU-a,10,24564,NVIDIA-x,true:", "5 fields"),  # v1.9 format
        ("GPU-a,ten,24564,NVIDIA-x,true,hami-core:", "device 0 (char 0) count"),
        ("GPU-a,10,-1,NVIDIA-x,true,hami-core:", "devmem"),
        ("GPU-a,10,24564,NVIDIA-x,yes,hami-core:", "health"),
        ("GPU-a,10,24564,NVIDIA-x,true,:", "mode"),
        (",10,24564,NVIDIA-x,true,hami-core:", "uuid"),
        ("GPU-a,10,24564,NVIDIA-x,true,hami-core::", "empty record"),
        ("garbage", "does not end with ':'"),
        ("\x00\xff:", "fields"),
    ],
)
def test_node_register_rejects_bad_input(text: str, fragment: str) -> None:
    with pytest.raises(FormatError) as err:
        ann.decode_node_register(text)
    assert ann.NODE_REGISTER in str(err.value)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("GPU-a,NVIDIA,3000,50", "container 0, device 0 (char 0)"),
        ("GPU-a,NVIDIA,3000,50:GPU-b,NVI", "container 0, device 1 (char 21)"),
        ("GPU-a,NVIDIA,3000,50:;GPU-b,NVIDIA,30", "container 1, device 0 (char 22)"),
        ("GPU-a,NVIDIA,3000:", "3 fields"),
        ("GPU-a,NVIDIA,3000,50,1:", "5 fields"),
        ("GPU-a,NVIDIA,-3000,50:", "usedmem"),
        ("GPU-a,NVIDIA,3000,x:", "usedcores"),
        ("GPU-a,NVIDIA,4294967296,50:", "larger than"),
        ("GPU-a,,3000,50:", "type"),
        ("GPU-a,NVIDIA,3000,50::", "empty record"),
        ("GPU-a,NVIDIA,\uff13\uff10,50:", "usedmem"),  # full-width digits are not digits here
    ],
)
def test_pod_devices_reject_bad_input(text: str, fragment: str) -> None:
    with pytest.raises(FormatError) as err:
        ann.decode_pod_devices(text)
    assert ann.DEVICES_TO_ALLOCATE in str(err.value)
    assert fragment in str(err.value)


def test_decode_names_the_annotation_it_was_given() -> None:
    with pytest.raises(FormatError, match=ann.VGPU_IDS_NEW):
        ann.decode_pod_devices("x", annotation=ann.VGPU_IDS_NEW)


@pytest.mark.parametrize(
    "device",
    [
        ann.ContainerDevice("GPU:a", "NVIDIA", 1, 1),
        ann.ContainerDevice("GPU-a", "NV;IDIA", 1, 1),
        ann.ContainerDevice("", "NVIDIA", 1, 1),
        ann.ContainerDevice(" ", "NVIDIA", 1, 1),
        ann.ContainerDevice("GPU-a", "NVIDIA", -1, 1),
        ann.ContainerDevice("GPU-a", "NVIDIA", 1, 2**32),
    ],
)
def test_encode_refuses_values_that_cannot_be_split_back(device: ann.ContainerDevice) -> None:
    with pytest.raises(FormatError, match="container 0, device 0"):
        ann.encode_pod_devices([[device]])


def test_encode_node_register_refuses_separators() -> None:
    with pytest.raises(FormatError, match="device 0 type"):
        ann.encode_node_register([ann.DeviceInfo("GPU-a", 10, 1, "NVIDIA-a,b", True)])


def test_vgpu_time_orders_like_upstream() -> None:
    assert ann.decode_vgpu_time("1764060249") == 1764060249
    assert ann.decode_vgpu_time(ann.VGPU_TIME_DONE) == ann.MAX_UINT64
    assert ann.decode_vgpu_time(None) == ann.MAX_UINT64
    assert ann.decode_vgpu_time("soon") == ann.MAX_UINT64
    assert ann.decode_vgpu_time("9" * 30) == ann.MAX_UINT64


def test_handshake_values() -> None:
    now = datetime(2026, 11, 21, 16, 50, 46, tzinfo=UTC)
    reported = ann.encode_handshake_reported(now)
    assert reported.startswith("Reported 2026-11-21 16:50:46")
    assert ann.decode_handshake(reported).state == ann.HANDSHAKE_REPORTED
    requesting = ann.encode_handshake_scheduler(ann.HANDSHAKE_REQUESTING, now)
    assert requesting == "Requesting_2026.11.21 16:50:46"
    assert ann.decode_handshake(requesting) == ann.Handshake("Requesting", now, requesting)
    assert ann.decode_handshake("Deleted_2026.11.21 16:50:46").state == "Deleted"
    for bad in ("Requesting_yesterday", "Deleted", "hello"):
        with pytest.raises(FormatError, match=ann.NODE_HANDSHAKE):
            ann.decode_handshake(bad)


def test_node_lock_values() -> None:
    now = datetime(2026, 11, 21, 16, 50, 46, tzinfo=UTC)
    value = ann.encode_node_lock(now)
    assert value == "2026-11-21T16:50:46Z"
    assert ann.decode_node_lock(value) == now
    assert ann.decode_node_lock("2026-11-21T17:50:46+01:00") == now
    assert not ann.node_lock_expired(value, now + timedelta(minutes=4))
    assert ann.node_lock_expired(value, now + timedelta(minutes=6))
    for bad in ("", "yesterday", "2026-11-21 16:50:46", "2026-11-21T16:50:46"):
        with pytest.raises(FormatError, match="hamivgpu"):
            ann.decode_node_lock(bad)


_token = st.text(
    alphabet=st.characters(blacklist_characters=",:;", blacklist_categories=("Cs",)), min_size=1
).filter(lambda s: s.strip() != "")
_u32 = st.integers(min_value=0, max_value=2**32 - 1)
_container_device = st.builds(ann.ContainerDevice, _token, _token, _u32, _u32)
_device_info = st.builds(
    ann.DeviceInfo, _token, st.integers(0, 2**63), st.integers(0, 2**63), _token, st.booleans(), _token
)


@given(st.lists(st.lists(_container_device, max_size=4), min_size=1, max_size=5))
def test_pod_devices_round_trip(pod: ann.PodDevices) -> None:
    text = ann.encode_pod_devices(pod)
    if pod == [[]]:  # one consumed container and "nothing pending" are the same text
        assert ann.decode_pod_devices(text) == []
    else:
        assert ann.decode_pod_devices(text) == pod


@given(st.lists(_device_info, max_size=8))
def test_node_register_round_trip(devices: list[ann.DeviceInfo]) -> None:
    assert ann.decode_node_register(ann.encode_node_register(devices)) == devices


@given(st.text(max_size=80))
def test_decoders_never_raise_anything_but_format_error(text: str) -> None:
    for decode in (ann.decode_pod_devices, ann.decode_node_register, ann.decode_handshake):
        with contextlib.suppress(FormatError):
            decode(text)
