"""helm lint and helm template of every profile; every rendered object valid for Kubernetes 1.30
and 1.33 (kubernetes-validate, strict), the custom resources against their CRDs."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.charts import chart
from tests.charts.conftest import Renders

KUBERNETES_VERSIONS = ["1.30", "1.34"]  # the oldest supported and the e2e suite's; both ship schemas


def test_lint_strict() -> None:
    out = chart.run_helm("lint", "--strict", str(chart.CHART))
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("profile", ["default", "full"])
def test_lint_strict_with_values(profile: str) -> None:
    chart.run_helm("lint", "--strict", str(chart.CHART), values=chart.PROFILES[profile])


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("profile", list(chart.PROFILES))
def test_objects_are_valid_kubernetes(renders: Renders, profile: str, version: str) -> None:
    crds = {(c["spec"]["group"], c["spec"]["names"]["kind"]): c
            for c in chart.of_kind(renders(profile), "CustomResourceDefinition")}
    checked = 0
    for obj in renders(profile):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        group = obj["apiVersion"].rpartition("/")[0]
        if obj["kind"] in chart.UNCHECKED_KINDS:
            continue
        if (group, obj["kind"]) in crds:
            jsonschema.validate(obj, chart.instance_schema(crds[group, obj["kind"]]))
        else:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                pytest.fail(f"{profile}: {where} is not valid for Kubernetes {version}: {err.message}")
        checked += 1
    assert checked >= 15


def test_monitoring_kinds_are_not_schema_checked(renders: Renders) -> None:
    """ServiceMonitor and PrometheusRule: no schema in kubernetes-validate and the Prometheus
    Operator CRDs are not vendored; their references are checked in test_monitoring.py."""
    kinds = {o["kind"] for o in renders("full")}
    assert kinds >= chart.UNCHECKED_KINDS


def test_default_profile_installs_the_whole_system(default_objects: list[dict[str, Any]]) -> None:
    kinds = sorted({o["kind"] for o in default_objects})
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "CustomResourceDefinition",
                     "DaemonSet", "Deployment", "NetworkPolicy", "ResourceQuota", "Role", "RoleBinding",
                     "Service", "ServiceAccount", "VGPUPolicy", "ValidatingAdmissionPolicy",
                     "ValidatingAdmissionPolicyBinding"]


def test_the_plugins_critical_priority_class_gets_its_quota_outside_kube_system() -> None:
    # GKE (and any cluster limiting system-*-critical to namespaces with such a quota) refused the
    # plugin pods in the release namespace: the DaemonSet made none.
    (quota,) = chart.of_kind(chart.render(), "ResourceQuota")
    assert quota["metadata"]["namespace"] == chart.NAMESPACE
    assert quota["spec"]["scopeSelector"]["matchExpressions"] == [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]}]
    in_kube_system = chart.run_helm("template", chart.RELEASE, str(chart.CHART), "--namespace", "kube-system")
    assert not chart.of_kind(chart.objects(in_kube_system), "ResourceQuota")
    for values in ({"priorityClassName": "gpu-high"}, {"criticalPriorityQuota": False}):
        assert not chart.of_kind(chart.render({"devicePlugin": values}), "ResourceQuota")


def test_common_labels_never_replace_the_charts_own(default_objects: list[dict[str, Any]]) -> None:
    # A commonLabels key the chart sets itself rendered twice; read last-wins, the pod labels no
    # longer matched their selectors.
    objects = chart.render({"commonLabels": {"app.kubernetes.io/name": "foo", "team": "gpu"}})
    for kind in ("Deployment", "DaemonSet"):
        for obj in chart.of_kind(objects, kind):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert labels["team"] == "gpu" and labels["app.kubernetes.io/name"] == "vgpu-operator"
            assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_every_object_has_the_standard_labels(full_objects: list[dict[str, Any]]) -> None:
    for obj in full_objects:
        if obj["kind"] == "CustomResourceDefinition":
            continue  # crds/ is not templated
        labels = obj["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                    "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "helm.sh/chart"):
            assert key in labels, f"{obj['kind']}/{obj['metadata']['name']} lacks {key}"
        assert labels["team"] == "gpu-platform", "commonLabels must reach every object"


def test_namespaced_objects_name_their_namespace(full_objects: list[dict[str, Any]]) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "VGPUPolicy",
                      "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for obj in full_objects:
        has_ns = "namespace" in obj["metadata"]
        assert has_ns != (obj["kind"] in cluster_scoped), f"{obj['kind']}/{obj['metadata']['name']}"


def test_names_are_unique(full_objects: list[dict[str, Any]]) -> None:
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in full_objects]
    assert len(keys) == len(set(keys))


def test_the_validator_catches_a_misplaced_field(default_objects: list[dict[str, Any]]) -> None:
    # Guards the test above against a vacuous pass: strict mode refuses an unknown field.
    daemonset = chart.one(default_objects, "DaemonSet")
    broken = {**daemonset, "spec": {**daemonset["spec"], "nodeSelector": {"a": "b"}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.33", strict=True)


def notes(values: dict[str, Any]) -> str:
    out = chart.run_helm("install", chart.RELEASE, str(chart.CHART), "--namespace", chart.NAMESPACE,
                         "--dry-run=client", values=values)
    return out.split("\nNOTES:\n", 1)[1]


def test_notes_tell_the_admin_what_to_run_next() -> None:
    text = notes({})
    assert "kubectl label node <gpu-node> volcano.sh/vgpu.enabled=true" in text
    assert "kubectl get vgpupolicy default -w" in text
    assert "kubectl -n vgpu-system rollout status deployment/vgpu-vgpu-operator" in text


def test_notes_without_a_policy_give_the_locations_to_use(default_objects: list[dict[str, Any]]) -> None:
    text = notes({"policy": {"create": False}})
    given = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(": ")
        if key in ("scheduler", "targets", "devicePlugin"):
            given[key] = json.loads(value)
    spec = chart.one(default_objects, "VGPUPolicy")["spec"]
    assert given == {k: spec[k] for k in ("scheduler", "targets", "devicePlugin")}
