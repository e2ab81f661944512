"""Least privilege: what each ServiceAccount may do, followed through its bindings, equals the
documented contract exactly (nothing more, nothing missing), in every install shape."""

from __future__ import annotations

from typing import Any

import pytest

from tests.charts import chart
from tests.charts.conftest import Renders

# (scope, apiGroup, resource, verb, resourceName): scope is a namespace or "*" (cluster-wide);
# resourceName "*" means any object.
Grant = tuple[str, str, str, str, str]

READ = ("get", "list", "watch")
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def grants_of(objs: list[dict[str, Any]], service_account: str) -> set[Grant]:
    """Everything `service_account` (in the release namespace) is granted by the rendered RBAC."""
    roles = {(o["kind"], o["metadata"].get("namespace", "*"), o["metadata"]["name"]): o
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    granted: set[Grant] = set()
    for binding in objs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == service_account
                   and s["namespace"] == chart.NAMESPACE for s in binding["subjects"]):
            continue
        scope = binding["metadata"].get("namespace", "*")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], scope if ref["kind"] == "Role" else "*", ref["name"])]
        for rule in role.get("rules", []):
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or ["*"]:
                            granted.add((scope, group, resource, verb, name))
    return granted


def expand(scope: str, group: str, resources: tuple[str, ...], verbs: tuple[str, ...],
           names: tuple[str, ...] = ("*",)) -> set[Grant]:
    return {(scope, group, r, v, n) for r in resources for v in verbs for n in names}


def operator_contract(*, scheduler_ns: str, targets_ns: str, plugin_ns: str, daemonset: str,
                      ha: bool, manage_crd: bool = True) -> set[Grant]:
    watched = {scheduler_ns, targets_ns, plugin_ns}
    named = ("get", "list", "watch", "patch")  # read by name, followed by name, patched by name
    want = (
        # kopf: list + watch, finalizer and progress marks; the operator: status, a read after a
        # conflicting status write. Never create, update or delete.
        expand("*", "vgpu.io", ("vgpupolicies",), ("get", "list", "watch", "patch"))
        | expand("*", "vgpu.io", ("vgpupolicies/status",), ("patch",))
        | expand("*", "", ("nodes",), ("list", "watch"))
        # its own CRD, read at start and updated with operator.manageCRD; no other CRD, no Namespace
        | expand("*", "apiextensions.k8s.io", ("customresourcedefinitions",),
                 ("get", "patch") if manage_crd else ("get",), ("vgpupolicies.vgpu.io",))
        # device-config where the scheduler reads it, node-config beside the plugin that mounts it;
        # create cannot be named: the chart's admission policy holds it to these two names
        | expand(targets_ns, "", ("configmaps",), ("create",))
        | expand(targets_ns, "", ("configmaps",), named, ("volcano-vgpu-device-config",))
        | expand(plugin_ns, "", ("configmaps",), ("create",))
        | expand(plugin_ns, "", ("configmaps",), named, ("volcano-vgpu-node-config",))
        | expand(scheduler_ns, "", ("configmaps",), named, ("volcano-scheduler-configmap",))
        | expand(scheduler_ns, "apps", ("deployments",), named, ("volcano-scheduler",))
        | expand(plugin_ns, "apps", ("daemonsets",), named, (daemonset,))
        # plugin pods have generated names: found by a list in their namespace, deleted there only
        | expand(plugin_ns, "", ("pods",), ("list", "delete"))
        # `default`: the only namespace the API server takes Events about cluster-scoped objects in
        | expand("default", "", ("events",), ("create",))
    )
    if targets_ns == "volcano-system":
        # an upstream plugin reads kube-system's copy first: read to check none shadows the target
        want |= expand("kube-system", "", ("configmaps",), ("get",), ("volcano-vgpu-device-config",))
    if ha:
        for ns in watched:
            want |= expand(ns, "kopf.dev", ("kopfpeerings",), ("list", "watch"))
            want |= expand(ns, "kopf.dev", ("kopfpeerings",), ("patch",), ("vgpu-operator",))
    return want


PLUGIN_CONTRACT = (
    # its own Node and the pods on it: RBAC cannot say "own", the admission policy does
    expand("*", "", ("nodes",), ("patch",))
    | expand("*", "", ("pods",), ("list", "watch", "patch"))
    | expand("kube-system", "", ("configmaps",), READ, ("volcano-vgpu-device-config",))
    | expand(chart.NAMESPACE, "", ("configmaps",), READ, ("volcano-vgpu-node-config",))
)
OPERATOR_SA, PLUGIN_SA = chart.OPERATOR_SA, chart.PLUGIN_SA
OURS = "vgpu-vgpu-operator-device-plugin"


def test_operator_default_install(renders: Renders) -> None:
    assert grants_of(renders("default"), OPERATOR_SA) == operator_contract(
        scheduler_ns="volcano-system", targets_ns="kube-system", plugin_ns=chart.NAMESPACE, daemonset=OURS,
        ha=False)


def test_operator_with_ha_may_touch_only_its_peering_objects(renders: Renders) -> None:
    assert grants_of(renders("ha"), OPERATOR_SA) == operator_contract(
        scheduler_ns="volcano-system", targets_ns="kube-system", plugin_ns=chart.NAMESPACE, daemonset=OURS,
        ha=True)


def test_operator_adopting_an_existing_plugin(renders: Renders) -> None:
    grants = grants_of(renders("adopt"), OPERATOR_SA)
    assert grants == operator_contract(
        scheduler_ns="volcano-system", targets_ns="kube-system", plugin_ns="kube-system",
        daemonset="volcano-device-plugin", ha=False)
    # Nothing of ours is installed, so nothing is granted on the release namespace.
    assert {g for g in grants if g[0] == chart.NAMESPACE} == set()


def test_one_namespace_playing_every_part_gets_the_union() -> None:
    objs = chart.render({"scheduler": {"namespace": "kube-system"}, "devicePlugin": {"enabled": False}})
    assert grants_of(objs, OPERATOR_SA) == operator_contract(
        scheduler_ns="kube-system", targets_ns="kube-system", plugin_ns="kube-system",
        daemonset="volcano-device-plugin", ha=False)
    assert len([o for o in objs if o["kind"] == "Role" and o["metadata"]["namespace"] == "kube-system"]) == 1


def test_device_config_in_volcano_system_may_read_the_kube_system_copy_that_shadows_it() -> None:
    # Adopting an upstream install whose device-config lives in volcano-system: the plugin reads
    # kube-system's copy first, so the operator must be able to see it (rule device-config-split).
    objs = chart.render({"devicePlugin": {"enabled": False}, "targets": {"namespace": "volcano-system"}})
    assert grants_of(objs, OPERATOR_SA) == operator_contract(
        scheduler_ns="volcano-system", targets_ns="volcano-system", plugin_ns="kube-system",
        daemonset="volcano-device-plugin", ha=False)
    objs = chart.render({"targets": {"namespace": "volcano-system"}})
    assert grants_of(objs, OPERATOR_SA) == operator_contract(
        scheduler_ns="volcano-system", targets_ns="volcano-system", plugin_ns=chart.NAMESPACE,
        daemonset=OURS, ha=False)


def test_operator_without_crd_management_only_reads_its_crd(renders: Renders) -> None:
    assert grants_of(renders("unmanaged-crd"), OPERATOR_SA) == operator_contract(
        scheduler_ns="volcano-system", targets_ns="kube-system", plugin_ns=chart.NAMESPACE, daemonset=OURS,
        ha=False, manage_crd=False)


def test_device_plugin(renders: Renders) -> None:
    assert grants_of(renders("default"), PLUGIN_SA) == PLUGIN_CONTRACT


def test_adopting_installs_no_plugin_rbac(renders: Renders) -> None:
    assert grants_of(renders("adopt"), PLUGIN_SA) == set()


@pytest.mark.parametrize("profile", list(chart.PROFILES))
def test_no_rule_grants_more_than_it_should(renders: Renders, profile: str) -> None:
    for role in renders(profile):
        if role["kind"] not in ("Role", "ClusterRole"):
            continue
        meta = role["metadata"]
        where = f"{profile}: {role['kind']} {meta.get('namespace', '')}/{meta['name']}"
        for rule in role["rules"]:
            fields = [*rule["apiGroups"], *rule["resources"], *rule["verbs"], *rule.get("resourceNames", [])]
            assert "*" not in fields, f"{where}: wildcard in {rule}"
            assert "secrets" not in rule["resources"], f"{where}: secrets in {rule}"
            assert "rbac.authorization.k8s.io" not in rule["apiGroups"], f"{where}: RBAC objects in {rule}"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), f"{where}: {rule}"
            assert "nonResourceURLs" not in rule, f"{where}: {rule}"
            if role["kind"] == "ClusterRole":
                assert "configmaps" not in rule["resources"], f"{where}: cluster-wide configmaps in {rule}"
            writes = WRITE_VERBS & set(rule["verbs"])
            if writes and "resourceNames" not in rule and role["kind"] == "Role":
                # Only what Kubernetes cannot limit by name: creating, deleting generated pods, events.
                assert (rule["resources"], writes) in (
                    (["configmaps"], {"create"}), (["pods"], {"delete"}), (["events"], {"create"}),
                ), f"{where}: unnamed write {rule}"
