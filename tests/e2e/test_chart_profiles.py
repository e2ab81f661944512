"""Every chart profile (tests/charts/chart.py: the default install, each documented toggle, all of
them at once) is accepted by a real API server, on the current and the oldest release the chart
claims. The chart tests check the same objects against published schemas; only a server runs
the CRD's own validation rules, its defaulting and the admission chain, a real
server refused the chart's CRD once, so that `helm install` failed on every cluster.

A server-side dry run: the server validates and admits each object as it would store it and
stores nothing. The Prometheus Operator's kinds are left out (no CRDs for them here, as
test_render.py says)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.charts import chart

from .cluster import Cluster

RELEASE = "profiles"
NAMESPACE = "vgpu-e2e-profiles"


def _rendered(profile: str) -> list[dict[str, Any]]:
    manifest = chart.run_helm("template", RELEASE, str(chart.CHART), "--namespace", NAMESPACE,
                              "--include-crds", values=chart.PROFILES[profile])
    return [o for o in chart.objects(manifest) if o["kind"] not in chart.UNCHECKED_KINDS]


def _with_crds(cluster: Cluster, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chart's CRDs (crds/: the VGPUPolicy's and kopf's peering, which the HA profile uses)
    applied for real, as `helm install` does before the templates; the other objects."""
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    assert {c["metadata"]["name"] for c in crds} >= {"vgpupolicies.vgpu.io"}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": crds}))
    for crd in crds:
        cluster.wait_established(crd["metadata"]["name"])
    return [o for o in objects if o["kind"] != "CustomResourceDefinition"]


def _key(obj: dict[str, Any]) -> str:
    """kind/namespace/name: a Role and its RoleBinding share a name in each namespace."""
    return f"{obj['kind']}/{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


def _dry_run(cluster: Cluster, objects: list[dict[str, Any]]) -> list[str]:
    """Each object as the server answers it (`_key`), or the server's refusal for the whole list."""
    for namespace in sorted({o["metadata"]["namespace"] for o in objects if "namespace" in o["metadata"]}):
        cluster.ensure_namespace(namespace)
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    applied = cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                              stdin=manifest, check=False)
    assert applied.returncode == 0, applied.stderr
    answered = json.loads(applied.stdout)
    items = answered["items"] if answered.get("kind") == "List" else [answered]
    return [_key(o) for o in items]


@pytest.mark.parametrize("profile", list(chart.PROFILES))
def test_every_profile_is_accepted_by_a_real_server(crd_server: Cluster, profile: str) -> None:
    objects = _with_crds(crd_server, _rendered(profile))
    answered = _dry_run(crd_server, objects)
    # Every object came back from the server, none dropped on the way (kubectl answers a List
    # for several documents), each where the chart put it.
    assert sorted(answered) == sorted(_key(o) for o in objects)


def test_a_profile_the_server_refuses_fails_here(crd_server: Cluster) -> None:
    """The check above can fail: a policy that breaks one of the CRD's CEL rules (which only a
    server evaluates) is refused by the dry run, the message naming the rule."""
    objects = _with_crds(crd_server, _rendered("default"))
    policy = next(o for o in objects if o["kind"] == "VGPUPolicy")
    policy["spec"]["resources"] = {"count": "volcano.sh/vgpu-number", "memory": "volcano.sh/vgpu-number"}
    with pytest.raises(AssertionError, match="three different resource names"):
        _dry_run(crd_server, objects)
