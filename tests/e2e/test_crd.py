"""The CRD on a real kube-apiserver: it installs, every schema constraint and CEL rule refuses its
bad policy with the message a user sees from kubectl, the pydantic model agrees with the server,
`kubectl explain` works and every example is accepted."""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import pydantic
import pytest
from vgpu_operator import api, crd

from .cluster import ROOT, Cluster

NAMES = {"count": "example.com/vgpu", "memory": "example.com/vgpu-memory", "cores": "example.com/vgpu-cores"}


def _policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "metadata": {"name": name},
            "spec": spec}


# (spec, what kubectl prints) for every rule: the CEL rules by their messages, the schema by the
# server's own wording.
BAD = [
    ({"resources": {**NAMES, "memory": NAMES["count"]}},
     "count, memory and cores must be three different resource names"),
    ({"resources": {**NAMES, "memoryPercentage": NAMES["cores"]}},
     "memoryPercentage must differ from count, memory and cores"),
    ({"nodeOverrides": [{"nodeNames": ["a"], "nodeSelector": {"matchLabels": {"x": "y"}},
                         "deviceSplitCount": 2}]},
     "set exactly one of nodeSelector or nodeNames"),
    ({"nodeOverrides": [{"nodeNames": ["a"]}]}, "an override must set at least one of"),
    ({"nodeOverrides": [{"nodeSelector": {"matchExpressions": [{"key": "gpu", "operator": "In"}]},
                         "deviceSplitCount": 2}]},
     "In and NotIn need values; Exists and DoesNotExist take none"),
    ({"devicePlugin": {"namespace": "gpu-plugins"}},
     "targets.nodeConfig.namespace must equal devicePlugin.namespace"),
    ({"device": {"deviceSplitCount": 0}}, "spec.device.deviceSplitCount: Invalid value: 0"),
    ({"driftPolicy": "Sometimes"}, 'spec.driftPolicy: Unsupported value: "Sometimes"'),
    ({"device": {"deviceSplitCont": 4}}, 'unknown field "spec.device.deviceSplitCont"'),
    # An empty name matches no node and made the whole rendered config.json unreadable.
    ({"nodeOverrides": [{"nodeNames": [""], "deviceSplitCount": 2}]},
     "spec.nodeOverrides[0].nodeNames[0]: Invalid value"),
]


def test_crd_is_established_with_its_names(crd_server: Cluster) -> None:
    served = crd_server.get("crd", f"{api.PLURAL}.{api.GROUP}")
    assert served is not None
    conditions = {c["type"]: c["status"] for c in served["status"]["conditions"]}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    assert served["status"]["acceptedNames"]["shortNames"] == list(api.SHORT_NAMES)


def test_a_policy_without_spec_gets_the_model_defaults_written_whole(crd_server: Cluster) -> None:
    policy = _policy("empty", {})
    del policy["spec"]
    created = json.loads(crd_server.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                                               stdin=json.dumps(policy)).stdout)
    assert created["spec"] == crd.model_default(api.VGPUPolicySpec())


def test_an_empty_spec_is_filled_field_by_field_as_the_model_fills_it(crd_server: Cluster) -> None:
    created = json.loads(crd_server.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                                               stdin=json.dumps(_policy("empty", {}))).stdout)
    assert api.VGPUPolicySpec.model_validate(created["spec"]) == api.VGPUPolicySpec()


@pytest.mark.parametrize(("spec", "message"), BAD, ids=[m[:40] for _, m in BAD])
def test_each_rule_refuses_its_bad_policy_with_the_users_message(crd_server: Cluster, spec: dict[str, Any],
                                                                   message: str) -> None:
    result = crd_server.kubectl("create", "--dry-run=server", "-f", "-", check=False,
                                   stdin=json.dumps(_policy("bad", spec)))
    assert result.returncode != 0, f"the server accepted {spec}"
    assert message in result.stderr


@pytest.mark.parametrize(("spec", "message"), BAD[:6], ids=[m[:40] for _, m in BAD[:6]])
def test_the_model_refuses_what_the_server_refuses(spec: dict[str, Any], message: str) -> None:
    # vgpuctl and the operator validate with the model: it must say no where the server does.
    with pytest.raises(pydantic.ValidationError, match=message.split(":")[0][:30]):
        api.VGPUPolicy.from_object(_policy("bad", spec))


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_accepted(crd_server: Cluster, example: Any) -> None:
    crd_server.kubectl("create", "--dry-run=server", "-f", str(example))


def test_kubectl_explain_describes_the_fields(crd_server: Cluster) -> None:
    explained = crd_server.kubectl("explain", "vgpupolicy.spec.targets.nodeConfig.namespace").stdout
    assert "must be the DaemonSet's namespace" in explained
    assert "deviceSplitCount" in crd_server.kubectl("explain", "vgpupolicy.spec.device").stdout


def test_the_chart_installs_with_default_values(crd_server: Cluster) -> None:
    # The release's objects (Roles in three namespaces, the default policy, the DaemonSet) are
    # accepted by each supported server; the operator itself runs in test_helm.py.
    crd_server.ensure_namespace("volcano-system")
    namespace = crd_server.namespace("chart")
    try:
        crd_server.helm("install", "vgpu-check", str(ROOT / "charts" / "vgpu-operator"), "-n", namespace)
        policy = crd_server.get("vgpupolicy", "default")
        assert policy is not None and policy["spec"]["targets"]["nodeConfig"]["namespace"] == namespace
    finally:
        crd_server.helm("uninstall", "vgpu-check", "-n", namespace, check=False)
        crd_server.kubectl("delete", "vgpupolicy", "default", "--ignore-not-found", "--wait=false")
        crd_server.kubectl("delete", "namespace", namespace, "--wait=false")


def _with_policy(cluster: Cluster, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(_policy(name, {})))
    return name


def _status_patch(cluster: Cluster, name: str, condition: dict[str, Any],
                  *extra: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("patch", "vgpupolicy", name, "--subresource=status", "--type=merge", *extra,
                           "-p", json.dumps({"status": {"conditions": [condition]}}), check=False)


READY = {"type": "Ready", "status": "False", "reason": "NotReady",
         "message": "NodesReady: NodesNotConverged", "lastTransitionTime": "2025-01-01T00:00:00Z"}


@pytest.mark.parametrize(("drop", "message"), [
    ("reason", "conditions[0].reason: Required value"),
    ("lastTransitionTime", "conditions[0].lastTransitionTime: Required value"),
])
def test_a_condition_without_reason_or_time_is_refused(crd_server: Cluster, drop: str, message: str) -> None:
    # As in metav1.Condition: `-o wide` shows the reason, so no writer may leave it out.
    name = _with_policy(crd_server, "cond")
    try:
        result = _status_patch(crd_server, name, {k: v for k, v in READY.items() if k != drop},
                               "--dry-run=server")
        assert result.returncode != 0, f"the server accepted a condition without {drop}"
        assert message in result.stderr
        empty = _status_patch(crd_server, name, {**READY, "reason": ""}, "--dry-run=server")
        assert empty.returncode != 0 and "conditions[0].reason" in empty.stderr
    finally:
        crd_server.kubectl("delete", "vgpupolicy", name, "--wait=false")


def test_wide_output_shows_why_ready_is_what_it_is(crd_server: Cluster) -> None:
    name = _with_policy(crd_server, "wide")
    try:
        assert _status_patch(crd_server, name, READY).returncode == 0
        plain = crd_server.kubectl("get", "vgpupolicy", name).stdout.splitlines()
        assert "REASON" not in plain[0], "the reason columns are for -o wide only"
        header, row = crd_server.kubectl("get", "vgpupolicy", name, "-o", "wide").stdout.splitlines()
        # Cut the row at the header's column starts: an empty column (NODES here) prints nothing.
        assert header.split()[-2:] == ["REASON", "MESSAGE"]
        reason, message = header.index("REASON"), header.index("MESSAGE")
        assert row[reason:message].strip() == READY["reason"]
        assert row[message:].strip() == READY["message"]
    finally:
        crd_server.kubectl("delete", "vgpupolicy", name, "--wait=false")
