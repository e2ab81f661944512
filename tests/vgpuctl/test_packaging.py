"""What ships around the CLI: shell completion, the krew plugin, the demo's dependencies."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from vgpu_formats.cli import version
from vgpuctl import krew
from vgpuctl.completion import script
from vgpuctl.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]

# Completes a command line in bash as readline would: the words so far, the cursor on the last.
COMPLETE = """
complete -p vgpuctl kubectl-vgpu
t() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _vgpuctl; echo "$*=${COMPREPLY[*]}"; }
t vgpuctl d
t kubectl-vgpu d
t vgpuctl import -o ''
t vgpuctl --log-level debug render -o ''
t vgpuctl diff --po
t vgpuctl completion ''
t vgpuctl doctor -f %s/exampl
"""


def test_bash_completion_knows_commands_flags_and_choices():
    text = script(build_parser(), "bash") + COMPLETE % ROOT
    result = subprocess.run(["bash", "--norc", "-c", text], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.splitlines() == [
        "complete -F _vgpuctl vgpuctl",
        "complete -F _vgpuctl kubectl-vgpu",
        "vgpuctl d=diff doctor demo",
        "kubectl-vgpu d=diff doctor demo",
        "vgpuctl import -o =yaml json",  # no table for a policy
        "vgpuctl --log-level debug render -o =table json yaml",
        "vgpuctl diff --po=--policy",
        "vgpuctl completion =-h --help --version --log-level --log-format --verbose -v bash zsh",
        f"vgpuctl doctor -f {ROOT}/exampl={ROOT}/examples",
    ]


def test_completion_command_prints_both_shells(capsys):
    assert main(["completion", "zsh"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#compdef vgpuctl kubectl-vgpu\n") and "bashcompinit" in out
    assert main(["completion", "bash"]) == 0
    assert capsys.readouterr().out.endswith("complete -F _vgpuctl vgpuctl kubectl-vgpu\n")


def test_krew_manifest_matches_the_archive_it_describes(tmp_path):
    manifest = yaml.safe_load((ROOT / "plugins" / "krew" / "vgpu.yaml").read_text())
    assert manifest == krew.manifest(manifest["spec"]["platforms"][0]["sha256"], krew.version())
    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert manifest["kind"] == "Plugin" and manifest["metadata"]["name"] == "vgpu"
    with (ROOT / "pyproject.toml").open("rb") as handle:
        assert manifest["spec"]["version"] == "v" + tomllib.load(handle)["project"]["version"]
    archive = tmp_path / krew.ARCHIVE
    sha256 = krew.build_archive(archive)
    assert sha256 == hashlib.sha256(archive.read_bytes()).hexdigest()
    platform = manifest["spec"]["platforms"][0]
    assert platform["sha256"] == sha256, "the launcher changed: run `make krew` and commit the manifest"
    assert platform["uri"].endswith(f"/releases/download/{manifest['spec']['version']}/{krew.ARCHIVE}")
    assert platform["bin"] == "kubectl-vgpu" and platform["files"] == [{"from": "kubectl-vgpu", "to": "."}]


def test_krew_launcher_runs_vgpuctl_or_says_what_is_missing(tmp_path):
    krew.build_archive(tmp_path / krew.ARCHIVE)
    with zipfile.ZipFile(tmp_path / krew.ARCHIVE) as archive:
        assert archive.namelist() == ["kubectl-vgpu"]
        assert archive.getinfo("kubectl-vgpu").external_attr >> 16 == 0o100755
        archive.extractall(tmp_path)
    launcher = tmp_path / "kubectl-vgpu"
    launcher.chmod(0o755)  # zipfile does not restore modes; krew does (the mode is in the archive)
    found = subprocess.run([str(launcher), "--version"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "VGPUCTL_PYTHON": sys.executable})
    assert found.stdout == f"kubectl vgpu {version()}\n"
    missing = subprocess.run([str(launcher), "doctor"], capture_output=True, text=True, timeout=60,
                             env={"PATH": str(tmp_path), "VGPUCTL_PYTHON": "/nonexistent/python"})
    assert missing.returncode == 2 and missing.stderr.startswith("kubectl vgpu: no Python with the "
                                                                 "vgpu-operator package")


def test_krew_outside_a_checkout_needs_its_paths_and_writes_the_same_manifest(tmp_path, monkeypatch, capsys):
    assert krew.checkout() == ROOT
    monkeypatch.setattr(krew, "checkout", lambda: None)  # as from an installed wheel
    with pytest.raises(SystemExit) as exited:
        krew.main([])
    assert exited.value.code == 2 and "--dist" in capsys.readouterr().err
    krew.main(["--dist", str(tmp_path / "dist"), "--manifest", str(tmp_path / "vgpu.yaml")])
    assert (tmp_path / "vgpu.yaml").read_text() == (ROOT / "plugins" / "krew" / "vgpu.yaml").read_text()


def test_the_demo_needs_no_extra():
    with (ROOT / "pyproject.toml").open("rb") as handle:
        project = tomllib.load(handle)["project"]
    assert any(dep.startswith("kmock") for dep in project["dependencies"])
