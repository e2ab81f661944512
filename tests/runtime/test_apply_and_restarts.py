"""A policy reaches the four places, and a change restarts exactly what must restart."""

from __future__ import annotations

import logging

import pytest
import yaml

from tests.support.waiting import eventually

from .conftest import NODES, PLUGIN_NS, Cluster

NODE_CONFIG = "volcano-vgpu-node-config"

SCHEDULER_NS = "volcano-system"
DEPLOY_HASH = "vgpu.io/scheduler-config-hash"
DS_HASH = "vgpu.io/plugin-config-hash"


def _template_annotation(cluster: Cluster, kind: str, namespace: str, name: str, key: str) -> str | None:
    obj = cluster.get(kind, namespace, name) or {}
    return ((obj["spec"]["template"].get("metadata") or {}).get("annotations") or {}).get(key)


def _deviceshare(cluster: Cluster) -> dict[str, object]:
    conf = yaml.safe_load(cluster.data("volcano-scheduler-configmap", "volcano-scheduler.conf", SCHEDULER_NS))
    plugins = [p for tier in conf["tiers"] for p in tier["plugins"]]
    return next(p for p in plugins if p["name"] == "deviceshare").get("arguments", {})


def _plugin_pods(cluster: Cluster) -> set[str]:
    return {p["metadata"]["name"] for p in cluster.emulator.list_objects("Pod", PLUGIN_NS)}


async def test_policy_makes_all_four_places_consistent_and_ready(cluster: Cluster) -> None:
    cluster.create_policy(spec={"resources": {"count": "volcano.sh/vgpu-number"}})
    status = await cluster.ready()

    device_config = yaml.safe_load(cluster.data("volcano-vgpu-device-config", "device-config.yaml"))
    assert device_config["nvidia"]["resourceCountName"] == "volcano.sh/vgpu-number"
    assert device_config["nvidia"]["deviceSplitCount"] == 10
    assert _deviceshare(cluster)["deviceshare.VGPUEnable"] is True
    assert _template_annotation(cluster, "Deployment", SCHEDULER_NS, "volcano-scheduler", DEPLOY_HASH)
    assert cluster.data("volcano-vgpu-node-config", "config.json")
    assert {t["kind"] for t in status["targets"]} == {"ConfigMap", "Deployment", "DaemonSet"}
    assert status["nodes"] == {
        "total": 2,
        "registered": 2,
        "converged": 2,
        "summary": "2/2",
        "mismatched": [],
    }
    assert status["capacity"] == {"gpus": 16, "vgpus": 160, "memoryMiB": 8 * 24564 + 8 * 32607, "cores": 1600}
    assert cluster.metrics.policy_ready._value.get() == 1
    assert cluster.metrics.nodes_converged._value.get() == 2
    assert cluster.events("Applied"), "every write is reported as an event"


async def test_scheduler_argument_change_updates_the_conf_without_a_rollout(cluster: Cluster) -> None:
    cluster.create_policy()
    await cluster.ready()
    await cluster.settle()
    rollout_hash = _template_annotation(cluster, "Deployment", SCHEDULER_NS, "volcano-scheduler", DEPLOY_HASH)
    deployment_writes = cluster.writes_to("/deployments/")

    cluster.set_spec("default", lambda spec: spec.update(scheduler={"schedulePolicy": "binpack"}))
    await eventually(
        lambda: _deviceshare(cluster).get("deviceshare.SchedulePolicy") == "binpack",
        what="SchedulePolicy in the scheduler conf",
    )
    await cluster.ready(generation=2)
    await cluster.settle()

    assert (
        _template_annotation(cluster, "Deployment", SCHEDULER_NS, "volcano-scheduler", DEPLOY_HASH)
        == rollout_hash
    )
    assert cluster.writes_to("/deployments/") == deployment_writes, "hot-reloaded argument: no rollout"
    assert _plugin_pods(cluster) >= {f"volcano-device-plugin-{node}" for node in NODES}


async def test_device_config_change_rolls_the_scheduler(cluster: Cluster,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="vgpu_operator")
    cluster.create_policy()
    await cluster.ready()
    await cluster.settle()
    before = _template_annotation(cluster, "Deployment", SCHEDULER_NS, "volcano-scheduler", DEPLOY_HASH)
    rollouts = cluster.metrics.restarts.labels(kind="scheduler")._value.get()

    cluster.set_spec("default", lambda spec: spec.update(device={"gpuMemoryFactor": 2}))
    after = await eventually(
        lambda: (
            (h := _template_annotation(cluster, "Deployment", SCHEDULER_NS, "volcano-scheduler", DEPLOY_HASH))
            != before
            and h
        )
    )

    assert after != before
    assert "gpuMemoryFactor: 2" in cluster.data("volcano-vgpu-device-config", "device-config.yaml")
    def scheduler_restarts() -> int:
        return sum(1 for e in cluster.events("Restarted") if "volcano-scheduler" in e["message"])

    await eventually(lambda: scheduler_restarts() == 2, what="a Restarted event besides the initial one")
    assert cluster.metrics.restarts.labels(kind="scheduler")._value.get() == rollouts + 1
    # The log line names the workload and the plan's reason for the restart.
    assert any(r.getMessage() == f"restarted Deployment {SCHEDULER_NS}/volcano-scheduler: rollout "
               f"(scheduler config changed)" for r in caplog.records), caplog.text


async def test_node_override_change_recreates_only_that_nodes_plugin_pod(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="vgpu_operator")
    cluster.create_policy()
    await cluster.ready()
    await cluster.settle()
    ds_writes = cluster.writes_to("/daemonsets/")
    first, second = NODES

    def plugin_pod_restarts() -> float:
        return float(cluster.metrics.restarts.labels(kind="plugin-pod")._value.get())

    # (The initial apply may already have recreated one: the fixture's node-config has an entry the
    # default policy drops.)
    restarted = plugin_pod_restarts()

    cluster.set_spec(
        "default", lambda spec: spec.update(nodeOverrides=[{"nodeNames": [first], "operatingMode": "mig"}])
    )
    await eventually(
        lambda: f"volcano-device-plugin-{first}" not in _plugin_pods(cluster),
        what="the plugin pod on the overridden node to be deleted",
    )
    await cluster.settle()

    pods = _plugin_pods(cluster)
    assert f"volcano-device-plugin-{second}" in pods, "other nodes keep their plugin pod"
    assert {f"bystander-{first}", f"bystander-{second}"} <= pods, "unrelated pods are never touched"
    # Nor one with the plugin's labels and no owner (deleted, nothing would bring it back).
    assert {f"plugin-debug-{first}", f"plugin-debug-{second}"} <= pods
    assert '"operatingmode": "mig"' in cluster.data("volcano-vgpu-node-config", "config.json")
    assert cluster.writes_to("/daemonsets/") == ds_writes, "node-config changes need no DaemonSet rollout"
    assert plugin_pod_restarts() == restarted + 1  # settled: all recorded
    assert any(r.getMessage() == f"restarted Pod {PLUGIN_NS}/volcano-device-plugin-{first}: device plugin "
               f"pod on {first} deleted to restart it (node-config entry changed)"
               for r in caplog.records), caplog.text


async def test_no_restart_is_reported_on_a_node_without_a_plugin_pod(cluster: Cluster) -> None:
    # The plan asks to recreate the node's plugin pod; with none there, nothing was deleted, so no
    # "recreated" Event, no status.restarts entry and no counted restart (they were all written
    # from the plan before).
    cluster.create_policy()
    await cluster.ready()
    await cluster.settle()
    first, _ = NODES
    await cluster.delete(f"/api/v1/namespaces/{PLUGIN_NS}/pods/volcano-device-plugin-{first}")
    before = float(cluster.metrics.restarts.labels(kind="plugin-pod")._value.get())
    recorded = len(cluster.status().get("restarts", []))

    cluster.set_spec(
        "default", lambda spec: spec.update(nodeOverrides=[{"nodeNames": [first], "operatingMode": "mig"}])
    )
    await eventually(lambda: '"operatingmode": "mig"' in cluster.data(NODE_CONFIG, "config.json"),
                     what="the override in node-config")
    await cluster.settle()

    assert not [e for e in cluster.events("Restarted") if "plugin pods recreated" in e["message"]]
    assert len(cluster.status().get("restarts", [])) == recorded
    assert float(cluster.metrics.restarts.labels(kind="plugin-pod")._value.get()) == before


async def test_a_new_node_matching_an_override_gets_its_entry(cluster: Cluster) -> None:
    cluster.create_policy(
        spec={"nodeOverrides": [{"nodeSelector": {"matchLabels": {"pool": "mig"}}, "operatingMode": "mig"}]}
    )
    await cluster.ready()
    assert "new-node" not in cluster.data("volcano-vgpu-node-config", "config.json")

    cluster.emulator.apply(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "new-node", "labels": {"pool": "mig"}}}
    )
    await eventually(
        lambda: "new-node" in cluster.data("volcano-vgpu-node-config", "config.json"),
        what="node-config entry for the new node",
    )
    cluster.edit("Node", None, "new-node", lambda node: node["metadata"]["labels"].pop("pool"))
    await eventually(
        lambda: "new-node" not in cluster.data("volcano-vgpu-node-config", "config.json"),
        what="entry removed when the label goes",
    )
