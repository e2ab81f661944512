"""YAML parsing of ConfigMap texts, and the one rule for reading manifests that hold a List.

libyaml's C loader when PyYAML was built with it (the same safe constructor, several times
faster), and a small cache keyed by the text: one reconcile reads the same device-config and
scheduler conf several times (validation, each renderer), and they rarely change between
reconciles. Callers get a fresh copy, so they may change what they got.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import yaml

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=16)
def _load(text: str) -> Any:
    return yaml.load(text, Loader=_LOADER)


def load(text: str) -> Any:
    """`yaml.safe_load(text)`; raises `yaml.YAMLError` the same way."""
    return copy.deepcopy(_load(text))


def clear_cache() -> None:
    """Forget every parsed text (benchmarks measure the cold path with it)."""
    _load.cache_clear()


def list_items(doc: Any) -> list[Any] | None:
    """The objects of a `kind: List` document (`kubectl get -o yaml` writes one, and so do
    `PodList`, `ConfigMapList`, ...); None for any other document."""
    if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List"):
        items = doc.get("items")
        if isinstance(items, list):
            return items
    return None
