"""Shared fixtures of the operator core suite: the fixture cluster as manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def load_docs(*paths: Path) -> list[dict[str, Any]]:
    """All YAML documents of `paths`, later documents replacing earlier ones of the same object."""
    by_key: dict[tuple[str, str, str], dict[str, Any]] = {}
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            meta = doc.get("metadata", {})
            by_key[(doc["kind"], meta.get("namespace", ""), meta["name"])] = doc
    return list(by_key.values())


@pytest.fixture
def cluster_docs() -> list[dict[str, Any]]:
    return load_docs(*sorted((FIXTURES / "cluster").glob("*.yaml")))


@pytest.fixture
def seed001_docs() -> list[dict[str, Any]]:
    return load_docs(*sorted((FIXTURES / "cluster").glob("*.yaml")),
                     FIXTURES / "scenarios" / "seed001-resource-name-mismatch.yaml")
