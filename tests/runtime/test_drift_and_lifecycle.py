"""Hand edits (Enforce / Report), paused, several policies, steady state, deletion."""

from __future__ import annotations

import asyncio

from vgpu_formats.device_config import DeviceConfig, parse_device_config, same_meaning

from tests.support.waiting import eventually

from .conftest import RESYNC, Cluster

DEVICE_CONFIG = "volcano-vgpu-device-config"
KEY = "device-config.yaml"


def _scribble(cm: dict[str, object]) -> None:
    data = cm["data"]
    assert isinstance(data, dict)
    data[KEY] = data[KEY].replace("deviceSplitCount: 10", "deviceSplitCount: 3")


async def test_hand_edit_is_repaired_under_enforce(cluster: Cluster) -> None:
    cluster.create_policy()
    await cluster.ready()
    await cluster.settle()
    before = parse_device_config(cluster.data(DEVICE_CONFIG, KEY))
    restarts = cluster.writes_to("/daemonsets/")

    cluster.edit("ConfigMap", "kube-system", DEVICE_CONFIG, _scribble)
    def split_back_to_10() -> DeviceConfig | None:
        config = parse_device_config(cluster.data(DEVICE_CONFIG, KEY))
        return config if config.nvidia and config.nvidia.device_split_count == 10 else None

    repaired = await eventually(split_back_to_10, what="repair")

    assert same_meaning(repaired, before), "the repair restores what the policy says, nothing else"
    assert cluster.writes_to("/daemonsets/") == restarts, "the plugin never saw the edit: no restart"
    # The counter and the event follow the writes: wait for the event (posted last), not race it.
    await eventually(lambda: [e for e in cluster.events("DriftRepaired") if DEVICE_CONFIG in e["message"]],
                     what="a DriftRepaired event naming device-config")
    assert cluster.metrics.drift_repairs._value.get() == 1
    await cluster.ready()


async def test_hand_deleted_target_is_recreated_under_enforce(cluster: Cluster) -> None:
    cluster.create_policy()
    await cluster.ready()
    await cluster.settle()
    await cluster.delete("/api/v1/namespaces/kube-system/configmaps/volcano-vgpu-node-config")
    await eventually(
        lambda: cluster.get("ConfigMap", "kube-system", "volcano-vgpu-node-config"),
        what="node-config recreated",
    )


async def test_hand_edit_is_only_reported_under_report(cluster: Cluster) -> None:
    cluster.create_policy(spec={"driftPolicy": "Report"})
    await cluster.ready()
    await cluster.settle()

    cluster.edit("ConfigMap", "kube-system", DEVICE_CONFIG, _scribble)
    in_sync = await eventually(
        lambda: (c := cluster.condition("InSync")).get("status") == "False" and c, what="InSync=False"
    )
    await eventually(lambda: cluster.events("DriftDetected"), what="the DriftDetected event")
    await asyncio.sleep(4 * RESYNC)  # more resyncs: still not written, not reported again

    assert "deviceSplitCount: 3" in cluster.data(DEVICE_CONFIG, KEY), "Report never writes"
    assert DEVICE_CONFIG in in_sync["message"]
    states = {t["name"]: t["state"] for t in cluster.status()["targets"]}
    assert states[DEVICE_CONFIG] == "Drifted"
    assert cluster.status()["drifted"] == 1
    assert cluster.condition("Ready")["status"] == "False"
    assert len(cluster.events("DriftDetected")) == 1, "a drift is reported once, not every resync"


async def test_paused_policy_writes_nothing_but_reports(cluster: Cluster) -> None:
    watched = [("kube-system", DEVICE_CONFIG), ("volcano-system", "volcano-scheduler-configmap")]
    before = [cluster.get("ConfigMap", ns, name) for ns, name in watched]
    cluster.create_policy(spec={"paused": True, "device": {"deviceSplitCount": 4}})
    applied = await eventually(lambda: (c := cluster.condition("Applied")) and c, what="Applied condition")
    await asyncio.sleep(4 * RESYNC)

    assert applied["reason"] == "Paused" and applied["status"] == "False"
    assert [cluster.get("ConfigMap", ns, name) for ns, name in watched] == before
    assert cluster.writes_to("/configmaps/") == 0 and cluster.writes_to("/deployments/") == 0
    assert cluster.writes_to("/daemonsets/") == 0 and cluster.writes_to("/pods/") == 0
    targets = {t["name"]: t["state"] for t in cluster.status()["targets"]}
    assert targets[DEVICE_CONFIG] == "Drifted", "status shows what would change"


async def test_second_policy_gets_conflict_and_writes_nothing(cluster: Cluster) -> None:
    cluster.create_policy("first")
    await cluster.ready("first")
    await cluster.settle()
    writes = cluster.writes_to("/configmaps/")

    cluster.create_policy("second", spec={"device": {"deviceSplitCount": 2}})
    conflict = await eventually(
        lambda: (c := cluster.condition("Conflict", "second")).get("status") == "True" and c,
        what="Conflict on the second policy",
    )
    await asyncio.sleep(4 * RESYNC)

    assert "first" in conflict["message"]
    assert cluster.writes_to("/configmaps/") == writes
    assert cluster.condition("Ready", "first")["status"] == "True"
    assert cluster.condition("Conflict", "first")["status"] == "False"

    await cluster.delete("/apis/vgpu.io/v1alpha1/vgpupolicies/first")
    await eventually(
        lambda: "deviceSplitCount: 2" in cluster.data(DEVICE_CONFIG, KEY),
        what="the second policy to take over once the first is gone",
    )


async def test_steady_state_makes_no_writes_over_many_resyncs(cluster: Cluster) -> None:
    cluster.create_policy()
    await cluster.ready()
    await cluster.settle()
    writes = len(cluster.emulator.writes())
    reconciles = cluster.metrics.reconciles.labels(result="ok")._value.get()

    await eventually(lambda: cluster.metrics.reconciles.labels(result="ok")._value.get() >= reconciles + 10,
                     what="10 more resyncs")
    assert cluster.emulator.writes()[writes:] == []


async def test_deleting_the_policy_leaves_the_configuration_in_place(cluster: Cluster) -> None:
    cluster.create_policy()
    await cluster.ready()
    await cluster.settle()
    rendered = {
        name: cluster.data(name, key)
        for name, key in [(DEVICE_CONFIG, KEY), ("volcano-vgpu-node-config", "config.json")]
    }

    finalizers = (cluster.get("VGPUPolicy", None, "default") or {})["metadata"].get("finalizers") or []
    assert finalizers == ["vgpu.io/finalizer"], "the operator holds the deletion until it lets go"
    assert cluster.metrics.policy_present._value.get() == 1
    assert cluster.metrics.policy_ready._value.get() == 1

    await cluster.delete("/apis/vgpu.io/v1alpha1/vgpupolicies/default")
    await eventually(lambda: cluster.get("VGPUPolicy", None, "default") is None, what="policy gone")
    # No policy now: the gauges say so, and VGPUPolicyNotReady (which needs a present one) stays
    # quiet rather than reading a stale value for ever.
    assert cluster.metrics.policy_present._value.get() == 0
    assert cluster.metrics.policy_ready._value.get() == 0

    assert {
        name: cluster.data(name, key)
        for name, key in [(DEVICE_CONFIG, KEY), ("volcano-vgpu-node-config", "config.json")]
    } == rendered
    assert cluster.events("Released")


async def test_deleting_a_policy_whose_target_is_forbidden_is_not_held_up(cluster: Cluster) -> None:
    # A 403 will not go away by retrying: the label stays (said in a Warning Event), the
    # finalizer goes. Before, kopf retried the release every 0.2 s for ever.
    cluster.create_policy()
    await cluster.ready()
    await cluster.settle()
    cluster.emulator.fail_next("GET", "configmaps/volcano-vgpu-node-config", status=403, times=100000)
    await cluster.delete("/apis/vgpu.io/v1alpha1/vgpupolicies/default")
    await eventually(lambda: cluster.get("VGPUPolicy", None, "default") is None, what="policy gone")
    warnings = [e for e in cluster.events("Released") if e["type"] == "Warning"]
    assert warnings and "volcano-vgpu-node-config" in warnings[0]["message"]
    assert "label not removed" in warnings[0]["message"]


async def test_deleting_a_policy_with_an_invalid_spec_is_not_held_up(cluster: Cluster) -> None:
    # The model refuses three equal resource names (a CRD served without its CEL rules lets it in).
    cluster.create_policy(spec={"resources": {"count": "a/b", "memory": "a/b", "cores": "a/b"}})
    await eventually(lambda: cluster.condition("Valid").get("status") == "False" or None, what="invalid")
    await cluster.delete("/apis/vgpu.io/v1alpha1/vgpupolicies/default")
    await eventually(lambda: cluster.get("VGPUPolicy", None, "default") is None, what="policy gone")
    assert any("invalid spec" in e["message"] for e in cluster.events("Released"))
