"""Advertised devices, the 4 MiB cap, and the node register records."""

from __future__ import annotations

from vgpu_deviceplugin.api import deviceplugin_pb2 as pb
from vgpu_deviceplugin.config import Flags, resolve_settings
from vgpu_deviceplugin.devices import ResourceKind, advertise, node_register, visible_gpus
from vgpu_deviceplugin.gpus import GpuDevice, parse_mock_spec
from vgpu_formats import annotations as ann
from vgpu_formats.list_and_watch import MESSAGE_LIMIT
from vgpu_formats.node_config import parse_node_config

NODE = "n1"


def test_sizes_per_resource_follow_upstream() -> None:
    gpus = parse_mock_spec("2xRTX4090", NODE)
    s = resolve_settings(Flags(node_name=NODE, device_split_count=10, gpu_memory_factor=2,
                               device_cores_scaling=1.5), None, None)
    count = advertise(ResourceKind.COUNT, gpus, {}, s).response
    memory = advertise(ResourceKind.MEMORY, gpus, {}, s).response
    cores = advertise(ResourceKind.CORES, gpus, {}, s).response
    assert len(count.devices) == 20 and len(memory.devices) == 2 * (24564 // 2) and len(cores.devices) == 300
    assert f"{gpus[0].uuid}-0" == count.devices[0].ID and f"{gpus[1].uuid}-9" == count.devices[19].ID
    assert memory.devices[0].ID == "0-0" and f"{gpus[1].uuid}-core-0" == cores.devices[150].ID
    assert all(len(d.ID) <= 63 for d in [*count.devices, *cores.devices])


def test_hand_encoded_message_equals_protobuf_encoding_and_tracks_health() -> None:
    gpus = parse_mock_spec("3xT4", NODE)
    s = resolve_settings(Flags(node_name=NODE, device_split_count=120), None, None)
    # The reference is built with protobuf from the id scheme, not from the payload itself.
    scheme = {  # kind -> (id prefix, ids per GPU)
        ResourceKind.COUNT: lambda g: (f"{g.uuid}-", 120),
        ResourceKind.CORES: lambda g: (f"{g.uuid}-core-", 100),
        ResourceKind.MEMORY: lambda g: (f"{g.index}-", g.memory_mib),
    }
    for kind in ResourceKind:
        adv = advertise(kind, gpus, {gpus[1].uuid: False}, s)
        reference = pb.ListAndWatchResponse()
        for g in gpus:
            prefix, units = scheme[kind](g)
            for i in range(units):
                reference.devices.add(ID=f"{prefix}{i}", health="Unhealthy" if g is gpus[1] else "Healthy")
        assert reference.SerializeToString() == adv.payload
        assert adv.size == reference.ByteSize()
        assert len({d.ID for d in adv.response.devices}) == len(adv.response.devices)
        health = {d.ID: d.health for d in adv.response.devices}
        assert sum(h == "Unhealthy" for h in health.values()) == len(adv.response.devices) // 3


def test_memory_list_is_capped_under_the_kubelet_limit_with_the_fix_named() -> None:
    gpus = parse_mock_spec("8xA100-80GB", NODE)
    adv = advertise(ResourceKind.MEMORY, gpus, {}, resolve_settings(Flags(node_name=NODE), None, None))
    assert adv.size <= MESSAGE_LIMIT
    assert adv.warning is not None and "Set gpuMemoryFactor to 4 or more" in adv.warning
    fits = advertise(ResourceKind.MEMORY, gpus, {},
                     resolve_settings(Flags(node_name=NODE, gpu_memory_factor=4), None, None))
    assert fits.warning is None and len(fits.response.devices) == 8 * 20480


def test_fixture_node_memory_fits_without_cap() -> None:
    # 8 x 24564 MiB at factor 1 is what the fixture node advertises (196512).
    gpus = [GpuDevice(i, f"GPU-{i}", "NVIDIA GeForce RTX 4090", 24564, i) for i in range(8)]
    adv = advertise(ResourceKind.MEMORY, gpus, {}, resolve_settings(Flags(node_name=NODE), None, None))
    assert adv.warning is None and len(adv.response.devices) == 196512


def test_node_register_records_and_filters() -> None:
    gpus = parse_mock_spec("2xV100-32GB", NODE)
    cfg = parse_node_config('{"nodeconfig": [{"name": "n1", "devicesplitcount": 4, "operatingmode": "mig",'
                            f' "filterdevices": {{"uuid": ["{gpus[0].uuid}"]}}}}]}}')
    s = resolve_settings(Flags(node_name=NODE, gpu_memory_factor=2), None, cfg)
    visible = visible_gpus(gpus, s)
    assert [g.uuid for g in visible] == [gpus[1].uuid]
    text = ann.encode_node_register(node_register(visible, {gpus[1].uuid: False}, s))
    assert text == f"{gpus[1].uuid},4,16384,NVIDIA-Tesla V100-SXM2-32GB,false,mig:"
