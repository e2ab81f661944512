"""Bad observed input: a Problem naming the object and the fix, nothing rendered for that target,
the other targets unaffected, and no exception."""

from __future__ import annotations

import copy
from typing import Any

import pydantic
import pytest
from vgpu_operator.api import parse_spec
from vgpu_operator.decide import render_all
from vgpu_operator.validate import errors, validate

from tests.core.support import observe, workload


def _set_conf(docs: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    docs = copy.deepcopy(docs)
    conf = next(d for d in docs if d["metadata"]["name"] == "volcano-scheduler-configmap")
    conf["data"]["volcano-scheduler.conf"] = text
    return docs


def _only_failed(docs: list[dict[str, Any]], spec_dict: dict[str, Any] | None = None) -> Any:
    spec = parse_spec(spec_dict or {})
    observed = observe(docs, spec)
    result = render_all(spec, observed)
    failed = [t for t in result.targets if t.error is not None]
    assert len(failed) == 1, [t.ref for t in failed]
    assert failed[0].desired is None and failed[0].patch() == {}
    healthy = [t for t in result.targets if t.error is None]
    assert all(t.desired is not None for t in healthy)
    return failed[0], validate(spec, observed)


@pytest.mark.parametrize(
    ("text", "reason", "hint"),
    [
        ("actions: [enqueue\ntiers: -", "SchedulerConfInvalid", "line"),
        ("actions: \"enqueue, allocate\"\n", "SchedulerConfNoTiers", "tiers"),
        ("- just\n- a list\n", "SchedulerConfNoTiers", "tiers"),
        ("actions: a\ntiers: {plugins: []}\n", "SchedulerConfNoTiers", "tiers"),
    ],
)
def test_unusable_scheduler_conf(cluster_docs: list[dict[str, Any]], text: str, reason: str,
                                 hint: str) -> None:
    failed, problems = _only_failed(_set_conf(cluster_docs, text))
    assert failed.kind == "ConfigMap" and failed.name == "volcano-scheduler-configmap"
    assert failed.error.reason == reason
    assert "ConfigMap volcano-system/volcano-scheduler-configmap" in failed.error.message
    assert hint in failed.error.message
    assert failed.error in problems and failed.error.severity == "error"


def test_conf_key_missing(cluster_docs: list[dict[str, Any]]) -> None:
    failed, _ = _only_failed(cluster_docs, {"scheduler": {"key": "other.conf"}})
    assert failed.error.field == "spec.scheduler.key" and "spec.scheduler.key" in failed.error.message


def test_daemonset_without_the_named_container(cluster_docs: list[dict[str, Any]]) -> None:
    failed, problems = _only_failed(cluster_docs, {"devicePlugin": {"container": "plugin"}})
    assert failed.kind == "DaemonSet"
    assert failed.error.reason == "DevicePluginContainerNotFound"
    assert failed.error.field == "spec.devicePlugin.container"
    assert "volcano-device-plugin, monitor" in failed.error.message
    assert [p.reason for p in errors(problems)] == ["DevicePluginContainerNotFound"]


def test_unknown_plugin_image(cluster_docs: list[dict[str, Any]]) -> None:
    docs = copy.deepcopy(cluster_docs)
    workload(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"] = "reg/plugin:latest"
    failed, problems = _only_failed(docs)
    assert failed.error.reason == "PluginGenerationUnknown"
    assert "spec.devicePlugin.generation" in failed.error.message
    assert [p.reason for p in errors(problems)] == ["PluginGenerationUnknown"]
    # Saying it explicitly fixes it.
    spec = parse_spec({"devicePlugin": {"generation": "current"}})
    assert all(t.error is None for t in render_all(spec, observe(docs, spec)).targets)


@pytest.mark.parametrize("image", ["docker.io/volcanosh/vc-scheduler:latest",
                                   "docker.io/volcanosh/vc-scheduler@sha256:" + "a" * 64,
                                   "volcanosh/vc-scheduler:my-build"])
def test_unknown_volcano_tag(cluster_docs: list[dict[str, Any]], image: str) -> None:
    docs = copy.deepcopy(cluster_docs)
    workload(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"] = image
    spec = parse_spec({})
    problems = validate(spec, observe(docs, spec))
    unknown = [p for p in problems if p.reason == "VolcanoVersionUnknown"]
    assert len(unknown) == 1 and unknown[0].severity == "warning"  # default names: harmless
    assert "spec.scheduler.volcanoVersion" in unknown[0].message
    assert unknown[0].object == "Deployment volcano-system/volcano-scheduler"
    custom = parse_spec({"resources": {"count": "volcano.sh/gpu"}})
    problems = validate(custom, observe(docs, custom))
    assert [p.severity for p in problems if p.reason == "VolcanoVersionUnknown"] == ["error"]
    assert all(t.error is None for t in render_all(custom, observe(docs, custom)).targets)


def test_unreadable_device_config_is_not_overwritten(cluster_docs: list[dict[str, Any]]) -> None:
    docs = copy.deepcopy(cluster_docs)
    cm = next(d for d in docs if d["metadata"]["name"] == "volcano-vgpu-device-config")
    cm["data"]["device-config.yaml"] = "nvidia: [broken\nvnpus: precious"
    failed, problems = _only_failed(docs)
    assert failed.error.reason == "DeviceConfigUnreadable"
    assert "ConfigMap kube-system/volcano-vgpu-device-config" in failed.error.message
    assert failed.error in problems


def test_a_foreign_setting_of_the_wrong_type_is_named_not_rewritten_for_ever(
        cluster_docs: list[dict[str, Any]]) -> None:
    # passDeviceSpecs is not the operator's: kept as written, it keeps the whole file unreadable
    # to its readers. Before, the operator wrote its own settings beside it at every resync
    # (the file never meant what it asked) and took each write for a hand edit it repaired.
    docs = copy.deepcopy(cluster_docs)
    cm = next(d for d in docs if d["metadata"]["name"] == "volcano-vgpu-device-config")
    text = cm["data"]["device-config.yaml"]
    cm["data"]["device-config.yaml"] = text.replace("nvidia:\n", 'nvidia:\n  passDeviceSpecs: "true"\n', 1)
    failed, problems = _only_failed(docs)
    assert failed.error.reason == "DeviceConfigUnreadable" and failed.error in problems
    assert "nvidia.passDeviceSpecs" in failed.error.message and "fix or remove it" in failed.error.message
    assert failed.desired is None  # nothing written


def test_missing_objects(cluster_docs: list[dict[str, Any]]) -> None:
    docs = [d for d in cluster_docs if d["kind"] != "Deployment"]
    failed, problems = _only_failed(docs)
    assert failed.error.reason == "SchedulerDeploymentNotFound" and failed.error.severity == "warning"
    assert failed.error in problems and not errors(problems)
    docs = [d for d in cluster_docs if d["kind"] != "DaemonSet"]
    failed, _ = _only_failed(docs)
    assert failed.error.reason == "DevicePluginNotFound"


def test_malformed_node_annotation_does_not_crash(cluster_docs: list[dict[str, Any]]) -> None:
    docs = copy.deepcopy(cluster_docs)
    node = next(d for d in docs if d["kind"] == "Node")
    node["metadata"]["annotations"]["volcano.sh/node-vgpu-register"] = "GPU-1,10,oops"
    spec = parse_spec({})
    problems = validate(spec, observe(docs, spec))
    assert not errors(problems)


def test_a_policy_read_from_the_api_leaves_out_fields_a_newer_crd_added() -> None:
    # A manifest with an unknown field is an error (a typo must not pass); the API server's copy
    # of a policy under a newer CRD carries that CRD's new fields, which this code cannot use.
    from vgpu_operator.api import VGPUPolicy

    body = {"apiVersion": "vgpu.io/v1alpha1", "kind": "VGPUPolicy", "metadata": {"name": "p"},
            "spec": {"device": {"deviceSplitCount": 4, "futureKnob": 1, "knownMigGeometries": [
                         {"models": ["A30"], "futureModelField": 1, "allowedGeometries": [
                             {"group": "g1", "geometries": [
                                 {"name": "1g.6gb", "memory": 6144, "count": 4, "futureSize": 2}]}]}]},
                     "nodeOverrides": [{"nodeNames": ["n1"], "deviceSplitCount": 2, "futureTag": "x"}]},
            "status": {"observedGeneration": 3, "conditions": [
                {"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                 "lastTransitionTime": "2026-12-02T00:00:00Z", "futureField": 1}]}}
    with pytest.raises(pydantic.ValidationError):
        VGPUPolicy.from_object(body)
    policy, unknown = VGPUPolicy.from_api(body)
    assert unknown == ["spec.device.futureKnob", "spec.device.knownMigGeometries[0].futureModelField",
                       "spec.device.knownMigGeometries[0].allowedGeometries[0].geometries[0].futureSize",
                       "spec.nodeOverrides[0].futureTag", "status.conditions[0].futureField"]
    assert policy.spec.device.device_split_count == 4
    assert policy.spec.node_overrides[0].device_split_count == 2
    assert policy.status is not None and policy.status.observed_generation == 3
    # Values are still validated: a known field with a bad value is an error.
    body["spec"]["device"]["deviceSplitCount"] = -1
    with pytest.raises(pydantic.ValidationError):
        VGPUPolicy.from_api(body)
