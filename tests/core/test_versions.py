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
