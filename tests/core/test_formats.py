"""The two ConfigMap formats: round trips, defaults, the scheduler's zero values, strict errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from vgpu_formats import FormatError
from vgpu_formats import device_config as dc
from vgpu_formats import node_config as nc


def _data(docs: list[dict[str, Any]], name: str, key: str) -> str:
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)
    return str(cm["data"][key])


def test_upstream_device_config_round_trips(cluster_docs: list[dict[str, Any]]) -> None:
    cfg = dc.parse_device_config(_data(cluster_docs, dc.CONFIGMAP_NAME, dc.CONFIGMAP_KEY))
    assert cfg.nvidia is not None
    assert cfg.nvidia.resource_count_name == "volcano.sh/vgpu-number"
    assert cfg.nvidia.gpu_memory_factor == 1
    geoms = cfg.nvidia.known_mig_geometries or []
    assert [g.models[0] for g in geoms] == ["A30", "A100-SXM4-40GB", "A100-SXM4-80GB"]
    assert geoms[2].allowed_geometries[3].geometries[0].memory == 80896
    text = dc.render_device_config(cfg)
    assert dc.parse_device_config(text) == cfg
    assert dc.render_device_config(dc.parse_device_config(text)) == text


def test_other_sections_and_unknown_keys_survive() -> None:
    text = ("vnpus:\n  hamiVnpuCore: true\n  configs: [{a: 1}]\n"
            "nvidia:\n  futureKey: x\n  deviceSplitCount: 4\n")
    cfg = dc.parse_device_config(text)
    out = dc.render_device_config(cfg)
    assert out.startswith("nvidia:\n  deviceSplitCount: 4\n  futureKey: x\nvnpus:")
    again = dc.parse_device_config(out)
    assert again.others == {"vnpus": {"hamiVnpuCore": True, "configs": [{"a": 1}]}}
    assert again.nvidia is not None and again.nvidia.model_extra == {"futureKey": "x"}


def test_absent_fields_differ_between_scheduler_and_plugin() -> None:
    cfg = dc.parse_device_config("nvidia:\n  resourceMemoryName: volcano.sh/vgpu-memory\n")
    sched = dc.scheduler_view(cfg)
    plugin = dc.plugin_view(cfg, dc.builtin_plugin_defaults())  # this project's plugin
    # The scheduler uses Go zero values: an empty count name, so no pod is a vGPU pod.
    assert sched.resource_count_name == ""
    assert sched.device_split_count == 0
    assert plugin.resource_count_name == "volcano.sh/vgpu-number"
    assert plugin.device_split_count == 10 and plugin.gpu_memory_factor == 1
    assert plugin.default_gpu_num == 1 and plugin.device_memory_scaling == 1.0


@pytest.mark.parametrize(("a", "b", "same"), [
    ("deviceSplitCount: 10\n  disableCoreLimit: false", "deviceSplitCount: 10", True),  # false == absent
    ("deviceMemoryScaling: 1", "deviceMemoryScaling: 1.0", True),
    ("overwriteEnv: false\n  gpuMemoryFactor: 1", "gpuMemoryFactor: 1\n  overwriteEnv: false", True),
    ("defaultGPUNum: 1", "deviceSplitCount: 10", False),  # absent defaultGPUNum is 0 to the scheduler
    ("gpuMemoryFactor: 1", "deviceSplitCount: 10", False),
    ("deviceSplitCount: 10", "deviceSplitCount: 10\n  futureKey: x", False),  # foreign keys count
])
def test_same_meaning_ignores_spelling_only(a: str, b: str, same: bool) -> None:
    one, two = dc.parse_device_config(f"nvidia:\n  {a}\n"), dc.parse_device_config(f"nvidia:\n  {b}\n")
    assert dc.same_meaning(one, two) is same
    assert dc.same_meaning(two, one) is same


def test_same_meaning_compares_other_sections_and_failed_loads() -> None:
    plain = dc.parse_device_config("nvidia:\n  deviceSplitCount: 10\n")
    with_npu = dc.parse_device_config("nvidia:\n  deviceSplitCount: 10\nvnpus: {hamiVnpuCore: true}\n")
    assert not dc.same_meaning(plain, with_npu)
    assert dc.same_meaning(None, None)
    assert not dc.same_meaning(None, plain)  # a failed load gives built-in defaults, not this


def test_failed_load_gives_builtin_defaults_without_percentage() -> None:
    view = dc.scheduler_view_of_text("nvidia:\n  gpuMemoryFactor: lots\n")
    assert view.resource_count_name == "volcano.sh/vgpu-number"
    assert view.resource_memory_percentage_name == ""
    assert view.gpu_memory_factor == 0
    assert dc.scheduler_view_of_text(None) == view


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('nvidia:\n  gpuMemoryFactor: "2"\n', "device-config.yaml: nvidia.gpuMemoryFactor"),
        ("nvidia:\n  deviceSplitCount: -1\n", "device-config.yaml: nvidia.deviceSplitCount"),
        ("nvidia:\n  overwriteEnv: 1\n", "device-config.yaml: nvidia.overwriteEnv"),
        ("nvidia:\n  resourceCountName: 5\n", "device-config.yaml: nvidia.resourceCountName"),
        ("nvidia:\n  knownMigGeometries:\n  - models: [A30]\n    allowedGeometries:\n"
         "    - group: g\n      geometries: [{name: x, memory: big, count: 1}]\n",
         "device-config.yaml: nvidia.knownMigGeometries[0].allowedGeometries[0].geometries[0].memory"),
        ("nvidia: [1, 2]\n", "device-config.yaml: nvidia"),
        ("- a\n- b\n", "device-config.yaml"),
        ("nvidia: {a: [}\n", "device-config.yaml"),
    ],
)
def test_device_config_errors_name_the_field(text: str, field: str) -> None:
    with pytest.raises(FormatError) as err:
        dc.parse_device_config(text)
    assert err.value.field == field
    assert err.value.fix


def test_floats_accept_integers_like_go() -> None:
    cfg = dc.parse_device_config("nvidia:\n  deviceMemoryScaling: 2\n")
    assert cfg.nvidia is not None and cfg.nvidia.device_memory_scaling == 2.0


def test_node_config_round_trip_sorted(cluster_docs: list[dict[str, Any]]) -> None:
    cfg = nc.parse_node_config(_data(cluster_docs, nc.CONFIGMAP_NAME, nc.CONFIGMAP_KEY))
    entry = cfg.entry_for("aio-node67")
    assert entry is not None and entry.devicememoryscaling == 1.8 and entry.devicesplitcount == 10
    assert cfg.entry_for("other") is None
    two = nc.NodeConfig(nodeconfig=[nc.NodeConfigEntry(name="b", devicesplitcount=4),
                                    nc.NodeConfigEntry(name="a", operatingmode="mig")])
    text = nc.render_node_config(two)
    assert text.index('"a"') < text.index('"b"')
    assert '"devicememoryscaling"' not in text  # unset stays unset
    assert nc.render_node_config(nc.parse_node_config(text)) == text


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"nodeconfig": [{"name": "a", "devicesplitcount": "10"}]}',
         "config.json: nodeconfig[0].devicesplitcount"),
        ('{"nodeconfig": [{"name": "a", "operatingmode": "vgpu"}]}',
         "config.json: nodeconfig[0].operatingmode"),
        ('{"nodeconfig": [{"name": "a"}, {"name": "b", "filterdevices": {"index": ["0"]}}]}',
         "config.json: nodeconfig[1].filterdevices.index[0]"),
        ('{"nodeconfig": [{"operatingmode": "mig"}]}', "config.json: nodeconfig[0].name"),
        ('{"nodeconfig": [', "config.json"),
        ("[]", "config.json"),
    ],
)
def test_node_config_errors_name_the_field(text: str, field: str) -> None:
    with pytest.raises(FormatError) as err:
        nc.parse_node_config(text)
    assert err.value.field == field


def test_node_config_text_is_one_entry_per_line_and_exact() -> None:
    data = {"nodeconfig": [{"name": "a", "x": 1}, {"name": "b", "x": True}, {"name": "c", "x": 1.0},
                           {"name": "d", "filterdevices": {"uuid": ["u"], "index": []}}, {"name": "e"}]}
    text = nc.node_config_text(data)
    lines = text.splitlines()
    assert lines[2:7] == ['    {"name": "a", "x": 1},', '    {"name": "b", "x": true},',
                          '    {"name": "c", "x": 1.0},',
                          '    {"name": "d", "filterdevices": {"uuid": ["u"], "index": []}},',
                          '    {"name": "e"}']
    assert json.loads(text) == data
    assert nc.node_config_text({"nodeconfig": []}) == '{\n  "nodeconfig": []\n}\n'
