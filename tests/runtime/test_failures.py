"""Invalid policies, unusable cluster objects and API failures: say why, clobber nothing, recover."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.waiting import eventually

from .conftest import RESYNC, Cluster

TARGETS = [
    ("ConfigMap", "kube-system", "volcano-vgpu-device-config"),
    ("ConfigMap", "volcano-system", "volcano-scheduler-configmap"),
    ("Deployment", "volcano-system", "volcano-scheduler"),
    ("DaemonSet", "kube-system", "volcano-device-plugin"),
]


def _snapshot(cluster: Cluster) -> list[dict[str, Any] | None]:
    return [cluster.get(*target) for target in TARGETS]


async def _rejected(cluster: Cluster) -> dict[str, Any]:
    return await eventually(
        lambda: (c := cluster.condition("Valid")).get("status") == "False" and c, what="Valid=False"
    )


async def test_invalid_policy_writes_nothing_and_says_why(cluster: Cluster) -> None:
    before = _snapshot(cluster)
    cluster.create_policy(spec={"device": {"gpuMemoryFactor": 1048576}})
    valid = await _rejected(cluster)
    await eventually(lambda: cluster.events("Rejected"), what="the Rejected event")
    await asyncio.sleep(4 * RESYNC)  # more resyncs: still nothing written, no second event

    assert "spec.device.gpuMemoryFactor" in valid["message"] and "Use at most" in valid["message"]
    assert "spec.spec." not in valid["message"] and "Value error" not in valid["message"]
    assert cluster.condition("Applied")["status"] == "False"
    assert _snapshot(cluster) == before
    assert len(cluster.events("Rejected")) == 1
    assert cluster.metrics.reconciles.labels(result="invalid")._value.get() >= 1

    cluster.set_spec("default", lambda spec: spec.update(device={"gpuMemoryFactor": 1}))
    await cluster.ready(generation=2)


async def test_a_spec_the_model_refuses_names_the_field_once(cluster: Cluster) -> None:
    # A CRD served without its CEL rules lets three equal resource names in; the model refuses.
    cluster.create_policy(spec={"resources": {"count": "a/b", "memory": "a/b", "cores": "a/b"}})
    valid = await _rejected(cluster)
    assert valid["message"].startswith(
        "spec.resources: count, memory and cores must be three different resource names"), valid


def _scheduler_conf(text: str) -> Callable[[dict[str, Any]], None]:
    return lambda cm: cm["data"].update({"volcano-scheduler.conf": text})


def _rename_plugin_container(ds: dict[str, Any]) -> None:
    ds["spec"]["template"]["spec"]["containers"][0]["name"] = "renamed"


@pytest.mark.parametrize(
    ("kind", "namespace", "name", "breakage", "field"),
    [
        (
            "ConfigMap",
            "volcano-system",
            "volcano-scheduler-configmap",
            _scheduler_conf("tiers: [oops"),
            "not valid YAML",
        ),
        (
            "ConfigMap",
            "volcano-system",
            "volcano-scheduler-configmap",
            _scheduler_conf("actions: enqueue\n"),
            "no `tiers:` list",
        ),
        (
            "DaemonSet",
            "kube-system",
            "volcano-device-plugin",
            _rename_plugin_container,
            "spec.devicePlugin.container",
        ),
    ],
    ids=["malformed-scheduler-conf", "conf-without-tiers", "daemonset-without-container"],
)
async def test_unusable_cluster_object_is_reported_and_never_clobbered(
    cluster: Cluster,
    kind: str,
    namespace: str,
    name: str,
    breakage: Callable[[dict[str, Any]], None],
    field: str,
) -> None:
    cluster.edit(kind, namespace, name, breakage)
    before = _snapshot(cluster)
    cluster.create_policy()
    valid = await _rejected(cluster)
    await eventually(lambda: cluster.events("Rejected"), what="the Rejected event")
    await asyncio.sleep(3 * RESYNC)

    assert field in valid["message"]
    assert _snapshot(cluster) == before, "nothing written while an input is unusable"


async def test_unknown_volcano_tag_is_a_warning_with_an_event(cluster: Cluster) -> None:
    cluster.edit(
        "Deployment",
        "volcano-system",
        "volcano-scheduler",
        lambda d: d["spec"]["template"]["spec"]["containers"][0].update(
            image="docker.io/volcanosh/vc-scheduler:latest"
        ),
    )
    cluster.create_policy()
    await cluster.ready()

    assert "spec.scheduler.volcanoVersion" in cluster.condition("Valid")["message"]
    assert any("volcanoVersion" in e["message"] for e in cluster.events("ValidationWarning"))


async def test_conflicts_and_server_errors_are_retried(cluster: Cluster) -> None:
    faults = [
        cluster.emulator.fail_next("PATCH", r"/configmaps/volcano-vgpu-device-config$", status=409, times=2),
        cluster.emulator.fail_next("PATCH", r"/deployments/", status=500, times=2),
        cluster.emulator.fail_next("PATCH", r"/vgpupolicies/default/status$", status=500, times=1),
    ]
    cluster.create_policy(spec={"device": {"overwriteEnv": True}})  # the fixture has false: a write
    await cluster.ready()
    assert "overwriteEnv: true" in cluster.data("volcano-vgpu-device-config", "device-config.yaml")
    # Every fault was served, and absorbed by the API layer's retries: no reconcile failed (a
    # reconcile-level retry alone would also reach Ready, so Ready by itself proves nothing).
    assert [fault.times for fault in faults] == [0, 0, 0]
    assert cluster.metrics.reconciles.labels(result="error")._value.get() == 0


async def test_persistent_failure_is_reported_then_recovers(cluster: Cluster) -> None:
    # The first apply restarts the scheduler (the fixture's Volcano has no deviceshare yet).
    # The fault lasts until the failure has been seen: a fixed count of failures would let the
    # next reconcile succeed a few ms later, and a poll could miss the failed state in between.
    fault = cluster.emulator.fail_next("PATCH", r"/deployments/volcano-scheduler$", status=500, times=10**6)
    cluster.create_policy()
    applied = await eventually(
        lambda: (c := cluster.condition("Applied")).get("status") == "False" and c, what="Applied=False"
    )
    assert applied["reason"] == "ApplyFailed" and "500" in applied["message"]
    assert cluster.events("ApplyFailed")
    fault.times = 0
    await cluster.ready()
    # The scheduler conf was written before the Deployment patch failed: the scheduler still runs
    # the old conf, so recovery must roll it although its inputs now look current.
    deployment = cluster.get("Deployment", "volcano-system", "volcano-scheduler")
    assert deployment is not None
    assert "vgpu.io/scheduler-config-hash" in deployment["spec"]["template"]["metadata"]["annotations"]


async def test_a_lasting_failure_posts_one_event_not_one_per_retry(cluster: Cluster) -> None:
    # An admission policy refusing a write fails every retry alike: before, each one (every 5 s
    # at most) posted its own ApplyFailed Warning, about 720 an hour.
    refused = r"/configmaps/volcano-vgpu-device-config$"
    fault = cluster.emulator.fail_next("PATCH", refused, status=403, times=10**6)
    cluster.create_policy(spec={"device": {"overwriteEnv": True}})  # the fixture has false: a write
    errors = cluster.metrics.reconciles.labels(result="error")
    await eventually(lambda: errors._value.get() >= 4, what="four failed reconciles in a row")
    first = cluster.events("ApplyFailed")
    assert len(first) == 1
    fault.times = 0
    await cluster.ready()
    # The same failure again, after a success between: news again, said anew.
    before = errors._value.get()
    cluster.emulator.fail_next("PATCH", refused, status=403, times=10**6)
    cluster.edit("ConfigMap", "kube-system", "volcano-vgpu-device-config",  # repaired: a write
                 lambda cm: cm["data"].update({"device-config.yaml": "nvidia: {}\n"}))
    await eventually(lambda: errors._value.get() >= before + 2, what="two more failed reconciles")
    events = cluster.events("ApplyFailed")
    assert len(events) == 2 and events[1]["message"] == first[0]["message"]


async def test_dropped_watches_do_not_lose_changes(cluster: Cluster) -> None:
    cluster.create_policy()
    await cluster.ready()
    await cluster.settle()
    assert cluster.emulator.drop_watches() > 0
    cluster.set_spec("default", lambda spec: spec.update(device={"deviceSplitCount": 7}))
    await eventually(
        lambda: "deviceSplitCount: 7" in cluster.data("volcano-vgpu-device-config", "device-config.yaml"),
        what="the change made right after the drop",
    )
    cluster.emulator.drop_watches("ConfigMap")
    cluster.edit(
        "ConfigMap",
        "kube-system",
        "volcano-vgpu-device-config",
        lambda cm: cm["data"].update({"device-config.yaml": "nvidia: {}\n"}),
    )
    await eventually(
        lambda: "deviceSplitCount: 7" in cluster.data("volcano-vgpu-device-config", "device-config.yaml"),
        what="drift repaired after the ConfigMap watch dropped",
    )


DEVICE_CONFIG, KEY = "volcano-vgpu-device-config", "device-config.yaml"
SHADOW_PATH = f"/api/v1/namespaces/kube-system/configmaps/{DEVICE_CONFIG}"
MOVED = {"targets": {"deviceConfig": {"namespace": "volcano-system"}}}


def _split_3(cm: dict[str, Any]) -> None:
    cm["data"][KEY] = cm["data"][KEY].replace("deviceSplitCount: 10", "deviceSplitCount: 3")


async def test_a_shadowing_copy_blocks_writes_until_it_is_removed(cluster: Cluster) -> None:
    """The upstream plugin reads kube-system before volcano-system: writing the volcano-system
    target while kube-system says something else would split the plugin from the scheduler."""
    cluster.edit("ConfigMap", "kube-system", DEVICE_CONFIG, _split_3)
    before = _snapshot(cluster)
    cluster.create_policy(spec=MOVED)
    valid = await _rejected(cluster)
    assert "ConfigMap kube-system/volcano-vgpu-device-config exists" in valid["message"]
    assert "kubectl -n kube-system delete configmap volcano-vgpu-device-config" in valid["message"]
    assert _snapshot(cluster) == before and cluster.get("ConfigMap", "volcano-system", DEVICE_CONFIG) is None

    await cluster.delete(SHADOW_PATH)
    await cluster.ready()
    assert "deviceSplitCount: 10" in cluster.data(DEVICE_CONFIG, KEY, namespace="volcano-system")


async def test_a_copy_the_operator_may_not_read_is_not_checked(cluster: Cluster) -> None:
    """RBAC decides what the operator sees: a 403 on the optional read is no reconcile error."""
    cluster.edit("ConfigMap", "kube-system", DEVICE_CONFIG, _split_3)
    forbidden = cluster.emulator.fail_next("GET", f"^{SHADOW_PATH}$", status=403, times=1000)
    cluster.create_policy(spec=MOVED)
    await cluster.ready()
    assert forbidden.times < 1000, "the copy was asked for"
    assert cluster.metrics.reconciles.labels(result="error")._value.get() == 0
