"""What RBAC cannot name, held by the chart's ValidatingAdmissionPolicies, and the metrics ports
behind NetworkPolicies: each policy names exactly what the code writes and the chart renders.
tests/e2e/test_rights.py shows each of them refusing and allowing on a real API server."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from vgpu_deviceplugin import allocate
from vgpu_formats import annotations as ann

from tests.charts import chart
from tests.charts.conftest import Renders
from tests.charts.test_workloads import container, pod_spec

Obj = dict[str, Any]
PLUGIN_SA, OPERATOR_SA = chart.PLUGIN_SA, chart.OPERATOR_SA


def policies(objs: list[Obj]) -> dict[str, Obj]:
    return chart.by_name(objs, "ValidatingAdmissionPolicy")


def variable(policy: Obj, name: str) -> str:
    return str(next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == name))


def annotation_keys(*patches: dict[str, Any]) -> set[str]:
    return {key for patch in patches for key in patch["metadata"]["annotations"]}


def test_each_policy_is_bound_and_denies(default_objects: list[Obj]) -> None:
    bound = chart.of_kind(default_objects, "ValidatingAdmissionPolicyBinding")
    bindings = {b["metadata"]["name"]: b for b in bound}
    found = policies(default_objects)
    assert set(found) == set(bindings) == {f"{PLUGIN_SA}-pods", f"{PLUGIN_SA}-node", OPERATOR_SA}
    for name, policy in found.items():
        assert bindings[name]["spec"] == {"policyName": name, "validationActions": ["Deny"]}
        assert policy["spec"]["failurePolicy"] == "Fail"


def test_each_policy_applies_to_its_service_account_only(default_objects: list[Obj]) -> None:
    accounts = {sa["metadata"]["name"] for sa in chart.of_kind(default_objects, "ServiceAccount")}
    for name, policy in policies(default_objects).items():
        (condition,) = policy["spec"]["matchConditions"]
        user = re.fullmatch(r'request\.userInfo\.username == "system:serviceaccount:([^:]+):([^"]+)"',
                            condition["expression"])
        assert user is not None, condition
        account = PLUGIN_SA if name.startswith(PLUGIN_SA) else OPERATOR_SA
        assert user.groups() == (chart.NAMESPACE, account) and account in accounts


def test_the_plugin_may_change_exactly_the_annotations_it_writes(default_objects: list[Obj]) -> None:
    found = policies(default_objects)
    pods, node = found[f"{PLUGIN_SA}-pods"], found[f"{PLUGIN_SA}-node"]
    assert pods["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["pods"]
    assert node["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes"]
    # Allocate consumes devices-to-allocate and ends with success or failed (allocate.py).
    written = annotation_keys(allocate.success_patch(), allocate.failed_patch()) | {ann.DEVICES_TO_ALLOCATE}
    assert set(json.loads(variable(pods, "writable"))) == written
    # Registration and handshake (node_register.py), the node lock released (allocate.py).
    written = annotation_keys(allocate.release_lock_patch()) | {ann.NODE_REGISTER, ann.NODE_HANDSHAKE}
    assert set(json.loads(variable(node, "writable"))) == written
    for policy in (pods, node):  # only UPDATE: RBAC grants the plugin no create or delete
        assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["UPDATE"]
        assert "authentication.kubernetes.io/node-name" in variable(policy, "node")


@pytest.mark.parametrize("profile", ["default", "adopt"])
def test_the_operator_may_create_exactly_the_configmaps_it_renders(renders: Renders, profile: str) -> None:
    objs = renders(profile)
    spec = chart.one(objs, "VGPUPolicy")["spec"]
    targets = {f"{spec['targets'][t]['namespace']}/{spec['targets'][t]['name']}"
               for t in ("deviceConfig", "nodeConfig")}
    operator = policies(objs)[OPERATOR_SA]
    create, delete = (v["expression"] for v in operator["spec"]["validations"])
    listed = re.search(r"in (\[[^\]]*\])", create)
    assert listed is not None and set(json.loads(listed.group(1))) == targets
    # Pods it deletes: those of the plugin DaemonSet the policy names, ours or the adopted one.
    assert f'o.name == "{spec["devicePlugin"]["daemonSet"]}"' in delete
    rules = operator["spec"]["matchConstraints"]["resourceRules"]
    assert [(r["resources"], r["operations"]) for r in rules] == [(["configmaps"], ["CREATE"]),
                                                                  (["pods"], ["DELETE"])]


def test_adopting_installs_no_plugin_policy(renders: Renders) -> None:
    assert set(policies(renders("adopt"))) == {OPERATOR_SA}


def test_the_policies_can_be_left_out(renders: Renders) -> None:
    objs = renders("no-admission-policy")
    assert not chart.of_kind(objs, "ValidatingAdmissionPolicy")
    assert not chart.of_kind(objs, "ValidatingAdmissionPolicyBinding")


# ----- metrics behind NetworkPolicies -----

def metrics_port(objs: list[Obj], kind: str, name: str) -> tuple[dict[str, str], int]:
    ports = container(pod_spec(objs, kind), name)["ports"]
    labels = chart.one(objs, kind)["spec"]["template"]["metadata"]["labels"]
    return labels, next(p["containerPort"] for p in ports if p["name"] == "metrics")


@pytest.mark.parametrize("profile", ["default", "full"])
def test_only_the_named_peers_reach_the_metrics_ports(renders: Renders, profile: str) -> None:
    objs = renders(profile)
    found = chart.by_name(objs, "NetworkPolicy")
    assert set(found) == {f"{OPERATOR_SA}-metrics", f"{PLUGIN_SA}-metrics"}
    values = chart.PROFILES[profile].get("metrics", {}).get("networkPolicy", {})
    sources = values.get("from", [{"namespaceSelector": {}, "podSelector": {
        "matchLabels": {"app.kubernetes.io/name": "prometheus"}}}])
    for name, (kind, name_in_pod) in {f"{OPERATOR_SA}-metrics": ("Deployment", "operator"),
                                    f"{PLUGIN_SA}-metrics": ("DaemonSet", "monitor")}.items():
        labels, port = metrics_port(objs, kind, name_in_pod)
        spec = found[name]["spec"]
        assert spec["podSelector"]["matchLabels"].items() <= labels.items(), name
        assert spec["policyTypes"] == ["Ingress"]
        assert spec["ingress"] == [{"from": sources, "ports": [{"port": port, "protocol": "TCP"}]}]


def test_network_policies_follow_what_runs(renders: Renders) -> None:
    assert set(chart.by_name(renders("no-monitor"), "NetworkPolicy")) == {f"{OPERATOR_SA}-metrics"}
    assert set(chart.by_name(renders("adopt"), "NetworkPolicy")) == {f"{OPERATOR_SA}-metrics"}
    assert chart.by_name(renders("no-network-policy"), "NetworkPolicy") == {}
