"""The CRD: in sync with the models, a valid CustomResourceDefinition, structural, described."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pydantic
import pytest
import yaml
from vgpu_operator import api, crd


def _schema() -> dict[str, Any]:
    return crd.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_file_matches_models() -> None:
    # Fails when someone edits api.py without `python -m vgpu_operator.crd --write`.
    assert crd.CRD_PATH.read_text() == crd.render_crd()
    assert crd.main(["--check"]) == 0


def test_check_reports_a_stale_file(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text(crd.render_crd().replace("maximum: 100", "maximum: 99", 1))
    assert crd.main(["--check", "--path", str(stale)]) == 1
    out = capsys.readouterr()
    assert "-" in out.out and "maximum: 100" in out.out
    assert "--write" in out.err


def test_kubernetes_accepts_the_crd() -> None:
    manifest = yaml.safe_load(crd.CRD_PATH.read_text())
    kubernetes_validate.validate(manifest, "1.30", strict=True)


def _walk(schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for key, sub in schema.get("properties", {}).items():
        found += _walk(sub, f"{path}.{key}")
    if "items" in schema:
        found += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found += _walk(schema["additionalProperties"], f"{path}{{}}")
    return found


def test_schema_is_structural_and_every_field_is_explained() -> None:
    for path, node in _walk(_schema(), "root"):
        assert "type" in node, path
        assert not {"$ref", "anyOf", "oneOf", "allOf"} & node.keys(), path
        if path.count(".") >= 2 and not path.endswith("]") and not path.endswith("}"):
            assert node.get("description"), f"{path} has no description (kubectl explain)"


def test_cel_lists_and_strings_are_bounded() -> None:
    # The API server rejects CEL whose estimated cost is unbounded: every list and string
    # in an object carrying rules must have a max size.
    for path, node in _walk(_schema(), "root"):
        if "x-kubernetes-validations" not in node:
            continue
        for sub_path, sub in _walk(node, path):
            if sub.get("type") == "array":
                assert "maxItems" in sub, sub_path
            if sub.get("type") == "string" and "enum" not in sub:
                assert "maxLength" in sub, sub_path


def test_printer_columns_and_names() -> None:
    manifest = crd.crd_manifest()
    version = manifest["spec"]["versions"][0]
    columns = version["additionalPrinterColumns"]
    assert [c["name"].upper() for c in columns if not c.get("priority")] == \
        ["READY", "DRIFT", "NODES", "GPUS", "VGPUS", "AGE"]
    # `-o wide` adds why Ready is what it is.
    assert [c["name"].upper() for c in columns if c.get("priority") == 1] == ["REASON", "MESSAGE"]
    assert version["subresources"] == {"status": {}}
    assert manifest["spec"]["scope"] == "Cluster"
    assert manifest["spec"]["names"]["shortNames"] == ["vgp"]
    # each column points at a field the status model has
    status = api.VGPUPolicyStatus(
        conditions=[api.Condition(type="Ready", status="True", reason="Ready",
                                  last_transition_time="2025-01-01T00:00:00Z")], drifted=1,
        nodes=api.NodeSummary(summary="2/2"), capacity=api.Capacity(gpus=16, vgpus=160),
    ).model_dump(by_alias=True, exclude_none=True)
    assert status["drifted"] == 1 and status["nodes"]["summary"] == "2/2"
    assert status["capacity"]["gpus"] == 16 and status["capacity"]["vgpus"] == 160


def _validator() -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(_schema())


def test_schema_accepts_the_models_output() -> None:
    spec = api.parse_spec({"nodeOverrides": [{"nodeNames": ["n1"], "deviceSplitCount": 4}],
                           "device": {"knownMigGeometries": [
                               {"models": ["A30"], "allowedGeometries": [
                                   {"group": "g1", "geometries": [{"name": "1g.6gb", "memory": 6144,
                                                                   "count": 4}]}]}]}})
    obj = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "default"},
           "spec": spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
           "status": api.VGPUPolicyStatus().model_dump(by_alias=True, exclude_none=True, mode="json")}
    _validator().validate(obj)


@pytest.mark.parametrize(
    "spec",
    [
        {"device": {"deviceSplitCount": 0}},
        {"device": {"deviceSplitCount": 101}},
        {"device": {"deviceMemoryScaling": 0}},
        {"device": {"knownMigGeometries": [{"models": ["A30"], "allowedGeometries": [
            {"group": "group-1", "geometries": [{"name": "x", "memory": 1, "count": 1}]}]}]}},
        {"resources": {"count": "not a name"}},
        {"driftPolicy": "Sometimes"},
        {"devicePlugin": {"generation": "v2"}},
        {"scheduler": {"volcanoVersion": "latest"}},
    ],
)
def test_schema_and_model_reject_the_same_bad_values(spec: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate({"spec": spec})
    with pytest.raises(ValueError):
        api.parse_spec(spec)


def _apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Structural defaulting as the API server does it: a missing property with a default gets it,
    then its own properties are defaulted in turn."""
    if isinstance(obj, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                obj[key] = _apply_defaults(sub, obj[key])
    if isinstance(obj, list) and "items" in schema:
        return [_apply_defaults(schema["items"], item) for item in obj]
    return obj


def _drop_empty_lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_empty_lists(v) for k, v in value.items() if v != []}
    if isinstance(value, list):
        return [_drop_empty_lists(v) for v in value]
    return value


@pytest.mark.parametrize("spec", [{}, {"device": {"deviceSplitCount": 4}, "targets": {"nodeConfig": {}}},
                                  {"nodeOverrides": [{"nodeNames": ["a"], "filterDevices": {}}]}])
def test_crd_defaults_equal_model_defaults(spec: dict[str, Any]) -> None:
    # What `kubectl get vgp -o yaml` shows after admission is what the operator's model assumes.
    defaulted = _apply_defaults(_schema()["properties"]["spec"], copy.deepcopy(spec))
    model = api.parse_spec(spec).model_dump(by_alias=True, exclude_none=True, mode="json")
    assert _drop_empty_lists(defaulted) == _drop_empty_lists(model)
    _validator().validate({"spec": defaulted})


def _installed(version: str, revision: str) -> dict[str, Any]:
    return {"metadata": {"name": crd.CRD_NAME, "annotations": {crd.VERSION_ANNOTATION: version,
                                                               crd.REVISION_ANNOTATION: revision}}}


def test_the_operator_upgrades_an_older_crd_and_never_downgrades_a_newer_one() -> None:
    ours = crd.crd_manifest()
    version = ours["metadata"]["annotations"][crd.VERSION_ANNOTATION]
    revision = ours["metadata"]["annotations"][crd.REVISION_ANNOTATION]
    assert crd.upgrade_action(None, ours) == "missing"
    assert crd.upgrade_action(_installed(version, revision), ours) == "current"
    assert crd.upgrade_action(_installed("0.0.1", "older"), ours) == "update"
    assert crd.upgrade_action(_installed(version, "a dev build's"), ours) == "update"
    unannotated = {"metadata": {"name": crd.CRD_NAME}}  # an old CRD applied by hand
    assert crd.upgrade_action(unannotated, ours) == "update"
    assert crd.upgrade_action(_installed("99.0.0", "newer"), ours) == "newer-installed"
    ours_090 = {**ours, "metadata": {"annotations": {crd.VERSION_ANNOTATION: "0.9.0",
                                                     crd.REVISION_ANNOTATION: revision}}}
    # versions compare as numbers, not as text ("0.10.0" < "0.9.0" as strings)
    assert crd.upgrade_action(_installed("0.10.0", "newer"), ours_090) == "newer-installed"


@pytest.mark.parametrize("missing", ["reason", "lastTransitionTime"])
def test_a_condition_needs_a_reason_and_a_time_as_the_server_does(missing: str) -> None:
    # tests/e2e/test_crd.py shows the server refusing the same; the model must not write one.
    fields = {"type": "Ready", "status": "True", "reason": "Ready",
              "lastTransitionTime": "2025-01-01T00:00:00Z"}
    with pytest.raises(pydantic.ValidationError):
        api.Condition.model_validate({k: v for k, v in fields.items() if k != missing})
    with pytest.raises(pydantic.ValidationError):
        api.Condition.model_validate({**fields, "reason": ""})
    status = crd.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    required = status["properties"]["conditions"]["items"]["required"]
    assert required == ["type", "status", "reason", "lastTransitionTime"]
