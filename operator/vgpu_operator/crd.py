"""The VGPUPolicy CustomResourceDefinition, generated from the pydantic models in `api`.

    python -m vgpu_operator.crd --write    # (re)write crds/vgpu.io_vgpupolicies.yaml
    python -m vgpu_operator.crd --check    # exit 1 with a diff when the file is stale

The schema is built by walking the models (not from pydantic's JSON schema, which uses `$ref` and
`anyOf` that a structural schema forbids): every property carries a `description`; `Literal`
becomes `enum`; ge/gt/le, min/max length and patterns carry over; object fields with a model
default get the model's defaults written out whole (the API server checks a default against its own
node's CEL rules as written, without filling nested defaults first, so `default: {}` would fail a
rule that reads a field); `cel_rules` become `x-kubernetes-validations`, and a rule must name a
property that is a CEL reserved word as Kubernetes exposes it (`namespace` as `__namespace__`).
Every list and string a CEL rule touches has a max size, which keeps the rules within the API
server's cost budget.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import re
import sys
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from vgpu_formats import cli

from vgpu_operator import api

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / f"{api.GROUP}_{api.PLURAL}.yaml"
CRD_NAME = f"{api.PLURAL}.{api.GROUP}"
# Helm installs crds/ once and never upgrades it, so the operator brings the CRD it was built with
# up to date at start (`upgrade_action`); these say which build wrote the installed one.
VERSION_ANNOTATION = f"{api.GROUP}/operator-version"
REVISION_ANNOTATION = f"{api.GROUP}/crd-revision"
# What an admin runs when the operator may not update the CRD (the chart README says the same,
# tests/e2e/test_crd_upgrade.py runs it): the chart carries the CRD, a chart-repo user has no crds/.
# Server-side apply with --force-conflicts takes over the fields helm or the operator wrote.
CRD_FIX = ("helm show crds <chart> | kubectl apply --server-side --force-conflicts -f - "
           "(<chart>: the chart you installed, e.g. <repo>/vgpu-operator --version <version>)")
# Only where the update was refused (403): the chart grants the patch with manageCRD, never create.
CRD_FIX_FORBIDDEN = f"{CRD_FIX}, or set the chart value operator.manageCRD=true"
HEADER = "# Generated from vgpu_operator/api.py by `python -m vgpu_operator.crd --write`. Do not edit.\n"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
     "description": "Valid, applied, in sync and every GPU node converged."},
    {"name": "Drift", "type": "integer", "jsonPath": ".status.drifted",
     "description": "Targets changed by hand since the last apply."},
    {"name": "Nodes", "type": "string", "jsonPath": ".status.nodes.summary",
     "description": "GPU nodes converged / total."},
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.capacity.gpus",
     "description": "Physical GPUs registered."},
    {"name": "vGPUs", "type": "integer", "jsonPath": ".status.capacity.vgpus",
     "description": "vGPU slots registered."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # priority 1: shown by `kubectl get -o wide` only, after Age as kubectl's own wide columns are.
    {"name": "Reason", "type": "string", "priority": 1,
     "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
     "description": "Why Ready is what it is."},
    {"name": "Message", "type": "string", "priority": 1,
     "jsonPath": '.status.conditions[?(@.type=="Ready")].message',
     "description": "What is wrong and the fix."},
]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _strip_optional(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def type_schema(tp: Any) -> dict[str, Any]:
    """OpenAPI v3 (structural) schema of a Python type used in `api`."""
    tp = _strip_optional(tp)
    origin = get_origin(tp)
    if _is_model(tp):
        return model_schema(tp)
    if origin is Literal:
        return {"type": "string", "enum": list(get_args(tp))}
    if origin is list:
        return {"type": "array", "items": type_schema(get_args(tp)[0])}
    if origin is dict:
        value = get_args(tp)[1]
        if value is Any:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        values = type_schema(value)
        if values["type"] == "string":
            values["maxLength"] = api.LABEL_VALUE_MAX  # maps in the API are label sets
        return {"type": "object", "additionalProperties": values}
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if tp in simple:
        return {"type": simple[tp]}
    raise TypeError(f"no CRD schema for type {tp!r}")


def _apply_constraints(schema: dict[str, Any], info: FieldInfo) -> None:
    kind = schema.get("type")
    size_keys = {"array": ("minItems", "maxItems"), "string": ("minLength", "maxLength"),
                 "object": ("minProperties", "maxProperties")}
    for meta in info.metadata:
        if isinstance(meta, annotated_types.Ge):
            schema["minimum"] = meta.ge
        elif isinstance(meta, annotated_types.Gt):
            schema["minimum"] = meta.gt
            schema["exclusiveMinimum"] = True
        elif isinstance(meta, annotated_types.Le):
            schema["maximum"] = meta.le
        elif isinstance(meta, annotated_types.MinLen) and kind in size_keys:
            schema[size_keys[str(kind)][0]] = meta.min_length
        elif isinstance(meta, annotated_types.MaxLen) and kind in size_keys:
            schema[size_keys[str(kind)][1]] = meta.max_length
        elif getattr(meta, "pattern", None):
            schema["pattern"] = meta.pattern


def _default(info: FieldInfo, schema: dict[str, Any]) -> tuple[bool, Any]:
    """(has a default worth writing, the default) for a field."""
    if info.default_factory is not None:
        if schema.get("type") == "object" and "properties" in schema:
            return True, model_default(info.default_factory())  # type: ignore[call-arg]
        return False, None
    if info.default is PydanticUndefined or info.default is None:
        return False, None
    return True, info.default


def model_default(value: Any) -> Any:
    """A model's defaults as the API server stores them (aliases, no nulls)."""
    return value.model_dump(by_alias=True, exclude_none=True, mode="json") if isinstance(value, BaseModel) \
        else value


_ITEM_CONSTRAINTS = {"items_max_length": "maxLength", "items_pattern": "pattern"}


def field_schema(info: FieldInfo) -> dict[str, Any]:
    schema = dict(type_schema(info.annotation))
    _apply_constraints(schema, info)
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    for key, value in extra.items():
        if key.startswith("items_"):  # a constraint on each item: items_max_length -> items.maxLength
            schema["items"] = {**schema["items"], _ITEM_CONSTRAINTS[key]: value}
        else:
            schema[key] = value
    if schema.get("type") == "array" and schema["items"].get("type") == "string" \
            and "maxLength" not in schema["items"]:
        schema["items"] = {**schema["items"], "maxLength": api.NAME_MAX}
    description = info.description or schema.get("description")
    if not description:
        raise ValueError(f"field without description: {info!r}")
    schema["description"] = description
    has_default, default = _default(info, schema)
    if has_default:
        schema["default"] = default
    return schema


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Object schema of a model: properties by alias, required fields, CEL rules."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        properties[key] = field_schema(info)
        if info.is_required():
            required.append(key)
    description = " ".join((model.__doc__ or "").split())
    schema: dict[str, Any] = {"type": "object", "description": description, "properties": properties}
    if required:
        schema["required"] = required
    rules = getattr(model, "cel_rules", [])
    if rules:
        schema["x-kubernetes-validations"] = [dict(rule) for rule in rules]
    return schema


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition as a dict, annotated with the operator version and a revision
    (a digest of its spec)."""
    manifest = _unannotated_manifest()
    digest = hashlib.sha256(json.dumps(manifest["spec"], sort_keys=True).encode()).hexdigest()[:16]
    manifest["metadata"]["annotations"] = {VERSION_ANNOTATION: cli.version(),
                                           REVISION_ANNOTATION: digest}
    return manifest


UpgradeAction = Literal["current", "update", "newer-installed", "missing"]


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3])


def upgrade_action(installed: dict[str, Any] | None, ours: dict[str, Any]) -> UpgradeAction:
    """What to do with the installed CRD: nothing when it is ours or written by a newer operator
    version (a rolling upgrade's old replica must not downgrade it), else update it to ours. Two
    builds of one version that differ in the CRD replace each other's at start (development)."""
    if installed is None:
        return "missing"
    have = (installed.get("metadata") or {}).get("annotations") or {}
    want = ours["metadata"]["annotations"]
    if have.get(REVISION_ANNOTATION) == want[REVISION_ANNOTATION]:
        return "current"
    if _version_key(have.get(VERSION_ANNOTATION, "0")) > _version_key(want[VERSION_ANNOTATION]):
        return "newer-installed"
    return "update"


def _unannotated_manifest() -> dict[str, Any]:
    root = {
        "type": "object",
        "description": "VGPUPolicy is the single source of truth for Volcano + HAMi vGPU configuration: "
                       "the operator renders the device-config and node-config ConfigMaps, the scheduler's "
                       "deviceshare arguments and the device plugin's args from it.",
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object (vgpu.io/v1alpha1)."},
            "kind": {"type": "string", "description": "Kind of this object (VGPUPolicy)."},
            "metadata": {"type": "object"},
            "spec": {**model_schema(api.VGPUPolicySpec), "default": model_default(api.VGPUPolicySpec())},
            "status": model_schema(api.VGPUPolicyStatus),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": api.GROUP,
            "names": {"kind": api.KIND, "listKind": f"{api.KIND}List", "plural": api.PLURAL,
                      "singular": api.SINGULAR, "shortNames": list(api.SHORT_NAMES)},
            "scope": "Cluster",
            "versions": [{
                "name": api.VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": root},
            }],
        },
    }


def render_crd() -> str:
    """The CRD file's text (deterministic)."""
    return HEADER + yaml.safe_dump(crd_manifest(), sort_keys=False, default_flow_style=False, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vgpu_operator.crd", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the CRD file")
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff when the file is stale")
    parser.add_argument("--path", type=Path, default=CRD_PATH, help=f"CRD file (default {CRD_PATH})")
    args = parser.parse_args(argv)
    text = render_crd()
    if args.write:
        args.path.parent.mkdir(parents=True, exist_ok=True)
        args.path.write_text(text)
        print(f"wrote {args.path}")
        return 0
    if args.check:
        current = args.path.read_text() if args.path.exists() else ""
        if current == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                                   str(args.path), "generated from vgpu_operator.api"))
        print(f"\n{args.path} is stale: run `python -m vgpu_operator.crd --write`", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
