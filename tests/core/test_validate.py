"""Cluster-dependent validation rules: each names the field, the object and the fix."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from vgpu_operator.api import parse_spec
from vgpu_operator.validate import Problem, errors, validate

from tests.core.support import observe, workload


def _problems(spec_dict: dict[str, Any], docs: list[dict[str, Any]]) -> list[Problem]:
    spec = parse_spec(spec_dict)
    return validate(spec, observe(docs, spec))


def _reasons(problems: list[Problem]) -> set[str]:
    return {p.reason for p in problems}


def _with_images(docs: list[dict[str, Any]], scheduler: str | None = None,
                 plugin: str | None = None) -> list[dict[str, Any]]:
    docs = copy.deepcopy(docs)
    if scheduler:
        workload(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"] = scheduler
    if plugin:
        workload(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"] = plugin
    return docs


CUSTOM = {"resources": {"count": "volcano.sh/gpu"}}


def test_default_policy_has_no_errors(cluster_docs: list[dict[str, Any]]) -> None:
    assert errors(_problems({}, cluster_docs)) == []


def test_custom_names_by_volcano_version(cluster_docs: list[dict[str, Any]]) -> None:
    assert errors(_problems(CUSTOM, cluster_docs)) == []  # fixture runs v1.13.0
    for tag in ("v1.12.0", "v1.14.4", "v1.15.1", "v1.16.0"):
        docs = _with_images(cluster_docs, scheduler=f"volcanosh/vc-scheduler:{tag}")
        found = [p for p in errors(_problems(CUSTOM, docs)) if p.reason == "CustomResourceNamesUnsupported"]
        assert len(found) == 1, tag
        assert found[0].field == "spec.resources.count"
        assert "volcano.sh/vgpu-number" in found[0].message and tag in found[0].message
    pinned = _problems({**CUSTOM, "scheduler": {"volcanoVersion": "v1.15.0"}},
                       _with_images(cluster_docs, scheduler="volcanosh/vc-scheduler:latest"))
    assert errors(pinned) == []


def test_current_plugin_needs_volcano_domain(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _with_images(cluster_docs, plugin="projecthami/volcano-vgpu-device-plugin:v1.12.0")
    found = errors(_problems({"resources": {"count": "nvidia.com/gpu"}}, docs))
    assert [(p.field, p.reason) for p in found] == [("spec.resources.count",
                                                     "ResourceNameOutsideVolcanoDomain")]
    # the legacy plugin takes any name through its flag
    assert errors(_problems({"resources": {"count": "nvidia.com/gpu"}}, cluster_docs)) == []


def test_gpushare_arguments_conflict(cluster_docs: list[dict[str, Any]]) -> None:
    conf = ("actions: enqueue\ntiers:\n- plugins:\n  - name: deviceshare\n    arguments:\n"
            "      deviceshare.GPUSharingEnable: true\n  - name: predicates\n")
    docs = copy.deepcopy(cluster_docs)
    next(d for d in docs if d["metadata"]["name"] == "volcano-scheduler-configmap")["data"][
        "volcano-scheduler.conf"] = conf
    found = errors(_problems({}, docs))
    assert [p.reason for p in found] == ["ConflictingDeviceShareArguments"]
    assert "deviceshare.GPUSharingEnable" in found[0].message and "Remove" in found[0].message


# How Volcano's GetBool reads a YAML value: a bool, or a string strconv.ParseBool takes; an
# integer is not a bool to it (yaml.v2, like PyYAML, reads `yes` as a YAML 1.1 bool).
# (spelling, read as true by Volcano v1.13, by v1.15): GetBool takes a YAML bool (`yes` is one in
# YAML 1.1); from v1.15 it also parses a string with Go's strconv.ParseBool
# (pkg/scheduler/framework/arguments.go of each tag).
GETBOOL = [("true", True, True), ('"true"', False, True), ('"1"', False, True), ("yes", True, True),
           ("1", False, False), ('"yes"', False, False), ("false", False, False)]
VOLCANO_1_15 = "docker.io/volcanosh/vc-scheduler:v1.15.0"


@pytest.mark.parametrize(("image", "severity"), [("v1.13.0", "warning"), ("v1.14.4", "error"),
                                                  ("v1.15.0", "error")])
def test_an_unknown_scheduler_action_is_an_error_where_volcano_rejects_the_file(
        cluster_docs: list[dict[str, Any]], image: str, severity: str) -> None:
    docs = copy.deepcopy(cluster_docs)
    conf = next(d for d in docs if d["metadata"]["name"] == "volcano-scheduler-configmap")["data"]
    conf["volcano-scheduler.conf"] = conf["volcano-scheduler.conf"].replace(
        '"enqueue, allocate, backfill"', '"enqueue, allocate, gangpreempt"')
    scheduler = next(d for d in docs
                     if d["kind"] == "Deployment" and d["metadata"]["name"] == "volcano-scheduler")
    container = scheduler["spec"]["template"]["spec"]["containers"][0]
    container["image"] = f"docker.io/volcanosh/vc-scheduler:{image}"
    found = [p for p in _problems({}, docs) if p.reason == "SchedulerActionUnknown"]
    if image == "v1.15.0":  # gangpreempt exists from v1.15
        assert found == []
        return
    assert [(p.severity, "'gangpreempt'" in p.message) for p in found] == [(severity, True)]


@pytest.mark.parametrize(("spelling", "before_1_15", "since_1_15"), GETBOOL)
def test_gpushare_switch_is_read_as_volcano_reads_it(cluster_docs: list[dict[str, Any]], spelling: str,
                                                      before_1_15: bool, since_1_15: bool) -> None:
    conf = ("actions: enqueue\ntiers:\n- plugins:\n  - name: deviceshare\n    arguments:\n"
            f"      deviceshare.GPUNumberEnable: {spelling}\n  - name: predicates\n")
    docs = copy.deepcopy(cluster_docs)
    next(d for d in docs if d["metadata"]["name"] == "volcano-scheduler-configmap")["data"][
        "volcano-scheduler.conf"] = conf
    assert ("ConflictingDeviceShareArguments" in _reasons(_problems({}, docs))) == before_1_15  # v1.13.0
    scheduler = next(d for d in docs
                     if d["kind"] == "Deployment" and d["metadata"]["name"] == "volcano-scheduler")
    scheduler["spec"]["template"]["spec"]["containers"][0]["image"] = VOLCANO_1_15
    assert ("ConflictingDeviceShareArguments" in _reasons(_problems({}, docs))) == since_1_15


def test_predicates_missing_is_an_error(cluster_docs: list[dict[str, Any]]) -> None:
    """Only predicates calls the devices' Allocate: without it vGPU pods bind with no device
    (vgpu_operator.rules.PREDICATES_MISSING; doctor says the same)."""
    docs = copy.deepcopy(cluster_docs)
    next(d for d in docs if d["metadata"]["name"] == "volcano-scheduler-configmap")["data"][
        "volcano-scheduler.conf"] = "actions: allocate\ntiers:\n- plugins:\n  - name: gang\n"
    problems = _problems({}, docs)
    assert [p.reason for p in errors(problems)] == ["PredicatesPluginMissing"]


def test_overlapping_overrides(cluster_docs: list[dict[str, Any]]) -> None:
    # Through a selector the overlap comes from node labels, which others change: a warning (the
    # first override applies), never an error that would stop every write of the policy.
    spec = {"nodeOverrides": [
        {"nodeSelector": {"matchLabels": {"gpu": "on"}}, "deviceSplitCount": 4},
        {"nodeNames": ["test-app-64-46-msxf"], "operatingMode": "mig"},
    ]}
    problems = _problems(spec, cluster_docs)
    assert errors(problems) == []
    found = [p for p in problems if p.reason == "OverlappingNodeSelectors"]
    assert [(p.field, p.severity) for p in found] == [("spec.nodeOverrides[1]", "warning")]
    assert "test-app-64-46-msxf" in found[0].message and "spec.nodeOverrides[0]" in found[0].message
    # Two overrides naming one node: the spec itself says two things, an error.
    named = {"nodeOverrides": [{"nodeNames": ["a", "b"], "deviceSplitCount": 2},
                               {"nodeNames": ["b"], "deviceSplitCount": 3}]}
    found = [p for p in errors(_problems(named, cluster_docs)) if p.reason == "OverlappingNodeOverrides"]
    assert [p.field for p in found] == ["spec.nodeOverrides[1]"] and "'b'" in found[0].message
    disjoint = {"nodeOverrides": [{"nodeNames": ["a"], "deviceSplitCount": 2},
                                  {"nodeNames": ["b"], "deviceSplitCount": 3}]}
    assert "OverlappingNodeOverrides" not in _reasons(_problems(disjoint, cluster_docs))


def test_gpu_memory_factor_against_largest_gpu(cluster_docs: list[dict[str, Any]]) -> None:
    found = errors(_problems({"device": {"gpuMemoryFactor": 40000}}, cluster_docs))
    assert {p.reason for p in found} == {"GPUMemoryFactorTooLarge"}
    assert any("32607" in p.message for p in found)
    # the fixture's 8 x 32 GiB node overflows ListAndWatch at factor 1, not at 8
    assert "ListAndWatchTooLarge" in _reasons(_problems({}, cluster_docs))
    assert "ListAndWatchTooLarge" not in _reasons(_problems({"device": {"gpuMemoryFactor": 8}}, cluster_docs))


def test_target_namespace_the_plugin_reads(cluster_docs: list[dict[str, Any]]) -> None:
    found = errors(_problems({"targets": {"deviceConfig": {"namespace": "gpu"}}}, cluster_docs))
    assert [(p.field, p.reason) for p in found] == [("spec.targets.deviceConfig.namespace",
                                                     "DeviceConfigNamespaceUnread")]
    other = {"targets": {"deviceConfig": {"namespace": "volcano-system"}}}
    assert errors(_problems(other, cluster_docs)) == []


def test_a_kube_system_copy_that_shadows_a_volcano_system_target(cluster_docs: list[dict[str, Any]]) -> None:
    """The upstream plugin reads kube-system first: a leftover copy there that says something else
    than the policy would split the plugin from the scheduler, which reads the target."""
    volcano_system = {"targets": {"deviceConfig": {"namespace": "volcano-system"}}}
    assert "DeviceConfigShadowed" not in _reasons(_problems(volcano_system, cluster_docs)), \
        "the fixture's kube-system copy says what the default policy says: harmless"
    four = {**volcano_system, "device": {"deviceSplitCount": 4}}
    (shadowed,) = errors(_problems(four, cluster_docs))
    assert shadowed.reason == "DeviceConfigShadowed"
    assert shadowed.field == "spec.targets.deviceConfig.namespace"
    assert "kubectl -n kube-system delete configmap volcano-vgpu-device-config" in shadowed.message
    assert "spec.targets.deviceConfig.namespace: kube-system" in shadowed.message
    without_copy = [d for d in cluster_docs if d["metadata"]["name"] != "volcano-vgpu-device-config"]
    assert errors(_problems(four, without_copy)) == []
    assert errors(_problems({**four, "targets": {}}, cluster_docs)) == [], "kube-system is the target itself"
    ours = _with_images(cluster_docs, plugin="ghcr.io/vgpu-operator/vgpu-device-plugin:0.1.0")
    assert "DeviceConfigShadowed" not in _reasons(_problems(four, ours)), "our plugin reads only the target"


def test_node_config_must_be_mounted(cluster_docs: list[dict[str, Any]]) -> None:
    problems = _problems({"targets": {"nodeConfig": {"name": "other"}}}, cluster_docs)
    assert "NodeConfigNotMounted" in _reasons(problems)


def test_a_plugin_daemonset_updated_on_delete_is_a_warning(cluster_docs: list[dict[str, Any]]) -> None:
    assert "DevicePluginOnDelete" not in _reasons(_problems({}, cluster_docs))
    docs = copy.deepcopy(cluster_docs)
    next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["updateStrategy"] = {"type": "OnDelete"}
    (found,) = [p for p in _problems({}, docs) if p.reason == "DevicePluginOnDelete"]
    assert found.severity == "warning" and "RollingUpdate" in found.message
    assert found.object.startswith("DaemonSet ")


def test_every_problem_says_what_to_do(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _with_images(cluster_docs, scheduler="volcanosh/vc-scheduler:v1.16.0")
    spec = {"resources": {"count": "volcano.sh/gpu"}, "device": {"gpuMemoryFactor": 40000},
            "scheduler": {"schedulePolicy": "binpack"},
            "nodeOverrides": [{"nodeNames": ["x"], "operatingMode": "mps", "filterDevices": {"uuid": ["u"]}}]}
    problems = _problems(spec, docs)
    assert len(problems) >= 5
    for p in problems:
        assert p.field.startswith("spec"), p
        assert any(w in p.message for w in ("set ", "Set ", "use ", "Use ", "Remove", "remove", "upgrade",
                                            "Add", "drop", "Narrow", "mount", "check ")), p
    assert problems == sorted(problems, key=lambda p: p.severity != "error")


def test_volcano_before_deviceshare_is_refused(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _with_images(cluster_docs, scheduler="volcanosh/vc-scheduler:v1.8.2")
    found = errors(_problems({}, docs))
    assert [(p.field, p.reason) for p in found] == [("spec.scheduler.volcanoVersion", "VolcanoTooOld")]
    assert "v1.9" in found[0].message


def test_overrides_that_target_nothing_are_flagged(cluster_docs: list[dict[str, Any]]) -> None:
    spec = {"nodeOverrides": [{"nodeSelector": {"matchLabels": {"pool": "none"}}, "deviceSplitCount": 2},
                              {"nodeNames": ["test-app-64-46-msxf", "tpyo-node"], "deviceSplitCount": 3}]}
    problems = _problems(spec, cluster_docs)
    found = {(p.field, p.reason) for p in problems}
    assert ("spec.nodeOverrides[0].nodeSelector", "OverrideMatchesNoNodes") in found
    assert ("spec.nodeOverrides[1].nodeNames", "NodeNotFound") in found
    assert "tpyo-node" in next(p.message for p in problems if p.reason == "NodeNotFound")
    assert not errors(problems)


V1_12 = "projecthami/volcano-vgpu-device-plugin:v1.12.0"
BUILTIN = "ghcr.io/example/vgpu-device-plugin:0.1.0"


def _warning(problems: list[Problem], reason: str) -> Problem:
    (found,) = [p for p in problems if p.reason == reason]
    return found


def test_list_and_watch_limit_follows_the_plugins_ids(cluster_docs: list[dict[str, Any]]) -> None:
    # The fixture node has 8 x 32607 MiB. v1.11 and ours send `<index>-<i>` ids (~20 bytes a
    # device), v1.12 `<UUID>-memory-<i>` (~66 bytes): 4 MiB holds ~210,000 or ~64,000 of them.
    legacy = _warning(_problems({}, cluster_docs), "ListAndWatchTooLarge")
    assert "set gpuMemoryFactor to 2 or more" in legacy.message and "<index>-<i>" in legacy.message
    assert "ListAndWatchTooLarge" not in _reasons(_problems({"device": {"gpuMemoryFactor": 2}}, cluster_docs))
    current = _with_images(cluster_docs, plugin=V1_12)
    found = _warning(_problems({"device": {"gpuMemoryFactor": 2}}, current), "ListAndWatchTooLarge")
    assert "set gpuMemoryFactor to 5 or more" in found.message and "<UUID>-memory-<i>" in found.message
    assert "the kubelet drops the list" in found.message
    assert "ListAndWatchTooLarge" not in _reasons(_problems({"device": {"gpuMemoryFactor": 5}}, current))
    ours = _warning(_problems({}, _with_images(cluster_docs, plugin=BUILTIN)), "ListAndWatchTooLarge")
    assert "advertises only part" in ours.message


def test_v1_12_skips_resource_names_over_63_characters(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _with_images(cluster_docs, plugin=V1_12)
    fits, too_long = "volcano.sh/" + "a" * 52, "volcano.sh/" + "a" * 53
    assert errors(_problems({"resources": {"cores": fits}}, docs)) == []
    found = errors(_problems({"resources": {"cores": too_long}}, docs))
    assert [(p.field, p.reason) for p in found] == [("spec.resources.cores", "ResourceNameTooLong")]
    assert "64 characters" in found[0].message
    # v1.11 registers what its flag says; the scheduler alone reads memoryPercentage
    assert errors(_problems({"resources": {"cores": too_long}}, cluster_docs)) == []
    assert errors(_problems({"resources": {"memoryPercentage": "example.com/percent"}}, docs)) == []


@pytest.mark.parametrize(("plugin", "expected"), [
    (None, {"spec.device.disableCoreLimit", "spec.device.deviceCoreScaling",  # the fixture's v1.11
            "spec.nodeOverrides[0].deviceCoreScaling"}),
    (V1_12, {"spec.device.disableCoreLimit"}),
    (BUILTIN, set()),
])
def test_core_settings_the_plugin_ignores(cluster_docs: list[dict[str, Any]], plugin: str | None,
                                          expected: set[str]) -> None:
    spec = {"device": {"disableCoreLimit": True, "deviceCoreScaling": 2.0},
            "nodeOverrides": [{"nodeNames": ["dev-app-2-150-master-1"], "deviceCoreScaling": 1.5}]}
    fields = {"spec.device.disableCoreLimit", "spec.device.deviceCoreScaling",
              "spec.nodeOverrides[0].deviceCoreScaling"}
    found = [p for p in _problems(spec, _with_images(cluster_docs, plugin=plugin)) if p.field in fields]
    assert {p.field for p in found} == expected
    assert all(p.severity == "warning" and p.reason.startswith("IgnoredBy") for p in found)


def test_flags_v1_12_does_not_define_are_named(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _with_images(cluster_docs, plugin=V1_12)
    workload(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"] = [
        "-v=4", "--node-name", "$(NODE_NAME)", "--debug", "--mig-strategy", "none", "--device-split-count=10"]
    found = [p for p in _problems({}, docs) if p.reason == "UnknownPluginFlagDropped"]
    assert [p.message.split("'")[1] for p in found] == ["-v=4", "--node-name $(NODE_NAME)", "--debug"]
    assert all(p.severity == "warning" and "does not define" in p.message for p in found)
    # legacy and ours keep them: no warning
    assert "UnknownPluginFlagDropped" not in _reasons(_problems({}, cluster_docs))


@pytest.mark.parametrize(("plugin", "expected"), [
    (None, {"IgnoredByDevicePlugin", "MpsNotImplemented"}),  # the fixture's v1.11
    (V1_12, {"IgnoredByDevicePlugin", "MpsNotImplemented"}),
    (BUILTIN, {"IgnoredByDevicePlugin", "MpsNotImplemented", "MigNotImplemented"}),
])
def test_node_modes_and_scaling_no_plugin_applies(cluster_docs: list[dict[str, Any]], plugin: str | None,
                                                  expected: set[str]) -> None:
    spec = {"nodeOverrides": [{"nodeNames": ["dev-app-2-150-master-1"], "deviceMemoryScaling": 2,
                               "operatingMode": "mps"},
                              {"nodeNames": ["test-app-64-46-msxf"], "operatingMode": "mig"}]}
    reasons = {"IgnoredByDevicePlugin", "MpsNotImplemented", "MigNotImplemented"}
    found = [p for p in _problems(spec, _with_images(cluster_docs, plugin=plugin)) if p.reason in reasons]
    assert {p.reason for p in found} == expected
    assert all(p.severity == "warning" and "builtin" not in p.message for p in found)
    modes = "use hami-core" if plugin == BUILTIN else "use hami-core or mig"  # ours refuses MIG
    assert _warning(found, "MpsNotImplemented").message.endswith(modes)


def _plugin_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = workload(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(("plugin", "severity"), [(None, "warning"), (V1_12, "error"), (BUILTIN, "warning")])
def test_a_plugin_run_from_a_shell_script_is_reported(cluster_docs: list[dict[str, Any]], plugin: str | None,
                                                       severity: str) -> None:
    docs = _with_images(cluster_docs, plugin=plugin)
    container = _plugin_container(docs)
    container["command"] = ["/bin/sh", "-c", "exec vgpu-device-plugin -v=4 \"$@\""]
    container["args"] = ["--device-split-count=4"]
    (found,) = [p for p in _problems({}, docs) if p.reason == "PluginFlagsInShellScript"]
    assert found.severity == severity and "'volcano-device-plugin'" in found.message
    assert "its flags in args, not in a shell script" in found.message
    # a wrapper that execs the binary after `--` is not a shell: its flags are edited, no problem
    container["command"] = ["/sbin/tini", "--", "/usr/bin/vgpu-device-plugin"]
    assert "PluginFlagsInShellScript" not in _reasons(_problems({}, docs))


def test_a_v1_12_switch_given_a_separate_value_is_named(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _with_images(cluster_docs, plugin=V1_12)
    _plugin_container(docs)["args"] = ["--fail-on-init-error", "false", "--device-split-count=10"]
    (found,) = [p for p in _problems({}, docs) if p.reason == "UnknownPluginFlagDropped"]
    assert "'--fail-on-init-error false'" in found.message and "ignores every flag after it" in found.message
    assert "--fail-on-init-error=false" in found.message


def test_list_and_watch_uses_the_factor_the_legacy_plugin_divided_by(
        cluster_docs: list[dict[str, Any]]) -> None:
    # The fixture's v1.11 runs without --gpu-memory-factor (so 1) and registers 32607 MiB GPUs;
    # a ConfigMap factor of 2 never reached it, so the register's devmem is MiB, not MiB / 2.
    docs = copy.deepcopy(cluster_docs)
    cm = next(d for d in docs if d["metadata"]["name"] == "volcano-vgpu-device-config")
    cm["data"]["device-config.yaml"] = cm["data"]["device-config.yaml"].replace(
        "gpuMemoryFactor: 1", "gpuMemoryFactor: 2")
    assert "ListAndWatchTooLarge" not in _reasons(_problems({"device": {"gpuMemoryFactor": 2}}, docs))
    # the flag is what v1.11 divided by
    _plugin_container(docs)["args"] = ["--device-split-count=10", "--gpu-memory-factor=2"]
    assert "ListAndWatchTooLarge" in _reasons(_problems({"device": {"gpuMemoryFactor": 2}}, docs))
