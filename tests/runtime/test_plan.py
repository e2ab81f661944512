"""The pure plan: which targets are written, which restarts follow, which events are emitted."""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from typing import Any

from vgpu_operator import api
from vgpu_operator.plan import (
    PENDING_ANNOTATION,
    Pending,
    Previous,
    Restart,
    make_plan,
    parse_ref,
    pending_of,
    previous_from_status,
    restart_events,
    unfinished,
)
from vgpu_operator.render.device_plugin import ANNOTATION as PLUGIN_HASH
from vgpu_operator.render.scheduler_deployment import ANNOTATION as SCHEDULER_HASH
from vgpu_operator.render.target import TargetRender


def _cm(changed: bool = False, live: bool = True, content_hash: str = "h1") -> TargetRender:
    return TargetRender("ConfigMap", "kube-system", "dc", {"data": {}} if live else None,
                        {"data": {"k": "v"}}, content_hash, changed, key="device-config.yaml",
                        slot="device_config")


def _workload(kind: str, annotation: str, live_hash: str | None, want: str) -> TargetRender:
    def obj(value: str | None) -> dict[str, Any]:
        annotations = {annotation: value} if value else {}
        return {"spec": {"template": {"metadata": {"annotations": annotations}}}}
    slot = {"Deployment": "scheduler_deployment", "DaemonSet": "device_plugin"}[kind]
    return TargetRender(kind, "ns", kind.lower(), obj(live_hash), obj(want), want, live_hash != want,
                      restart_hash=want, slot=slot)


def _node_config(nodes: list[str]) -> TargetRender:
    return TargetRender("ConfigMap", "kube-system", "nc", {"data": {}}, {"data": {}}, "n2", bool(nodes),
                      key="config.json", changed_nodes=nodes, slot="node_config")


def test_steady_state_writes_nothing() -> None:
    plan = make_plan([_cm()], {}, enforce=True, paused=False, builtin_plugin=False)
    assert plan.writes == [] and plan.events == [] and plan.restarts == []
    assert plan.decisions[0].state == "InSync"


def test_policy_change_and_first_adoption_write() -> None:
    previous = {("ConfigMap", "kube-system", "dc"): Previous("h0", "InSync")}
    plan = make_plan([_cm(changed=True)], previous, enforce=False, paused=False, builtin_plugin=False)
    assert len(plan.writes) == 1 and plan.decisions[0].state == "Updated" and not plan.decisions[0].repair
    assert [e.reason for e in plan.events] == ["Applied"]


def test_hand_edit_is_repaired_under_enforce_and_reported_under_report() -> None:
    previous = {("ConfigMap", "kube-system", "dc"): Previous("h1", "InSync")}
    enforce = make_plan([_cm(changed=True)], previous, enforce=True, paused=False, builtin_plugin=False)
    assert enforce.decisions[0].repair and len(enforce.writes) == 1
    assert [e.reason for e in enforce.events] == ["DriftRepaired"]

    report = make_plan([_cm(changed=True)], previous, enforce=False, paused=False, builtin_plugin=False)
    assert report.writes == [] and report.decisions[0].state == "Drifted"
    assert report.decisions[0].hash == "h1", "the last applied hash is kept, so the drift stays visible"
    assert [e.reason for e in report.events] == ["DriftDetected"]

    again = {("ConfigMap", "kube-system", "dc"): Previous("h1", "Drifted")}
    repeated = make_plan([_cm(changed=True)], again, enforce=False, paused=False, builtin_plugin=False)
    assert repeated.events == []

    deleted = make_plan([_cm(changed=True, live=False)], previous, enforce=False, paused=False,
                        builtin_plugin=False)
    assert deleted.decisions[0].state == "Missing"


def test_paused_writes_nothing_and_unrenderable_targets_are_errors() -> None:
    paused = make_plan([_cm(changed=True)], {}, enforce=True, paused=True, builtin_plugin=False)
    assert paused.writes == [] and paused.decisions[0].state == "Drifted"
    broken = TargetRender("DaemonSet", "ns", "ds", {}, None, error="error: no container")
    plan = make_plan([broken], {}, enforce=True, paused=False, builtin_plugin=False)
    assert plan.writes == [] and plan.decisions[0].state == "Error"
    assert "no container" in plan.decisions[0].message


def test_restarts_follow_the_pod_template_hashes() -> None:
    same = _workload("Deployment", SCHEDULER_HASH, "a", "a")
    assert make_plan([same], {}, enforce=True, paused=False, builtin_plugin=False).restarts == []
    rolled = make_plan([_workload("Deployment", SCHEDULER_HASH, "a", "b")], {}, enforce=True, paused=False,
                       builtin_plugin=False)
    assert [(r.kind, r.hash) for r in rolled.restarts] == [("scheduler", "b")]


def test_plugin_pods_recreated_only_on_changed_nodes_and_only_when_needed() -> None:
    plan = make_plan([_node_config(["n1"])], {}, enforce=True, paused=False, builtin_plugin=False)
    assert plan.recreate_plugin_pods_on == ["n1"]
    assert [r.kind for r in plan.restarts] == ["plugin-pod"]
    builtin = make_plan([_node_config(["n1"])], {}, enforce=True, paused=False, builtin_plugin=True)
    assert builtin.recreate_plugin_pods_on == [], "the builtin plugin watches the ConfigMap"
    rolling = make_plan([_node_config(["n1"]), _workload("DaemonSet", PLUGIN_HASH, "a", "b")], {},
                        enforce=True, paused=False, builtin_plugin=False)
    assert rolling.recreate_plugin_pods_on == [], "a DaemonSet rollout restarts every pod anyway"
    assert [r.kind for r in rolling.restarts] == ["daemonset"]


def test_a_daemonset_updated_on_delete_restarts_nothing_by_its_template() -> None:
    # OnDelete ignores a template change: before, a rollout was reported (an event, a
    # status.restarts entry) that restarted no pod, and node-config changes, taken as covered
    # by it, never reached the plugin.
    on_delete = _workload("DaemonSet", PLUGIN_HASH, "a", "b")
    assert on_delete.live is not None
    on_delete.live["spec"]["updateStrategy"] = {"type": "OnDelete"}
    plan = make_plan([_node_config(["n1"]), on_delete], {}, enforce=True, paused=False, builtin_plugin=False)
    assert [d.write for d in plan.decisions] == [True, True]  # the arguments are written all the same
    assert [(r.kind, r.target) for r in plan.restarts] == [("plugin-pod", "n1")]
    assert plan.recreate_plugin_pods_on == ["n1"]


def test_only_restarts_that_happened_are_reported() -> None:
    plan = make_plan([_node_config(["n1", "n2"]), _workload("Deployment", SCHEDULER_HASH, "a", "b")], {},
                     enforce=True, paused=False, builtin_plugin=False)
    assert not [e for e in plan.events if e.reason == "Restarted"], "restart events wait for the deletes"
    done = plan.done({"n2"})  # n1 had no plugin pod to delete
    assert [(r.kind, r.target) for r in done if r.kind == "plugin-pod"] == [("plugin-pod", "n2")]
    assert [e.message for e in restart_events(done) if "pods" in e.message] == [
        "device plugin pods recreated on 1 node(s): n2"]
    assert not [e for e in restart_events(plan.done(set())) if "pods" in e.message]


def test_previous_from_status_indexes_the_stored_targets() -> None:
    entry = {"kind": "ConfigMap", "namespace": "a", "name": "b", "hash": "x", "state": "InSync"}
    status = api.VGPUPolicyStatus.model_validate({"targets": [entry]})
    assert previous_from_status(status) == {("ConfigMap", "a", "b"): Previous("x", "InSync")}
    assert previous_from_status(None) == {}


def test_pending_restarts_survive_the_annotation_round_trip() -> None:
    restarts = [Restart("scheduler", "Deployment v/s", "r", "h1"), Restart("plugin-pod", "n2", "r"),
                Restart("plugin-pod", "n1", "r")]
    pending = Pending.of(restarts)
    assert pending == Pending({"Deployment v/s": "h1"}, frozenset({"n1", "n2"}))
    assert Pending.parse(pending.text()) == pending
    assert not Pending.parse(None) and not Pending.parse(Pending().text())
    # Thousands of node names are announced compressed, each still by name: a reconcile that
    # fails half-way restarts only the nodes the change touched, not every node of the cluster.
    many = Pending(nodes=frozenset(f"gpu-pool-a-worker-{i:05d}.eu-west-1.compute.internal"
                                   for i in range(5000)))
    assert Pending.parse(many.text()) == many
    assert len(many.text()) < 64 * 1024
    unique = Pending(nodes=frozenset(hashlib.sha256(str(i).encode()).hexdigest() for i in range(5000)))
    assert Pending.parse(unique.text()) == Pending(all_nodes=True), "beyond that: every node, kept small"
    assert len(unique.text()) < 100
    bomb = base64.b64encode(zlib.compress(b"[" + b'"10",' * (3 << 20) + b'"1"]', 9)).decode()
    assert len(bomb) < 64 * 1024
    assert Pending.parse(json.dumps({"nodesZ": bomb})) == Pending(all_nodes=True), "bounded inflation"
    deep = base64.b64encode(zlib.compress(b"[" * 200_000, 9)).decode()
    for hostile in ("[" * 100_000, json.dumps({"nodesZ": deep})):
        assert Pending.parse(hostile) == Pending(all_nodes=True), "unreadable: every node, never a crash"
    # Whatever the writer compresses the reader takes: long (253-character) names near the bound.
    def long_names(count: int) -> Pending:
        return Pending(nodes=frozenset("gpu-pool-a." + "x" * 237 + f"-{i:04d}" for i in range(count)))

    under, over = long_names(4000), long_names(4096)  # 256 bytes a name in the compact JSON
    assert "nodesZ" in json.loads(under.text()) and Pending.parse(under.text()) == under
    assert "nodesZ" not in json.loads(over.text()) and Pending.parse(over.text()) == Pending(all_nodes=True)
    # The operator of the version before reads only "nodes": it must see every node, not none.
    assert json.loads(many.text())["nodes"] == "*"
    assert Pending.parse("{not json") == Pending(all_nodes=True), "unreadable: err on the side of a restart"
    newer = Pending({"Deployment v/s": "h2"}, frozenset({"n3"}))
    assert pending.merged(newer) == Pending({"Deployment v/s": "h2"}, frozenset({"n1", "n2", "n3"}))


def test_announcements_are_read_from_every_configmap() -> None:
    def cm(pending: Pending | None) -> dict[str, Any]:
        return {"metadata": {"annotations": {PENDING_ANNOTATION: pending.text()} if pending else {}}}
    found = pending_of([cm(Pending({"Deployment v/s": "h"})), None, cm(None),
                        cm(Pending(nodes=frozenset({"n"})))])
    assert found == Pending({"Deployment v/s": "h"}, frozenset({"n"}))


def test_an_announced_rollout_is_done_when_the_template_has_its_hash() -> None:
    def deployment(value: str | None) -> dict[str, Any]:
        annotations = {SCHEDULER_HASH: value} if value else {}
        return {"kind": "Deployment", "metadata": {"namespace": "v", "name": "s"},
                "spec": {"template": {"metadata": {"annotations": annotations}}}}
    pending = Pending({"Deployment v/s": "h2", "DaemonSet k/p": "h3"})
    assert unfinished(pending, [deployment(None), None]) == (["Deployment v/s"], [])
    assert unfinished(pending, [deployment("h1")]) == (["Deployment v/s"], [])
    todo, done = unfinished(pending, [deployment("h2")])
    assert todo == []
    assert [(r.kind, r.target, r.hash) for r in done] == [("scheduler", "Deployment v/s", "h2")]


def test_announced_plugin_pods_are_recreated_unless_every_pod_restarts_anyway() -> None:
    plan = make_plan([_node_config([])], {}, enforce=True, paused=False, builtin_plugin=False,
                     pending_nodes={"n2"})
    assert plan.recreate_plugin_pods_on == ["n2"], "no write this time: the announcement alone"
    both = make_plan([_node_config(["n1"])], {}, enforce=True, paused=False, builtin_plugin=False,
                     pending_nodes={"n2"})
    assert both.recreate_plugin_pods_on == ["n1", "n2"]
    rolling = make_plan([_workload("DaemonSet", PLUGIN_HASH, "a", "b")], {}, enforce=True, paused=False,
                        builtin_plugin=False, pending_nodes={"n2"})
    assert rolling.recreate_plugin_pods_on == []


def test_an_apply_that_stopped_part_way_reports_only_what_it_wrote() -> None:
    plan = make_plan([_node_config(["n1"]), _workload("Deployment", SCHEDULER_HASH, "a", "b")], {},
                     enforce=True, paused=False, builtin_plugin=False)
    assert plan.done(set(), written=[]) == []
    done = plan.done({"n1"}, written=["Deployment ns/deployment"])
    assert [r.kind for r in done] == ["scheduler", "plugin-pod"]


def test_a_restart_target_parses_back_into_kind_namespace_and_name() -> None:
    [restart] = make_plan([_workload("Deployment", SCHEDULER_HASH, "old", "new")], {}, enforce=True,
                          paused=False, builtin_plugin=False).restarts
    assert parse_ref(restart.target) == ("Deployment", "ns", "deployment")
    assert parse_ref("DaemonSet kube-system/volcano-device-plugin") == \
        ("DaemonSet", "kube-system", "volcano-device-plugin")
