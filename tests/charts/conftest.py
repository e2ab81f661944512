"""Fixtures of the chart suite: helm renders cached per profile for the whole session.

`helm template` takes a fraction of a second but the suite looks at each profile many times.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.charts import chart

Objects = list[dict[str, Any]]


class Renders:
    """Lazy per-profile cache of rendered objects (CRDs included)."""

    def __init__(self) -> None:
        self._cache: dict[str, Objects] = {}

    def __call__(self, profile: str) -> Objects:
        if profile not in self._cache:
            self._cache[profile] = chart.render(chart.PROFILES[profile], include_crds=True)
        return self._cache[profile]


@pytest.fixture(scope="session")
def renders() -> Renders:
    return Renders()


@pytest.fixture(scope="session")
def default_objects(renders: Renders) -> Objects:
    return renders("default")


@pytest.fixture(scope="session")
def full_objects(renders: Renders) -> Objects:
    return renders("full")
