"""The fault suite: the operator dies between any two writes of a reconcile, or any kind of API
call it makes fails (error status, dropped connection, hang); the cluster still converges to
what an undisturbed operator leaves, restarts included, and status tells the truth all along.

Instances without kopf (`solo`) keep each case to a fraction of a second; `test_recovery.py`
runs the whole operator through the same kinds of faults."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu_emulator import Emulator

from .conftest import plugin_pods
from .solo import (
    HANG_TIMEOUT,
    PODS,
    ROLL,
    SCENARIOS,
    TIMEOUT,
    Killed,
    cluster_state,
    condition,
    pending_markers,
    scenario,
    solo,
    status,
    template_annotations,
)

_references: dict[str, tuple[dict[str, Any], list[str]]] = {}


async def _reference(name: str) -> tuple[dict[str, Any], list[str]]:
    """What an undisturbed operator leaves in the cluster, and the writes (every call but GET, in
    order) of its first reconcile."""
    if name not in _references:
        async with scenario(SCENARIOS[name]) as running, solo(running) as operator:
            served = len(running.emulator.served)
            assert await operator.reconcile()
            calls = [f"{s.method} {s.path}" for s in list(running.emulator.served)[served:]
                     if s.method != "GET"]
            await operator.converge()
            _assert_truthful(running.emulator, "undisturbed")
            _references[name] = (cluster_state(running.emulator), calls)
    return _references[name]


def _rolled(emulator: Emulator, kind: str, namespace: str, name: str, annotation: str) -> list[str]:
    """The hash the workload's pods were rolled to (none if never), as the cluster says."""
    value = template_annotations(emulator, kind, namespace, name).get(annotation)
    return [value] if value else []


def _assert_truthful(emulator: Emulator, where: str, unrecorded_pods: int = 0) -> None:
    """Status says Ready, and its restart history is what happened: each rollout once, with the
    hash the pod template has; one entry per plugin pod really deleted, but for `unrecorded_pods`
    deleted by an operator that died before it could write status."""
    current = status(emulator)
    for type_ in ("Ready", "Applied", "InSync", "Valid"):
        assert condition(emulator, type_).get("status") == "True", (where, type_, current.get("conditions"))
    assert current["observedGeneration"] == 1, where
    assert {t["state"] for t in current["targets"]} <= {"InSync", "Updated"}, (where, current["targets"])
    assert pending_markers(emulator) == [], (where, "every announced restart finished")
    restarts = current.get("restarts") or []

    def hashes(target: str) -> list[str]:
        return [r["hash"] for r in restarts if r["target"] == target]

    scheduler = _rolled(emulator, "Deployment", "volcano-system", "volcano-scheduler",
                        "vgpu.io/scheduler-config-hash")
    plugin = _rolled(emulator, "DaemonSet", "kube-system", "volcano-device-plugin",
                     "vgpu.io/plugin-config-hash")
    assert scheduler, (where, "the first apply rolls the scheduler (deviceshare added)")
    assert hashes("Deployment volcano-system/volcano-scheduler") == scheduler, (where, restarts)
    assert hashes("DaemonSet kube-system/volcano-device-plugin") == plugin, (where, restarts)
    deleted = [w.path.rsplit("/", 1)[1] for w in emulator.writes("/pods/") if w.method == "DELETE"]
    recorded = [r["target"] for r in restarts if r["target"].startswith("Pod on node ")]
    assert len(recorded) == len(deleted) - unrecorded_pods, (where, recorded, deleted)


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_killed_between_any_two_writes_a_fresh_operator_finishes_the_job(name: str) -> None:
    reference, calls = await _reference(name)
    assert len(calls) >= 10, calls
    for k, call in enumerate(calls):
        where = f"{name}: died right before write {k + 1}, {call}"
        async with scenario(SCENARIOS[name]) as running:
            async with solo(running, lives=k) as doomed:
                with pytest.raises(Killed):
                    await doomed.reconcile()
            plugin_pods(running.emulator)  # the DaemonSet controller replaced a deleted plugin pod
            async with solo(running) as heir:
                await heir.converge()
            assert cluster_state(running.emulator) == reference, where
            # A pod deleted by the dead operator after its last status write is in no history: the
            # heir recreates that pod once more (it cannot tell) and records that.
            done = calls[:k]
            reported = any(c.endswith("/status") for c in done)
            lost = [] if reported else [c for c in done if c.startswith("DELETE")]
            _assert_truthful(running.emulator, where, unrecorded_pods=len(lost))


# (method, path, scenario) of every kind of call a reconcile makes; the policy and its nodes are
# read by kopf and the node follower, whose faults `test_recovery.py` covers.
CALLS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "get ConfigMap": ("GET", r"/configmaps/volcano-scheduler-configmap$", PODS),
    "get Deployment": ("GET", r"/deployments/volcano-scheduler$", PODS),
    "get DaemonSet": ("GET", r"/daemonsets/volcano-device-plugin$", PODS),
    "list Pods": ("GET", r"/namespaces/kube-system/pods$", PODS),
    "create ConfigMap": ("POST", r"/namespaces/kube-system/configmaps$", PODS),
    "patch ConfigMap": ("PATCH", r"/configmaps/volcano-scheduler-configmap$", PODS),
    "patch Deployment": ("PATCH", r"/deployments/volcano-scheduler$", PODS),
    "patch DaemonSet": ("PATCH", r"/daemonsets/volcano-device-plugin$", ROLL),
    "delete Pod": ("DELETE", r"/pods/volcano-device-plugin-", PODS),
    "patch status": ("PATCH", r"/vgpupolicies/default/status$", PODS),
    "post Event": ("POST", r"/events$", PODS),
}
FAULTS: dict[str, dict[str, Any]] = {
    "500": {"status": 500}, "409": {"status": 409}, "404": {"status": 404},
    "drop": {"action": "drop"}, "hang": {"action": "hang"},
}
# A 404 answers a read ("not there": the renderers' business) rather than failing it, and a 404
# on a pod deletion means it is gone already (test_apply_and_restarts covers both).
CASES = [(call, fault) for call, (method, _, _) in CALLS.items() for fault in FAULTS
         if not (fault == "404" and method in ("GET", "DELETE"))]


@pytest.mark.parametrize(("call", "fault"), CASES,
                         ids=[f"{call}-{fault}".replace(" ", "-") for call, fault in CASES])
async def test_a_failing_call_is_reported_and_the_operator_converges_once_it_works(call: str,
                                                                                   fault: str) -> None:
    method, path, spec = CALLS[call]
    name = next(key for key, value in SCENARIOS.items() if value is spec)
    reference, _ = await _reference(name)
    timeout = HANG_TIMEOUT if fault == "hang" else TIMEOUT
    async with scenario(spec) as running, solo(running, timeout=timeout) as operator:
        emulator = running.emulator
        broken = emulator.fail_next(method, path, times=10**6, **FAULTS[fault])
        ok = await operator.reconcile()
        assert broken.times < 10**6, "the call was made"
        if call == "post Event":
            assert ok, "a lost event is no failed reconcile"
        else:
            assert not ok
            ready, applied = condition(emulator, "Ready"), condition(emulator, "Applied")
            assert ready.get("status") != "True", ready
            if call != "patch status":  # then there is no status to tell it: events do
                failed = applied if applied.get("reason") == "ApplyFailed" else ready
                assert failed["reason"] in ("ApplyFailed", "ReconcileFailed") and failed["status"] != "True"
                if fault == "404" and method == "PATCH":  # deleted since read: said so, not re-created
                    assert "deleted while the operator was writing it" in failed["message"], failed
            assert [e for e in emulator.list_objects("Event")
                    if e["reason"] in ("ApplyFailed", "ReconcileFailed")], "a Warning event says why"
        recreated = [s for s in emulator.served if s.method == "POST" and "/configmaps" not in s.path
                     and "/events" not in s.path]
        assert recreated == [], "nothing but ConfigMaps rendered as missing is ever created"

        broken.release()
        await operator.converge()
        assert cluster_state(emulator) == reference
        _assert_truthful(emulator, f"{call} {fault}")
