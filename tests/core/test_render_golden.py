"""Golden renders: one file per case under golden/, each read by a human before it was committed
(regenerate with `UPDATE_GOLDEN=1 pytest tests/core`, then read the diff)."""

from __future__ import annotations

import copy
from typing import Any

from tests.core.support import check_golden, golden_view, workload


def _with_plugin(docs: list[dict[str, Any]], image: str, args: list[str] | None) -> list[dict[str, Any]]:
    docs = copy.deepcopy(docs)
    container = workload(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    container["image"] = image
    if args is None:
        container.pop("args", None)
    else:
        container["args"] = args
    return docs


def test_default_policy_on_fixture_cluster(cluster_docs: list[dict[str, Any]]) -> None:
    check_golden("default-policy", golden_view({}, cluster_docs))


def test_custom_resource_names_on_volcano_1_13(cluster_docs: list[dict[str, Any]]) -> None:
    spec = {"resources": {"count": "volcano.sh/gpu", "memory": "volcano.sh/gpu-mem",
                          "cores": "volcano.sh/gpu-cores", "memoryPercentage": ""}}
    check_golden("custom-names-volcano-1.13", golden_view(spec, cluster_docs))


def test_node_overrides_by_selector(cluster_docs: list[dict[str, Any]]) -> None:
    spec = {"nodeOverrides": [
        {"nodeSelector": {"matchLabels": {"gpu": "on"},
                          "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                "values": ["dev-app-2-150-master-1"]}]},
         "deviceSplitCount": 4, "deviceMemoryScaling": 1.5},
        {"nodeNames": ["test-app-64-46-msxf", "joins-later"], "filterDevices": {"index": [7]}},
    ]}
    check_golden("node-overrides-selector", golden_view(spec, cluster_docs))


def test_mig_geometries(cluster_docs: list[dict[str, Any]]) -> None:
    spec = {"device": {"knownMigGeometries": [
        {"models": ["H100-80GB"], "allowedGeometries": [
            {"group": "small", "geometries": [{"name": "1g.10gb", "memory": 9856, "count": 7}]},
            {"group": "large", "geometries": [{"name": "7g.80gb", "memory": 80000, "count": 1}]}]}]},
        "nodeOverrides": [{"nodeNames": ["dev-app-2-150-master-1"], "operatingMode": "mig"}]}
    check_golden("mig-geometries", golden_view(spec, cluster_docs))


def test_legacy_plugin_flag_forms(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _with_plugin(cluster_docs, "docker.io/projecthami/volcano-vgpu-device-plugin:v1.11.0",
                        ["-v=4", "--resource-name", "nvidia.com/gpu", "--device-split-count=10",
                         "--fail-on-init-error=false", "--device-split-count=2"])
    check_golden("plugin-legacy", golden_view({"device": {"deviceSplitCount": 5, "gpuMemoryFactor": 4}},
                                              docs))


def test_current_plugin_drops_resource_flags(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _with_plugin(cluster_docs, "docker.io/projecthami/volcano-vgpu-device-plugin:v1.12.0",
                        ["--resource-name=volcano.sh/vgpu-number", "--mig-strategy", "none",
                         "--device-split-count", "10", "--pass-device-specs"])
    check_golden("plugin-current", golden_view({}, docs))


def test_builtin_plugin_has_no_sizing_flags(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _with_plugin(cluster_docs, "ghcr.io/example/vgpu-device-plugin:0.1.0",
                        ["--mock-nvml", "--gpu-memory-factor=1"])
    check_golden("plugin-builtin", golden_view({}, docs))


def test_seed001_mismatch_repaired(seed001_docs: list[dict[str, Any]]) -> None:
    check_golden("seed001-repaired", golden_view({}, seed001_docs))


def test_seed001_repaired_keeping_the_users_name(seed001_docs: list[dict[str, Any]]) -> None:
    # The user meant nvidia.com/gpu: Volcano 1.13 honours it and the legacy plugin gets the flag,
    # so both sides agree on the name and "device request not found" cannot happen.
    check_golden("seed001-custom-name", golden_view({"resources": {"count": "nvidia.com/gpu"}}, seed001_docs))
