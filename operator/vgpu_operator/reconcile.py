"""One reconcile of a VGPUPolicy: read, validate, render, plan, write, report.

The I/O sequence around the pure core. Everything it decides comes from `validate`, `render_all`,
`make_plan` and `build_status`; this module only moves data between them and the API, keeps the
in-memory indexes (policies, nodes) the kopf handlers feed, and serialises reconciles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic
from vgpu_formats import annotations as node_annotations
from vgpu_formats import node_config

from vgpu_operator import api
from vgpu_operator.k8s import Kube, now_rfc3339
from vgpu_operator.metrics import Metrics
from vgpu_operator.observed import Observed, wanted_objects
from vgpu_operator.plan import Plan, Restart, make_plan, previous_from_status, restart_events
from vgpu_operator.render import render_all
from vgpu_operator.render.target import MANAGED_BY, MANAGED_BY_LABEL, TargetRender
from vgpu_operator.status import Outcome, build_status, parse_status, report_nodes, status_dict
from vgpu_operator.validate import validate
from vgpu_operator.versions import plugin_generation

logger = logging.getLogger(__name__)

NODE_KEYS = (node_annotations.NODE_REGISTER,)  # the only node annotation rendering and status read
BACKOFF_SECONDS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)  # after the 1st, 2nd, ... failure in a row


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
        # (active policy body, the objects it names): `is_target` runs on every ConfigMap,
        # Deployment and DaemonSet event, so the body is parsed once per new state, not per event.
        self._targets: tuple[dict[str, Any] | None, frozenset[tuple[str, str, str]]] = (None, frozenset())
        # Policies this replica works on now (their kopf daemon runs). With peering, a paused
        # replica's daemons are stopped, so its worker stops resyncing: one writer at a time.
        self.working: set[str] = set()
        self.paused = False  # peering paused this replica: a reconcile still under way exports nothing

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

    def is_target(self, kind: str, namespace: str | None, name: str | None) -> bool:
        """Is this object one the active policy renders or reads?"""
        active = self.policies.active()
        if active is None:
            return False
        body = self.policies.bodies[active]
        if self._targets[0] is not body:  # PolicyIndex stores a new dict for every new state
            try:
                wanted = frozenset(wanted_objects(api.VGPUPolicy.from_object(body).spec).values())
            except pydantic.ValidationError:
                wanted = frozenset()
            self._targets = (body, wanted)
        return (kind, namespace or "", name or "") in self._targets[1]

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
            except Exception:
                logger.exception("reconcile of VGPUPolicy %s failed", name)
                result = "error"
            self.metrics.reconciles.labels(result=result).inc()
            self.metrics.duration.observe(time.monotonic() - started)
            return result != "error"

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
        await asyncio.wait_for(self.nodes.seeded.wait(), timeout=self.tuning.nodes_timeout_seconds)
        observed = await self.kube.read_observed(policy.spec, self.nodes.all())
        render = render_all(policy, observed)
        found = validate(policy, observed, render)
        # Any error blocks every write: a partial apply is how the four places drift apart.
        found += [p for p in render.problems if p not in found]
        problems = [str(p) for p in found if p.severity == "error"]
        warnings = [str(p) for p in found if p.severity != "error"]
        nodes = report_nodes(observed.nodes, policy.spec, _node_splits(render.targets))
        if problems:
            await self._report(body, previous, Outcome(generation, problems=problems, warnings=warnings,
                                                       nodes=nodes))
            return "invalid"
        plan = make_plan(render.targets, previous_from_status(body.get("status")),
                         enforce=policy.spec.drift_policy == "Enforce", paused=policy.spec.paused,
                         builtin_plugin=_builtin(policy, observed))
        apply_error: str | None = None
        restarted: list[Restart] = []
        if not policy.spec.paused:
            apply_error, restarted = await self._execute(plan, observed, body)
        outcome = Outcome(generation, warnings=warnings, plan=plan, apply_error=apply_error, nodes=nodes,
                          paused=policy.spec.paused, restarts=restarted)
        await self._report(body, previous, outcome)
        if apply_error:
            return "error"
        return "paused" if policy.spec.paused else "ok"

    async def _execute(self, plan: Plan, observed: Observed,
                       body: dict[str, Any]) -> tuple[str | None, list[Restart]]:
        """Write the planned targets, then recreate plugin pods. Returns the error text on failure,
        else the restarts that really happened (reported in status, events and metrics)."""
        recreated: set[str] = set()
        try:
            for target in plan.writes:
                await self.kube.apply(target)
            if plan.recreate_plugin_pods_on and observed.device_plugin is not None:
                for pod in await self.kube.plugin_pods(observed.device_plugin, plan.recreate_plugin_pods_on):
                    if await self.kube.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"]):
                        recreated.add(pod["spec"].get("nodeName", ""))
        except Exception as exc:
            logger.warning("applying VGPUPolicy %s failed: %s", body["metadata"]["name"], exc)
            await self.kube.post_event(body, "Warning", "ApplyFailed", str(exc))
            return f"{type(exc).__name__}: {exc}"[:1024], []
        restarted = plan.done(recreated)
        self.metrics.drift_repairs.inc(sum(1 for d in plan.decisions if d.repair))
        self.metrics.record_restarts(restarted)
        for event in [*plan.events, *restart_events(restarted)]:
            await self.kube.post_event(body, event.type, event.reason, event.message)
        return None, restarted

    async def _report(self, body: dict[str, Any], previous: api.VGPUPolicyStatus | None,
                      outcome: Outcome) -> None:
        """Write status when it changed; post an event when a condition turned bad."""
        status = build_status(outcome, previous, now_rfc3339())
        new, old = status_dict(status), dict(body.get("status") or {})
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
        if new == {key: value for key, value in old.items() if key in new}:
            return
        patch = {**new, **{key: None for key in old if key not in new and key != "kopf"}}
        written = await self.kube.patch_status(body["metadata"]["name"], patch)
        if written:
            self.policies.update(written)


def _node_splits(targets: list[TargetRender]) -> dict[str, int]:
    node_config_targets = (t for t in targets if t.kind == "ConfigMap" and t.key == node_config.CONFIGMAP_KEY)
    return next((t.node_splits for t in node_config_targets), {})


def _builtin(policy: api.VGPUPolicy, observed: Observed) -> bool:
    spec = policy.spec.device_plugin
    return plugin_generation(spec.generation, observed.device_plugin, spec.container).generation == "builtin"
