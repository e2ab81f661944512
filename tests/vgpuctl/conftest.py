"""Fixtures for the vgpuctl tests: the fixture cluster as plain objects."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
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
