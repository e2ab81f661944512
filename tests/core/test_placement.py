"""Where the device plugin's DaemonSet runs (placement.Placement), as the DaemonSet controller
decides it: nodeSelector, required node affinity, taints and tolerations."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu_operator.placement import Placement


def _daemonset(**pod_spec: Any) -> dict[str, Any]:
    return {"spec": {"template": {"spec": pod_spec}}}


def _node(name: str = "n", labels: dict[str, str] | None = None,
          taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []}}


def _affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def _expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def test_no_daemonset_or_no_constraint_means_every_node() -> None:
    assert Placement.of(None).admits(_node())
    assert Placement.of(_daemonset()).admits(_node(labels={"any": "thing"}))


def test_node_selector_needs_every_label() -> None:
    ds = _daemonset(nodeSelector={"gpu": "on", "pool": "vgpu"})
    assert Placement.of(ds).admits(_node(labels={"gpu": "on", "pool": "vgpu", "zone": "a"}))
    assert not Placement.of(ds).admits(_node(labels={"gpu": "on"}))
    assert not Placement.of(ds).admits(_node(labels={"gpu": "off", "pool": "vgpu"}))


@pytest.mark.parametrize(("expression", "labels", "admitted"), [
    (_expr("gpu", "In", "on", "yes"), {"gpu": "yes"}, True),
    (_expr("gpu", "In", "on"), {"gpu": "off"}, False),
    (_expr("gpu", "In", "on"), {}, False),
    (_expr("gpu", "NotIn", "off"), {}, True),  # NotIn also matches a node without the key
    (_expr("gpu", "NotIn", "off"), {"gpu": "off"}, False),
    (_expr("gpu", "Exists"), {"gpu": ""}, True),
    (_expr("gpu", "DoesNotExist"), {"gpu": "on"}, False),
    (_expr("gpus", "Gt", "3"), {"gpus": "8"}, True),
    (_expr("gpus", "Gt", "3"), {"gpus": "2"}, False),
    (_expr("gpus", "Lt", "3"), {"gpus": "many"}, False),  # not an integer: no match
    (_expr("gpus", "Lt", "3"), {}, False),
    (_expr("gpu", "Near", "on"), {"gpu": "on"}, False),  # an operator Kubernetes does not know
])
def test_each_node_affinity_operator(expression: dict[str, Any], labels: dict[str, str],
                                     admitted: bool) -> None:
    ds = _daemonset(affinity=_affinity({"matchExpressions": [expression]}))
    assert Placement.of(ds).admits(_node(labels=labels)) is admitted


def test_terms_are_ored_their_requirements_anded_and_an_empty_term_matches_nothing() -> None:
    ds = _daemonset(affinity=_affinity(
        {"matchExpressions": [_expr("gpu", "In", "on"), _expr("pool", "In", "vgpu")]},
        {"matchFields": [_expr("metadata.name", "In", "special")]}))
    assert Placement.of(ds).admits(_node(labels={"gpu": "on", "pool": "vgpu"}))
    assert not Placement.of(ds).admits(_node(labels={"gpu": "on"}))
    assert Placement.of(ds).admits(_node("special"))
    assert not Placement.of(_daemonset(affinity=_affinity({}))).admits(_node(labels={"gpu": "on"}))


def test_selector_and_affinity_must_both_admit() -> None:
    ds = _daemonset(nodeSelector={"pool": "vgpu"},
                    affinity=_affinity({"matchExpressions": [_expr("gpu", "Exists")]}))
    assert Placement.of(ds).admits(_node(labels={"pool": "vgpu", "gpu": "on"}))
    assert not Placement.of(ds).admits(_node(labels={"pool": "vgpu"}))


def test_an_untolerated_taint_keeps_the_plugin_away() -> None:
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert not Placement.of(_daemonset()).admits(_node(taints=[taint]))
    for toleration in ({"key": "nvidia.com/gpu", "operator": "Exists"},
                       {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present",
                        "effect": "NoSchedule"},
                       {"operator": "Exists"}):
        assert Placement.of(_daemonset(tolerations=[toleration])).admits(_node(taints=[taint])), toleration
    wrong_value = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}
    assert not Placement.of(_daemonset(tolerations=[wrong_value])).admits(_node(taints=[taint]))
    other_effect = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}
    assert not Placement.of(_daemonset(tolerations=[other_effect])).admits(_node(taints=[taint]))


def test_taints_a_daemonset_pod_runs_beside() -> None:
    # PreferNoSchedule does not keep it away, nor do the lifecycle taints the DaemonSet
    # controller tolerates on every DaemonSet pod (a cordoned node keeps its plugin), each for
    # its own effect only; network-unavailable only for a hostNetwork pod.
    taints = [{"key": "x", "effect": "PreferNoSchedule"},
              {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
              {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]
    assert Placement.of(_daemonset()).admits(_node(taints=taints))
    not_ready = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    assert not Placement.of(_daemonset()).admits(_node(taints=[not_ready]))
    no_network = {"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}
    assert not Placement.of(_daemonset()).admits(_node(taints=[no_network]))
    assert Placement.of(_daemonset(hostNetwork=True)).admits(_node(taints=[no_network]))
