"""Version rules: image tags -> Volcano version and plugin generation, and what each supports."""

from __future__ import annotations

from typing import Any

import pytest
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


def test_current_flags_are_exactly_what_v1_12_defines() -> None:
    # 23 flags and 4 aliases (cmd/vgpu/main.go v1.12.0); 6 of them switches.
    assert len(v.CURRENT_FLAGS) == 27
    assert {name for name, switch in v.CURRENT_FLAGS.items() if switch} == {
        "fail-on-init-error", "pass-device-specs", "gdrcopy-enabled", "gds-enabled", "mofed-enabled",
        "imex-required"}
    # v1.11's flags it dropped, and urfave/cli's own -v (--version) and -h (--help)
    for gone in ("resource-name", "resource-memory-name", "resource-core-name", "node-name", "debug", "v",
                 "version", "h", "help"):
        assert gone not in v.CURRENT_FLAGS
    for sizing in ("device-split-count", "gpu-memory-factor", "device-cores-scaling"):
        assert v.CURRENT_FLAGS[sizing] is False


def test_legacy_flag_defaults() -> None:
    assert v.LEGACY_FLAG_DEFAULTS == {
        "resource-name": "volcano.sh/vgpu-number", "resource-memory-name": "volcano.sh/vgpu-memory",
        "resource-core-name": "volcano.sh/vgpu-cores", "device-split-count": "2", "gpu-memory-factor": "1",
        "device-cores-scaling": "1"}


@pytest.mark.parametrize(
    ("generation", "row"),
    [
        ("legacy", dict(split_default=2, memory_ids="index", caps_memory_list=False, max_resource_name=None,
                        forces_volcano_prefix=False, applies_core_scaling=False,
                        applies_disable_core_limit=False, applies_memory_scaling=False,
                        applies_node_split_and_filters=False, implements_mps=False,
                        fixed_device_config_place=True, mig_table="v1.11")),
        ("current", dict(split_default=0, memory_ids="uuid", caps_memory_list=False, max_resource_name=63,
                         forces_volcano_prefix=True, applies_core_scaling=True,
                         applies_disable_core_limit=False, applies_memory_scaling=False,
                         applies_node_split_and_filters=True, implements_mps=False,
                         fixed_device_config_place=True, mig_table="v1.12")),
        ("builtin", dict(split_default=10, memory_ids="index", caps_memory_list=True, max_resource_name=None,
                         forces_volcano_prefix=False, applies_core_scaling=True,
                         applies_disable_core_limit=True, applies_memory_scaling=True,
                         applies_node_split_and_filters=True, implements_mps=True,
                         fixed_device_config_place=False, mig_table="v1.12")),
    ],
)
def test_plugin_traits(generation: v.Generation, row: dict[str, Any]) -> None:
    traits = v.plugin_traits(generation)
    assert {key: getattr(traits, key) for key in row} == row
    assert traits.flags == (v.CURRENT_FLAGS if generation == "current" else None)


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
        return v.memory_list_bytes(generation, [(UUIDS[0], 81920 // f)] * 8) <= v.KUBELET_MESSAGE_LIMIT

    assert fits(factor) and not fits(factor - 1)
