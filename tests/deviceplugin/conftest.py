"""Fixtures: an in-memory KubeClient fake, plugin flags in a short temp dir."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from vgpu_deviceplugin.config import Flags

from tests.deviceplugin.kit import FIXTURE_NODE, FakeKube


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Unix socket paths are limited to ~107 bytes: keep the folder short.
    with tempfile.TemporaryDirectory(prefix="dp-", dir="/tmp") as folder:
        yield Path(folder)


@pytest.fixture
def flags(plugin_dir: Path, tmp_path: Path) -> Flags:
    return Flags(
        node_name=FIXTURE_NODE,
        device_plugin_dir=str(plugin_dir),
        hook_path="/usr/local/vgpu",
        cache_root=str(tmp_path / "vgpu"),
        register_interval=30.0,
    )
