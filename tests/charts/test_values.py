"""values.schema.json turns typos into clear install errors; every value is documented."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts import chart
from tests.charts.conftest import Renders
from tests.charts.values_schema import main as values_schema_main

VALUES = yaml.safe_load((chart.CHART / "values.yaml").read_text())
SCHEMA = json.loads((chart.CHART / "values.schema.json").read_text())
README = (chart.CHART / "README.md").read_text()


def value_paths(values: Any, schema: dict[str, Any], path: str = "") -> Iterator[str]:
    """Dotted paths of the chart's settings: the leaves of closed objects. Free-form maps
    (labels, selectors), `resources` and the pass-through `policy.spec` count as one setting."""
    # `global` stays open (a parent chart adds its own keys), but the keys it has here are ours.
    closed = schema.get("additionalProperties") is False or path == "global"
    if isinstance(values, dict) and closed and path != "policy.spec" and not path.endswith(".resources"):
        for key, sub in values.items():
            yield from value_paths(sub, schema["properties"][key], f"{path}.{key}" if path else key)
    else:
        yield path


def test_every_value_is_documented_in_the_readme() -> None:
    documented = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", README, re.MULTILINE))
    paths = set(value_paths(VALUES, SCHEMA))
    assert paths - documented == set(), "values missing from the README table"
    assert documented - paths == set(), "README documents values that do not exist"


@pytest.mark.parametrize(("values", "message"), [
    ({"operator": {"replica": 2}}, "at '/operator': additional properties 'replica' not allowed"),
    ({"devicePlugin": {"nodeselector": {"gpu": "on"}}},
     "at '/devicePlugin': additional properties 'nodeselector' not allowed"),
    ({"scheduler": {"namespace": "Volcano_System"}}, "at '/scheduler/namespace'"),
    ({"existingDevicePlugin": {"generation": "v1.12"}}, "at '/existingDevicePlugin/generation'"),
    ({"operator": {"metricsPort": 0}}, "at '/operator/metricsPort'"),
    ({"policy": {"spec": {"device": {"deviceSplitCont": 4}}}},
     "at '/policy/spec/device': additional properties 'deviceSplitCont' not allowed"),
    ({"policy": {"spec": {"driftPolicy": "enforce"}}}, "at '/policy/spec/driftPolicy'"),
    ({"policy": {"spec": {"device": {"deviceSplitCount": 0}}}}, "at '/policy/spec/device/deviceSplitCount'"),
    ({"devicePlugin": {"tolerations": [{"key": "a", "operator": "Exist"}]}},
     "at '/devicePlugin/tolerations/0/operator'"),
    # values the API server would refuse on every object, or on the DaemonSet
    ({"devicePlugin": {"maxUnavailable": "0%"}}, "at '/devicePlugin/maxUnavailable'"),
    ({"commonLabels": {"team": "a b"}}, "at '/commonLabels/team'"),
    ({"commonLabels": {"bad key!": "a"}}, "invalid propertyName 'bad key!'"),
    ({"nameOverride": "X.Y"}, "at '/nameOverride'"),
    ({"fullnameOverride": "Vgpu"}, "at '/fullnameOverride'"),
])
def test_a_typo_fails_install_and_names_the_field(values: dict[str, Any], message: str) -> None:
    with pytest.raises(chart.HelmError) as err:
        chart.template(values)
    assert "values don't meet the specifications of the schema" in str(err.value)
    assert message in str(err.value)


@pytest.mark.parametrize(("section", "field", "fix"), [
    ("scheduler", "namespace", "scheduler.*"),
    ("targets", "deviceConfig", "targets.*"),
    ("devicePlugin", "daemonSet", "devicePlugin.* / existingDevicePlugin.*"),
])
def test_a_location_in_policy_spec_is_refused_with_the_fix(section: str, field: str, fix: str) -> None:
    value: Any = "somewhere"
    if field == "deviceConfig":
        value = {"namespace": "elsewhere", "name": "other-config"}
    with pytest.raises(chart.HelmError) as err:
        chart.template({"policy": {"spec": {section: {field: value}}}})
    assert f"policy.spec.{section}.{field}: set by the chart from {fix}" in str(err.value)


def test_policy_spec_is_passed_through_with_the_locations(full_objects: list[dict[str, Any]]) -> None:
    spec = chart.one(full_objects, "VGPUPolicy")["spec"]
    assert spec["device"] == {"deviceSplitCount": 4, "deviceMemoryScaling": 1.5}
    assert spec["driftPolicy"] == "Report"
    assert spec["nodeOverrides"] == [{"nodeNames": ["gpu-a100-1"], "deviceSplitCount": 2}]
    assert spec["devicePlugin"] == {"namespace": chart.NAMESPACE,
                                    "daemonSet": "vgpu-vgpu-operator-device-plugin",
                                    "container": "device-plugin", "generation": "builtin"}


def test_non_location_scheduler_fields_stay() -> None:
    objs = chart.render({"policy": {"spec": {"scheduler": {"volcanoVersion": "1.12.0"}}}})
    scheduler = chart.one(objs, "VGPUPolicy")["spec"]["scheduler"]
    assert scheduler == {"namespace": "volcano-system", "configMap": "volcano-scheduler-configmap",
                         "key": "volcano-scheduler.conf", "deployment": "volcano-scheduler",
                         "volcanoVersion": "1.12.0"}


def test_adopting_points_the_policy_at_the_existing_plugin(renders: Renders) -> None:
    spec = chart.one(renders("adopt"), "VGPUPolicy")["spec"]
    assert spec["devicePlugin"] == {"namespace": "kube-system", "daemonSet": "volcano-device-plugin",
                                    "container": "volcano-device-plugin", "generation": "auto"}
    assert not chart.of_kind(renders("adopt"), "DaemonSet")


def test_values_schema_policy_spec_matches_the_crd() -> None:
    assert values_schema_main(["--check"]) == 0


def test_chart_locations_default_to_the_crd_defaults() -> None:
    # A stock Volcano install needs no location values: the chart and the API agree on where
    # things live, so a policy applied by hand points at the same objects.
    spec = chart.crd_schema(yaml.safe_load(chart.CRD_FILE.read_text()))["properties"]["spec"]["properties"]

    def default(section: str, *path: str) -> Any:
        node = spec[section]
        for key in path:
            node = node["properties"][key]
        return node["default"]

    for field in ("namespace", "configMap", "key", "deployment"):
        assert VALUES["scheduler"][field] == default("scheduler", field)
    assert VALUES["targets"]["namespace"] == default("targets", "deviceConfig", "namespace")
    # node-config lives beside the plugin: the CRD's default is the upstream plugin's namespace
    assert VALUES["existingDevicePlugin"]["namespace"] == default("targets", "nodeConfig", "namespace")
    assert VALUES["targets"]["deviceConfig"] == default("targets", "deviceConfig", "name")
    assert VALUES["targets"]["nodeConfig"] == default("targets", "nodeConfig", "name")
    existing = VALUES["existingDevicePlugin"]
    for field in ("namespace", "daemonSet", "container", "generation"):
        assert existing[field] == default("devicePlugin", field)


def lookup(values: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(values, dict) or key not in values:
            return None
        values = values[key]
    return values


def test_every_toggle_is_rendered_flipped_by_some_profile() -> None:
    toggles = [p for p in value_paths(VALUES, SCHEMA) if isinstance(lookup(VALUES, p), bool)]
    assert len(toggles) >= 10
    for path in toggles:
        flipped = not lookup(VALUES, path)
        assert any(lookup(values, path) == flipped for values in chart.PROFILES.values()), path


def test_a_service_monitor_without_the_service_is_refused_with_the_fix() -> None:
    """It would install, select nothing and scrape nothing, silently."""
    with pytest.raises(chart.HelmError) as err:
        chart.template({"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}})
    message = str(err.value)
    assert "metrics.serviceMonitor.enabled" in message and "set metrics.service.enabled=true" in message


def test_the_same_port_for_liveness_and_metrics_is_refused_with_the_fix() -> None:
    """The operator would exit at start: address already in use."""
    with pytest.raises(chart.HelmError) as err:
        chart.template({"operator": {"livenessPort": 19090, "metricsPort": 19090}})
    assert "operator.livenessPort and operator.metricsPort are both 19090" in str(err.value)
    assert "give them different ports" in str(err.value)


def test_the_longest_names_helm_accepts_give_valid_object_names() -> None:
    # Service names are DNS labels (63; other names may have 253); the plugin's monitor Service
    # has the longest suffix.
    longest = ({"fullnameOverride": "f" * 63},
               {"fullnameOverride": "gpu-platform-vgpu-operator-prod-eu-west-1"})
    for values in longest:
        objs = chart.render(values)
        services = [o["metadata"]["name"] for o in chart.of_kind(objs, "Service")]
        assert [name for name in services if len(name) > 63] == []
        assert any(name.endswith("-device-plugin-monitor") for name in services)
        assert [o["metadata"]["name"] for o in objs if len(o["metadata"]["name"]) > 253] == []


def test_a_mock_gpu_spec_is_one_quoted_argument() -> None:
    spec = "2x NVIDIA A100: 40960"
    daemonset = chart.one(chart.render({"devicePlugin": {"mockGpus": spec}}), "DaemonSet")
    args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--mock-gpus={spec}" in args


def test_values_of_an_older_chart_fail_with_the_upgrade_fix(tmp_path: Path) -> None:
    # `helm upgrade --reuse-values` over a release of the older chart: the new templates get the
    # old values and none of the new defaults (no logging, no security context values).
    old_chart = tmp_path / "vgpu-operator"
    shutil.copytree(chart.CHART, old_chart, symlinks=False)
    shutil.copy(Path(__file__).parent / "fixtures" / "values-before-logging.yaml", old_chart / "values.yaml")
    with pytest.raises(chart.HelmError) as err:
        chart.run_helm("template", chart.RELEASE, str(old_chart), "--namespace", chart.NAMESPACE)
    assert "value logging.level is missing" in str(err.value)
    assert "--reset-then-reuse-values" in str(err.value)


def test_a_security_context_set_to_null_is_dropped_not_refused() -> None:
    # Null is how a user removes a whole context (e.g. a platform that sets its own); not stale values.
    objs = chart.render({"operator": {"podSecurityContext": None}})
    assert "securityContext" not in chart.one(objs, "Deployment")["spec"]["template"]["spec"]
