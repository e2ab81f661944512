"""One reconcile of a VGPUPolicy: read, validate, render, plan, write, report.

The I/O sequence around the pure core. Everything it decides comes from `validate`, `render_all`,
`make_plan` and `build_status`; this module only moves data between them and the API, keeps the
in-memory indexes (policies, nodes) the kopf handlers feed, and serialises reconciles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic
from kubernetes_asyncio.client.exceptions import ApiException
from vgpu_formats import annotations as node_annotations
from vgpu_formats import node_config

from vgpu_operator import api, logs
from vgpu_operator.k8s import Kube, describe_error, now_rfc3339
from vgpu_operator.metrics import Metrics
from vgpu_operator.observed import Observed, wanted_objects
from vgpu_operator.plan import (
    PENDING_ANNOTATION,
    Decision,
    Pending,
    Plan,
    Restart,
    describe,
    make_plan,
    parse_ref,
    pending_of,
    previous_from_status,
    restart_events,
    unfinished,
)
from vgpu_operator.render import RenderResult, render_all
from vgpu_operator.render.inputs import Problem
from vgpu_operator.render.target import MANAGED_BY, MANAGED_BY_LABEL, TargetRender
from vgpu_operator.status import (
    Outcome,
    build_status,
    failed_status,
    parse_status,
    report_nodes,
    status_dict,
)
from vgpu_operator.validate import validate
from vgpu_operator.versions import plugin_generation

logger = logging.getLogger(__name__)

NODE_KEYS = (node_annotations.NODE_REGISTER,)  # the only node annotation rendering and status read
BACKOFF_SECONDS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)  # after the 1st, 2nd, ... failure in a row
STATUS_ATTEMPTS = 5  # status writes that met a newer policy (409), each merged into it anew


def _version(obj: Mapping[str, Any]) -> int:
    value = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(value) if value.isdigit() else -1


class PolicyIndex:
    """The VGPUPolicies the operator has seen, newest state of each; the oldest one is active."""

    def __init__(self) -> None:
        self.bodies: dict[str, dict[str, Any]] = {}

    def update(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        name = str((body.get("metadata") or {}).get("name", ""))
        if deleted:
            self.bodies.pop(name, None)
            return
        known = self.bodies.get(name)
        # Our own status write returns a newer object than a watch event still in flight.
        if known is None or _version(body) >= _version(known) or _version(body) < 0:
            self.bodies[name] = dict(body)

    def active(self, *, including_deleted: bool = False) -> str | None:
        """Oldest by creationTimestamp, then name; policies being deleted step aside (unless
        `including_deleted`: was this one in charge before its deletion?)."""
        alive = [(str(b["metadata"].get("creationTimestamp") or ""), name) for name, b in self.bodies.items()
                 if including_deleted or not b["metadata"].get("deletionTimestamp")]
        return min(alive)[1] if alive else None


class NodeIndex:
    """Nodes, trimmed to what rendering and status read; tells whether a change matters."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, int] = {}
        self.seeded = asyncio.Event()  # set once a full list was read: safe to render node-config

    @staticmethod
    def trim(body: Mapping[str, Any]) -> dict[str, Any]:
        meta = body.get("metadata") or {}
        status = body.get("status") or {}
        kept = {key: value for key, value in (meta.get("annotations") or {}).items() if key in NODE_KEYS}
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": meta.get("name"), "labels": dict(meta.get("labels") or {}),
                         "annotations": kept},
            "status": {"allocatable": dict(status.get("allocatable") or {})},
        }

    def update(self, body: Mapping[str, Any], deleted: bool = False) -> bool:
        """Record a node event; True when labels, registration or allocatable changed."""
        name = str((body.get("metadata") or {}).get("name", ""))
        version = _version(body)
        if 0 <= version < self.versions.get(name, -1):
            return False  # an older state than the one already indexed (the list raced the watch)
        if deleted:  # the last event of this node: the stream is ordered, nothing older follows
            self.versions.pop(name, None)
            return self.nodes.pop(name, None) is not None
        self.versions[name] = version
        trimmed = self.trim(body)
        if self.nodes.get(name) == trimmed:
            return False
        self.nodes[name] = trimmed
        return True

    def all(self) -> list[dict[str, Any]]:
        return [self.nodes[name] for name in sorted(self.nodes)]


@dataclass
class Tuning:
    """Timings of the runtime (short by default: failures show within a second)."""

    resync_seconds: float = 60.0
    debounce_seconds: float = 0.02
    error_backoff_seconds: tuple[float, ...] = BACKOFF_SECONDS
    nodes_timeout_seconds: float = 30.0  # how long a reconcile waits for the first node list


class Reconciler:
    """Reconciles the active policy; one at a time, triggered by handlers, events and a timer."""

    def __init__(self, kube: Kube, metrics: Metrics, tuning: Tuning | None = None) -> None:
        self.kube = kube
        self.metrics = metrics
        self.tuning = tuning or Tuning()
        self.policies = PolicyIndex()
        self.nodes = NodeIndex()
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._failures = 0
        # Policies this replica works on now (their kopf daemon runs). With peering, a paused
        # replica's daemons are stopped, so its worker stops resyncing: one writer at a time.
        self.working: set[str] = set()
        self.paused = False  # peering paused this replica: a reconcile still under way exports nothing
        # Restarts made but not in status yet (its write failed): the next status write adds them.
        self._unreported: list[Restart] = []
        # Nodes whose plugin pod this process recreated while announced restarts were pending: a
        # reconcile that retries after a late failure must not restart them twice.
        self._recreated: set[str] = set()

    # ----- triggers -----

    def start_working(self, name: str) -> None:
        self.working.add(name)
        self.paused = False
        self.metrics.set_active(True)
        self.trigger()  # taking over (start, or after a peering pause): resync now

    def stop_working(self, name: str) -> None:
        self.working.discard(name)
        self.paused = not self.working
        self.metrics.set_active(not self.paused)

    def trigger(self) -> None:
        """Ask the worker for a reconcile of the active policy soon (bursts coalesce)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """The worker: reconcile on triggers, and every resync period as a safety net."""
        while not stop.is_set():
            delay = self.tuning.resync_seconds
            if self._failures:
                backoff = self.tuning.error_backoff_seconds
                delay = backoff[min(self._failures, len(backoff)) - 1]
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
                await asyncio.sleep(self.tuning.debounce_seconds)
            except TimeoutError:
                pass
            self._wake.clear()
            active = self.policies.active()
            if active is not None and active in self.working and not stop.is_set():
                ok = await self.reconcile(active)
                self._failures = 0 if ok else self._failures + 1

    async def release(self, name: str, body: dict[str, Any]) -> None:
        """The policy is going away: keep every rendered setting (the cluster keeps working) and
        drop only the managed-by label we put on ConfigMaps we created."""
        async with self._lock:
            policy = api.VGPUPolicy.model_validate({**body, "status": None})
            wanted = wanted_objects(policy.spec)
            for slot in ("device_config", "node_config"):
                kind, namespace, cm_name = wanted[slot]
                live = await self.kube.get(kind, namespace, cm_name)
                labels = ((live or {}).get("metadata") or {}).get("labels") or {}
                if labels.get(MANAGED_BY_LABEL) == MANAGED_BY:
                    unlabel = {"metadata": {"labels": {MANAGED_BY_LABEL: None}}}
                    await self.kube.patch(kind, namespace, cm_name, unlabel)
                    logs.action(logs.PolicyLogger(body, logger), "released", kind, namespace, cm_name,
                                "policy-deleted", f"{MANAGED_BY_LABEL} label removed, data left in place")
            await self.kube.post_event(body, "Normal", "Released", "policy deleted: rendered configuration "
                                       "left in place, ownership labels removed")
            self.policies.update(body, deleted=True)
        self.trigger()  # an older-but-conflicting policy may take over now

    # ----- the reconcile -----

    async def reconcile(self, name: str) -> bool:
        """Reconcile one policy; False when an API call failed (the caller retries)."""
        async with self._lock:
            started = time.monotonic()
            try:
                result = await self._reconcile(name)
            except Exception as exc:
                self._log(name).exception("reconcile of VGPUPolicy %s failed", name)
                result = "error"
                await self._report_failure(name, exc)
            self.metrics.reconciles.labels(result=result).inc()
            self.metrics.duration.observe(time.monotonic() - started)
            return result != "error"

    def _log(self, name: str) -> logging.Logger | logs.PolicyLogger:
        """Lines about this policy: with its object reference when its body is known."""
        body = self.policies.bodies.get(name)
        return logs.PolicyLogger(body, logger) if body is not None else logger

    async def _reconcile(self, name: str) -> str:
        body = self.policies.bodies.get(name)
        if body is None:
            return "ok"  # deleted meanwhile
        previous = parse_status(body.get("status"))
        generation = body["metadata"].get("generation")
        active = self.policies.active()
        if active != name:
            await self._report(body, previous, Outcome(generation, conflict_with=active))
            return "conflict"
        try:
            policy = api.VGPUPolicy.from_object(body)
        except pydantic.ValidationError as exc:
            problems = [f"spec.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in exc.errors()]
            await self._report(body, previous, Outcome(generation, problems=problems))
            return "invalid"
        # Never render node-config from a partial node list: that would drop the entries of the
        # nodes not seen yet and restart their plugin pods.
        try:
            await asyncio.wait_for(self.nodes.seeded.wait(), timeout=self.tuning.nodes_timeout_seconds)
        except TimeoutError as exc:
            raise TimeoutError(f"no node list after {self.tuning.nodes_timeout_seconds:g}s") from exc
        observed = await self.kube.read_observed(policy.spec, self.nodes.all())
        # Restarts an interrupted reconcile announced and did not finish (plan.Pending).
        pending = pending_of([observed.device_config, observed.node_config, observed.scheduler_configmap])
        to_roll, rolled = unfinished(pending, [observed.scheduler_deployment, observed.device_plugin])
        rendered_for = _interrupted(policy, to_roll, pending) if to_roll else policy
        # Parsing what others wrote (bounded, yet up to 1 MiB a ConfigMap) and rendering for
        # thousands of nodes is CPU work: in a worker thread, watches and probes stay answered.
        render, found = await asyncio.to_thread(_render_and_validate, rendered_for, policy, observed)
        problems = [str(p) for p in found if p.severity == "error"]
        warnings = [str(p) for p in found if p.severity != "error"]
        nodes = report_nodes(observed.nodes, policy.spec, _node_splits(render.targets))
        if problems:
            await self._report(body, previous, Outcome(generation, problems=problems, warnings=warnings,
                                                       nodes=nodes))
            return "invalid"
        if not pending:
            self._recreated.clear()
        pending_nodes = set([str(n["metadata"]["name"]) for n in observed.nodes] if pending.all_nodes
                            else pending.nodes) - self._recreated
        plan = make_plan(render.targets, previous_from_status(body.get("status")),
                         enforce=policy.spec.drift_policy == "Enforce", paused=policy.spec.paused,
                         builtin_plugin=_builtin(policy, observed), pending_nodes=pending_nodes)
        apply_error: str | None = None
        restarted: list[Restart] = []
        if not policy.spec.paused:
            apply_error, restarted = await self._execute(plan, observed, body, pending)
        # Rollouts an interrupted reconcile did make: in status once (it may have written them).
        restarted = self._unreported + restarted
        recorded = {(r.target, r.hash) for r in previous.restarts} if previous else set()
        recorded |= {(r.target, r.hash) for r in restarted}
        self._unreported = [r for r in rolled if (r.target, r.hash) not in recorded] + restarted
        outcome = Outcome(generation, warnings=warnings, plan=plan, apply_error=apply_error, nodes=nodes,
                          paused=policy.spec.paused, restarts=self._unreported)
        await self._report(body, previous, outcome)
        self._unreported = []
        if apply_error:
            return "error"
        if policy.spec.paused:
            return "paused"
        await self._settle_pending(plan, bool(pending or plan.restarts), logs.PolicyLogger(body, logger))
        self._recreated.clear()
        return "ok"

    async def _execute(self, plan: Plan, observed: Observed, body: dict[str, Any],
                       pending: Pending) -> tuple[str | None, list[Restart]]:
        """Write the planned targets, then recreate plugin pods. Returns the error text on failure,
        else the restarts that really happened (reported in status, events and metrics).

        Each ConfigMap write carries every restart still to do (`pending`, plus this plan's) in
        the same request: a crash before they are done cannot lose them (`_settle_pending`)."""
        announce = pending.merged(Pending.of(plan.restarts))
        marker: dict[str, str | None] | None = {PENDING_ANNOTATION: announce.text()} if announce else None
        recreated: set[str] = set()
        written: list[str] = []
        error: str | None = None
        log = logs.PolicyLogger(body, logger)
        self._recreated -= set(plan.recreate_plugin_pods_on)  # announced anew: not done yet
        why = {r.target: r.reason for r in plan.restarts if r.kind == "plugin-pod"}  # node -> reason
        try:
            for decision in (d for d in plan.decisions if d.write):
                target = decision.target
                await self.kube.apply(target, marker if target.kind == "ConfigMap" else None)
                written.append(describe(target))  # the ref Plan.done matches restarts by
                _log_write(log, decision)
            if plan.recreate_plugin_pods_on and observed.device_plugin is not None:
                for pod in await self.kube.plugin_pods(observed.device_plugin, plan.recreate_plugin_pods_on):
                    namespace, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                    if await self.kube.delete_pod(namespace, pod_name):
                        node = pod["spec"].get("nodeName", "")
                        recreated.add(node)
                        self._recreated.add(node)
                        logs.action(log, "restarted", "Pod", namespace, pod_name, "config",
                                    f"device plugin pod on {node} deleted to restart it "
                                    f"({why.get(node, 'config changed')})")
        except Exception as exc:
            error = describe_error(exc)[:1024]
            log.warning("applying VGPUPolicy %s failed: %s", body["metadata"]["name"], error)
            await self.kube.post_event(body, "Warning", "ApplyFailed", error)
        else:
            self.metrics.drift_repairs.inc(sum(1 for d in plan.decisions if d.repair))
        # What happened before a failure did happen: reported like a whole apply's.
        restarted = plan.done(recreated, written)
        for restart in restarted:
            if restart.kind != "plugin-pod":  # a rollout: the workload write above started it
                kind, namespace, name = parse_ref(restart.target)
                logs.action(log, "restarted", kind, namespace, name, "config", f"rollout ({restart.reason})")
        self.metrics.record_restarts(restarted)
        for event in [*(plan.events if error is None else []), *restart_events(restarted)]:
            await self.kube.post_event(body, event.type, event.reason, event.message)
        return error, restarted

    async def _settle_pending(self, plan: Plan, announced: bool, log: logs.PolicyLogger) -> None:
        """Every announced restart is done (and in status): remove the announcements, from the
        ConfigMaps that had one and those this reconcile wrote with one."""
        if not announced:
            return
        for decision in plan.decisions:
            target = decision.target
            had = PENDING_ANNOTATION in (((target.live or {}).get("metadata") or {}).get("annotations") or {})
            if target.kind != "ConfigMap" or not (had or decision.write):
                continue
            try:
                await self.kube.patch("ConfigMap", target.namespace, target.name,
                                      {"metadata": {"annotations": {PENDING_ANNOTATION: None}}})
            except ApiException as exc:
                if exc.status != 404:  # deleted meanwhile: nothing left to remove
                    raise
            else:
                logs.action(log, "updated", "ConfigMap", target.namespace, target.name, "restarts-done",
                            f"restarts done, {PENDING_ANNOTATION} removed")

    async def _report_failure(self, name: str, exc: Exception) -> None:
        """Say in status that the reconcile failed before it could report (best effort: the API
        may be what failed): Ready becomes Unknown, the rest stays as last reported."""
        body = self.policies.bodies.get(name)
        if body is None or self.policies.active() != name:
            return
        error = describe_error(exc)[:1024]
        generation = body["metadata"].get("generation")
        previous = parse_status(body.get("status"))
        now = now_rfc3339()
        if not self.paused:
            self.metrics.policy_ready.set(0)
        try:
            before = previous.condition("Ready") if previous else None
            if before is None or before.status != "Unknown":
                await self.kube.post_event(body, "Warning", "ReconcileFailed", error)
            await self._write_status(body, failed_status(previous, generation, error, now),
                                     lambda fresh: failed_status(fresh, generation, error, now))
        except Exception as report_exc:
            logger.warning("could not report the failed reconcile of VGPUPolicy %s: %s", name, report_exc)

    async def _report(self, body: dict[str, Any], previous: api.VGPUPolicyStatus | None,
                      outcome: Outcome) -> None:
        """Write status when it changed; post an event when a condition turned bad."""
        now = now_rfc3339()
        status = build_status(outcome, previous, now)
        if outcome.conflict_with is None and not self.paused:
            self.metrics.nodes_converged.set(status.nodes.converged)
            ready = status.condition("Ready")
            self.metrics.policy_ready.set(1 if ready is not None and ready.status == "True" else 0)
        for condition in status.conditions:
            before = previous.condition(condition.type) if previous else None
            turned = before is None or before.status != condition.status
            bad = (condition.type == "Conflict") == (condition.status == "True")
            if turned and bad and condition.type in ("Valid", "Conflict"):
                reason = "Rejected" if condition.type == "Valid" else "Conflict"
                await self.kube.post_event(body, "Warning", reason, condition.message)
            elif condition.type == "Valid" and condition.status == "True" and condition.message and (
                    before is None or before.message != condition.message):
                await self.kube.post_event(body, "Warning", "ValidationWarning", condition.message)
        await self._write_status(body, status, lambda fresh: build_status(outcome, fresh, now))

    async def _write_status(self, body: dict[str, Any], status: api.VGPUPolicyStatus,
                            rebuild: Callable[[api.VGPUPolicyStatus | None], api.VGPUPolicyStatus]) -> None:
        """Write `status` (when it differs) to the version of the policy it was computed from.
        A 409 means the policy changed since (another replica's status, kopf's marks): read it and
        `rebuild` the status on top of the newer one, so its `restarts` history is kept, not
        replaced by ours."""
        name = body["metadata"]["name"]
        for _ in range(STATUS_ATTEMPTS):
            new, old = status_dict(status), dict(body.get("status") or {})
            if new == {key: value for key, value in old.items() if key in new}:
                return
            patch = {**new, **{key: None for key in old if key not in new and key != "kopf"}}
            version = str(body["metadata"].get("resourceVersion") or "") or None
            try:
                written = await self.kube.patch_status(name, patch, version)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                fresh = await self.kube.get(api.KIND, None, name)
                if fresh is None:
                    return  # deleted meanwhile: no status to write
                self.policies.update(fresh)
                body, status = fresh, rebuild(parse_status(fresh.get("status")))
                continue
            if written:
                self.policies.update(written)
            summary = ", ".join(f"{c.type}={c.status}" for c in status.conditions)
            logs.action(logs.PolicyLogger(body, logger), "updated", api.KIND, None, name, "status",
                        f"status ({summary})")
            return
        raise RuntimeError(f"VGPUPolicy {name}: status still conflicting after {STATUS_ATTEMPTS} attempts")


def _log_write(log: logs.PolicyLogger, decision: Decision) -> None:
    """The INFO line of one target write: created or updated for the policy, or repaired drift."""
    target = decision.target
    if decision.repair:
        verb, reason = "repaired", "drift"
        detail = ("deleted by hand, recreated" if target.live is None else "hand edit undone") + \
            " (driftPolicy Enforce)"
    elif target.live is None:
        verb, reason, detail = "created", "policy", "rendered from the policy"
    else:
        verb, reason, detail = "updated", "policy", "differed from the policy"
    logs.action(log, verb, target.kind, target.namespace, target.name, reason, detail)


def _interrupted(policy: api.VGPUPolicy, refs: Collection[str], pending: Pending) -> api.VGPUPolicy:
    """The policy as rendering must see it when the workloads `refs` were announced and not
    rolled: their inputs may be written already, so they count as a failed apply (status state
    Error: `render.running_hashes`), which rolls them although their inputs look current."""
    status = policy.status or api.VGPUPolicyStatus()
    interrupted: dict[tuple[str, str, str], api.TargetStatus] = {}
    for ref in refs:
        kind, namespace, name = parse_ref(ref)
        interrupted[(kind, namespace, name)] = api.TargetStatus(
            kind=kind, namespace=namespace, name=name, hash=pending.workloads[ref], state="Error",
            message="a reconcile was interrupted before rolling it")
    kept: Sequence[api.TargetStatus] = [t for t in status.targets
                                        if (t.kind, t.namespace, t.name) not in interrupted]
    targets = [*kept, *interrupted.values()]
    return policy.model_copy(update={"status": status.model_copy(update={"targets": targets})})


def _render_and_validate(rendered_for: api.VGPUPolicy, policy: api.VGPUPolicy,
                         observed: Observed) -> tuple[RenderResult, list[Problem]]:
    """The render and every problem found in it or the cluster; any error blocks every write (a
    partial apply is how the four places drift apart)."""
    render = render_all(rendered_for, observed)
    found = validate(policy, observed, render)
    return render, found + [p for p in render.problems if p not in found]


def _node_splits(targets: list[TargetRender]) -> dict[str, int]:
    node_config_targets = (t for t in targets if t.kind == "ConfigMap" and t.key == node_config.CONFIGMAP_KEY)
    return next((t.node_splits for t in node_config_targets), {})


def _builtin(policy: api.VGPUPolicy, observed: Observed) -> bool:
    spec = policy.spec.device_plugin
    return plugin_generation(spec.generation, observed.device_plugin, spec.container).generation == "builtin"
