"""Render the chart with the real `helm` binary: shared by the chart tests and bench/chart_bench.py.

A *profile* is a named set of values; `PROFILES` lists the default install, every documented
toggle on its own, and a "full" profile with everything switched on at once.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support.k8s_tools import ensure_tools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "vgpu-operator"
CRD_FILE = ROOT / "crds" / "vgpu.io_vgpupolicies.yaml"
RELEASE = "vgpu"
NAMESPACE = "vgpu-system"
OPERATOR_SA = f"{RELEASE}-vgpu-operator"  # what the chart names the operator's and plugin's accounts
PLUGIN_SA = f"{RELEASE}-vgpu-operator-device-plugin"

Values = Mapping[str, Any]

# Prometheus Operator kinds: kubernetes-validate has no schema for them and we do not vendor the
# operator's CRDs; test_monitoring.py checks what they point at instead.
UNCHECKED_KINDS = frozenset({"ServiceMonitor", "PrometheusRule"})

# One profile per documented toggle (README "Toggles"), plus the default and everything at once.
PROFILES: dict[str, Values] = {
    "default": {},
    "ha": {"operator": {"ha": {"enabled": True}}},
    "adopt": {"devicePlugin": {"enabled": False}},
    "privileged-plugin": {"devicePlugin": {"privileged": True, "runtimeClassName": "nvidia"}},
    "no-monitor": {"devicePlugin": {"monitor": {"enabled": False}}},
    "mock-gpus": {"devicePlugin": {"mockGpus": "2xA100-80GB"}},
    "no-policy": {"policy": {"create": False}},
    "no-metrics-service": {"metrics": {"service": {"enabled": False}}},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    # The alerts read the ServiceMonitor's jobs: the chart refuses the rule without it.
    "prometheus-rule": {"metrics": {"prometheusRule": {"enabled": True},
                                    "serviceMonitor": {"enabled": True}}},
    "no-dashboard": {"metrics": {"grafanaDashboard": {"enabled": False}}},
    "verbose": {"operator": {"verbose": True}},
    "unmanaged-crd": {"operator": {"manageCRD": False}},
    "no-admission-policy": {"admissionPolicy": {"enabled": False}},
    "no-network-policy": {"metrics": {"networkPolicy": {"enabled": False}}},
    "full": {
        "commonLabels": {"team": "gpu-platform"},
        "imagePullSecrets": ["registry-cred"],
        "operator": {"ha": {"enabled": True}, "verbose": True, "priorityClassName": "system-cluster-critical",
                     "podAnnotations": {"example.com/owner": "gpu"}, "extraArgs": ["--resync=30"]},
        "devicePlugin": {"runtimeClassName": "nvidia", "mockGpus": "1xA100-40GB,1xT4",
                         "extraArgs": ["--no-handshake"], "allowDisableControl": True,
                         "criticalPriorityQuota": False,
                         "podAnnotations": {"example.com/owner": "gpu"}},
        "policy": {"spec": {"device": {"deviceSplitCount": 4, "deviceMemoryScaling": 1.5},
                            "driftPolicy": "Report",
                            "nodeOverrides": [{"nodeNames": ["gpu-a100-1"], "deviceSplitCount": 2}]}},
        "metrics": {"serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}},
                    "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
                    "grafanaDashboard": {"namespace": "monitoring"},
                    "networkPolicy": {"from": [
                        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
                        {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]}},
    },
}


class HelmError(RuntimeError):
    """helm exited non-zero; the message is its stderr."""


def helm() -> Path:
    return ensure_tools()["helm"]


def run_helm(*args: str, values: Values | None = None) -> str:
    """Run helm with `values` (if given) in a file; return stdout or raise HelmError(stderr)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(dict(values or {}), f)
        f.flush()
        values_args = [] if values is None else ["-f", f.name]
        proc = subprocess.run([str(helm()), *args, *values_args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip())
    return proc.stdout


def template(values: Values | None = None, *, include_crds: bool = False) -> str:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    if include_crds:
        args.append("--include-crds")
    return run_helm(*args, values=values or {})


def objects(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def render(values: Values | None = None, *, include_crds: bool = False) -> list[dict[str, Any]]:
    return objects(template(values, include_crds=include_crds))


def by_name(objs: Iterable[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """The objects of `kind`, by name."""
    return {o["metadata"]["name"]: o for o in of_kind(objs, kind)}


def of_kind(objs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def crd_schema(crd: Mapping[str, Any]) -> dict[str, Any]:
    """The openAPIV3Schema of a CRD's storage version."""
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def instance_schema(crd: Mapping[str, Any]) -> dict[str, Any]:
    """JSON Schema for one object of a CRD's kind: the closed spec schema plus the fields the API
    server adds to every kind's root."""
    schema: dict[str, Any] = to_json_schema(crd_schema(crd))
    schema["properties"] = {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                            "metadata": {"type": "object"}, **schema.get("properties", {})}
    return schema


def to_json_schema(schema: Any) -> Any:
    """Turn a CRD's OpenAPI v3 schema into a JSON Schema for values-time checks.

    The API server prunes unknown fields silently (a typo is lost, not refused), so every object
    with `properties` becomes closed (additionalProperties: false) unless it preserves unknown
    fields; Kubernetes-only keywords (CEL, list types) are dropped, `nullable` becomes a null type
    and OpenAPI 3.0's boolean exclusive bounds become JSON Schema's numeric ones.
    """
    if isinstance(schema, list):
        return [to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: to_json_schema(v) for k, v in schema.items()
           if not k.startswith("x-kubernetes-") and k != "nullable"}
    if "properties" in out:
        out["properties"] = {k: to_json_schema(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in schema:
            out["additionalProperties"] = False
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    # OpenAPI 3.0 spells an exclusive bound as a flag beside minimum/maximum; JSON Schema as the bound.
    for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(flag), bool) and out.pop(flag):
            out[flag] = out.pop(bound)
    return out
