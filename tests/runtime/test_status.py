"""The pure status: node convergence and capacity from node annotations, conditions and their times."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from vgpu_operator import api
from vgpu_operator.status import Outcome, build_status, report_node, report_nodes

ROOT = Path(__file__).resolve().parents[2]
REGISTER = "volcano.sh/node-vgpu-register"
GPU = "GPU-{i},{split},24564,NVIDIA-NVIDIA GeForce RTX 4090,true,hami-core:"


def _node(name: str, register: str | None = None, **allocatable: str) -> dict[str, Any]:
    annotations = {REGISTER: register} if register is not None else {}
    return {"metadata": {"name": name, "annotations": annotations}, "status": {"allocatable": allocatable}}


def _register(gpus: int, split: int) -> str:
    return "".join(GPU.format(i=i, split=split) for i in range(gpus))


SPEC = api.VGPUPolicySpec()


def test_converged_node_counts_its_capacity() -> None:
    report = report_node(_node("a", _register(2, 10), **{"volcano.sh/vgpu-number": "20"}), SPEC, 10)
    assert report.converged and (report.gpus, report.vgpus, report.memory_mib) == (2, 20, 2 * 24564)


def test_mismatch_reasons_name_the_fix() -> None:
    wrong_name = report_node(_node("a", _register(1, 10), **{"nvidia.com/gpu": "10"}), SPEC, 10)
    assert wrong_name.reason == "node advertises nvidia.com/gpu but policy says volcano.sh/vgpu-number"
    wrong_split = report_node(_node("a", _register(1, 10), **{"volcano.sh/vgpu-number": "10"}), SPEC, 4)
    assert wrong_split.reason.startswith("registered split 10 but policy says 4")
    unregistered = report_node(_node("a", None, **{"volcano.sh/vgpu-number": "10"}), SPEC, 10)
    assert unregistered.gpu and not unregistered.registered and "has not registered" in unregistered.reason


def test_malformed_annotation_is_reported_never_raised() -> None:
    report = report_node(_node("a", "garbage,,:", **{"volcano.sh/vgpu-number": "10"}), SPEC, 10)
    assert report.gpu and not report.registered and report.reason.startswith("unreadable register annotation")


def test_cpu_nodes_are_not_counted() -> None:
    assert report_nodes([_node("cpu", None, cpu="8")], SPEC, {}) == []


def _vgpu_and_training_nodes(plugin: dict[str, Any], labels: dict[str, str],
                             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A registered vGPU node with `labels`, and an unlabelled node of 8 whole GPUs (NVIDIA's
    plugin) that `plugin` does not run on, so is none of the policy's: checked here."""
    vgpu = _node("vgpu", _register(1, 10), **{"volcano.sh/vgpu-number": "10"})
    vgpu["metadata"]["labels"] = labels
    train = _node("train-1", None, **{"nvidia.com/gpu": "8"})
    reports = report_nodes([vgpu, train], SPEC, {}, plugin)
    assert [(r.name, r.converged) for r in reports] == [("vgpu", True)]
    return vgpu, train


def test_a_whole_gpu_pool_the_plugin_does_not_run_on_is_none_of_the_policys_nodes() -> None:
    # A training pool under NVIDIA's own plugin (nvidia.com/gpu, no register annotation) that the
    # vGPU plugin's DaemonSet does not select: before, READY stayed False for ever (NODES 1/2).
    plugin = {"spec": {"template": {"spec": {"nodeSelector": {"volcano.sh/vgpu.enabled": "true"}}}}}
    vgpu, train = _vgpu_and_training_nodes(plugin, {"volcano.sh/vgpu.enabled": "true"})
    # Where the plugin should run and has not registered, the node is still reported.
    train["metadata"]["labels"] = {"volcano.sh/vgpu.enabled": "true"}
    reports = report_nodes([vgpu, train], SPEC, {}, plugin)
    assert [(r.name, r.converged) for r in reports] == [("vgpu", True), ("train-1", False)]
    assert "has not registered" in reports[1].reason
    # A node an override names is the policy's whatever the DaemonSet selects.
    train["metadata"]["labels"] = {}
    named = api.VGPUPolicySpec.model_validate(
        {"nodeOverrides": [{"nodeNames": ["train-1"], "deviceSplitCount": 4}]})
    reports = report_nodes([vgpu, train], named, {}, plugin)
    assert [(r.name, r.converged) for r in reports] == [("vgpu", True), ("train-1", False)]


def test_split_comes_from_the_node_config_entry() -> None:
    node_config = {"a": 4}  # the rendered node-config target's node_splits
    nodes = [_node("a", _register(1, 4), **{"volcano.sh/vgpu-number": "4"}),
             _node("b", _register(1, 4), **{"volcano.sh/vgpu-number": "4"})]
    reports = {r.name: r.converged for r in report_nodes(nodes, SPEC, node_config)}
    assert reports == {"a": True, "b": False}


def test_transition_time_changes_only_with_the_condition_status() -> None:
    nodes = report_nodes([_node("a", _register(1, 10), **{"volcano.sh/vgpu-number": "10"})], SPEC, {})
    first = build_status(Outcome(1, problems=["spec.x: bad"], nodes=nodes), None, "T1")
    second = build_status(Outcome(1, problems=["spec.x: bad"], nodes=nodes), first, "T2")
    assert second == first, "an unchanged outcome gives an identical status (no write)"
    fixed = build_status(Outcome(2, nodes=nodes), second, "T3")
    valid = fixed.condition("Valid")
    assert valid is not None and (valid.status, valid.last_transition_time) == ("True", "T3")
    assert fixed.condition("Conflict") is not None
    assert fixed.nodes.summary == "1/1" and fixed.capacity.gpus == 1


def test_conflict_says_which_policy_is_active() -> None:
    status = build_status(Outcome(1, conflict_with="older"), None, "T")
    conflict, ready = status.condition("Conflict"), status.condition("Ready")
    assert conflict is not None and conflict.status == "True" and "older" in conflict.message
    assert ready is not None and ready.status == "False"


def test_the_stock_upstream_plugin_selects_its_nodes_by_affinity() -> None:
    # examples/adopt-upstream's DaemonSet (upstream's, unchanged) has no nodeSelector, only
    # `gpu In [on]` node affinity: read as "every node", a whole-GPU pool beside it kept READY
    # False for ever.
    example = ROOT / "examples" / "adopt-upstream" / "volcano-vgpu-device-plugin.yaml"
    docs = yaml.safe_load_all(example.read_text())
    plugin = next(d for d in docs if d and d["kind"] == "DaemonSet")
    assert "nodeSelector" not in plugin["spec"]["template"]["spec"]
    vgpu, train = _vgpu_and_training_nodes(plugin, {"gpu": "on"})
    train["metadata"]["labels"] = {"gpu": "on"}
    reports = report_nodes([vgpu, train], SPEC, {}, plugin)
    assert [(r.name, r.converged) for r in reports] == [("vgpu", True), ("train-1", False)]
