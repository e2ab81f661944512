"""One reconcile of a VGPUPolicy: read, decide, write, report.

The I/O sequence around the pure core: read the objects the policy names into a `ClusterView`,
`decide.decide` what to do, execute its plan (writes, then plugin pod restarts), and write the
status `build_status` makes of the outcome, with the events the plan and the conditions call for.
Nothing here decides; it moves data between the core and the API and serialises reconciles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import pydantic
from vgpu_formats.device_config import error_path
from vgpu_formats.kubeapi import ApiException

from vgpu_operator import api, decide, logs
from vgpu_operator.k8s import Kube, describe_error, now_rfc3339
from vgpu_operator.metrics import Metrics
from vgpu_operator.plan import (
    PENDING_ANNOTATION,
    Pending,
    Plan,
    Restart,
    TargetDecision,
    describe,
    parse_ref,
    restart_events,
)
from vgpu_operator.registry import TARGETS
from vgpu_operator.render.target import MANAGED_BY, MANAGED_BY_LABEL
from vgpu_operator.runtime.indexes import NodeIndex, PolicyIndex
from vgpu_operator.status import (
    Outcome,
    build_status,
    condition_events,
    failed_status,
    parse_status,
    status_dict,
)
from vgpu_operator.view import ClusterView

logger = logging.getLogger(__name__)

STATUS_ATTEMPTS = 5  # status writes that met a newer policy (409), each merged into it anew
NODES_TIMEOUT_SECONDS = 30.0  # how long a reconcile waits for the first full node list
APPLY_FAILED_REPEAT_SECONDS = 600.0  # the same ApplyFailed event again after this long


class Reconciler:
    """Reconciles one policy at a time: `reconcile(name)` reads, decides, writes and reports once;
    when and how often is the runtime's business (`vgpu_operator.runtime.worker`)."""

    def __init__(self, kube: Kube, metrics: Metrics, *, nodes_timeout: float = NODES_TIMEOUT_SECONDS,
                 policies: PolicyIndex | None = None, nodes: NodeIndex | None = None) -> None:
        self.kube = kube
        self.metrics = metrics
        self.nodes_timeout = nodes_timeout
        self.policies = policies or PolicyIndex()
        self.nodes = nodes or NodeIndex()
        self._lock = asyncio.Lock()
        self.paused = False  # peering paused this replica: a reconcile still under way exports nothing
        # Restarts made but not in status yet (its write failed): the next status write adds them.
        self._unreported: list[Restart] = []
        # Nodes whose plugin pod this process recreated while announced restarts were pending: a
        # reconcile that retries after a late failure must not restart them twice.
        self._recreated: set[str] = set()
        # Per policy (`_identity`), the ApplyFailed event last posted and when (monotonic).
        self._apply_failed: dict[str, tuple[str, float]] = {}
        # Per policy (`_identity`), the fields unknown here last said, and for which generation.
        self._unknown_said: dict[str, tuple[Any, tuple[str, ...]]] = {}

    async def release(self, name: str, body: dict[str, Any]) -> None:
        """The policy is going away: keep every rendered setting (the cluster keeps working) and
        drop only the managed-by label we put on ConfigMaps we created.

        What can never succeed does not hold the deletion up: a spec that does not validate names
        no targets, and a target the operator may not read or patch (403) or that is gone (404)
        keeps its label, said in a Warning Event. Other errors (timeouts, 5xx) are raised for the
        caller to retry."""
        async with self._lock:
            log = logs.PolicyLogger(body, logger)
            try:
                policy, _ = api.VGPUPolicy.from_api({**body, "status": None})
            except pydantic.ValidationError as exc:
                log.warning("policy deleted with a spec that does not validate (%d problems): no "
                            "target released", len(exc.errors()))
                await self.kube.post_event(body, "Warning", "Released", "policy deleted with an invalid "
                                           "spec: rendered configuration left in place, labels not removed")
                self._forget(body)
                return
            kept: list[str] = []
            for target in (t for t in TARGETS if t.owned):
                kind, namespace, cm_name = target.key(policy.spec)
                try:
                    await self._unlabel(log, kind, namespace, cm_name)
                except ApiException as exc:
                    if exc.status not in (403, 404):
                        raise
                    why = describe_error(exc)
                    log.warning("%s %s/%s: label not removed: %s", kind, namespace, cm_name, why)
                    kept.append(f"{kind} {namespace}/{cm_name} ({why})")
            if kept:
                await self.kube.post_event(body, "Warning", "Released", "policy deleted: rendered "
                                           "configuration left in place; label not removed from "
                                           + "; ".join(kept))
            else:
                await self.kube.post_event(body, "Normal", "Released", "policy deleted: rendered "
                                           "configuration left in place, ownership labels removed")
            self._forget(body)

    def _forget(self, body: dict[str, Any]) -> None:
        """The policy is gone; with no other active one, the policy gauges say there is none."""
        self.policies.update(body, deleted=True)
        if self.policies.active() is None and not self.paused:
            self.metrics.no_policy()

    async def _unlabel(self, log: logs.PolicyLogger, kind: str, namespace: str, name: str) -> None:
        live = await self.kube.get(kind, namespace, name)
        labels = ((live or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) == MANAGED_BY:
            await self.kube.patch(kind, namespace, name, {"metadata": {"labels": {MANAGED_BY_LABEL: None}}})
            logs.action(log, "released", kind, namespace, name, "policy-deleted",
                        f"{MANAGED_BY_LABEL} label removed, data left in place")

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

    def _say_unknown(self, body: dict[str, Any], unknown: list[str]) -> None:
        """Fields of a newer CRD than this operator's (a rollback), ignored: said once a generation."""
        key, said = _identity(body), (body["metadata"].get("generation"), tuple(unknown))
        if self._unknown_said.get(key) == said:
            return
        self._unknown_said[key] = said
        logs.PolicyLogger(body, logger).warning(
            "the policy has fields this operator does not know, ignored: %s. The installed CRD is "
            "newer than the operator (a rollback keeps the newer CRD): upgrade the operator, or "
            "leave those fields at their defaults", ", ".join(unknown))

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
            await self._report(body, previous, decide.conflict(generation, active).outcome())
            return "conflict"
        try:
            policy, unknown = api.VGPUPolicy.from_api(body)
        except pydantic.ValidationError as exc:
            # The locations start at the object (`spec...`); pydantic prefixes a validator's own
            # message with "Value error, ", which says nothing to a user.
            problems = [f"{error_path(err['loc'])}: {err['msg'].removeprefix('Value error, ')}"
                        for err in exc.errors()]
            await self._report(body, previous, decide.rejected(generation, problems).outcome())
            return "invalid"
        # Unknown status fields are a newer operator's, rewritten by this one: not the admin's.
        on_spec = [path for path in unknown if path.startswith("spec.")]
        if on_spec:
            self._say_unknown(body, on_spec)
        # Never render node-config from a partial node list: that would drop the entries of the
        # nodes not seen yet and restart their plugin pods.
        try:
            await asyncio.wait_for(self.nodes.seeded.wait(), timeout=self.nodes_timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"no node list after {self.nodes_timeout:g}s") from exc
        observed = await self.kube.read_observed(policy.spec, self.nodes.all())
        view = ClusterView.of(observed, policy.spec, policy.status)  # the same objects `decide` gets
        if not view.pending:
            self._recreated.clear()
        # Parsing what others wrote (bounded, yet up to 1 MiB a ConfigMap) and rendering for
        # thousands of nodes is CPU work: in a worker thread, watches and probes stay answered.
        decision = await asyncio.to_thread(decide.decide, policy, view, generation=generation,
                                           recreated=frozenset(self._recreated))
        if decision.plan is None:
            await self._report(body, previous, decision.outcome())
            return decision.result
        plan = decision.plan
        apply_error: str | None = None
        restarted: list[Restart] = []
        written: frozenset[str] = frozenset()
        if not decision.paused:
            apply_error, restarted, written = await self._execute(plan, view, body)
        # Rollouts an interrupted reconcile did make: in status once (it may have written them).
        restarted = self._unreported + restarted
        recorded = {(r.target, r.hash) for r in previous.restarts} if previous else set()
        recorded |= {(r.target, r.hash) for r in restarted}
        self._unreported = [r for r in decision.rolled if (r.target, r.hash) not in recorded] + restarted
        await self._report(body, previous, decision.outcome(apply_error, self._unreported, written))
        self._unreported = []
        if apply_error:
            return "error"
        if decision.paused:
            return "paused"
        await self._settle_pending(plan, bool(view.pending or plan.restarts), logs.PolicyLogger(body, logger))
        self._recreated.clear()
        return "ok"

    async def _execute(self, plan: Plan, view: ClusterView,
                       body: dict[str, Any]) -> tuple[str | None, list[Restart], frozenset[str]]:
        """Write the planned targets, then recreate plugin pods. Returns the error text on failure
        (else None), the restarts that really happened (reported in status, events and metrics)
        and the targets written.

        Each ConfigMap write carries every restart still to do (`pending`, plus this plan's) in
        the same request: a crash before they are done cannot lose them (`_settle_pending`)."""
        announce = view.pending.merged(Pending.of(plan.restarts))
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
            if plan.recreate_plugin_pods_on and view.device_plugin is not None:
                for pod in await self.kube.plugin_pods(view.device_plugin, plan.recreate_plugin_pods_on):
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
            if self._apply_failure_is_news(_identity(body), error):
                await self.kube.post_event(body, "Warning", "ApplyFailed", error)
        else:
            self._apply_failed.pop(_identity(body), None)
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
        return error, restarted, frozenset(written)

    def _apply_failure_is_news(self, policy: str, error: str) -> bool:
        """Whether an ApplyFailed event is due: the first failure in a row, one that says something
        else, or the same again after APPLY_FAILED_REPEAT_SECONDS (Events expire; the Applied
        condition says it all along). A lasting failure retried every few seconds posted an
        Event each time."""
        now = time.monotonic()
        last = self._apply_failed.get(policy)
        if last is not None and last[0] == error and now - last[1] < APPLY_FAILED_REPEAT_SECONDS:
            return False
        self._apply_failed[policy] = (error, now)
        return True

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
            self.metrics.policy_present.set(1)  # active, just not reconciled: NotReady must fire
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
        """Write status when it changed; post the events its conditions call for."""
        now = now_rfc3339()
        status = build_status(outcome, previous, now)
        if outcome.conflict_with is None and not self.paused:
            self.metrics.policy_present.set(1)
            self.metrics.nodes_converged.set(status.nodes.converged)
            ready = status.condition("Ready")
            self.metrics.policy_ready.set(1 if ready is not None and ready.status == "True" else 0)
        for event in condition_events(previous, status):
            await self.kube.post_event(body, event.type, event.reason, event.message)
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


def _log_write(log: logs.PolicyLogger, decision: TargetDecision) -> None:
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


def _identity(body: dict[str, Any]) -> str:
    """A policy's uid (a policy deleted and made again is another), else its name."""
    meta = body.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name"))
