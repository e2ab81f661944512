"""import and diff on the fixtures and on broken variants of a cluster the operator manages."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from vgpu_operator.api import VGPUPolicy
from vgpu_operator.decide import render_all
from vgpu_operator.registry import load_observed_from_manifests
from vgpu_operator.validate import validate
from vgpuctl.diffing import target_diff
from vgpuctl.errors import UsageError
from vgpuctl.facts import gather
from vgpuctl.importer import import_policy
from vgpuctl.main import main
from vgpuctl.manifests import object_key

from . import test_doctor as variants
from .conftest import find


def _render(policy: dict[str, Any], objects: list[dict[str, Any]]) -> Any:
    model = VGPUPolicy.from_object(policy)
    return render_all(model, load_observed_from_manifests(objects, model.spec))


def _managed(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The cluster after the operator applied the imported policy once (its canonical form)."""
    policy = import_policy(gather(objects)).policy
    written = [t.desired for t in _render(policy, objects).targets if t.changed and t.desired is not None]
    by_key = {object_key(o): o for o in objects}
    for obj in written:
        by_key[object_key(obj)] = copy.deepcopy(obj)
    return policy, list(by_key.values())


def test_import_of_the_healthy_fixture_cluster(healthy):
    imported = import_policy(gather(healthy))
    spec = imported.policy["spec"]
    assert imported.notes == []
    assert spec["resources"]["count"] == "volcano.sh/vgpu-number"
    assert spec["device"]["deviceSplitCount"] == 10  # the legacy plugin's --device-split-count=10
    assert spec["device"]["knownMigGeometries"][0]["models"] == ["A30"]
    assert spec["scheduler"]["namespace"] == "volcano-system"
    assert spec["devicePlugin"] == {"namespace": "kube-system", "daemonSet": "volcano-device-plugin",
                                    "container": "volcano-device-plugin", "generation": "auto"}
    assert spec["nodeOverrides"][0]["nodeNames"] == ["aio-node67"]
    assert spec["nodeOverrides"][0]["deviceMemoryScaling"] == 1.8
    VGPUPolicy.from_object(imported.policy)  # the API accepts it


def test_import_follows_what_each_component_runs_with(healthy):
    variants._plugin_split(healthy)  # legacy plugin on --device-split-count=4, ConfigMap says 10
    imported = import_policy(gather(healthy))
    assert imported.policy["spec"]["device"]["deviceSplitCount"] == 4
    variants._rename_count(healthy)
    imported = import_policy(gather(healthy))
    assert imported.policy["spec"]["resources"]["count"] == "volcano.sh/gpu-count"
    assert any("registers volcano.sh/vgpu-number" in note for note in imported.notes)


def test_import_then_render_changes_nothing_on_first_pass(healthy):
    """Adopting a working cluster: the imported policy renders to exactly what is live (no write,
    no restart, byte for byte), although the live objects spell defaults differently."""
    policy = import_policy(gather(healthy)).policy
    result = _render(policy, healthy)
    assert [t.ref for t in result.targets if t.changed] == []
    assert all(target_diff(t) == "" for t in result.targets)
    assert all(t.patch() == {} for t in result.targets)
    # The live objects really do leave defaults implicit (so the test is not vacuous).
    config = find(healthy, "ConfigMap", "volcano-vgpu-device-config")["data"]["device-config.yaml"]
    assert "disableCoreLimit" not in config
    plugin = find(healthy, "DaemonSet", "volcano-device-plugin")
    args = plugin["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--resource-name") for a in args)


def test_managed_cluster_has_an_empty_diff(healthy):
    policy, managed = _managed(healthy)
    result = _render(policy, managed)
    assert [t.ref for t in result.targets if t.changed] == []
    assert all(target_diff(t) == "" for t in result.targets)
    # ...and importing it again gives the same policy (adopting changes nothing).
    assert import_policy(gather(managed)).policy == policy


# Which object the diff must name when a place is broken in a managed cluster.
TARGET = {
    "device-config": "ConfigMap kube-system/volcano-vgpu-device-config",
    "plugin args": "DaemonSet kube-system/volcano-device-plugin",
    "scheduler conf": "ConfigMap volcano-system/volcano-scheduler-configmap",
    "node-config": "ConfigMap kube-system/volcano-vgpu-node-config",
}


@pytest.mark.parametrize("case", [c for c in variants.BROKEN if c.split(":")[0] in TARGET])
def test_diff_or_validation_names_the_broken_place(healthy, case):
    """In a managed cluster, each broken place shows up in the diff (the operator repairs it) or,
    for settings it does not own (gpushare, predicates), in the validation it reports."""
    policy, managed = _managed(healthy)
    breaker, _ = variants.BROKEN[case]
    if case.startswith("plugin args"):
        # The managed DaemonSet lists all its flags: start the variant from the fixture's args.
        container = find(managed, "DaemonSet", "volcano-device-plugin")["spec"]["template"]["spec"]
        container["containers"][0]["args"] = ["--device-split-count=10"]
    breaker(managed)
    model = VGPUPolicy.from_object(policy)
    observed = load_observed_from_manifests(managed, model.spec)
    result = render_all(model, observed)
    place = TARGET[case.split(":")[0]]
    changed = [t.ref for t in result.targets if t.changed or t.error]
    reported = [p.object for p in validate(model, observed)]
    assert place in changed + reported, (case, changed, reported)
    diff = "".join(target_diff(t) for t in result.targets)
    assert (f"live/{place}" in diff) == (place in changed and place not in [t.ref for t in result.targets
                                                                              if t.error])


def test_diff_uses_the_live_policys_status_for_restarts(capsys, tmp_path, healthy):
    """A hand edit of device-config in an adopted cluster: the operator repairs the ConfigMap and
    does not roll the plugin (its status says the pods run with the policy's settings); `vgpuctl
    diff -f` against the live cluster predicts exactly that."""
    policy = import_policy(gather(healthy)).policy
    result = _render(policy, healthy)
    plugin = result.target("DaemonSet", "volcano-device-plugin")
    assert not plugin.changed and plugin.restart_hash is None  # adopted without a restart
    live_policy = {**policy, "status": {"targets": [
        {"kind": t.kind, "namespace": t.namespace, "name": t.name, "hash": t.content_hash, "state": "InSync"}
        for t in result.targets]}}
    config = find(healthy, "ConfigMap", "volcano-vgpu-device-config")
    config["data"]["device-config.yaml"] = config["data"]["device-config.yaml"].replace(
        "deviceSplitCount: 10", "deviceSplitCount: 3")
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    (cluster / "all.yaml").write_text(yaml.safe_dump_all([*healthy, live_policy]))
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy))

    assert main(["diff", "-f", str(policy_file), "-c", str(cluster), "--no-color"]) == 1
    out = capsys.readouterr().out
    assert "live/ConfigMap kube-system/volcano-vgpu-device-config" in out
    assert "DaemonSet" not in out, "the plugin's pods never read the edit: no restart"
    # Without the live status (a policy new to this cluster) the edit may be what pods run with.
    (cluster / "all.yaml").write_text(yaml.safe_dump_all(healthy))
    assert main(["diff", "-f", str(policy_file), "-c", str(cluster), "--no-color"]) == 1
    assert "live/DaemonSet kube-system/volcano-device-plugin" in capsys.readouterr().out


def test_import_doctor_and_facts_agree_on_v1_12_sizing_flags(healthy):
    """v1.12 takes a given sizing flag over the ConfigMap: import, the expected split and doctor
    all say so."""
    from vgpuctl.doctor import diagnose

    container = variants._plugin(healthy)
    container["image"] = variants.V1_12
    container["args"] = ["--device-split-count=4"]  # the ConfigMap says 10
    facts = gather(healthy)
    assert import_policy(facts).policy["spec"]["device"]["deviceSplitCount"] == 4
    assert facts.expected_split("dev-app-2-150-master-1") == (4, "--device-split-count=4")
    (mismatch,) = [f for f in diagnose(facts).findings if f.code == "sizing-mismatch"]
    assert "deviceSplitCount: 10" in mismatch.message and "overrides the ConfigMap" in mismatch.message


def test_import_of_a_v1_12_plugin_missing_sizing_keys_notes_the_fix(healthy):
    container = variants._plugin(healthy)
    container["image"] = variants.V1_12
    container["args"] = []
    cm = find(healthy, "ConfigMap", "volcano-vgpu-device-config")
    cm["data"]["device-config.yaml"] = cm["data"]["device-config.yaml"].replace("  gpuMemoryFactor: 1\n", "")
    imported = import_policy(gather(healthy))
    assert imported.policy["spec"]["device"]["gpuMemoryFactor"] == 1
    assert any("runs with gpuMemoryFactor 0" in note for note in imported.notes)


def _set_node_lock(objects: list[dict[str, Any]], spelling: str, scheduler_image: str) -> None:
    conf = variants._scheduler_conf(objects)
    conf["volcano-scheduler.conf"] = conf["volcano-scheduler.conf"].replace(
        "VGPUEnable: true", f"VGPUEnable: true\n      deviceshare.NodeLockEnable: {spelling}")
    deployment = find(objects, "Deployment", "volcano-scheduler")
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = scheduler_image


@pytest.mark.parametrize(("spelling", "image", "locked"), [
    ("true", "docker.io/volcanosh/vc-scheduler:v1.13.0", True),
    ('"true"', "docker.io/volcanosh/vc-scheduler:v1.15.1", True),  # 1.15+ reads the string
    ('"true"', "docker.io/volcanosh/vc-scheduler:v1.13.0", False),  # before: off
])
def test_import_reads_node_lock_as_the_scheduler_does(healthy, spelling, image, locked):
    # Before, only a YAML true counted: a quoted "true" that Volcano 1.15 reads as on was
    # imported as off, and applying the import turned the node lock off.
    _set_node_lock(healthy, spelling, image)
    imported = import_policy(gather(healthy))
    assert imported.policy["spec"]["scheduler"]["nodeLockEnable"] is locked
    assert any("NodeLockEnable is the string 'true'" in n for n in imported.notes) == spelling.startswith('"')


def test_import_refuses_a_target_without_a_namespace_and_a_bad_name(healthy):
    # Templated manifests (`helm template` without -n) leave metadata.namespace out: before, a
    # pydantic traceback, exit 1 (the code for "problems found").
    del find(healthy, "DaemonSet", "volcano-device-plugin")["metadata"]["namespace"]
    with pytest.raises(UsageError, match=r"DaemonSet volcano-device-plugin, has no metadata\.namespace"):
        import_policy(gather(healthy))
    find(healthy, "DaemonSet", "volcano-device-plugin")["metadata"]["namespace"] = "kube-system"
    for name in ("Bad_Name", "", "-x"):
        with pytest.raises(UsageError, match="must be a DNS-1123 subdomain"):
            import_policy(gather(healthy), name=name)


def test_a_plugin_run_from_a_shell_script_is_not_read_as_its_flag_defaults(healthy):
    # A legacy plugin started by `sh -c "exec plugin --device-split-count=10"`: its flags cannot
    # be read. Before, doctor took the flag defaults (split 2) and reported a sizing mismatch and
    # a split-count mismatch on every node, and import wrote deviceSplitCount 2.
    from vgpuctl.doctor import diagnose

    container = variants._plugin(healthy)
    container["command"] = ["/bin/sh", "-c", "exec volcano-vgpu-device-plugin " + " ".join(container["args"])]
    container["args"] = []
    facts = gather(healthy)
    codes = {f.code for f in diagnose(facts).findings}
    assert "plugin-flags-in-shell-script" in codes
    assert not codes & {"sizing-mismatch", "split-count-mismatch"}
    imported = import_policy(facts)
    assert imported.policy["spec"]["device"]["deviceSplitCount"] == 10  # device-config's
    assert any("runs from a shell script" in n for n in imported.notes)


def test_manifest_objects_with_null_fields_are_read_not_a_traceback(healthy):
    find(healthy, "DaemonSet", "volcano-device-plugin")["spec"]["template"]["spec"] = None
    facts = gather(healthy)
    assert facts.plugin.daemonset.found and facts.plugin.args == []


def test_import_takes_the_scheduler_copys_device_settings_and_notes_the_plugins(healthy):
    # The scheduler reads a volcano-system copy of device-config, the plugin the kube-system one.
    # Before, the policy took the plugin's copy's geometries without a note, and its diff then
    # replaced the ones the scheduler reads.
    variants._wrong_namespace(healthy)
    plugin_copy = find(healthy, "ConfigMap", "volcano-vgpu-device-config")
    scheduler_copy = copy.deepcopy(plugin_copy)
    scheduler_copy["metadata"]["namespace"] = "volcano-system"
    text = scheduler_copy["data"]["device-config.yaml"]
    assert '[ "A30" ]' in text
    scheduler_copy["data"]["device-config.yaml"] = text.replace('[ "A30" ]', '[ "H100-SXM5-80GB" ]', 1)
    healthy.append(scheduler_copy)
    imported = import_policy(gather(healthy))
    models = [m for g in imported.policy["spec"]["device"]["knownMigGeometries"] for m in g["models"]]
    assert "H100-SXM5-80GB" in models and "A30" not in models
    assert any("whose knownMigGeometries differs" in n and "keeps the scheduler's" in n
               for n in imported.notes)


def test_a_device_config_diff_shows_the_lines_that_change(healthy):
    # Upstream's device-config has lines with trailing spaces (`geometries: `): PyYAML then gave
    # up the block style and the diff showed the whole text as one escaped line, before and after.
    config = find(healthy, "ConfigMap", "volcano-vgpu-device-config")
    assert "geometries: \n" in config["data"]["device-config.yaml"]
    policy = import_policy(gather(healthy)).policy
    policy["spec"]["device"]["deviceSplitCount"] = 4
    (target,) = [t for t in _render(policy, healthy).targets
                 if t.ref == "ConfigMap kube-system/volcano-vgpu-device-config"]
    lines = [line for line in target_diff(target).splitlines() if not line.startswith(("---", "+++"))]
    assert "deviceSplitCount: 10" in [line[1:].strip() for line in lines if line.startswith("-")]
    assert "deviceSplitCount: 4" in [line[1:].strip() for line in lines if line.startswith("+")]
    assert all(len(line) < 200 for line in lines)
