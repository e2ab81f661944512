"""Version rules: image tags -> Volcano version and plugin generation, and what each supports."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from vgpu_formats import device_config as dc
from vgpu_formats import list_and_watch as lw
from vgpu_formats import node_config as nc
from vgpu_operator import versions as v


def _workload(image: str, name: str = "volcano-device-plugin",
              command: list[str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": image}
    if command:
        container["command"] = command
    return {"spec": {"template": {"spec": {"containers": [container]}}}}


@pytest.mark.parametrize(
    ("image", "generation"),
    [
        ("docker.io/projecthami/volcano-vgpu-device-plugin:v1.9.0", "legacy"),
        ("projecthami/volcano-vgpu-device-plugin:v1.11.0", "legacy"),
        ("projecthami/volcano-vgpu-device-plugin:v1.12.0", "current"),
        ("registry.local:5000/hami/volcano-vgpu-device-plugin:v1.13.2-rc1", "current"),
        ("projecthami/volcano-vgpu-device-plugin:v1.12.0@sha256:" + "b" * 64, "current"),
        ("ghcr.io/acme/vgpu-device-plugin:0.1.0", "builtin"),
        ("ghcr.io/acme/vgpu-operator:latest", "builtin"),
        ("projecthami/volcano-vgpu-device-plugin:latest", None),
        ("projecthami/volcano-vgpu-device-plugin@sha256:" + "c" * 64, None),
        ("registry.local:5000/volcano-vgpu-device-plugin", None),
    ],
)
def test_plugin_generation_from_image(image: str, generation: str | None) -> None:
    found = v.plugin_generation("auto", _workload(image), "volcano-device-plugin")
    assert found.generation == generation
    if generation is None:
        assert "cannot tell" in found.detail and image in found.detail


def test_builtin_by_command_and_explicit_generation() -> None:
    found = v.plugin_generation("auto", _workload("custom/build:dev", command=["deviceplugin"]),
                                "volcano-device-plugin")
    assert found.generation == "builtin"
    assert v.plugin_generation("legacy", None, "x").generation == "legacy"
    assert v.plugin_generation("auto", None, "x").generation is None
    missing = v.plugin_generation("auto", _workload("a:v1.12.0", name="other"), "volcano-device-plugin")
    assert missing.generation is None and "no container" in missing.detail


@pytest.mark.parametrize(
    ("tag", "reads", "builtin_only", "works"),
    [
        ("v1.9.0", False, False, False),
        ("v1.12.0", False, False, False),
        ("v1.13.0", True, False, True),
        ("v1.14.2", True, False, True),
        ("v1.14.3", True, True, False),
        ("v1.15.0", True, False, True),
        ("v1.15.1", True, True, False),
        ("v1.16.0-alpha.1", True, True, False),
        ("1.16", True, True, False),
    ],
)
def test_resource_name_rules(tag: str, reads: bool, builtin_only: bool, works: bool) -> None:
    version = v.parse_version(tag)
    assert version is not None
    assert v.reads_custom_resource_names(version) is reads
    assert v.requires_builtin_resource_names(version) is builtin_only
    assert v.custom_resource_names_work(version) is works


def test_volcano_version_sources() -> None:
    deploy = _workload("docker.io/volcanosh/vc-scheduler:v1.13.0", name="volcano-scheduler")
    assert str(v.volcano_version("auto", deploy).version) == "v1.13.0"
    assert str(v.volcano_version("v1.15.0", None).version) == "v1.15.0"
    assert v.volcano_version("auto", None).version is None
    latest = v.volcano_version("auto", _workload("volcanosh/vc-scheduler:latest", name="volcano-scheduler"))
    assert latest.version is None and "latest" in latest.detail


def test_prerelease_sorts_before_release() -> None:
    alpha, final = v.parse_version("v1.16.0-alpha.1"), v.parse_version("v1.16.0")
    assert alpha is not None and final is not None and alpha < final
    assert v.parse_version("latest") is None and v.parse_version("") is None


# --- what each device plugin generation does (facts: operator/README.md, "Plugin generations") ---


UPSTREAM = Path(__file__).resolve().parents[1] / "fixtures" / "upstream"


def _go_flags(text: str) -> dict[str, bool]:
    """name -> is a switch, for every `&cli.<Kind>Flag{ Name: ..., Aliases: [...] }` in Go source."""
    out: dict[str, bool] = {}
    code = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    for kind, body in re.findall(r"&cli\.(\w+)Flag\{(.*?)\n\t\t\}", code, re.S):
        names = re.findall(r'Name:\s+"([^"]+)"', body)
        aliases = re.search(r"Aliases:\s+\[\]string\{([^}]*)\}", body)
        names += re.findall(r'"([^"]+)"', aliases.group(1)) if aliases else []
        out.update(dict.fromkeys(names, kind == "Bool"))
    return out


def test_current_flags_are_exactly_what_v1_12_defines() -> None:
    upstream = _go_flags((UPSTREAM / "v1.12.0-flags.txt").read_text())
    assert len(upstream) == 27  # 23 flags and 4 aliases: the parse above found them all
    assert upstream == v.CURRENT_FLAGS


@pytest.mark.parametrize("config", [None, "nvidia:\n  deviceSplitCount: 7\n  gpuMemoryFactor: 3\n"
                                          "  deviceCoreScaling: 2\n"])
def test_legacy_sizing_comes_from_its_flags_only(config: str | None) -> None:
    cfg = dc.parse_device_config(config) if config else None
    node = nc.NodeConfigEntry(name="n", devicesplitcount=5, devicecorescaling=3.0)
    assert [v.effective_sizing("legacy", flag, None, cfg, node) for flag in v.SIZING_KEYS] == [
        v.Sizing(2, "flag default"), v.Sizing(1, "flag default"), v.Sizing(1, "flag default")]
    assert v.effective_sizing("legacy", "device-split-count", "4", cfg, node) == v.Sizing(4, "flag")


def test_v1_12_sizing_a_set_flag_overrides_the_configmap() -> None:
    cfg = dc.parse_device_config("nvidia:\n  deviceSplitCount: 10\n")
    assert v.effective_sizing("current", "device-split-count", "4", cfg) == v.Sizing(4, "flag")
    assert v.effective_sizing("current", "device-split-count", None, cfg) == v.Sizing(10, "device-config")
    node = nc.NodeConfigEntry(name="n", devicesplitcount=3)
    assert v.effective_sizing("current", "device-split-count", "4", cfg, node) == v.Sizing(3, "node-config")
    # absent keys are Go's zero: factor 0 (a division by zero), no core devices
    assert v.effective_sizing("current", "gpu-memory-factor", None, cfg) == v.Sizing(0, "default")
    assert v.effective_sizing("current", "device-cores-scaling", None, None) == v.Sizing(0, "default")
    # the flag is a Go uint: a negative or fractional value makes the binary exit
    for text in ("-4", "4.5", "four"):
        assert v.effective_sizing("current", "device-split-count", text, cfg).value is None
    assert v.effective_sizing("current", "device-split-count", "0x10", cfg).value == 16


@pytest.mark.parametrize("config", [None, "nvidia: {}\n", "nvidia:\n  deviceSplitCount: 7\n",
                                    "nvidia:\n  deviceSplitCount: 0\n  gpuMemoryFactor: 0\n",
                                    "nvidia:\n  gpuMemoryFactor: 3\n  deviceCoreScaling: 2.5\n"])
@pytest.mark.parametrize("flags", [{}, {"device-split-count": "4", "gpu-memory-factor": "2",
                                        "device-cores-scaling": "0.5"}, {"device-split-count": "-3"}])
@pytest.mark.parametrize("node", [None, {"devicesplitcount": 6, "devicecorescaling": 1.5}])
def test_builtin_sizing_is_what_our_plugin_resolves(config: str | None, flags: dict[str, str],
                                                    node: dict[str, Any] | None) -> None:
    from vgpu_deviceplugin.config import Flags, resolve_settings

    cfg = dc.parse_device_config(config) if config else None
    entry = nc.NodeConfigEntry(name="n", **node) if node else None
    settings = resolve_settings(Flags(node_name="n", **{
        key.replace("-", "_"): (float(value) if key == "device-cores-scaling" else int(value))
        for key, value in flags.items()}), cfg, nc.NodeConfig(nodeconfig=[entry]) if entry else None)
    found = [v.effective_sizing("builtin", flag, flags.get(flag), cfg, entry).value for flag in v.SIZING_KEYS]
    assert found == [settings.split_count, settings.memory_factor, settings.core_scaling]


def test_unknown_generation_gets_the_strictest_traits() -> None:
    assert v.plugin_traits(None) == v.plugin_traits("current")


def test_registered_name() -> None:
    assert v.registered_name("current", "nvidia.com/gpu") == "volcano.sh/nvidia.com/gpu"
    assert v.registered_name("current", "volcano.sh/gpu") == "volcano.sh/gpu"
    assert v.registered_name("legacy", "nvidia.com/gpu") == "nvidia.com/gpu"
    assert v.registered_name("builtin", "nvidia.com/gpu") == "nvidia.com/gpu"


UUIDS = ["GPU-bc94e532-1820-8ee8-ceaa-704166369c7c", "GPU-5beec879-79c9-6252-3aaa-9f5e146ba220"]


@pytest.mark.parametrize("generation", ["legacy", "current", "builtin"])
def test_memory_list_bytes_is_the_wire_size(generation: v.Generation) -> None:
    from vgpu_deviceplugin.api import deviceplugin_pb2 as pb

    gpus = [(UUIDS[0], 1234), (UUIDS[1], 7)]
    message = pb.ListAndWatchResponse()
    for index, (uuid, units) in enumerate(gpus):
        prefix = f"{uuid}-memory-" if generation == "current" else f"{index}-"
        for i in range(units):
            message.devices.add(ID=f"{prefix}{i}", health="Healthy")
    assert v.memory_list_bytes(generation, gpus) == len(message.SerializeToString())


@pytest.mark.parametrize(("generation", "factor"), [("legacy", 4), ("builtin", 4), ("current", 11)])
def test_eight_80gb_gpus_need_this_memory_factor(generation: v.Generation, factor: int) -> None:
    def fits(f: int) -> bool:
        return v.memory_list_bytes(generation, [(UUIDS[0], 81920 // f)] * 8) <= lw.MESSAGE_LIMIT

    assert fits(factor) and not fits(factor - 1)


def test_our_plugin_caps_its_memory_list_exactly_where_the_operator_predicts() -> None:
    from vgpu_deviceplugin.config import Flags, resolve_settings
    from vgpu_deviceplugin.devices import ResourceKind, advertise
    from vgpu_deviceplugin.gpus import GpuDevice

    settings = resolve_settings(Flags(node_name="n"), None, None)

    def capped(mib: int) -> bool:
        gpu = GpuDevice(index=0, uuid=UUIDS[0], name="A100", memory_mib=mib, minor=0)
        return advertise(ResourceKind.MEMORY, [gpu], {}, settings).warning is not None

    low, high = 1, 1_000_000  # the largest list that fits, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        fits = v.memory_list_bytes("builtin", [(UUIDS[0], mid)]) <= lw.MESSAGE_LIMIT
        low, high = (mid, high) if fits else (low, mid - 1)
    assert not capped(low) and capped(low + 1)
