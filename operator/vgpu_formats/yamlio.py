"""YAML parsing of ConfigMap texts.

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
