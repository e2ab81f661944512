"""The commands as a user runs them: files in, text out, exit codes."""

from __future__ import annotations

import asyncio
import json

import yaml
from vgpu_emulator import run_emulator
from vgpuctl.main import main
from vgpuctl.output import Style, table

from .conftest import CLUSTER, SEED001, unreachable_kubeconfig

SEED = ["-c", str(CLUSTER), "-c", str(SEED001)]


def _import(capsys, tmp_path, *sources: str):
    assert main(["import", *sources]) == 0
    captured = capsys.readouterr()
    path = tmp_path / "policy.yaml"
    path.write_text(captured.out)
    return path, captured


def test_import_writes_an_appliable_policy_with_notes(capsys, tmp_path):
    path, captured = _import(capsys, tmp_path, *SEED)
    policy = yaml.safe_load(path.read_text())
    assert policy["kind"] == "VGPUPolicy" and policy["spec"]["resources"]["count"] == "nvidia.com/gpu"
    assert "# note: the device plugin registers volcano.sh/vgpu-number" in captured.out
    assert "warning: the device plugin registers volcano.sh/vgpu-number" in captured.err


def test_render_with_and_without_a_cluster(capsys, tmp_path):
    path, _ = _import(capsys, tmp_path, *SEED)
    assert main(["render", "-f", str(path), *SEED]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("ConfigMap", "volcano-vgpu-device-config"), ("ConfigMap", "volcano-vgpu-node-config"),
        ("ConfigMap", "volcano-scheduler-configmap"), ("Deployment", "volcano-scheduler"),
        ("DaemonSet", "volcano-device-plugin")]
    args = docs[4]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--resource-name=nvidia.com/gpu" in args
    assert main(["render", "--policy", str(path), "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert [d["metadata"]["name"] for d in json.loads(captured.out)] == [
        "volcano-vgpu-device-config", "volcano-vgpu-node-config"]
    assert "no cluster given" in captured.err
    # Offline, the two ConfigMaps are what the operator would create, not "blocked" by the
    # workloads it cannot see.
    assert main(["render", "--policy", str(path), "-o", "table", "--no-color"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:] if line.strip()]
    assert [(row[1], row[2]) for row in rows] == [
        ("kube-system/volcano-vgpu-device-config", "create"),
        ("kube-system/volcano-vgpu-node-config", "create")]


def test_diff_shows_unified_diffs_and_refuses_an_invalid_policy(capsys, tmp_path):
    path, _ = _import(capsys, tmp_path, *SEED)
    assert main(["diff", "-f", str(path), *SEED, "--no-color"]) == 1
    out = capsys.readouterr().out
    assert "--- live/DaemonSet kube-system/volcano-device-plugin" in out
    assert "+        - --resource-name=nvidia.com/gpu" in out
    assert "+          deviceshare.KnownGeometriesCMNamespace: kube-system" in out
    policy = yaml.safe_load(path.read_text())
    policy["spec"]["scheduler"]["namespace"] = "nowhere"
    path.write_text(yaml.safe_dump(policy))
    assert main(["diff", "-f", str(path), *SEED]) == 1
    captured = capsys.readouterr()
    assert "SchedulerConfigMapNotFound" in captured.err and "would write nothing" in captured.err
    assert captured.out == ""
    policy["spec"]["device"]["deviceSplitCount"] = "ten"
    path.write_text(yaml.safe_dump(policy))
    assert main(["diff", "-f", str(path), *SEED]) == 2
    assert "spec.device.deviceSplitCount" in capsys.readouterr().err


def test_import_then_diff_is_empty_on_a_healthy_cluster(capsys, tmp_path, healthy):
    """The adoption round trip as a user types it: import, then diff against the same manifests."""
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    (cluster / "all.yaml").write_text(yaml.safe_dump_all(healthy))
    assert main(["doctor", "-c", str(cluster), "-o", "json"]) == 0
    capsys.readouterr()
    path, _ = _import(capsys, tmp_path, "-c", str(cluster))
    assert main(["diff", "--policy", str(path), "-f", str(cluster), "--no-color"]) == 0
    assert capsys.readouterr().out == "vgpuctl diff: nothing to change\n"


async def test_doctor_reads_a_live_cluster(capsys):
    async with run_emulator(CLUSTER, SEED001) as running:
        argv = ["doctor", "--kubeconfig", str(running.kubeconfig), "-o", "json"]
        code = await asyncio.to_thread(main, argv)
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    assert "resource-name-mismatch" in {f["code"] for f in report["findings"]}
    assert report["pods"][0]["pod"] == "volcano-system/test-vgpu-compatible"


def test_unreachable_cluster_is_a_clear_error(capsys, tmp_path):
    config = unreachable_kubeconfig(tmp_path)
    assert main(["doctor", "--kubeconfig", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vgpuctl doctor: cannot reach the API server http://127.0.0.1:9 (")
    assert err.count("\n") == 1


def test_colour_only_when_asked_or_on_a_terminal(capsys):
    rows = [["a", "error"], ["bb", "ok"]]
    plain = table(["name", "state"], rows)
    assert "\x1b[" not in plain and plain.splitlines()[1] == "a      error"
    coloured = table(["name", "state"], rows, Style(True))
    assert "\x1b[31merror\x1b[0m" in coloured and "\x1b[32mok\x1b[0m" in coloured
    assert main(["doctor", *SEED, "--color"]) == 1
    assert "\x1b[31m" in capsys.readouterr().out
    assert main(["doctor", *SEED]) == 1  # captured output is not a terminal
    assert "\x1b[" not in capsys.readouterr().out


def test_render_offline_does_not_warn_of_nodes_it_never_read(capsys, tmp_path):
    # Without a cluster no node is known: each override naming a node warned NodeNotFound.
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "vgpu.io/v1alpha1", "kind": "VGPUPolicy",
                                    "metadata": {"name": "default"},
                                    "spec": {"nodeOverrides": [{"nodeNames": ["gpu-a100-1"],
                                                                "deviceSplitCount": 2}]}}))
    assert main(["render", "--policy", str(path), "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert "NodeNotFound" not in captured.err and "no cluster given" in captured.err
    rendered = json.loads(captured.out)
    (node_config,) = [d for d in rendered if d["metadata"]["name"] == "volcano-vgpu-node-config"]
    assert "gpu-a100-1" in node_config["data"]["config.json"]
