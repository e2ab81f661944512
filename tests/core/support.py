"""Test helpers of the core suite: build observed state, apply a render, dump goldens."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml
from vgpu_operator.api import VGPUPolicySpec, parse_spec
from vgpu_operator.decide import render_all
from vgpu_operator.observed import Observed, object_key
from vgpu_operator.registry import RenderResult, load_observed_from_manifests
from vgpu_operator.validate import validate

GOLDEN = Path(__file__).resolve().parent / "golden"


def observe(docs: list[dict[str, Any]], spec: VGPUPolicySpec) -> Observed:
    return load_observed_from_manifests(copy.deepcopy(docs), spec)


def apply(docs: list[dict[str, Any]], result: RenderResult) -> list[dict[str, Any]]:
    """The manifests after the operator wrote every changed target's desired object."""
    out = {object_key(d): d for d in copy.deepcopy(docs)}
    for target in result.targets:
        if target.changed and target.desired is not None:
            out[object_key(target.desired)] = copy.deepcopy(target.desired)
    return list(out.values())


def workload(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


def _block_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


class _GoldenDumper(yaml.SafeDumper):
    pass


_GoldenDumper.add_representer(str, _block_str)


def golden_view(spec_dict: dict[str, Any], docs: list[dict[str, Any]]) -> str:
    """What a human reviews: problems, then per target what would be written and why."""
    spec = parse_spec(spec_dict)
    observed = observe(docs, spec)
    result = render_all(spec, observed)
    view: dict[str, Any] = {
        "policy": spec_dict,
        "problems": [{"severity": p.severity, "field": p.field, "reason": p.reason, "message": p.message}
                     for p in validate(spec, observed)],
        "targets": [],
    }
    for target in result.targets:
        entry: dict[str, Any] = {"target": target.ref, "changed": target.changed}
        if target.error is not None:
            entry["error"] = f"{target.error.reason}: {target.error.message}"
        else:
            entry["hash"] = target.content_hash
        if target.restart_hash:
            entry["restartHash"] = target.restart_hash
        if target.changed_nodes:
            entry["changedNodes"] = target.changed_nodes
        if target.kind == "ConfigMap" and target.text is not None and target.changed:
            entry["text"] = target.text
        elif target.changed:
            entry["patch"] = _trim_containers(target.patch())
        view["targets"].append(entry)
    return yaml.dump(view, Dumper=_GoldenDumper, sort_keys=False, width=100, allow_unicode=True)


def _trim_containers(patch: dict[str, Any]) -> dict[str, Any]:
    """Show only name/image/args of patched containers: the rest is copied verbatim (tested apart)."""
    patch = copy.deepcopy(patch)
    containers = patch.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
    if containers:
        patch["spec"]["template"]["spec"]["containers"] = [
            {k: c[k] for k in ("name", "image", "args", "command") if k in c} for c in containers]
    return patch


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run UPDATE_GOLDEN=1 pytest tests/core and read it"
    assert path.read_text() == text, f"{path} differs: review, then UPDATE_GOLDEN=1 pytest tests/core"
