"""Fixtures for the vgpuctl tests: the fixture cluster as plain objects."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from vgpuctl.manifests import load_objects, of_kind

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CLUSTER = FIXTURES / "cluster"
SEED001 = FIXTURES / "scenarios" / "seed001-resource-name-mismatch.yaml"


@pytest.fixture(scope="session")
def _cluster_objects() -> list[dict[str, Any]]:
    return load_objects([CLUSTER])


@pytest.fixture
def cluster_objects(_cluster_objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A fresh deep copy per test: tests may edit it."""
    return copy.deepcopy(_cluster_objects)


@pytest.fixture
def nodes(cluster_objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return of_kind(cluster_objects, "Node")


@pytest.fixture
def fixture_pod(cluster_objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The fixture pod `vgpu-test` as it looks before the scheduler touched it."""
    pods = of_kind(cluster_objects, "Pod")
    pod = copy.deepcopy(next(p for p in pods if p["metadata"]["name"] == "vgpu-test"))
    pod["metadata"]["annotations"] = {
        k: v for k, v in pod["metadata"]["annotations"].items() if not k.startswith("volcano.sh/")
    }
    pod["spec"].pop("nodeName", None)
    return pod


# The fixture cluster with vGPU enabled the way the seeds document it: deviceshare with
# VGPUEnable and an explicit KnownGeometriesCMNamespace. Everything else as in tests/fixtures.
HEALTHY_SCHEDULER_CONF = """\
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
    enablePreemptable: false
  - name: conformance
- plugins:
  - name: drf
    enablePreemptable: false
  - name: deviceshare
    arguments:
      deviceshare.VGPUEnable: true
      deviceshare.KnownGeometriesCMNamespace: kube-system
  - name: predicates
  - name: capacity-card
    arguments:
      cardUnlimitedCpuMemory: true
  - name: nodeorder
  - name: binpack
"""


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


@pytest.fixture
def healthy(cluster_objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    conf = find(cluster_objects, "ConfigMap", "volcano-scheduler-configmap")
    conf["data"]["volcano-scheduler.conf"] = HEALTHY_SCHEDULER_CONF
    return cluster_objects


def unreachable_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig whose API server is a closed port: reading it proves the file was used."""
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    return config
