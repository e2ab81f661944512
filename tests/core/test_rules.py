"""The rules catalogue (vgpu_operator.rules) and the field table (vgpu_formats.device_fields).

The operator's validation and `vgpuctl doctor` judge the same cluster with the same rules: on one
broken cluster (the fixtures, one place broken), doctor's finding and the operator's problem for
a policy imported from that cluster name the same catalogue rule with the same severity.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from vgpu_formats import device_fields
from vgpu_operator import rules
from vgpu_operator.api import parse_spec
from vgpu_operator.decide import render_all
from vgpuctl.doctor import diagnose, policy_findings
from vgpuctl.facts import gather
from vgpuctl.importer import import_policy
from vgpuctl.manifests import load_objects

from tests.core.support import apply, observe
from tests.vgpuctl.conftest import CLUSTER, HEALTHY_SCHEDULER_CONF, find

OPERATOR = Path(__file__).resolve().parents[2] / "operator"
Objects = list[dict[str, Any]]


@pytest.fixture(scope="module")
def _healthy() -> Objects:
    objects = load_objects([CLUSTER])
    find(objects, "ConfigMap", "volcano-scheduler-configmap")["data"]["volcano-scheduler.conf"] = (
        HEALTHY_SCHEDULER_CONF)
    return objects


@pytest.fixture
def healthy(_healthy: Objects) -> Objects:
    return copy.deepcopy(_healthy)


def _doctor_rules(objects: Objects) -> set[tuple[rules.Rule, str]]:
    return {(rules.BY_CODE[f.code], f.severity) for f in diagnose(gather(objects)).findings}


def _operator_findings(objects: Objects) -> list[tuple[str, str]]:
    """(reason, severity) of each problem the operator's validation finds in the policy
    `vgpuctl import` writes for this cluster (as doctor runs it on a VGPUPolicy it finds)."""
    policy = import_policy(gather(objects)).policy
    return [(f.code.removeprefix("policy-"), f.severity) for f in policy_findings([*objects, policy])]


def _operator_rules(objects: Objects) -> set[tuple[rules.Rule, str]]:
    return {(rules.BY_REASON[reason], severity) for reason, severity in _operator_findings(objects)}


# --- one place broken at a time ----------------------------------------------------------------


def _scheduler_conf(objects: Objects, old: str, new: str) -> None:
    data = find(objects, "ConfigMap", "volcano-scheduler-configmap")["data"]
    assert old in data["volcano-scheduler.conf"]
    data["volcano-scheduler.conf"] = data["volcano-scheduler.conf"].replace(old, new)


def _device_config(objects: Objects, old: str, new: str) -> None:
    data = find(objects, "ConfigMap", "volcano-vgpu-device-config")["data"]
    assert old in data["device-config.yaml"]
    data["device-config.yaml"] = data["device-config.yaml"].replace(old, new)


def _image(objects: Objects, kind: str, name: str, image: str) -> None:
    find(objects, kind, name)["spec"]["template"]["spec"]["containers"][0]["image"] = image


def _current_plugin(objects: Objects) -> None:
    _image(objects, "DaemonSet", "volcano-device-plugin",
           "docker.io/projecthami/volcano-vgpu-device-plugin:v1.12.0")


def _no_predicates(objects: Objects) -> None:
    _scheduler_conf(objects, "  - name: predicates\n", "")


def _gpushare(objects: Objects) -> None:
    _scheduler_conf(objects, "VGPUEnable: true", "VGPUEnable: true\n      deviceshare.GPUSharingEnable: true")


def _name_outside_domain(objects: Objects) -> None:
    _current_plugin(objects)
    _device_config(objects, "resourceCountName: volcano.sh/vgpu-number", "resourceCountName: nvidia.com/gpu")


def _name_too_long(objects: Objects) -> None:
    _current_plugin(objects)
    _device_config(objects, "resourceCountName: volcano.sh/vgpu-number",
                   "resourceCountName: volcano.sh/" + "g" * 60)


def _custom_names_on_v1_15_1(objects: Objects) -> None:
    _image(objects, "Deployment", "volcano-scheduler", "docker.io/volcanosh/vc-scheduler:v1.15.1")
    _device_config(objects, "resourceCountName: volcano.sh/vgpu-number",
                   "resourceCountName: volcano.sh/gpu-count")


def _custom_names_on_v1_12(objects: Objects) -> None:
    _image(objects, "Deployment", "volcano-scheduler", "docker.io/volcanosh/vc-scheduler:v1.12.0")
    _device_config(objects, "resourceCountName: volcano.sh/vgpu-number",
                   "resourceCountName: volcano.sh/gpu-count")


def _node_split_on_legacy(objects: Objects) -> None:
    find(objects, "ConfigMap", "volcano-vgpu-node-config")["data"]["config.json"] = (
        '{"nodeconfig": [{"name": "dev-app-2-150-master-1", "devicesplitcount": 5}]}')


def _no_plugin(objects: Objects) -> None:
    objects.remove(find(objects, "DaemonSet", "volcano-device-plugin"))


SHARED: dict[str, tuple[Callable[[Objects], None], rules.Rule]] = {
    "predicates missing": (_no_predicates, rules.PREDICATES_MISSING),
    "gpushare with vGPU": (_gpushare, rules.GPUSHARE_CONFLICT),
    "name outside volcano.sh/": (_name_outside_domain, rules.NAME_OUTSIDE_DOMAIN),
    "name too long": (_name_too_long, rules.NAME_TOO_LONG),
    "custom names, nodes ignored": (_custom_names_on_v1_15_1, rules.CUSTOM_NAMES_UNSUPPORTED),
    "custom names, hard-coded": (_custom_names_on_v1_12, rules.CUSTOM_NAMES_UNSUPPORTED),
    "node split on a legacy plugin": (_node_split_on_legacy, rules.LEGACY_IGNORES),
    "no device plugin": (_no_plugin, rules.PLUGIN_MISSING),
}


@pytest.mark.parametrize("case", SHARED)
def test_operator_and_doctor_agree(healthy: Objects, case: str) -> None:
    breaker, rule = SHARED[case]
    assert (rule, rule.severity) not in _doctor_rules(healthy)
    breaker(healthy)
    assert (rule, rule.severity) in _doctor_rules(healthy)
    assert (rule, rule.severity) in _operator_rules(healthy)


# Where doctor and the operator once disagreed on severity, both now report an error, which
# counts against doctor's exit code: with the upstream fact that makes each fatal.
RESOLVED = {
    "predicates missing": "no device is ever allocated",
    "name outside volcano.sh/": "the kubelet rejects volcano.sh/nvidia.com/gpu",
    "no device plugin": "nothing registers vGPU resources",
}


@pytest.mark.parametrize("case", RESOLVED)
def test_the_resolved_disagreements(healthy: Objects, case: str) -> None:
    breaker, rule = SHARED[case]
    assert diagnose(gather(healthy)).problems == 0
    breaker(healthy)
    report = diagnose(gather(healthy))
    assert [f.severity for f in report.findings if f.code == rule.code] == ["error"], RESOLVED[case]
    assert report.problems >= 1
    assert (rule, "error") in _operator_rules(healthy)


# --- every code in the catalogue ------------------------------------------------------------


def test_codes_and_reasons_are_unique() -> None:
    assert len(rules.BY_CODE) == len(rules.CATALOGUE)
    assert len(rules.BY_REASON) == len([r for r in rules.CATALOGUE if r.reason])
    for rule in rules.CATALOGUE:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.code), rule.code
        assert not rule.reason or re.fullmatch(r"[A-Z][A-Za-z]+", rule.reason), rule.reason
        assert rule.fix and rule.field
        rule.fix_text(**dict.fromkeys(set(re.findall(r"{(\w+)}", rule.fix)) - {"apply"}, "x"))


@pytest.mark.parametrize("path", ["vgpu_operator/validate.py", "vgpuctl/doctor.py"])
def test_every_rule_used_is_in_the_catalogue(path: str) -> None:
    """No severity or code written at a call site: each Problem and Finding names a rule."""
    source = (OPERATOR / path).read_text()
    assert not re.search(r'(Problem|Finding)\((ERROR|WARNING|INFO|f?"[^"]*", ")', source)
    used = set(re.findall(r"rules\.([A-Z][A-Z_]+)\b", source))
    assert used
    for name in used:
        assert isinstance(getattr(rules, name, None), (rules.Rule, str)), name


def test_every_code_reported_is_in_the_catalogue(healthy: Objects) -> None:
    for breaker, _ in SHARED.values():
        objects = copy.deepcopy(healthy)
        breaker(objects)
        for finding in diagnose(gather(objects)).findings:
            assert finding.code in rules.BY_CODE
        reasons = [reason for reason, _ in _operator_findings(objects)]
        assert reasons
        assert set(reasons) <= set(rules.BY_REASON), reasons


# --- the field table ---------------------------------------------------------------------------


ROUND_TRIP = {
    "resources": {"count": "volcano.sh/gpu-count", "memory": "volcano.sh/gpu-mem",
                  "memoryPercentage": "volcano.sh/gpu-mem-pct", "cores": "volcano.sh/gpu-sm",
                  "priority": "volcano.sh/gpu-priority"},
    "device": {"deviceSplitCount": 4, "deviceMemoryScaling": 1.5, "deviceCoreScaling": 2.0,
               "gpuMemoryFactor": 8, "overwriteEnv": True, "disableCoreLimit": True,
               "defaults": {"memory": 1024, "cores": 20, "gpuNum": 2},
               "knownMigGeometries": [{"models": ["A30"], "allowedGeometries": [
                   {"group": "group1", "geometries": [{"name": "1g.6gb", "memory": 6144, "count": 4}]}]}]},
}


def test_field_table_round_trips(healthy: Objects) -> None:
    """Render a policy to the cluster, import it back: every field of the table comes back."""
    spec = parse_spec(ROUND_TRIP)
    written = apply(healthy, render_all(spec, observe(healthy, spec)))
    imported = import_policy(gather(written)).policy["spec"]
    given = spec.model_dump(by_alias=True, mode="json")
    for field in device_fields.FIELDS:
        expected = device_fields.policy_value(given, field)
        assert device_fields.policy_value(imported, field) == expected, field.policy


def test_field_table_covers_the_owned_keys() -> None:
    """Every nvidia key the policy renders has a row (passDeviceSpecs is upstream's, unused)."""
    keys = {str(info.alias) for info in device_fields.dc.NvidiaConfig.model_fields.values()}
    assert set(device_fields.BY_KEY) == keys - {"passDeviceSpecs"}
    given = parse_spec(ROUND_TRIP).model_dump(by_alias=True, mode="json")
    data = device_fields.to_nvidia(given)
    # Written out by hand from ROUND_TRIP: the nvidia section the scheduler reads.
    assert yaml.safe_load(yaml.safe_dump(data)) == {
        "resourceCountName": "volcano.sh/gpu-count", "resourceMemoryName": "volcano.sh/gpu-mem",
        "resourceMemoryPercentageName": "volcano.sh/gpu-mem-pct",
        "resourceCoreName": "volcano.sh/gpu-sm", "resourcePriorityName": "volcano.sh/gpu-priority",
        "overwriteEnv": True, "defaultMemory": 1024, "defaultCores": 20, "defaultGPUNum": 2,
        "deviceSplitCount": 4, "deviceMemoryScaling": 1.5, "deviceCoreScaling": 2.0,
        "disableCoreLimit": True, "gpuMemoryFactor": 8,
        "knownMigGeometries": ROUND_TRIP["device"]["knownMigGeometries"],
    }


def test_flags_parse_as_the_table_says() -> None:
    assert {f.flag: f.parse_flag("4") for f in device_fields.FLAGGED if f.type is not str} == {
        "--device-split-count": 4, "--device-cores-scaling": 4.0, "--gpu-memory-factor": 4}
    assert device_fields.SIZING_FIELDS["device-split-count"].legacy_default == "2"
