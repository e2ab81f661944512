"""The CRD's CEL rules evaluate as the model validators decide (`cel-python`, a dev dependency:
imported plainly, so a missing install fails here instead of skipping the rules unchecked). The
rules are evaluated on the generated schema, so a rule that does not compile or that disagrees
with api.py fails here."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
from vgpu_operator import crd


def _rules() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}

    def walk(node: dict[str, Any], path: str) -> None:
        for rule in node.get("x-kubernetes-validations", []):
            found.setdefault(path, []).append(rule["rule"])
        for key, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{key}")
        if "items" in node:
            walk(node["items"], f"{path}[]")

    walk(crd.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")
    return found


# Kubernetes exposes a property whose name is a CEL reserved word as `__name__` (and escapes
# `__`, `.`, `-`, `/`); cel-python does not, so the objects are escaped here as the API server
# does, and a rule that writes `self.namespace` finds no such key, as it would on a real server.
CEL_RESERVED = {"as", "break", "const", "continue", "else", "for", "function", "if", "import", "let",
                "loop", "package", "namespace", "return", "var", "void", "while", "in", "null", "true",
                "false"}


def _escape(key: str) -> str:
    if key in CEL_RESERVED:
        return f"__{key}__"
    for raw, escaped in (("__", "__underscores__"), (".", "__dot__"), ("-", "__dash__"), ("/", "__slash__")):
        key = key.replace(raw, escaped)
    return key


def _escaped(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {_escape(k): _escaped(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_escaped(v) for v in obj]
    return obj


def _allowed(path: str, obj: dict[str, Any]) -> bool:
    env = celpy.Environment()
    return all(bool(env.program(env.compile(rule)).evaluate({"self": celpy.json_to_cel(_escaped(obj))}))
               for rule in _rules()[path])


NAMES = {"count": "a", "memory": "b", "cores": "c", "memoryPercentage": "", "priority": ""}


@pytest.mark.parametrize(
    ("path", "obj", "allowed"),
    [
        (".spec.resources", NAMES, True),
        (".spec.resources", {**NAMES, "memory": "a"}, False),
        (".spec.resources", {**NAMES, "memoryPercentage": "b"}, False),
        (".spec.nodeOverrides[]", {"nodeNames": ["x"], "deviceSplitCount": 3}, True),
        (".spec.nodeOverrides[]", {"nodeNames": ["x"], "nodeSelector": {}, "operatingMode": "mig"}, False),
        (".spec.nodeOverrides[]", {"deviceSplitCount": 3}, False),
        (".spec.nodeOverrides[]", {"nodeNames": ["x"]}, False),
        (".spec.nodeOverrides[].nodeSelector.matchExpressions[]", {"key": "a", "operator": "In",
                                                                    "values": ["x"]}, True),
        (".spec.nodeOverrides[].nodeSelector.matchExpressions[]", {"key": "a", "operator": "NotIn"}, False),
        (".spec.nodeOverrides[].nodeSelector.matchExpressions[]", {"key": "a", "operator": "Exists"}, True),
        (".spec.nodeOverrides[].nodeSelector.matchExpressions[]", {"key": "a", "operator": "Exists",
                                                                    "values": ["x"]}, False),
        (".spec", {"targets": {"nodeConfig": {"namespace": "kube-system"}},
                   "devicePlugin": {"namespace": "kube-system"}}, True),
        (".spec", {"targets": {"nodeConfig": {"namespace": "gpu"}},
                   "devicePlugin": {"namespace": "kube-system"}}, False),
    ],
)
def test_cel_rules(path: str, obj: dict[str, Any], allowed: bool) -> None:
    assert _allowed(path, obj) is allowed
