"""`pip install .` from a clean clone: the wheel must carry the gRPC stubs, which are generated
(never committed), made by the pinned grpcio-tools that pyproject.toml's runtime floors match."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUBS = ("deviceplugin_pb2.py", "deviceplugin_pb2.pyi", "deviceplugin_pb2_grpc.py")


def _clean_copy(dest: Path) -> Path:
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    for folder in ("operator", "deviceplugin"):
        shutil.copytree(ROOT / folder, dest / folder,
                        ignore=shutil.ignore_patterns("*_pb2*", "__pycache__", "*.egg-info"))
    return dest


@pytest.mark.timeout(300)
def test_a_wheel_built_from_a_clean_tree_carries_the_stubs(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    source = _clean_copy(tmp_path / "src")
    assert not list(source.rglob("*_pb2*.py")), "the copy starts without stubs, as a clone does"
    dist = tmp_path / "dist"
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = dist.glob("vgpu_operator-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert {f"vgpu_deviceplugin/api/{stub}" for stub in STUBS} <= names
        grpc_stub = archive.read("vgpu_deviceplugin/api/deviceplugin_pb2_grpc.py").decode()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (tools_pin,) = [r for r in project["build-system"]["requires"] if r.startswith("grpcio-tools")]
    pinned = tools_pin.split("==")[1]
    generated = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", grpc_stub)
    assert generated and generated.group(1) == pinned
    # The stubs refuse to import on an older grpcio: the runtime floor is the generator's version.
    assert f"grpcio>={pinned}" in project["project"]["dependencies"]
