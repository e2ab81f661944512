"""`make krew`: the krew plugin archive (dist/kubectl-vgpu.zip) and its manifest (plugins/krew/vgpu.yaml).

The archive holds one file, a `kubectl-vgpu` launcher that runs vgpuctl from the vgpu-operator
Python package; the package itself (pydantic and grpcio are compiled) is installed with pip, as
the manifest's caveats say. The zip is stored, not deflated, with fixed times and modes, so the
same launcher gives the same bytes on any machine and the sha256 in the committed manifest can be
checked by rebuilding it (tests/vgpuctl/test_packaging.py).

Until a release carries the archive at `uri`, install from a checkout:
`kubectl krew install --manifest=plugins/krew/vgpu.yaml --archive=dist/kubectl-vgpu.zip`.

The module ships in the package: run from an installed wheel (`python -m vgpuctl.krew`), it takes
the version from the installed package and needs `--dist` and `--manifest`; only in a checkout do
they default to its dist/ and plugins/krew/vgpu.yaml.
"""

from __future__ import annotations

import argparse
import hashlib
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import yaml
from vgpu_formats import cli

ARCHIVE = "kubectl-vgpu.zip"
LAUNCHER = "kubectl-vgpu"
# The project's home, as charts/vgpu-operator/Chart.yaml names it.
HOME = "https://github.com/vgpu-operator/vgpu-operator"

LAUNCHER_TEXT = """\
#!/bin/sh
# kubectl-vgpu as krew installs it: `kubectl vgpu` runs vgpuctl from the vgpu-operator Python
# package (Python 3.11+), found in $VGPUCTL_PYTHON, python3 or python.
for python in "${VGPUCTL_PYTHON:-python3}" python3 python; do
  if "$python" -c 'import vgpuctl.main' >/dev/null 2>&1; then
    exec "$python" -c 'import sys; from vgpuctl.main import main; sys.argv[0] = "kubectl-vgpu"; \
sys.exit(main())' "$@"
  fi
done
echo "kubectl vgpu: no Python with the vgpu-operator package: pip install it (pip install . in its \
source tree), or set VGPUCTL_PYTHON to the python that has it" >&2
exit 2
"""

# 1980-01-01, the earliest time a zip entry can carry; any fixed time makes the bytes stable.
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
UNIX = 3  # zip "created on" system: Unix, so unzip and krew honour the mode bits


def version() -> str:
    """The plugin version: the installed package's (pyproject.toml's), as a krew `v`-prefixed semver."""
    return "v" + cli.version()


def checkout() -> Path | None:
    """The source tree this module runs from, or None: an installed wheel has none."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "plugins" / "krew").is_dir() else None


def build_archive(target: Path) -> str:
    """Write the archive to `target`; return its sha256."""
    entry = zipfile.ZipInfo(LAUNCHER, date_time=FIXED_TIME)
    entry.create_system = UNIX
    entry.external_attr = 0o100755 << 16  # a regular file, executable
    entry.compress_type = zipfile.ZIP_STORED
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w") as archive:
        archive.writestr(entry, LAUNCHER_TEXT)
    return hashlib.sha256(target.read_bytes()).hexdigest()


def manifest(sha256: str, plugin_version: str) -> dict[str, Any]:
    """The krew Plugin object for the archive with this sha256."""
    return {
        "apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
        "kind": "Plugin",
        "metadata": {"name": "vgpu"},
        "spec": {
            "version": plugin_version,
            "homepage": HOME,
            "shortDescription": "Explain, diff and adopt Volcano + HAMi vGPU configuration",
            "description": _block(
                "kubectl vgpu (vgpuctl) reads a cluster, read-only, and explains its Volcano + HAMi vGPU "
                "configuration: doctor finds every inconsistency across the device-config, the device "
                "plugin's flags, the scheduler conf and node-config, and why a pod failed with "
                "UnexpectedAdmissionError; import writes an equivalent VGPUPolicy; render and diff show "
                "what the vgpu-operator would change."),
            "caveats": _block(
                "kubectl vgpu needs Python 3.11+ with the vgpu-operator package installed (pip install . "
                "in its source tree); set VGPUCTL_PYTHON to that python if it is not python3 on the PATH."),
            "platforms": [{
                "selector": {"matchExpressions": [
                    {"key": "os", "operator": "In", "values": ["linux", "darwin"]}]},
                "uri": f"{HOME}/releases/download/{plugin_version}/{ARCHIVE}",
                "sha256": sha256,
                "bin": LAUNCHER,
                "files": [{"from": LAUNCHER, "to": "."}],
            }],
        },
    }


def _block(text: str) -> str:
    return textwrap.fill(text, 90) + "\n"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as `|` blocks, the way krew-index manifests are written."""


_Dumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def write(dist: Path, manifest_path: Path) -> str:
    """Build the archive into `dist` and write the manifest; return the manifest's text."""
    sha256 = build_archive(dist / ARCHIVE)
    text = (f"# Generated by `make krew` (operator/vgpuctl/krew.py): sha256 of dist/{ARCHIVE}.\n"
            + yaml.dump(manifest(sha256, version()), Dumper=_Dumper, sort_keys=False, width=100))
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(text, encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> None:
    root = checkout()
    parser = argparse.ArgumentParser(prog="python -m vgpuctl.krew", description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, required=root is None, default=root / "dist" if root else None,
                        help="folder the archive is written to (a checkout's dist/)")
    parser.add_argument("--manifest", type=Path, required=root is None,
                        default=root / "plugins" / "krew" / "vgpu.yaml" if root else None,
                        help="the krew manifest to write (a checkout's plugins/krew/vgpu.yaml)")
    args = parser.parse_args(argv)
    write(args.dist, args.manifest)
    print(f"wrote {args.dist / ARCHIVE} and {args.manifest}")


if __name__ == "__main__":
    main()
