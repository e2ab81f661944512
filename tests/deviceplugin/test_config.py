"""Settings precedence: node-config > device-config > flags > defaults, with loud conflicts."""

from __future__ import annotations

import pytest
from vgpu_deviceplugin.config import Flags, resolve_settings
from vgpu_deviceplugin.runner import ConfigError, _first_config, load_config
from vgpu_formats.device_config import parse_device_config
from vgpu_formats.node_config import parse_node_config

from tests.deviceplugin.kit import FakeKube

NODE = "gpu-1"


def test_defaults_without_any_configmap() -> None:
    s = resolve_settings(Flags(node_name=NODE), None, None)
    assert (s.names.count, s.names.memory, s.names.cores) == (
        "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores")
    assert (s.split_count, s.memory_factor, s.core_scaling, s.mode) == (10, 1, 1.0, "hami-core")
    assert s.warnings == ()


def test_configmap_beats_a_contradicting_legacy_flag_loudly() -> None:
    cfg = parse_device_config("nvidia:\n  resourceCountName: nvidia.com/gpu\n  deviceSplitCount: 4\n")
    s = resolve_settings(Flags(node_name=NODE, resource_name="volcano.sh/vgpu-number", device_split_count=4),
                         cfg, None)
    assert s.names.count == "nvidia.com/gpu" and s.split_count == 4
    ignored = [w for w in s.warnings if w.startswith("IGNORED FLAG")]
    assert ignored == ["IGNORED FLAG --resource-name=volcano.sh/vgpu-number: device-config sets "
                       "resourceCountName=nvidia.com/gpu, and the scheduler reads the ConfigMap; remove the "
                       "flag or change the ConfigMap"]
    assert any("outside volcano.sh/" in w and "nvidia.com/gpu" in w for w in s.warnings)


def test_flag_fills_what_the_configmap_leaves_out() -> None:
    cfg = parse_device_config("nvidia:\n  deviceSplitCount: 4\n")
    s = resolve_settings(Flags(node_name=NODE, gpu_memory_factor=8, device_cores_scaling=2.0), cfg, None)
    assert (s.split_count, s.memory_factor, s.cores_per_gpu) == (4, 8, 200)
    assert s.warnings == ()


def test_node_config_entry_wins_for_this_node_only() -> None:
    cfg = parse_device_config("nvidia:\n  deviceSplitCount: 4\n  deviceCoreScaling: 1\n")
    nodes = parse_node_config('{"nodeconfig": [{"name": "gpu-1", "devicesplitcount": 7,'
                              ' "devicecorescaling": 1.5, "operatingmode": "mig"},'
                              ' {"name": "gpu-2", "devicesplitcount": 2}]}')
    mine = resolve_settings(Flags(node_name="gpu-1"), cfg, nodes)
    other = resolve_settings(Flags(node_name="gpu-3"), cfg, nodes)
    assert (mine.split_count, mine.cores_per_gpu, mine.mode) == (7, 150, "mig")
    assert (other.split_count, other.cores_per_gpu, other.mode) == (4, 100, "hami-core")


def test_unusable_values_are_corrected_with_a_warning() -> None:
    cfg = parse_device_config("nvidia:\n  gpuMemoryFactor: 0\n  deviceSplitCount: 0\n")
    s = resolve_settings(Flags(node_name=NODE, mig_strategy="mixed"), cfg, None)
    assert (s.memory_factor, s.split_count) == (1, 1)
    assert sum("gpuMemoryFactor=0" in w or "deviceSplitCount=0" in w or "--mig-strategy" in w
               for w in s.warnings) == 3



@pytest.mark.parametrize("scaling", ["0", "-1", "0.004"])
def test_a_core_scaling_that_advertises_no_cores_is_corrected_with_a_warning(scaling: str) -> None:
    # 0 core devices a GPU: Volcano v1.14.3 and later pass such a node over, silently.
    cfg = parse_device_config(f"nvidia:\n  deviceCoreScaling: {scaling}\n")
    s = resolve_settings(Flags(node_name=NODE), cfg, None)
    assert s.cores_per_gpu == 100
    assert [w for w in s.warnings if f"deviceCoreScaling={float(scaling)}" in w and "using 1" in w]


def test_namespace_lookup_order() -> None:
    assert Flags(node_name=NODE).device_config_namespaces() == ("kube-system", "volcano-system")
    assert Flags(node_name=NODE, device_config_namespace="gpu").device_config_namespaces() == ("gpu",)


def test_the_plugin_watches_only_the_configmaps_it_may_read() -> None:
    # The chart's Roles name device-config in targets.namespace and node-config in the plugin's
    # namespace: a watch on any other pair is a 403 retried forever.
    chart = Flags(node_name="n", device_config_namespace="kube-system", node_config_namespace="vgpu-system")
    assert chart.watched_configmaps() == (("kube-system", "volcano-vgpu-device-config"),
                                          ("vgpu-system", "volcano-vgpu-node-config"))
    upstream = Flags(node_name="n")  # no flags: the upstream lookup order, node-config beside it
    assert upstream.watched_configmaps() == (
        ("kube-system", "volcano-vgpu-device-config"), ("volcano-system", "volcano-vgpu-device-config"),
        ("kube-system", "volcano-vgpu-node-config"), ("volcano-system", "volcano-vgpu-node-config"))


@pytest.mark.parametrize(("key", "text", "said"), [
    ("config.json", '{"nodeconfig": ' + "[" * 5000 + "]" * 5000 + "}", "nested deeper than 64 levels"),
    ("device-config.yaml", "nvidia:\n  x: " + "[" * 5000 + "]" * 5000, "nested deeper than 64 levels"),
    ("device-config.yaml", "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
     "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
     "e: [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n", "aliases expand to more than"),
])
async def test_a_hostile_configmap_leaves_the_plugin_on_defaults_with_the_reason(
        key: str, text: str, said: str, kube: FakeKube) -> None:
    # Before: RecursionError at start on every node (10 KB of brackets in one ConfigMap).
    kube.set_configmap("kube-system", "volcano-vgpu-device-config", {"device-config.yaml": "nvidia: {}\n"})
    name = "volcano-vgpu-node-config" if key == "config.json" else "volcano-vgpu-device-config"
    kube.set_configmap("kube-system", name, {key: text})
    with pytest.raises(ConfigError, match=said):
        await load_config(kube, Flags(node_name="node-1"))
    loaded = await _first_config(kube, Flags(node_name="node-1"))
    assert said in loaded.settings.source and loaded.settings.names.count == "volcano.sh/vgpu-number"
