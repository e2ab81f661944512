"""Renderers as a user sees them: what gets written, what restarts, what is left alone."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from vgpu_operator.api import VGPUPolicy, parse_spec
from vgpu_operator.decide import render_all
from vgpu_operator.registry import RenderResult
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


def _restarts(spec: dict[str, Any], docs: list[dict[str, Any]]) -> set[str]:
    """The workloads whose pods the render would roll (their restart annotation changes)."""
    result = _render(spec, docs)
    rolled = set()
    for kind, name, annotation in (("Deployment", "volcano-scheduler", sd.ANNOTATION),
                                   ("DaemonSet", "volcano-device-plugin", dp.ANNOTATION)):
        target = result.target(kind, name)
        assert target.live is not None
        if target.restart_hash != template_annotations(target.live).get(annotation):
            rolled.add(name)
    return rolled


def test_restart_matrix(cluster_docs: list[dict[str, Any]]) -> None:
    docs = _converged({}, cluster_docs)
    # The fixture cluster runs vGPU-less Volcano (no deviceshare) and a plugin already on the
    # default settings: enabling vGPU restarts only the scheduler.
    assert _restarts({}, cluster_docs) == {"volcano-scheduler"}
    assert _restarts({}, docs) == set()
    # Resource names: scheduler and (legacy) plugin both read them at start.
    assert _restarts({"resources": {"count": "volcano.sh/gpu"}}, docs) == {
        "volcano-scheduler", "volcano-device-plugin"}
    # Split count: plugin-only; the scheduler learns it from the node annotation.
    assert _restarts({"device": {"deviceSplitCount": 4}}, docs) == {"volcano-device-plugin"}
    # Hot-reloaded deviceshare arguments restart nothing.
    assert _restarts({"scheduler": {"schedulePolicy": "binpack", "scheduleWeight": 10}}, docs) == set()
    # Node overrides: only the node-config entries change (per-node pod recreation), and only
    # where the plugin acts on what changed: the fixture's legacy plugin (v1.11) takes its split
    # count from its flag alone, so a per-node split restarts no pod and sets nothing its node
    # reports; a current plugin (v1.12) reads it.
    spec = {"nodeOverrides": [{"nodeNames": ["test-app-64-46-msxf"], "deviceSplitCount": 4}]}
    assert _restarts(spec, docs) == set()
    result = _render(spec, docs)
    assert result.target("ConfigMap", "volcano-vgpu-node-config").changed_nodes == []
    assert result.target("ConfigMap", "volcano-vgpu-node-config").node_splits == {}
    mig = {"nodeOverrides": [{"nodeNames": ["test-app-64-46-msxf"], "operatingMode": "mig"}]}
    assert _render(mig, docs).target("ConfigMap", "volcano-vgpu-node-config").changed_nodes == [
        "test-app-64-46-msxf"]
    current = {**spec, "devicePlugin": {"generation": "current"}}
    result = _render(current, docs)
    assert result.target("ConfigMap", "volcano-vgpu-node-config").changed_nodes == ["test-app-64-46-msxf"]
    # What status compares that node's registration with.
    assert result.target("ConfigMap", "volcano-vgpu-node-config").node_splits == {"test-app-64-46-msxf": 4}
    # Once rolled, the annotation is kept up to date: a second change rolls again.
    split4 = _converged({"device": {"deviceSplitCount": 4}}, docs)
    assert _restarts({"device": {"deviceSplitCount": 4}}, split4) == set()
    assert _restarts({"device": {"deviceSplitCount": 5}}, split4) == {"volcano-device-plugin"}


def test_builtin_plugin_is_not_restarted_for_device_config(cluster_docs: list[dict[str, Any]]) -> None:
    docs = copy.deepcopy(cluster_docs)
    plugin = workload(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    plugin["image"] = "x/vgpu-device-plugin:1"
    docs = _converged({}, docs)
    _, base = _hashes({}, docs)
    _, after = _hashes({"resources": {"count": "volcano.sh/gpu"}, "device": {"deviceSplitCount": 3}}, docs)
    assert base == after


def test_builtin_plugin_reads_the_policys_targets(cluster_docs: list[dict[str, Any]]) -> None:
    """Our plugin is told where the targets are, so it reads what the scheduler reads; a flag
    that repeats what it would read anyway is not added (adopting a matching plugin rolls nothing)."""
    docs = copy.deepcopy(cluster_docs)
    plugin = workload(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    plugin["image"], plugin["args"] = "x/vgpu-device-plugin:1", ["--mock-gpus=8xT4"]

    def args(spec: dict[str, Any]) -> list[str]:
        target = _render(spec, docs).target("DaemonSet", "volcano-device-plugin")
        assert target.desired is not None
        return list(target.desired["spec"]["template"]["spec"]["containers"][0]["args"])

    assert args({}) == ["--mock-gpus=8xT4"], "kube-system is where it looks first anyway"
    moved = {"targets": {"deviceConfig": {"namespace": "volcano-system"}}}
    # Without flags it would read kube-system's device-config, and node-config beside it.
    assert args(moved) == ["--mock-gpus=8xT4", "--device-config-namespace=volcano-system",
                           "--node-config-namespace=kube-system"]
    assert "volcano-device-plugin" in _restarts(moved, docs)
    plugin["args"] = ["--device-config-namespace", "gpu-config", "--mock-gpus=8xT4"]
    assert args({}) == ["--device-config-namespace", "kube-system", "--mock-gpus=8xT4"], "replaced in place"


def test_daemonset_edit_keeps_everything_else(cluster_docs: list[dict[str, Any]]) -> None:
    live = workload(cluster_docs, "DaemonSet")
    desired = _render({"device": {"deviceSplitCount": 4}}, cluster_docs).target(
        "DaemonSet", "volcano-device-plugin").desired
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
        {"key": "pool", "operator": "In", "values": ["inference"]}]}, "deviceSplitCount": 2}],
            "devicePlugin": {"generation": "current"}}  # one that reads a node's split count
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


def test_repairing_a_hand_edit_does_not_restart_an_adopted_plugin(cluster_docs: list[dict[str, Any]]) -> None:
    """The plugin was adopted without a restart (no annotation). Someone edits device-config: the
    repair puts back what the pods already run with, so it must not roll them; the policy status
    (DaemonSet InSync at this hash) is how the renderer knows."""
    docs = _converged({}, cluster_docs)
    adopted = _render({}, docs).target("DaemonSet", "volcano-device-plugin")
    assert adopted.restart_hash is None and not adopted.changed
    cm = next(d for d in docs if d["metadata"]["name"] == "volcano-vgpu-device-config")
    cm["data"]["device-config.yaml"] = cm["data"]["device-config.yaml"].replace(
        "deviceSplitCount: 10", "deviceSplitCount: 3")
    status = {"targets": [{"kind": "DaemonSet", "namespace": "kube-system", "name": "volcano-device-plugin",
                           "hash": adopted.content_hash, "state": "InSync"}]}
    policy = VGPUPolicy.from_object({"metadata": {"name": "default"}, "spec": {}, "status": status})
    result = render_all(policy, observe(docs, policy.spec))
    assert result.target("ConfigMap", "volcano-vgpu-device-config").changed  # repaired
    assert not result.target("DaemonSet", "volcano-device-plugin").changed  # not rolled
    # Without that record (a policy new to this cluster) the edit may be what the pods run with.
    assert _render({}, docs).target("DaemonSet", "volcano-device-plugin").changed
    # A recorded Drifted state proves nothing about the pods.
    status["targets"][0]["state"] = "Drifted"
    policy = VGPUPolicy.from_object({"metadata": {"name": "default"}, "spec": {}, "status": status})
    assert render_all(policy, observe(docs, policy.spec)).target("DaemonSet", "volcano-device-plugin").changed


def test_a_workload_whose_roll_failed_is_rolled_once_its_inputs_look_current(
        cluster_docs: list[dict[str, Any]]) -> None:
    """An apply wrote the scheduler conf, then failed to patch the Deployment: the live conf now
    matches the policy, but the scheduler still runs the old one. Status (Error) says so."""
    first = _render({}, cluster_docs)
    assert first.target("Deployment", "volcano-scheduler").changed, "the fixture's scheduler needs a roll"
    conf = first.target("ConfigMap", "volcano-scheduler-configmap").desired
    docs = [conf if d["metadata"]["name"] == "volcano-scheduler-configmap" else d for d in cluster_docs]
    current = _render({}, docs).target("Deployment", "volcano-scheduler")
    assert not current.changed, "with the conf written, the live inputs look current"
    status = {"targets": [{"kind": "Deployment", "namespace": "volcano-system", "name": "volcano-scheduler",
                           "hash": current.content_hash, "state": "Error"}]}
    policy = VGPUPolicy.from_object({"metadata": {"name": "default"}, "spec": {}, "status": status})
    rolled = render_all(policy, observe(docs, policy.spec)).target("Deployment", "volcano-scheduler")
    assert rolled.changed and rolled.restart_hash == current.content_hash


def test_legacy_flags_left_at_their_defaults_stay_absent() -> None:
    defaults = dp.LEGACY_DEFAULTS
    flags = {"resource-name": "volcano.sh/vgpu-number", "device-split-count": "10", "gpu-memory-factor": "1"}
    # absent + default -> absent; absent + other value -> appended; present -> set in place
    assert dp.edit_args(["--fail-on-init-error=false"], flags, defaults) == [
        "--fail-on-init-error=false", "--device-split-count=10"]
    assert dp.edit_args(["--gpu-memory-factor", "4", "-v=2"], flags, defaults) == [
        "--gpu-memory-factor", "1", "-v=2", "--device-split-count=10"]
    assert dp.edit_args(["--resource-name=nvidia.com/gpu"], flags, defaults)[0] == \
        "--resource-name=volcano.sh/vgpu-number"


def _with_deviceshare(docs: list[dict[str, Any]], arguments: dict[str, Any]) -> list[dict[str, Any]]:
    docs = copy.deepcopy(docs)
    cm = next(d for d in docs if d["metadata"]["name"] == "volcano-scheduler-configmap")
    conf = yaml.safe_load(cm["data"]["volcano-scheduler.conf"])
    conf["tiers"][-1]["plugins"].insert(0, {"name": "deviceshare", "arguments": arguments})
    cm["data"]["volcano-scheduler.conf"] = yaml.safe_dump(conf)
    return docs


def test_scheduler_conf_is_kept_when_it_means_the_same(cluster_docs: list[dict[str, Any]]) -> None:
    namespace = {"deviceshare.KnownGeometriesCMNamespace": "kube-system"}
    # NodeLockEnable false, ScheduleWeight 0 and the ConfigMap name are Volcano's defaults.
    docs = _with_deviceshare(cluster_docs, {"deviceshare.VGPUEnable": True, **namespace})
    assert not _render({}, docs).target("ConfigMap", "volcano-scheduler-configmap").changed
    # Volcano ignores a quoted weight and a non-bool flag: those are rewritten with the right type.
    for wrong in ({"deviceshare.ScheduleWeight": "0"}, {"deviceshare.VGPUEnable": 1}):
        docs = _with_deviceshare(cluster_docs, {"deviceshare.VGPUEnable": True, **namespace, **wrong})
        target = _render({}, docs).target("ConfigMap", "volcano-scheduler-configmap")
        assert target.changed, wrong
        args = next(p for t in yaml.safe_load(target.text or "")["tiers"] for p in t["plugins"]
                    if p["name"] == "deviceshare")["arguments"]
        assert args["deviceshare.VGPUEnable"] is True and args["deviceshare.ScheduleWeight"] == 0
    # An unset KnownGeometriesCMNamespace is spelled out (vgpuctl doctor flags it).
    docs = _with_deviceshare(cluster_docs, {"deviceshare.VGPUEnable": True})
    target = _render({}, docs).target("ConfigMap", "volcano-scheduler-configmap")
    assert target.changed and "deviceshare.KnownGeometriesCMNamespace: kube-system" in (target.text or "")


def test_objects_inside_a_kubectl_list_are_observed(cluster_docs: list[dict[str, Any]]) -> None:
    """`kubectl get ... -o yaml` writes a `kind: List`; its items count as the objects themselves."""
    spec = parse_spec({})
    wrapped = [{"apiVersion": "v1", "kind": "List", "items": copy.deepcopy(cluster_docs)}]
    assert observe(wrapped, spec) == observe(cluster_docs, spec)
    assert observe(wrapped, spec).device_config is not None and len(observe(wrapped, spec).nodes) == 2


def _plugin_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = workload(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    return container


def _rendered_plugin(spec: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, Any]:
    desired = _render(spec, docs).target("DaemonSet", "volcano-device-plugin").desired
    assert desired is not None
    return _plugin_container([desired])


def test_a_daemonset_upgraded_to_v1_12_keeps_only_flags_v1_12_defines(
        cluster_docs: list[dict[str, Any]]) -> None:
    docs = copy.deepcopy(cluster_docs)
    container = _plugin_container(docs)
    container["image"] = V1_12
    container["args"] = ["-v=4", "--node-name", "$(NODE_NAME)", "--debug", "--device-split-count", "-4",
                         "--mig-strategy", "none", "--pass-device-specs", "--logtostderr",
                         "--kubelet-socket", "/var/lib/kubelet/device-plugins/kubelet.sock", "-v", "2"]
    assert _rendered_plugin({}, docs)["args"] == [
        "--mig-strategy", "none", "--pass-device-specs",
        "--kubelet-socket", "/var/lib/kubelet/device-plugins/kubelet.sock"]
    assert not _render({}, _converged({}, docs)).target("DaemonSet", "volcano-device-plugin").changed


def test_flags_written_in_command_are_edited_too(cluster_docs: list[dict[str, Any]]) -> None:
    docs = copy.deepcopy(cluster_docs)
    container = _plugin_container(docs)
    container["command"] = ["/usr/bin/vgpu-device-plugin", "--device-split-count=4", "--resource-name",
                            "nvidia.com/gpu", "-v=4"]
    container["args"] = ["--gpu-memory-factor", "2"]
    legacy = _rendered_plugin({}, docs)
    assert legacy["command"] == ["/usr/bin/vgpu-device-plugin", "--device-split-count=10", "--resource-name",
                                 "volcano.sh/vgpu-number", "-v=4"]
    assert legacy["args"] == ["--gpu-memory-factor", "1"]  # set where it was, not appended twice
    container["image"] = V1_12
    current = _rendered_plugin({}, docs)
    assert current["command"] == ["/usr/bin/vgpu-device-plugin"] and current["args"] == []
    # A wrapper's binary comes after `--`: its flags are the binary's.
    container["command"] = ["/sbin/tini", "--", "/usr/bin/vgpu-device-plugin", "-v=4", "--mig-strategy=none"]
    assert _rendered_plugin({}, docs)["command"] == ["/sbin/tini", "--", "/usr/bin/vgpu-device-plugin",
                                                     "--mig-strategy=none"]
    # A shell's script is not ours to edit, and args given to it are the script's $0...: nothing is
    # changed or appended, for any generation (validation reports it).
    container["command"] = ["/bin/sh", "-c", "exec vgpu-device-plugin -v=4"]
    container["args"] = ["--gpu-memory-factor", "2"]
    for image in (V1_12, "docker.io/projecthami/volcano-vgpu-device-plugin:v1.11.0"):
        container["image"] = image
        split4 = _rendered_plugin({"device": {"deviceSplitCount": 4}}, docs)
        assert split4["args"] == ["--gpu-memory-factor", "2"]
        assert _rendered_plugin({}, docs)["command"] == ["/bin/sh", "-c", "exec vgpu-device-plugin -v=4"]


def test_a_negative_separate_value_goes_with_its_flag() -> None:
    flags: dict[str, str | None] = {"device-split-count": None, "gpu-memory-factor": "3"}
    assert dp.edit_args(["--device-split-count", "-4", "--x", "y"], flags, dp.LEGACY_DEFAULTS) == [
        "--x", "y", "--gpu-memory-factor=3"]
    assert dp.edit_args(["--gpu-memory-factor", "-1.5"], flags) == ["--gpu-memory-factor", "3"]
    # a flag after a value-less flag is not taken as its value
    assert dp.edit_args(["--device-split-count", "--fail-on-init-error=false"], flags) == [
        "--fail-on-init-error=false", "--gpu-memory-factor=3"]
    assert dp.flag_values(["--device-split-count", "-4", "-v=2", "--debug"]) == {
        "--device-split-count": "-4", "--v": "2", "--debug": "true"}


DEVICE_CONFIG = "volcano-vgpu-device-config"
V1_11 = "docker.io/projecthami/volcano-vgpu-device-plugin:v1.11.0"
V1_12 = "docker.io/projecthami/volcano-vgpu-device-plugin:v1.12.0"
A100_80GB_V1_12 = [("1g.10gb", 9728, 7), ("2g.20gb", 19968, 3), ("1g.10gb", 9728, 1), ("3g.40gb", 40192, 2),
                   ("7g.80gb", 80896, 1)]


def _a100_80gb(text: str) -> list[tuple[str, int, int]]:
    table = yaml.safe_load(text)["nvidia"]["knownMigGeometries"]
    entry = next(e for e in table if "A100-SXM4-80GB" in e["models"])
    return [(g["name"], g["memory"], g["count"]) for group in entry["allowedGeometries"]
            for g in group["geometries"]]


def _stock_v1_12(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fixture as upstream's v1.12.0 manifest ships it: image and the fixed A100-80GB shapes."""
    docs = _with_plugin_image(docs, V1_12)
    cm = next(d for d in docs if d["metadata"]["name"] == "volcano-vgpu-device-config")
    text = cm["data"]["device-config.yaml"]
    head, tail = text.split("A100-SXM4-80GB", 1)
    for old, new in (("memory: 10240", "memory: 9728"), ("memory: 20480", "memory: 19968"),
                     ("memory: 40960", "memory: 40192"), ("7g.79gb", "7g.80gb")):
        tail = tail.replace(old, new)
    cm["data"]["device-config.yaml"] = head + "A100-SXM4-80GB" + tail
    return docs


def test_mig_table_is_the_one_the_plugin_generation_ships(cluster_docs: list[dict[str, Any]]) -> None:
    stock = _stock_v1_12(cluster_docs)
    assert _a100_80gb(_device_config_text(stock)) == A100_80GB_V1_12
    # adopting a stock install (v1.11 or v1.12) leaves its table alone
    for docs in (cluster_docs, stock):
        assert not _render({}, docs).target("ConfigMap", "volcano-vgpu-device-config").changed
    # a v1.11 table under a v1.12 plugin (an upgraded image) becomes v1.12's
    target = _render({}, _with_plugin_image(cluster_docs, V1_12)).target("ConfigMap", DEVICE_CONFIG)
    assert target.changed and _a100_80gb(target.text or "") == A100_80GB_V1_12
    # and back: v1.11's under a v1.11 plugin
    target = _render({}, _with_plugin_image(stock, V1_11)).target("ConfigMap", DEVICE_CONFIG)
    assert target.changed and ("7g.79gb", 80896, 1) in _a100_80gb(target.text or "")
    # a table in the policy wins over both
    own = {"device": {"knownMigGeometries": []}}
    assert "A100" not in (_render(own, stock).target("ConfigMap", "volcano-vgpu-device-config").text or "")


def _device_config_text(docs: list[dict[str, Any]]) -> str:
    cm = next(d for d in docs if d["metadata"]["name"] == "volcano-vgpu-device-config")
    return str(cm["data"]["device-config.yaml"])


def _with_plugin_image(docs: list[dict[str, Any]], image: str) -> list[dict[str, Any]]:
    docs = copy.deepcopy(docs)
    _plugin_container(docs)["image"] = image
    return docs


def test_a_v1_12_switch_loses_its_separate_value(cluster_docs: list[dict[str, Any]]) -> None:
    # Go stops parsing at `false`: --kubelet-socket would be ignored. The switch keeps the meaning
    # v1.12 gave it (on), and the flags after it are read again.
    docs = _with_plugin_image(cluster_docs, V1_12)
    _plugin_container(docs)["args"] = ["--fail-on-init-error", "false", "--kubelet-socket", "/k.sock",
                                       "--pass-device-specs", "extra"]
    assert _rendered_plugin({}, docs)["args"] == ["--fail-on-init-error", "--kubelet-socket", "/k.sock",
                                                  "--pass-device-specs", "extra"]


def test_a_quoted_vgpu_enable_rolls_the_scheduler_once(cluster_docs: list[dict[str, Any]]) -> None:
    # Volcano before 1.15 reads only a YAML bool there (its GetBool): with "true" the scheduler
    # runs with vGPU off, and registers devices only at start. The real `true` the conf gets
    # must come with a rollout.
    docs = _converged({}, cluster_docs)
    conf = next(d for d in docs
                if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "volcano-scheduler-configmap")
    text = conf["data"]["volcano-scheduler.conf"]
    assert "deviceshare.VGPUEnable: true" in text
    conf["data"]["volcano-scheduler.conf"] = text.replace("deviceshare.VGPUEnable: true",
                                                          'deviceshare.VGPUEnable: "true"')
    workload(docs, "Deployment")["spec"]["template"]["metadata"].pop("annotations", None)
    assert _restarts({}, docs) == {"volcano-scheduler"}
