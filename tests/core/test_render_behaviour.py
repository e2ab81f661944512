"""Renderers as a user sees them: what gets written, what restarts, what is left alone."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from vgpu_operator.api import parse_spec
from vgpu_operator.render import RenderResult, render_all
from vgpu_operator.render import device_plugin as dp
from vgpu_operator.render import scheduler_deployment as sd
from vgpu_operator.render.inputs import template_annotations

from tests.core.support import apply, observe, workload


def _render(spec_dict: dict[str, Any], docs: list[dict[str, Any]]) -> RenderResult:
    spec = parse_spec(spec_dict)
    return render_all(spec, observe(docs, spec))


def _converged(spec_dict: dict[str, Any], docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return apply(docs, _render(spec_dict, docs))


def test_second_render_writes_nothing(cluster_docs: list[dict[str, Any]]) -> None:
    spec = {"nodeOverrides": [{"nodeSelector": {"matchLabels": {"gpu": "on"}}, "deviceSplitCount": 4}]}
    docs = _converged(spec, cluster_docs)
    again = _render(spec, docs)
    assert [t.ref for t in again.changed] == []
    assert all(t.patch() == {} for t in again.targets)


def test_rendering_is_deterministic(cluster_docs: list[dict[str, Any]]) -> None:
    one, two = _render({}, cluster_docs), _render({}, copy.deepcopy(cluster_docs))
    assert [(t.text, t.desired, t.content_hash) for t in one.targets] == \
        [(t.text, t.desired, t.content_hash) for t in two.targets]


def test_adopting_a_matching_cluster_restarts_nothing(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _converged({}, cluster_docs)
    # Someone removes our annotations (e.g. re-applies their manifests): inputs still match.
    for kind in ("Deployment", "DaemonSet"):
        workload(docs, kind)["spec"]["template"]["metadata"].pop("annotations", None)
    result = _render({}, docs)
    assert result.target("Deployment", "volcano-scheduler").changed is False
    assert result.target("Deployment", "volcano-scheduler").restart_hash is None
    assert result.target("DaemonSet", "volcano-device-plugin").changed is False


def _hashes(spec: dict[str, Any], docs: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    result = _render(spec, docs)
    return (result.target("Deployment", "volcano-scheduler").restart_hash,
            result.target("DaemonSet", "volcano-device-plugin").restart_hash)


def test_restart_matrix(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _converged({}, cluster_docs)
    base_sched, base_plugin = _hashes({}, docs)
    assert base_sched and base_plugin
    # Resource names: scheduler and (legacy) plugin both read them at start.
    sched, plugin = _hashes({"resources": {"count": "volcano.sh/gpu"}}, docs)
    assert sched != base_sched and plugin != base_plugin
    # Split count: plugin-only; the scheduler learns it from the node annotation.
    sched, plugin = _hashes({"device": {"deviceSplitCount": 4}}, docs)
    assert sched == base_sched and plugin != base_plugin
    # Hot-reloaded deviceshare arguments restart nothing.
    sched, plugin = _hashes({"scheduler": {"schedulePolicy": "binpack", "scheduleWeight": 10}}, docs)
    assert (sched, plugin) == (base_sched, base_plugin)
    # Node overrides: only the node-config entries change (per-node pod recreation).
    result = _render({"nodeOverrides": [{"nodeNames": ["test-app-64-46-msxf"], "deviceSplitCount": 4}]}, docs)
    assert (result.target("Deployment", "volcano-scheduler").restart_hash,
            result.target("DaemonSet", "volcano-device-plugin").restart_hash) == (base_sched, base_plugin)
    assert result.target("ConfigMap", "volcano-vgpu-node-config").changed_nodes == ["test-app-64-46-msxf"]


def test_builtin_plugin_is_not_restarted_for_device_config(cluster_docs: list[dict[str, Any]]) -> None:
    docs = copy.deepcopy(cluster_docs)
    plugin = workload(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    plugin["image"] = "x/vgpu-device-plugin:1"
    docs = _converged({}, docs)
    _, base = _hashes({}, docs)
    _, after = _hashes({"resources": {"count": "volcano.sh/gpu"}, "device": {"deviceSplitCount": 3}}, docs)
    assert base == after


def test_daemonset_edit_keeps_everything_else(cluster_docs: list[dict[str, Any]]) -> None:
    live = workload(cluster_docs, "DaemonSet")
    desired = _render({}, cluster_docs).target("DaemonSet", "volcano-device-plugin").desired
    assert desired is not None
    live_c, want_c = live["spec"]["template"]["spec"], desired["spec"]["template"]["spec"]
    assert want_c["volumes"] == live_c["volumes"]
    assert want_c["containers"][1] == live_c["containers"][1]
    for key in ("env", "volumeMounts", "securityContext", "lifecycle", "image"):
        assert want_c["containers"][0][key] == live_c["containers"][0][key]
    annotations = template_annotations(desired)
    assert annotations["scheduler.alpha.kubernetes.io/critical-pod"] == ""
    assert set(annotations) == {"scheduler.alpha.kubernetes.io/critical-pod", dp.ANNOTATION}
    assert want_c["affinity"] == live_c["affinity"]


def test_patches_are_minimal_and_guarded(cluster_docs: list[dict[str, Any]]) -> None:
    docs = copy.deepcopy(cluster_docs)
    for doc in docs:
        doc["metadata"]["resourceVersion"] = "42"
    result = _render({"device": {"deviceSplitCount": 4}}, docs)
    cm = result.target("ConfigMap", "volcano-vgpu-device-config").patch()
    assert cm == {"metadata": {"resourceVersion": "42"},
                  "data": {"device-config.yaml": result.targets[0].text}}
    deploy = result.target("Deployment", "volcano-scheduler").patch()
    assert deploy == {"metadata": {"resourceVersion": "42"}, "spec": {"template": {"metadata": {
        "annotations": {sd.ANNOTATION: result.target("Deployment", "volcano-scheduler").restart_hash}}}}}
    ds = result.target("DaemonSet", "volcano-device-plugin").patch()
    assert [c["name"] for c in ds["spec"]["template"]["spec"]["containers"]] == \
        ["volcano-device-plugin", "monitor"]


def test_missing_configmaps_are_created(cluster_docs: list[dict[str, Any]]) -> None:
    docs = [d for d in cluster_docs
            if d["kind"] != "ConfigMap" or d["metadata"]["namespace"] != "kube-system"]
    result = _render({}, docs)
    created = result.target("ConfigMap", "volcano-vgpu-device-config")
    assert created.live is None and created.changed
    body = created.patch()
    assert body["kind"] == "ConfigMap" and body["metadata"]["namespace"] == "kube-system"
    assert body["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "vgpu-operator"}
    assert "resourceCountName: volcano.sh/vgpu-number" in body["data"]["device-config.yaml"]


def test_foreign_configmap_content_survives(cluster_docs: list[dict[str, Any]]) -> None:
    docs = copy.deepcopy(cluster_docs)
    cm = next(d for d in docs if d["metadata"]["name"] == "volcano-vgpu-device-config")
    cm["data"]["device-config.yaml"] += "\n  passDeviceSpecs: true\nvnpus:\n  hamiVnpuCore: true\n"
    cm["data"]["notes.txt"] = "keep me"
    cm["metadata"]["annotations"] = {"team": "ml"}
    desired = _render({"device": {"deviceSplitCount": 4}}, docs).targets[0].desired
    assert desired is not None
    doc = yaml.safe_load(desired["data"]["device-config.yaml"])
    assert doc["vnpus"] == {"hamiVnpuCore": True}
    assert doc["nvidia"]["passDeviceSpecs"] is True and doc["nvidia"]["deviceSplitCount"] == 4
    assert desired["data"]["notes.txt"] == "keep me"
    assert desired["metadata"]["annotations"] == {"team": "ml"}
    assert desired["metadata"]["labels"] == cm["metadata"]["labels"]


def test_equivalent_live_text_is_not_rewritten(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _converged({}, cluster_docs)
    conf = next(d for d in docs if d["metadata"]["name"] == "volcano-scheduler-configmap")
    # Same meaning, different formatting (flow style, quotes): nothing to write.
    data = yaml.safe_load(conf["data"]["volcano-scheduler.conf"])
    conf["data"]["volcano-scheduler.conf"] = yaml.safe_dump(data, default_flow_style=True)
    target = _render({}, docs).target("ConfigMap", "volcano-scheduler-configmap")
    assert not target.changed and target.text == conf["data"]["volcano-scheduler.conf"]


def test_selector_expansion_follows_node_labels(cluster_docs: list[dict[str, Any]]) -> None:
    spec = {"nodeOverrides": [{"nodeSelector": {"matchExpressions": [
        {"key": "pool", "operator": "In", "values": ["inference"]}]}, "deviceSplitCount": 2}]}
    docs = _converged(spec, cluster_docs)
    assert _render(spec, docs).target("ConfigMap", "volcano-vgpu-node-config").changed is False
    node = next(d for d in docs if d["kind"] == "Node")
    node["metadata"]["labels"]["pool"] = "inference"
    target = _render(spec, docs).target("ConfigMap", "volcano-vgpu-node-config")
    assert target.changed_nodes == [node["metadata"]["name"]]
    assert f'"name": "{node["metadata"]["name"]}"' in (target.text or "")


def test_existing_deviceshare_arguments_updated_in_place(seed001_docs: list[dict[str, Any]]) -> None:
    text = _render({"scheduler": {"schedulePolicy": "spread", "scheduleWeight": 5}},
                   seed001_docs).target("ConfigMap", "volcano-scheduler-configmap").text
    conf = yaml.safe_load(text or "")
    names = [p["name"] for p in conf["tiers"][1]["plugins"]]
    assert names == ["drf", "deviceshare", "predicates", "capacity-card", "nodeorder", "binpack"]
    args = conf["tiers"][1]["plugins"][1]["arguments"]
    assert next(iter(args)) == "deviceshare.VGPUEnable"  # kept its position
    assert args["deviceshare.ScheduleWeight"] == 5 and args["deviceshare.SchedulePolicy"] == "spread"
    assert args["deviceshare.KnownGeometriesCMNamespace"] == "kube-system"
