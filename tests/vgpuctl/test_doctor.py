"""doctor on the fixtures and on broken variants: every problem named, no false alarm."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from vgpuctl.doctor import Report, diagnose
from vgpuctl.facts import gather
from vgpuctl.main import main
from vgpuctl.manifests import load_objects

from tests.core.test_validate import GETBOOL, VOLCANO_1_15

from .conftest import CLUSTER, SEED001, find

PLUGIN_CONTAINER = ("DaemonSet", "volcano-device-plugin")


def _doctor(objects: list[dict[str, Any]], pod: str | None = None) -> Report:
    return diagnose(gather(objects), pod=pod)


def _codes(report: Report, severities: tuple[str, ...] = ("error", "warning")) -> set[str]:
    return {f.code for f in report.findings if f.severity in severities}


def _device_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objects, "ConfigMap", "volcano-vgpu-device-config")


def _plugin_args(objects: list[dict[str, Any]]) -> list[str]:
    container = find(objects, *PLUGIN_CONTAINER)["spec"]["template"]["spec"]["containers"][0]
    args: list[str] = container["args"]
    return args


def _scheduler_conf(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objects, "ConfigMap", "volcano-scheduler-configmap")["data"]


def test_healthy_cluster_has_no_problems(healthy):
    report = _doctor(healthy)
    assert _codes(report) == set(), report.findings
    assert report.problems == 0
    assert report.nodes == {"gpuNodes": 2, "registered": 2, "withProblems": 0}
    assert report.pods == []  # the bound fixture pod is fine, so it is not explained unasked
    assert report.versions["volcano"].startswith("v1.13.0")
    assert report.versions["devicePlugin"].startswith("v1.11.0 legacy")


def test_seed001_names_the_mismatch_and_the_missing_namespace():
    report = _doctor(load_objects([CLUSTER, SEED001]))
    by_code = {f.code: f for f in report.findings}
    mismatch = by_code["resource-name-mismatch"]
    assert mismatch.severity == "error"
    assert mismatch.field == "resourceCountName vs --resource-name"
    assert "nvidia.com/gpu" in mismatch.message and "volcano.sh/vgpu-number" in mismatch.message
    assert "--resource-name=nvidia.com/gpu" in mismatch.fix and "VGPUPolicy" in mismatch.fix
    namespace = by_code["cm-namespace-unset"]
    assert namespace.field == "deviceshare.KnownGeometriesCMNamespace"
    assert "set deviceshare.KnownGeometriesCMNamespace: kube-system" in namespace.fix
    assert "2 nodes" in by_code["node-advertisement"].place
    # The failed pod is explained without being asked for.
    (pod,) = report.pods
    assert pod.pod == "volcano-system/test-vgpu-compatible"
    assert pod.requests == {"nvidia.com/gpu": "2"}
    assert any("registers volcano.sh/vgpu-number" in c for c in pod.causes)
    assert any("no volcano.sh/devices-to-allocate" in c for c in pod.causes)
    assert "--resource-name=nvidia.com/gpu" in pod.fix


# Each of the four places wrong in turn: (how to break it, the codes that must appear).
def _rename_count(objs: list[dict[str, Any]]) -> None:
    cm = _device_config(objs)
    cm["data"]["device-config.yaml"] = cm["data"]["device-config.yaml"].replace(
        "resourceCountName: volcano.sh/vgpu-number", "resourceCountName: volcano.sh/gpu-count")


def _drop_memory_name(objs: list[dict[str, Any]]) -> None:
    cm = _device_config(objs)
    cm["data"]["device-config.yaml"] = cm["data"]["device-config.yaml"].replace(
        "  resourceMemoryName: volcano.sh/vgpu-memory\n", "")


def _bad_yaml(objs: list[dict[str, Any]]) -> None:
    cm = _device_config(objs)
    cm["data"]["device-config.yaml"] = cm["data"]["device-config.yaml"].replace(
        "deviceSplitCount: 10", "deviceSplitCount: ten")


def _plugin_resource_flag(objs: list[dict[str, Any]]) -> None:
    _plugin_args(objs).append("--resource-name=example.com/gpu")


def _plugin_split(objs: list[dict[str, Any]]) -> None:
    _plugin_args(objs)[0] = "--device-split-count=4"


def _plugin_current_with_legacy_flags(objs: list[dict[str, Any]]) -> None:
    container = find(objs, *PLUGIN_CONTAINER)["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "docker.io/projecthami/volcano-vgpu-device-plugin:v1.12.0"
    container["args"] = ["--resource-name=volcano.sh/vgpu-number"]


def _vgpu_off(objs: list[dict[str, Any]]) -> None:
    conf = _scheduler_conf(objs)
    text = conf["volcano-scheduler.conf"]
    conf["volcano-scheduler.conf"] = text.replace("VGPUEnable: true", "VGPUEnable: false")


def _wrong_namespace(objs: list[dict[str, Any]]) -> None:
    conf = _scheduler_conf(objs)
    conf["volcano-scheduler.conf"] = conf["volcano-scheduler.conf"].replace(
        "KnownGeometriesCMNamespace: kube-system", "KnownGeometriesCMNamespace: volcano-system")


def _gpushare_too(objs: list[dict[str, Any]]) -> None:
    conf = _scheduler_conf(objs)
    conf["volcano-scheduler.conf"] = conf["volcano-scheduler.conf"].replace(
        "VGPUEnable: true", "VGPUEnable: true\n      deviceshare.GPUSharingEnable: true")


def _no_predicates(objs: list[dict[str, Any]]) -> None:
    conf = _scheduler_conf(objs)
    conf["volcano-scheduler.conf"] = conf["volcano-scheduler.conf"].replace("  - name: predicates\n", "")


def _node_config_invalid(objs: list[dict[str, Any]]) -> None:
    node_config = find(objs, "ConfigMap", "volcano-vgpu-node-config")
    node_config["data"]["config.json"] = '{"nodeconfig": [{"name": 1}]}'


def _node_config_ignored(objs: list[dict[str, Any]]) -> None:
    find(objs, "ConfigMap", "volcano-vgpu-node-config")["data"]["config.json"] = (
        '{"nodeconfig": [{"name": "dev-app-2-150-master-1", "devicesplitcount": 5}]}')


def _node_config_not_applied(objs: list[dict[str, Any]]) -> None:
    """A current plugin honours node-config; the node still registers 10, so it was not restarted."""
    _node_config_ignored(objs)
    container = find(objs, *PLUGIN_CONTAINER)["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "docker.io/projecthami/volcano-vgpu-device-plugin:v1.12.0"


def _node_unregistered(objs: list[dict[str, Any]]) -> None:
    del find(objs, "Node", "test-app-64-46-msxf")["metadata"]["annotations"]


BROKEN = {
    "device-config: count renamed": (_rename_count, {"resource-name-mismatch", "node-advertisement"}),
    "device-config: memory name absent": (_drop_memory_name, {"resource-name-empty"}),
    "device-config: type error": (_bad_yaml, {"device-config-unreadable"}),
    "plugin args: --resource-name": (_plugin_resource_flag, {"resource-name-mismatch"}),
    "plugin args: split count": (_plugin_split, {"sizing-mismatch", "split-count-mismatch"}),
    "plugin args: legacy flags on v1.12": (_plugin_current_with_legacy_flags, {"legacy-flags"}),
    "scheduler conf: VGPUEnable off": (_vgpu_off, {"vgpu-disabled"}),
    "scheduler conf: wrong namespace": (_wrong_namespace, {"device-config-split"}),
    "scheduler conf: gpushare too": (_gpushare_too, {"gpushare-conflict"}),
    "scheduler conf: no predicates": (_no_predicates, {"predicates-missing"}),
    "node-config: invalid": (_node_config_invalid, {"node-config-invalid"}),
    "node-config: ignored by legacy plugin": (_node_config_ignored, {"node-config-ignored"}),
    "node-config: not applied yet": (_node_config_not_applied, {"split-count-mismatch"}),
    "node: not registered": (_node_unregistered, {"node-not-registered"}),
}


@pytest.mark.parametrize("case", BROKEN)
def test_each_broken_place_is_named(healthy, case):
    breaker, expected = BROKEN[case]
    breaker(healthy)
    report = _doctor(healthy)
    assert _codes(report) == expected, [(f.code, f.message) for f in report.findings]
    for finding in report.findings:
        assert finding.place and finding.message and finding.fix


@pytest.mark.parametrize(("spelling", "before_1_15", "since_1_15"), GETBOOL)
def test_scheduler_switches_are_read_as_volcano_reads_them(healthy, spelling, before_1_15, since_1_15):
    """doctor and the operator's validation agree with Volcano's GetBool on every spelling, in
    the version that runs (v1.13.0 in the fixture; strings are read from v1.15)."""
    conf = _scheduler_conf(healthy)
    conf["volcano-scheduler.conf"] = conf["volcano-scheduler.conf"].replace(
        "VGPUEnable: true", f"VGPUEnable: {spelling}\n      deviceshare.GPUSharingEnable: true")
    for version, enabled in ((None, before_1_15), (VOLCANO_1_15, since_1_15)):
        if version is not None:
            find(healthy, "Deployment", "volcano-scheduler")["spec"]["template"]["spec"]["containers"][0][
                "image"] = version
        report = _doctor(healthy)
        codes = _codes(report)
        assert ("vgpu-disabled" in codes) == (not enabled), (version, codes)
        assert ("gpushare-conflict" in codes) == enabled
        if spelling == '"true"' and not enabled:
            (finding,) = [f for f in report.findings if f.code == "vgpu-disabled"]
            assert "reads only a YAML bool there before v1.15: write true without quotes" in finding.message


def test_split_count_mismatch_names_node_and_setting(healthy):
    _node_config_not_applied(healthy)
    (finding,) = [f for f in _doctor(healthy).findings if f.code == "split-count-mismatch"]
    assert finding.place == "Node dev-app-2-150-master-1"
    assert "registers split count 10" in finding.message
    setting = "ConfigMap kube-system/volcano-vgpu-node-config: dev-app-2-150-master-1.devicesplitcount"
    assert f"give 5 ({setting})" in finding.message


def test_version_skew_is_reported(healthy):
    container = find(healthy, *PLUGIN_CONTAINER)["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "docker.io/projecthami/volcano-vgpu-device-plugin:v1.13.0"
    container["args"] = []
    report = _doctor(healthy)
    skew = [f for f in report.findings if f.code == "version-skew"]
    assert skew and "node-vgpu-handshake" in skew[0].message


def test_volcano_1_15_1_with_custom_names(healthy):
    _rename_count(healthy)
    deployment = find(healthy, "Deployment", "volcano-scheduler")
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "volcanosh/vc-scheduler:v1.15.1"
    codes = _codes(_doctor(healthy))
    assert "custom-names-unsupported" in codes


def test_pod_diagnosis_on_request(healthy):
    pod = find(healthy, "Pod", "vgpu-test")
    pod["spec"]["schedulerName"] = "default-scheduler"
    pod["metadata"]["annotations"] = {}
    pod["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError"}
    report = _doctor(healthy, pod="default/vgpu-test")
    (diagnosis,) = report.pods
    assert any("not volcano" in c for c in diagnosis.causes)
    assert "spec.schedulerName: volcano" in diagnosis.fix


def test_cli_exit_codes_and_json(capsys, tmp_path, healthy):
    import yaml

    path = tmp_path / "healthy.yaml"
    path.write_text(yaml.safe_dump_all(healthy))
    assert main(["doctor", "-f", str(path), "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["healthy"] is True
    assert main(["doctor", "--cluster-dir", str(CLUSTER), "--cluster-dir", str(SEED001), "-o", "yaml"]) == 1
    assert "resource-name-mismatch" in capsys.readouterr().out
    assert main(["doctor", "-f", str(tmp_path / "nope")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_table_output_reads_well(capsys):
    assert main(["doctor", "-c", str(CLUSTER), "-c", str(SEED001), "--no-color"]) == 1
    out = capsys.readouterr().out
    assert "\x1b[" not in out
    assert "count              nvidia.com/gpu" in out and "volcano.sh/vgpu-number   error" in out
    assert "Pod volcano-system/test-vgpu-compatible  Failed (UnexpectedAdmissionError)" in out


def test_doctor_includes_the_policys_validation(healthy, capsys, tmp_path):
    import yaml
    from vgpuctl.importer import import_policy

    policy = import_policy(gather(healthy)).policy
    policy["spec"]["resources"]["count"] = "example.com/gpu"  # legacy plugin + Volcano 1.13: fine
    policy["spec"]["nodeOverrides"] = [{"nodeNames": ["dev-app-2-150-master-1"], "deviceSplitCount": 4},
                                       {"nodeNames": ["dev-app-2-150-master-1"], "operatingMode": "mig"}]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([*healthy, policy]))
    assert main(["doctor", "-f", str(path), "-o", "json"]) == 1
    codes = {f["code"] for f in json.loads(capsys.readouterr().out)["findings"]}
    assert any(code.startswith("policy-") and "Overlap" in code for code in codes), codes


def test_builtin_plugin_reads_the_schedulers_copy(healthy):
    """This project's plugin takes names from the same ConfigMap as the scheduler: no mismatch."""
    container = find(healthy, *PLUGIN_CONTAINER)["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "ghcr.io/example/vgpu-device-plugin:0.1.0"
    container["args"] = []
    _rename_count(healthy)
    report = _doctor(healthy)
    assert report.versions["devicePlugin"].startswith("unknown builtin")
    assert report.names["devicePlugin"]["count"] == "volcano.sh/gpu-count"
    # The nodes still advertise the old name until the plugin pods restart.
    assert _codes(report) == {"node-advertisement"}


def test_builtin_plugin_told_to_read_another_copy_is_a_split(healthy):
    """doctor reads the copy our plugin's flags name, not the upstream hard-coded places."""
    container = find(healthy, *PLUGIN_CONTAINER)["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "ghcr.io/example/vgpu-device-plugin:0.1.0"
    other = {**_device_config(healthy), "metadata": {"name": "volcano-vgpu-device-config",
                                                      "namespace": "gpu-config"}}
    other["data"] = {"device-config.yaml": "nvidia:\n  resourceCountName: volcano.sh/other\n"}
    healthy.append(other)
    container["args"] = ["--device-config-namespace", "gpu-config"]
    split = [f for f in _doctor(healthy).findings if f.code == "device-config-split"]
    assert split and "gpu-config/volcano-vgpu-device-config" in split[0].message
    container["args"] = ["--device-config-namespace=kube-system"]
    assert "device-config-split" not in _codes(_doctor(healthy))


V1_12 = "docker.io/projecthami/volcano-vgpu-device-plugin:v1.12.0"


def _plugin(objs: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = find(objs, *PLUGIN_CONTAINER)["spec"]["template"]["spec"]["containers"][0]
    return container


def test_every_flag_v1_12_lacks_is_named_from_command_and_args(healthy):
    container = _plugin(healthy)
    container["image"] = V1_12
    container["command"] = ["/usr/bin/vgpu-device-plugin", "-v=4"]
    container["args"] = ["--node-name", "$(NODE_NAME)", "--debug", "--device-split-count=10"]
    (finding,) = [f for f in _doctor(healthy).findings if f.code == "legacy-flags"]
    assert finding.field == "args -v=4 --node-name $(NODE_NAME) --debug"


def test_v1_12_names_outside_volcano_sh_and_over_63_characters(healthy):
    _plugin(healthy)["image"] = V1_12
    cm = _device_config(healthy)
    text = cm["data"]["device-config.yaml"]
    # the scheduler alone reads the percentage name: no finding for it
    percentage = "resourceMemoryPercentageName: "
    cm["data"]["device-config.yaml"] = text.replace(f"{percentage}volcano.sh/vgpu-memory-percentage",
                                                    f"{percentage}example.com/percent")
    assert not {"name-outside-volcano-domain", "name-too-long"} & _codes(_doctor(healthy))
    long_name = "volcano.sh/" + "c" * 53
    cm["data"]["device-config.yaml"] = text.replace("resourceCoreName: volcano.sh/vgpu-cores",
                                                    f"resourceCoreName: {long_name}")
    (finding,) = [f for f in _doctor(healthy).findings if f.code == "name-too-long"]
    assert long_name in finding.message and "63" in finding.message


def test_split_count_a_v1_12_plugin_uses_without_a_configmap_value(healthy):
    _plugin(healthy)["image"] = V1_12
    _plugin(healthy)["args"] = []
    cm = _device_config(healthy)
    cm["data"]["device-config.yaml"] = cm["data"]["device-config.yaml"].replace("deviceSplitCount: 10\n", "")
    facts = gather(healthy)
    # v1.12 keeps Go's zero for an absent deviceSplitCount; only a flag would set it
    assert facts.expected_split("dev-app-2-150-master-1")[0] == 0
    _plugin(healthy)["command"] = ["/usr/bin/vgpu-device-plugin", "--device-split-count", "-4"]
    assert gather(healthy).plugin.flags == {"--device-split-count": "-4"}


def test_an_unknown_plugin_tag_is_not_taken_for_v1_12(healthy):
    # a v1.11 binary under a :latest tag: -v=4 is fine for it, so doctor only warns
    container = _plugin(healthy)
    container["image"] = "docker.io/projecthami/volcano-vgpu-device-plugin:latest"
    container["args"] = ["-v=4", "--device-split-count=10"]
    (finding,) = [f for f in _doctor(healthy).findings if f.code == "legacy-flags"]
    assert finding.severity == "warning" and "cannot be told" in finding.message
    container["image"] = V1_12
    (finding,) = [f for f in _doctor(healthy).findings if f.code == "legacy-flags"]
    assert finding.severity == "error"


def test_a_v1_12_plugin_without_factor_or_core_scaling(healthy):
    _plugin(healthy)["image"] = V1_12
    _plugin(healthy)["args"] = ["--device-split-count=10"]
    cm = _device_config(healthy)
    text = cm["data"]["device-config.yaml"]
    cm["data"]["device-config.yaml"] = text.replace("  gpuMemoryFactor: 1\n", "")
    zero = next(f for f in _doctor(healthy).findings if f.code == "memory-factor-zero")
    assert zero.severity == "error" and "panics" in zero.message
    cm["data"]["device-config.yaml"] = text.replace("  deviceCoreScaling: 1\n", "")
    by_code = {f.code: f for f in _doctor(healthy).findings}
    assert "memory-factor-zero" not in by_code
    assert by_code["core-scaling-zero"].severity == "warning"
    # the legacy plugin sizes from its flags: the same ConfigMap is fine for it
    _plugin(healthy)["image"] = "docker.io/projecthami/volcano-vgpu-device-plugin:v1.11.0"
    assert not {"memory-factor-zero", "core-scaling-zero"} & _codes(_doctor(healthy))


def test_a_negative_v1_12_split_flag_makes_it_exit(healthy):
    _plugin(healthy)["image"] = V1_12
    _plugin(healthy)["command"] = ["/usr/bin/vgpu-device-plugin", "--device-split-count", "-4"]
    (finding,) = [f for f in _doctor(healthy).findings if f.code == "sizing-flag-rejected"]
    assert finding.severity == "error" and "exits 1" in finding.message and "-4" in finding.message
    assert gather(healthy).expected_split("dev-app-2-150-master-1")[0] is None


def test_a_quoted_vgpu_enable_on_an_unknown_volcano_still_reports_a_gpushare_conflict(healthy):
    # v1.15+ would read "true" as on, and with GPUSharingEnable the scheduler exits: checked as if
    # it were on, while the quoted value itself is named.
    conf = _scheduler_conf(healthy)
    conf["volcano-scheduler.conf"] = conf["volcano-scheduler.conf"].replace(
        "VGPUEnable: true", 'VGPUEnable: "true"\n      deviceshare.GPUSharingEnable: true')
    find(healthy, "Deployment", "volcano-scheduler")["spec"]["template"]["spec"]["containers"][0][
        "image"] = "docker.io/volcanosh/vc-scheduler:latest"
    report = _doctor(healthy)
    (conflict,) = [f for f in report.findings if f.code == "gpushare-conflict"]
    assert conflict.message.startswith("if this Volcano is v1.15 or later (its version is unknown)")
    (finding,) = [f for f in report.findings if f.code == "vgpu-disabled"]
    assert "Volcano of an unknown version reads only a YAML bool there before v1.15" in finding.message


def test_only_a_volcano_release_from_v1_15_reads_string_bools():
    from vgpu_operator.versions import parse_version
    from vgpu_operator.versions import reads_string_bools as reads_strings

    versions = {tag: reads_strings(parse_version(tag)) for tag in
                ("v1.14.4", "v1.15.0-alpha.0", "v1.15.0", "v1.16.0-alpha.1")}
    assert versions == {"v1.14.4": False, "v1.15.0-alpha.0": False, "v1.15.0": True, "v1.16.0-alpha.1": True}


@pytest.mark.parametrize(("image", "severity"), [
    ("docker.io/volcanosh/vc-scheduler:v1.13.0", "warning"),  # logged and skipped
    ("docker.io/volcanosh/vc-scheduler:v1.14.4", "error"),  # the whole file rejected
    ("docker.io/volcanosh/vc-scheduler:latest", "warning"),  # cannot tell
])
def test_an_action_volcano_does_not_have_is_named_as_that_version_treats_it(healthy, image, severity):
    conf = _scheduler_conf(healthy)
    text = conf["volcano-scheduler.conf"]
    actions = next(line for line in text.splitlines() if line.startswith("actions:"))
    conf["volcano-scheduler.conf"] = text.replace(actions, actions.rstrip('"') + ', backfil"'
                                                  if actions.endswith('"') else actions + ", backfil")
    scheduler = find(healthy, "Deployment", "volcano-scheduler")
    scheduler["spec"]["template"]["spec"]["containers"][0]["image"] = image
    (found,) = [f for f in _doctor(healthy).findings if f.code == "unknown-scheduler-action"]
    assert found.severity == severity and "'backfil'" in found.message and "'backfil'" in found.fix


def _memory_only_pod(name: str, init: bool = False) -> dict[str, Any]:
    container = {"name": "m", "image": "cuda", "resources": {"limits": {"volcano.sh/vgpu-memory": "1k"}}}
    spec: dict[str, Any] = {"schedulerName": "volcano", "containers": [
        {"name": "app", "image": "cuda", "resources": {"limits": {"volcano.sh/vgpu-number": "1"}}}]}
    if init:
        spec["initContainers"] = [container]
    else:
        spec["containers"].append(container)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": spec, "status": {"phase": "Running"}}


def test_a_memory_only_container_under_the_upstream_plugin_is_named(healthy, tmp_path, capsys):
    """Upstream's plugin answers the memory call of a container asking memory alone empty: it
    runs uncapped while the scheduler counts a share, its pod left in bind-phase allocating."""
    assert "memory-only-container" not in _codes(_doctor(healthy))
    uncapped = _memory_only_pod("uncapped")
    uncapped["metadata"]["annotations"] = {"volcano.sh/bind-phase": "allocating"}
    done = _memory_only_pod("done")
    done["status"]["phase"] = "Succeeded"
    other = _memory_only_pod("other-scheduler")
    other["spec"]["schedulerName"] = "default-scheduler"
    healthy += [uncapped, done, other]
    found = [f for f in _doctor(healthy).findings if f.code == "memory-only-container"]
    assert len(found) == 1 and found[0].severity == "warning"
    assert found[0].message.startswith("containers asking for volcano.sh/vgpu-memory without "
                                       "volcano.sh/vgpu-number: default/uncapped container m. ")
    assert "no memory or SM limit" in found[0].message
    assert "done" not in found[0].message and "other-scheduler" not in found[0].message
    assert "add volcano.sh/vgpu-number: 1" in found[0].fix
    # From files too: the running pod is read (doctor's prefilter keeps pods left allocating).
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(healthy))
    main(["doctor", "-f", str(path), "-o", "json"])
    codes = {f["code"] for f in json.loads(capsys.readouterr().out)["findings"]}
    assert "memory-only-container" in codes


def test_a_memory_only_container_under_a_guessed_plugin_is_only_info(healthy):
    container = find(healthy, *PLUGIN_CONTAINER)["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "registry.example/gpu-plugin:latest"
    healthy.append(_memory_only_pod("maybe"))
    found = [f for f in _doctor(healthy).findings if f.code == "memory-only-container"]
    assert len(found) == 1 and found[0].severity == "info"
    assert "guessed from image 'registry.example/gpu-plugin:latest': if it is upstream's" in found[0].message


def test_a_memory_only_container_under_another_memory_name_is_the_name_mismatch(healthy):
    cm = _device_config(healthy)
    cm["data"]["device-config.yaml"] = cm["data"]["device-config.yaml"].replace(
        "resourceMemoryName: volcano.sh/vgpu-memory", "resourceMemoryName: volcano.sh/gpu-mem")
    pod = _memory_only_pod("renamed")
    pod["spec"]["containers"][1]["resources"]["limits"] = {"volcano.sh/gpu-mem": "1k"}
    healthy.append(pod)
    codes = _codes(_doctor(healthy), ("error", "warning", "info"))
    assert "resource-name-mismatch" in codes and "memory-only-container" not in codes


def test_our_plugin_serves_memory_only_containers_but_not_init_ones(healthy):
    container = find(healthy, *PLUGIN_CONTAINER)["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "ghcr.io/example/vgpu-device-plugin:0.1.0"
    container["args"] = []
    healthy.append(_memory_only_pod("served"))
    assert "memory-only-container" not in _codes(_doctor(healthy))
    healthy.append(_memory_only_pod("refused", init=True))
    found = [f for f in _doctor(healthy).findings if f.code == "memory-only-container"]
    assert len(found) == 1 and "default/refused container m" in found[0].message
    assert "refuses its pod" in found[0].message and "served" not in found[0].message


def test_a_node_offering_no_vgpu_memory_is_found(healthy):
    # The plugin's memory list (one device per gpuMemoryFactor MiB) over the kubelet's 4 MiB
    # message: the node offers the count but 0 memory, and every pod asking memory waits.
    # Before, doctor said healthy (diff warned of it).
    node = find(healthy, "Node", "test-app-64-46-msxf")
    node["status"]["allocatable"]["volcano.sh/vgpu-memory"] = "0"
    report = _doctor(healthy)
    (found,) = [f for f in report.findings if f.code == "list-and-watch-too-large"]
    assert "test-app-64-46-msxf" in found.place and "raise gpuMemoryFactor" in found.fix
