"""The whole operator after a crash, beside another replica, on an API that hangs, and on a target
deleted under it (issue 15 items 4, 8 and 9, and the API deadline)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from vgpu_emulator import Emulator
from vgpu_operator import api
from vgpu_operator.plan import PENDING_ANNOTATION
from vgpu_operator.runtime import nodes

from tests.support.waiting import eventually

from .conftest import NODES, PLUGIN_NS, operator_on
from .solo import (
    CONFIGMAPS,
    NAME,
    PODS,
    ROLL,
    SCHEDULER_NS,
    Killed,
    condition,
    pending_markers,
    scenario,
    solo,
    status,
    template_annotations,
)

SCHEDULER = ("Deployment", SCHEDULER_NS, "volcano-scheduler")
PLUGIN = ("DaemonSet", PLUGIN_NS, "volcano-device-plugin")
SCHEDULER_HASH = "vgpu.io/scheduler-config-hash"
PLUGIN_HASH = "vgpu.io/plugin-config-hash"
CHANGED_POD = f"volcano-device-plugin-{NODES[0]}"


def _restarted(emulator: Emulator, target: str) -> list[str]:
    return [r["hash"] for r in status(emulator).get("restarts") or [] if r["target"] == target]


@pytest.mark.parametrize(
    ("spec", "dies_at"),
    [(PODS, "PATCH /apis/apps/v1/namespaces/volcano-system/deployments/"),
     (ROLL, "PATCH /apis/apps/v1/namespaces/kube-system/daemonsets/")],
    ids=["before-the-scheduler-rollout", "before-the-plugin-rollout"],
)
async def test_a_restart_the_dead_operator_announced_is_made_by_the_next_one(spec: dict[str, Any],
                                                                           dies_at: str) -> None:
    """Item 4: the ConfigMaps are written, the operator dies before the rollout that makes the
    pods read them. The inputs now look current, so without the announcement on the ConfigMaps
    the next operator would report Ready with the old configuration still running."""
    async with scenario(spec) as running:
        emulator = running.emulator
        async with solo(running, dies_at=dies_at) as doomed:
            with pytest.raises(Killed):
                await doomed.reconcile()
        assert pending_markers(emulator), "the ConfigMap writes announced the restarts"

        async with operator_on(running) as cluster:
            await cluster.ready()
            await cluster.settle()

        scheduler = template_annotations(emulator, *SCHEDULER).get(SCHEDULER_HASH)
        assert scheduler, "the scheduler was rolled onto the written conf"
        assert _restarted(emulator, "Deployment volcano-system/volcano-scheduler") == [scheduler]
        if spec is ROLL:
            plugin = template_annotations(emulator, *PLUGIN).get(PLUGIN_HASH)
            assert plugin, "the device plugin was rolled onto the written device-config"
            assert _restarted(emulator, "DaemonSet kube-system/volcano-device-plugin") == [plugin]
        else:
            assert emulator.get_object("Pod", PLUGIN_NS, CHANGED_POD) is None, "its plugin pod recreated"
            assert _restarted(emulator, f"Pod on node {NODES[0]}") == [""]
        assert pending_markers(emulator) == []


async def test_a_second_replica_with_an_older_view_keeps_the_restart_history() -> None:
    """Item 8: two standalone replicas. B read the policy before A applied it and wrote its
    status; B finds nothing to do and writes its status computed from that old view. Without the
    resourceVersion on the status write, its empty `restarts` replaced A's."""
    async with scenario(PODS) as running, solo(running) as first, solo(running) as second:
        emulator = running.emulator
        body = await second.kube.get("VGPUPolicy", None, NAME)
        assert body is not None
        second.reconciler.policies.update(body)  # B's view: the policy without any status
        assert await first.reconcile()
        history = status(emulator)["restarts"]
        assert [r["target"] for r in history] == ["Deployment volcano-system/volcano-scheduler",
                                                  f"Pod on node {NODES[0]}"]

        assert await second.reconciler.reconcile(NAME)  # from the old view: a 409, then merged

        assert status(emulator)["restarts"] == history
        assert condition(emulator, "Ready")["status"] == "True"
        assert second.reconciler.policies.bodies[NAME]["status"]["restarts"] == history, "B's view caught up"


async def test_two_standalone_operators_keep_each_others_restart_history() -> None:
    """Item 8 with the whole operator: two replicas without peering, a policy and a change that
    rolls the scheduler again; both rollouts stay in the history whichever replica wrote last."""
    async with scenario(PODS) as running, operator_on(running) as cluster, operator_on(running):
        emulator = running.emulator
        await cluster.ready()
        cluster.set_spec(NAME, lambda spec: spec.update(device={"gpuMemoryFactor": 2}))
        await cluster.ready(generation=2)
        await cluster.settle()
        rolled = [r["hash"] for r in status(emulator)["restarts"] if r["target"].startswith("Deployment ")]
        assert len(set(rolled)) == 2, status(emulator)["restarts"]
        assert rolled[-1] == template_annotations(emulator, *SCHEDULER)[SCHEDULER_HASH]


class _Deleting:
    """Delete one object right before the operator's PATCH of it reaches the server."""

    def __init__(self, emulator: Emulator, kind: str, namespace: str, name: str) -> None:
        self.emulator, self.kind, self.namespace, self.name = emulator, kind, namespace, name

    def before(self, method: str, path: str) -> None:
        if method == "PATCH" and path.endswith(f"/{self.name}") and \
                self.emulator.get_object(self.kind, self.namespace, self.name) is not None:
            self.emulator.delete_object(self.kind, self.namespace, self.name)


@pytest.mark.parametrize(
    ("spec", "kind", "namespace", "name"),
    [(PODS, *SCHEDULER), (ROLL, *PLUGIN), (ROLL, "ConfigMap", PLUGIN_NS, "volcano-vgpu-device-config")],
    ids=["Deployment", "DaemonSet", "ConfigMap"],
)
async def test_a_target_deleted_while_being_written_is_reported_not_resurrected(
        spec: dict[str, Any], kind: str, namespace: str, name: str) -> None:
    """Item 9: the PATCH meets a 404. Creating the object from the copy read before would bring
    back someone's deleted workload (or a stale ConfigMap with other data)."""
    async with scenario(spec) as running, solo(running) as operator:
        emulator = running.emulator
        deleting = _Deleting(emulator, kind, namespace, name)
        call = operator.kube._call

        async def intercepted(method: str, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
            deleting.before(method, path)
            return await call(method, path, *args, **kwargs)

        operator.kube._call = intercepted  # type: ignore[method-assign]
        assert not await operator.reconcile()
        applied = condition(emulator, "Applied")
        assert applied["status"] == "False"
        assert "deleted while the operator was writing it" in applied["message"]
        assert condition(emulator, "Ready")["status"] == "False"
        assert not [s for s in emulator.served if s.method == "POST" and f"/{kind.lower()}s" in s.path]

        deleting.name = "-"  # nothing else is deleted: the next reconciles see what is there
        await operator.converge()
        if kind == "ConfigMap":  # ours to create: from the policy alone, not the stale copy
            created = emulator.get_object(kind, namespace, name)
            assert created is not None and list(created["data"]) == ["device-config.yaml"]
            assert created["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "vgpu-operator"}
        else:  # someone else's: stays deleted, and status says so
            assert emulator.get_object(kind, namespace, name) is None
            said = [c["message"] for c in status(emulator)["conditions"]] + \
                [t["message"] for t in status(emulator)["targets"] if t["kind"] == kind]
            assert [m for m in said if f"{namespace}/{name} not found" in m], said


async def test_a_hung_request_times_out_and_the_worker_carries_on() -> None:
    """Every API call has a deadline: a PATCH the server never answers fails the reconcile, the
    status says so, the worker backs off and retries, and converges once the server answers."""
    async with scenario(PODS) as running:
        emulator = running.emulator
        hang = emulator.fail_next("PATCH", r"/deployments/volcano-scheduler$", times=10**6, action="hang")
        async with operator_on(running, api_timeout=0.3) as cluster:
            applied = await eventually(
                lambda: (c := cluster.condition("Applied")).get("reason") == "ApplyFailed" and c,
                what="Applied=False after the deadline")
            assert "no answer within 0.3s" in applied["message"]
            assert cluster.condition("Ready")["status"] == "False"
            await eventually(lambda: cluster.metrics.reconciles.labels(result="error")._value.get() >= 3,
                             what="the worker retrying, not stuck on the hung request")
            hang.release()
            await cluster.ready()
            await cluster.settle()
        assert template_annotations(emulator, *SCHEDULER).get(SCHEDULER_HASH)
        assert pending_markers(emulator) == []


async def test_a_hung_read_makes_ready_unknown_until_the_server_answers() -> None:
    async with scenario(PODS) as running:
        emulator = running.emulator
        async with operator_on(running, api_timeout=0.3) as cluster:
            await cluster.ready()
            await cluster.settle()
            hang = emulator.fail_next("GET", r"/configmaps/volcano-scheduler-configmap$", times=10**6,
                                      action="hang")
            cluster.set_spec(NAME, lambda spec: spec.update(scheduler={"schedulePolicy": "binpack"}))
            ready = await eventually(
                lambda: (c := cluster.condition("Ready")).get("status") == "Unknown" and c,
                what="Ready=Unknown")
            assert ready["reason"] == "ReconcileFailed" and "no answer within 0.3s" in ready["message"]
            assert cluster.events("ReconcileFailed")
            hang.release()
            await cluster.ready(generation=2)


async def test_a_hung_node_list_holds_the_first_reconcile_back_until_it_is_answered() -> None:
    """Node-config is never rendered from a partial node list: while the list hangs (each try cut
    at the deadline, then retried), nothing is written; once it is answered, the policy applies."""
    async with scenario(PODS) as running:
        emulator = running.emulator
        hang = emulator.fail_next("GET", r"^/api/v1/nodes$", times=10**6, action="hang")
        async with operator_on(running, api_timeout=0.2) as cluster:
            await eventually(lambda: hang.times < 10**6 - 2, what="the list tried again after a deadline")
            assert emulator.writes("/configmaps/") == []
            assert condition(emulator, "Ready").get("status") != "True"
            hang.release()
            await cluster.ready()


@pytest.mark.parametrize("failing", ["configmaps/volcano-vgpu-device-config",
                                     "daemonsets/volcano-device-plugin"])
async def test_a_write_that_failed_is_finished_later_not_taken_for_a_hand_edit(failing: str) -> None:
    # Under Report a hand edit is left alone; the operator's own unfinished change is not one.
    # Before, the failed round stored the desired hash, and the next round saw "changed by hand"
    # (the DaemonSet never rolled, and Ready came back True).
    async with scenario({"device": {"overwriteEnv": True}, "driftPolicy": "Report"}) as running, \
            solo(running) as op:
        em = running.emulator
        em.fail_next("PATCH", failing, status=403, times=1)
        assert not await op.reconcile()
        for _ in range(3):
            assert await op.reconcile()
        targets = {t["name"]: (t["state"], t.get("message")) for t in status(em)["targets"]}
        assert all(state in ("InSync", "Updated") for state, _ in targets.values()), targets
        config = em.get_object("ConfigMap", "kube-system", "volcano-vgpu-device-config")
        assert "overwriteEnv: true" in config["data"]["device-config.yaml"]
        assert "vgpu.io/plugin-config-hash" in template_annotations(em, "DaemonSet", PLUGIN_NS,
                                                                    "volcano-device-plugin")
        assert not [e for e in em.list_objects("Event") if e.get("reason") == "DriftDetected"]
        assert condition(em, "Ready").get("status") == "True"


@pytest.mark.parametrize("edit", ["status", "template"])
async def test_a_workload_written_meanwhile_is_patched_unless_its_template_changed(edit: str) -> None:
    # The DaemonSet controller writes status all the time, which moves the resourceVersion the
    # patch carries: that must not fail the rollout (before: 409 on every retry, ApplyFailed).
    # An edit of the pod template, which the patch replaces, still must not be overwritten.
    async with scenario(ROLL) as running, solo(running) as op:
        em = running.emulator
        call = op.kube._call
        edited = False

        async def meanwhile(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            nonlocal edited
            if method == "PATCH" and path.endswith("daemonsets/volcano-device-plugin") and not edited:
                edited = True
                ds = copy.deepcopy(em.get_object(*PLUGIN))
                if edit == "status":
                    ds.setdefault("status", {})["numberReady"] = 1
                else:
                    ds["spec"]["template"]["metadata"].setdefault("labels", {})["edited"] = "by-hand"
                em.apply(ds)
            return await call(method, path, *args, **kwargs)

        op.kube._call = meanwhile  # type: ignore[method-assign]
        written = await op.reconcile()
        patches = [s.status for s in em.served if s.method == "PATCH" and s.path.endswith(
            "daemonsets/volcano-device-plugin")]
        if edit == "status":
            assert written and condition(em, "Applied").get("status") == "True"
            assert patches == [409, 200]
        else:
            assert not written and "changed while the operator was writing it" in condition(
                em, "Applied").get("message", "")
            assert patches == [409]  # not retried with the same stale patch
            labels = em.get_object(*PLUGIN)["spec"]["template"]["metadata"]["labels"]
            assert labels["edited"] == "by-hand"


async def test_a_first_write_that_failed_still_rolls_the_plugin_later() -> None:
    # No earlier status row, so no hash to keep: the Error state alone must tell the next round
    # that the pods never rolled, even with the pending-restarts marker gone.
    async with scenario(ROLL) as running, solo(running) as op:
        em = running.emulator
        em.fail_next("PATCH", "daemonsets/volcano-device-plugin", status=403, times=1)
        assert not await op.reconcile()
        for namespace, name in CONFIGMAPS:
            cm = em.get_object("ConfigMap", namespace, name)
            if cm and PENDING_ANNOTATION in (cm["metadata"].get("annotations") or {}):
                del cm["metadata"]["annotations"][PENDING_ANNOTATION]
                em.apply(cm)
        for _ in range(2):
            assert await op.reconcile()
        assert "vgpu.io/plugin-config-hash" in template_annotations(em, *PLUGIN)


async def test_a_target_written_before_another_failed_keeps_its_hand_edit_under_report() -> None:
    async with scenario({"device": {"overwriteEnv": True}, "driftPolicy": "Report"}) as running, \
            solo(running) as op:
        em = running.emulator
        await op.converge()
        policy = copy.deepcopy(em.get_object(api.KIND, None, NAME))
        policy["spec"]["device"]["overwriteEnv"] = False
        em.apply(policy)
        em.fail_next("PATCH", "daemonsets/volcano-device-plugin", status=403, times=1)
        assert not await op.reconcile()  # device-config was written, the DaemonSet was not
        key = "device-config.yaml"
        cm = copy.deepcopy(em.get_object("ConfigMap", PLUGIN_NS, "volcano-vgpu-device-config"))
        assert "overwriteEnv: false" in cm["data"][key]
        cm["data"][key] = cm["data"][key].replace("overwriteEnv: false", "overwriteEnv: true")
        em.apply(cm)  # a hand edit after our write
        await op.reconcile()
        live = em.get_object("ConfigMap", PLUGIN_NS, "volcano-vgpu-device-config")["data"][key]
        assert "overwriteEnv: true" in live
        assert [e for e in em.list_objects("Event") if e.get("reason") == "DriftDetected"]


async def test_a_relabelled_node_that_makes_two_selectors_overlap_does_not_stop_the_policy() -> None:
    # Someone labels a node so that two disjoint selector overrides both match it: a warning, the
    # first override applies to it, and the policy's other changes are still written.
    spec = {"nodeOverrides": [
        {"nodeSelector": {"matchLabels": {"pool": "a"}}, "deviceSplitCount": 4},
        {"nodeSelector": {"matchLabels": {"team": "x"}}, "deviceSplitCount": 6},
    ]}
    async with scenario(spec) as running, solo(running) as op:
        em = running.emulator
        first, second = NODES[0], NODES[1]
        for node, labels in ((first, {"pool": "a"}), (second, {"team": "x"})):
            obj = copy.deepcopy(em.get_object("Node", None, node))
            obj["metadata"].setdefault("labels", {}).update(labels)
            em.apply(obj)
        await nodes.relist(op.kube, op.reconciler.nodes)
        await op.converge()
        obj = copy.deepcopy(em.get_object("Node", None, first))
        obj["metadata"]["labels"]["team"] = "x"
        em.apply(obj)
        policy = copy.deepcopy(em.get_object(api.KIND, None, NAME))
        policy["spec"]["device"] = {"overwriteEnv": True}
        em.apply(policy)
        await nodes.relist(op.kube, op.reconciler.nodes)
        assert await op.reconcile()
        config = em.get_object("ConfigMap", PLUGIN_NS, "volcano-vgpu-device-config")
        assert "overwriteEnv: true" in config["data"]["device-config.yaml"]
        valid = condition(em, "Valid")
        assert valid.get("status") == "True", valid
        assert "OverlappingNodeSelectors" in json.dumps(status(em)["conditions"])
        node_config = json.loads(em.get_object("ConfigMap", PLUGIN_NS, "volcano-vgpu-node-config")
                                 ["data"]["config.json"])
        splits = {entry["name"]: entry.get("devicesplitcount") for entry in node_config["nodeconfig"]}
        assert splits[first] == 4 and splits[second] == 6  # the first override applies to both-matched



async def test_repairing_a_hand_edit_of_node_config_restarts_the_edited_nodes_plugin_pod() -> None:
    # Nothing records what each plugin pod read, and a restart still owed may have gone with a
    # deleted ConfigMap's pending-restarts annotation: a repair restarts the edited node's pod
    # (once too often, never a restart lost), and only that node's.
    spec = {"devicePlugin": {"generation": "current"},
            "nodeOverrides": [{"nodeNames": list(NODES), "deviceSplitCount": 4}]}
    async with scenario(spec) as running, solo(running) as op:
        em = running.emulator
        await op.converge()
        served = len(em.served)
        cm = copy.deepcopy(em.get_object("ConfigMap", PLUGIN_NS, "volcano-vgpu-node-config"))
        entries = json.loads(cm["data"]["config.json"])
        edited = entries["nodeconfig"][0]["name"]
        entries["nodeconfig"][0]["devicesplitcount"] = 7
        cm["data"]["config.json"] = json.dumps(entries)
        em.apply(cm)
        await op.converge()
        deleted = [s.path for s in list(em.served)[served:] if s.method == "DELETE" and "/pods/" in s.path]
        assert len(deleted) == 1 and deleted[0].endswith(edited), deleted
        assert [e for e in em.list_objects("Event") if e.get("reason") == "DriftRepaired"]


async def test_an_active_policy_whose_reconciles_fail_reads_present_and_not_ready() -> None:
    # VGPUPolicyNotReady needs policy_present 1: a policy that cannot be reconciled at all (its
    # reads fail from the start) must still count as present.
    async with scenario({}) as running, solo(running) as op:
        running.emulator.fail_next("GET", "configmaps/volcano-vgpu-node-config", status=500, times=100)
        assert not await op.reconcile()
        metrics = op.reconciler.metrics
        assert metrics.policy_present._value.get() == 1
        assert metrics.policy_ready._value.get() == 0


async def test_a_configmap_someone_creates_while_the_operator_creates_it_is_not_overwritten() -> None:
    # The device-config ConfigMap was missing when read; someone (the plugin's own chart, say)
    # creates it before the operator's write. Before, that write was a merge patch of the whole
    # object rendered for "missing": it replaced their device-config.yaml and added the
    # managed-by label. Now it is a POST, which meets 409 and is decided again.
    async with scenario(ROLL) as running, solo(running) as operator:
        emulator = running.emulator
        emulator.delete_object("ConfigMap", PLUGIN_NS, "volcano-vgpu-device-config")
        theirs = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "volcano-vgpu-device-config", "namespace": PLUGIN_NS},
                  "data": {"device-config.yaml": "nvidia: {}\n", "vnpus": "theirs\n"}}
        call = operator.kube._call

        async def racing(method: str, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
            if method in ("PATCH", "POST") and "/configmaps" in path and \
                    emulator.get_object("ConfigMap", PLUGIN_NS, "volcano-vgpu-device-config") is None:
                emulator.apply(copy.deepcopy(theirs))
            return await call(method, path, *args, **kwargs)

        operator.kube._call = racing  # type: ignore[method-assign]
        assert not await operator.reconcile()
        assert "created by someone else while the operator was creating it" in condition(
            emulator, "Applied")["message"]
        found = emulator.get_object("ConfigMap", PLUGIN_NS, "volcano-vgpu-device-config")
        assert found is not None and found["data"] == theirs["data"]
        assert "app.kubernetes.io/managed-by" not in (found["metadata"].get("labels") or {})


async def test_a_policy_with_fields_of_a_newer_crd_is_reconciled_and_they_are_said_once(
        caplog: pytest.LogCaptureFixture) -> None:
    # After a rollback the API server keeps the newer CRD (Helm never downgrades crds/) and
    # fills its new fields' defaults into every policy. Read strictly, every policy was rejected
    # (Valid False, nothing applied, drift not repaired) and its status rebuilt without the
    # last-applied hashes.
    spec = copy.deepcopy(ROLL)
    spec["device"]["futureKnob"] = 3
    spec["futureSection"] = {"enabled": True}
    async with scenario(spec) as running, solo(running) as operator:
        emulator = running.emulator
        assert await operator.reconcile()
        assert condition(emulator, "Valid")["status"] == "True"
        assert condition(emulator, "Applied")["status"] == "True"
        policy = emulator.get_object(api.KIND, None, NAME)
        policy.setdefault("status", {})["futureCounter"] = 7  # a newer operator's status field
        policy["status"]["targets"][0]["futureNote"] = "x"
        emulator.apply(policy)
        hashes = [t["hash"] for t in policy["status"]["targets"]]
        assert await operator.reconcile()
        assert [t["hash"] for t in status(emulator)["targets"]] == hashes  # kept, not rebuilt
    said = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(said) == 1 and "spec.device.futureKnob, spec.futureSection" in said[0]
