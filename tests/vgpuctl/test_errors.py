"""Flags and errors as a user meets them: one line `vgpuctl <command>: <problem>`, exit code 2.

A few run the installed `vgpuctl` in a subprocess (the console script, its argv[0] and exit code);
the rest call `main` in-process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from vgpu_formats.cli import version
from vgpuctl.facts import gather
from vgpuctl.importer import import_policy
from vgpuctl.main import build_parser, main

from .conftest import CLUSTER, SEED001, unreachable_kubeconfig

BIN = Path(sys.executable).parent


def _run(*argv: str, program: str = "vgpuctl",
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / program), *argv], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent-home", **(env or {})})


@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["diff", "-f", "nope.yaml"], {}, "vgpuctl diff: nope.yaml: no such file or directory"),
    (["doctor", "--kubeconfig", "/nonexistent"], {},
     "vgpuctl doctor: --kubeconfig /nonexistent: no such file"),
    (["doctor"], {"KUBECONFIG": "/nonexistent"},
     "vgpuctl doctor: $KUBECONFIG=/nonexistent: no such file; set it to a kubeconfig or unset it"),
    (["import", "-o", "table"], {}, "vgpuctl import: argument -o/--output: invalid choice: 'table'"),
])
def test_installed_command_says_the_problem_in_one_line(argv, env, expected):
    result = _run(*argv, env=env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(expected) and result.stderr.count("\n") == 1, result.stderr


def test_version_and_help_of_both_names():
    assert _run("--version").stdout == f"vgpuctl {version()}\n"
    assert _run("--version", program="kubectl-vgpu").stdout == f"kubectl vgpu {version()}\n"
    demo = _run("demo", "--help")
    assert demo.returncode == 0 and "--no-hook" in demo.stdout and "--log-level" in demo.stdout


def test_an_empty_manifest_directory_is_not_an_empty_cluster(capsys, tmp_path):
    assert main(["doctor", "-c", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"vgpuctl doctor: no manifests found in {tmp_path} "
                                       f"(no .yaml, .yml, .json files)\n")


def test_common_flags_before_or_after_the_command():
    parse = build_parser().parse_args
    assert parse(["doctor"]).log_level == "warning"
    assert parse(["doctor", "-v"]).log_level == "debug"
    assert parse(["--log-level", "error", "doctor"]).log_level == "error"  # not reset by doctor's flags
    assert parse(["doctor", "--log-format", "json"]).log_format == "json"
    args = parse(["doctor", "-f", "a", "--cluster-dir", "b", "--filename", "c", "-c", "d"])
    assert args.sources == ["a", "b", "c", "d"]  # one meaning, four spellings, in order


def test_kubeconfig_problems_name_the_fix(capsys, tmp_path, monkeypatch):
    config = unreachable_kubeconfig(tmp_path)
    assert main(["doctor", "--kubeconfig", str(config), "--context", "nope"]) == 2
    assert capsys.readouterr().err == (f"vgpuctl doctor: kubeconfig {config}: no context named 'nope'; "
                                       f"it has: x (or read manifests instead of a cluster with -f PATH)\n")
    bare = yaml.safe_load(config.read_text())
    del bare["current-context"]
    config.write_text(yaml.safe_dump(bare))
    assert main(["import", "--kubeconfig", str(config)]) == 2
    assert "no current-context; run `kubectl config use-context NAME` or pass --context NAME" \
        in capsys.readouterr().err
    # $KUBECONFIG is the file read when --kubeconfig is not given
    monkeypatch.setenv("KUBECONFIG", str(unreachable_kubeconfig(tmp_path)))
    assert main(["doctor"]) == 2
    assert "cannot reach the API server http://127.0.0.1:9" in capsys.readouterr().err


def test_render_reads_a_cluster_only_when_asked(capsys, tmp_path, monkeypatch, healthy):
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(import_policy(gather(healthy)).policy))
    monkeypatch.setenv("KUBECONFIG", str(unreachable_kubeconfig(tmp_path)))
    assert main(["render", "--policy", str(policy), "-o", "json"]) == 0  # offline: $KUBECONFIG unread
    assert "no cluster given" in capsys.readouterr().err
    assert main(["render", "--policy", str(policy), "--context", "x"]) == 2
    assert "cannot reach the API server" in capsys.readouterr().err


def test_the_policy_among_the_manifests_or_named(capsys, tmp_path, healthy):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump_all(healthy))
    assert main(["diff", "-f", str(cluster)]) == 2
    assert capsys.readouterr().err == ("vgpuctl diff: no VGPUPolicy in the manifests given with -f: pass one "
                                       "with --policy FILE (`vgpuctl import` writes one)\n")
    policy = import_policy(gather(healthy)).policy
    both = tmp_path / "both.yaml"
    both.write_text(yaml.safe_dump_all([*healthy, policy]))
    assert main(["diff", "-f", str(both), "--no-color"]) == 0  # the policy found among the manifests
    assert capsys.readouterr().out == "vgpuctl diff: nothing to change\n"
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(yaml.safe_dump(policy))
    second.write_text(yaml.safe_dump(policy))
    assert main(["render", "-f", str(first), "-f", str(second)]) == 2
    assert "each hold only a VGPUPolicy: pass the one to render with --policy" in capsys.readouterr().err
    policy["spec"]["device"]["deviceSplitCount"] = "ten"
    first.write_text(yaml.safe_dump(policy))
    assert main(["diff", "--policy", str(first), "-c", str(CLUSTER), "-c", str(SEED001)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vgpuctl diff: {first} is not a valid VGPUPolicy: spec.device.deviceSplitCount")
    assert err.count("\n") == 1


def test_an_offline_render_without_a_policy_says_it_read_no_cluster(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert main(["render"]) == 2
    assert capsys.readouterr().err == ("vgpuctl render: no VGPUPolicy given: pass --policy FILE (render "
                                       "reads a cluster only with -f, --kubeconfig or --context)\n")


def test_a_policy_file_taken_from_f_is_named_when_the_cluster_cannot_be_read(capsys, tmp_path, monkeypatch):
    # `vgpuctl diff -f policy.yaml` with no cluster: the user passed -f, so the error says what it did.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: vgpu.io/v1alpha1\nkind: VGPUPolicy\nmetadata: {name: default}\nspec: {}\n")
    assert main(["diff", "-f", str(policy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vgpuctl diff: no kubeconfig: pass --kubeconfig PATH or set $KUBECONFIG")
    assert f"({policy} holds only a VGPUPolicy, taken as --policy; or read manifests instead of a cluster " \
           "with -f PATH)" in err


@pytest.mark.parametrize(("command", "text", "problem"), [
    ("doctor", "kind: ConfigMap\n"
     "metadata: {name: volcano-vgpu-device-config, namespace: kube-system}\ndata: 5\n",
     "ConfigMap kube-system/volcano-vgpu-device-config: `data` is a number, expected a mapping"),
    ("doctor", "kind: ConfigMap\nmetadata: {name: c, namespace: kube-system}\ndata: {a: [1]}\n",
     "ConfigMap kube-system/c: `data.a` is a list, expected a string"),
    ("import", "kind: DaemonSet\nmetadata: {name: p, namespace: kube-system}\n"
     "spec: {template: {spec: {containers: 5}}}\n",
     "DaemonSet kube-system/p: `spec.template.spec.containers` is a number, expected a list"),
    ("diff", "kind: Deployment\nmetadata: {name: s}\n"
     "spec: {template: {spec: {containers: [{name: a, args: x}]}}}\n",
     "Deployment s: `spec.template.spec.containers[0].args` is a string, expected a list"),
    ("doctor", "kind: Node\nmetadata: [1]\n", "Node (no name): `metadata` is a list, expected a mapping"),
])
def test_a_malformed_object_in_a_manifest_is_named_not_a_traceback(
        capsys, tmp_path, command, text, problem):
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(text)
    assert main([command, "-f", str(manifest)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vgpuctl {command}: {manifest}: {problem}; fix the manifest")
    assert "Traceback" not in err
