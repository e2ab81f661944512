"""What a reconcile should do, decided from the render, the cluster and what we applied before.

Pure: no I/O. `make_plan` classifies every target:

* live == desired                                  -> InSync, no write (a steady state writes nothing)
* differs, and desired is what we last applied     -> drift (someone edited or deleted it by hand):
  Enforce writes it back (a repair), Report only reports it (Drifted / Missing)
* differs otherwise (policy changed, first adoption) -> write (Updated)
* paused                                            -> nothing is written, differences are reported
* not rendered (bad input, `error` set)             -> Error, nothing written

Restarts follow from the writes (restart matrix, research anchors.md §5): the renderers put the
config hash into the pod templates, so writing a changed hash *is* the scheduler or DaemonSet
rollout; device-plugin pods are deleted only on nodes whose node-config entry changed, only for
plugins that read node-config at start (not the builtin one, which watches the ConfigMap), and not
when the DaemonSet is rolling anyway.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from vgpu_formats import node_config

from vgpu_operator.api import TargetState
from vgpu_operator.render.device_plugin import ANNOTATION as PLUGIN_HASH
from vgpu_operator.render.inputs import template_annotations
from vgpu_operator.render.scheduler_deployment import ANNOTATION as SCHEDULER_HASH

RestartKind = Literal["scheduler", "daemonset", "plugin-pod"]


class Target(Protocol):
    """The parts of the core's TargetRender the plan reads."""

    kind: str
    namespace: str
    name: str
    live: dict[str, Any] | None
    desired: dict[str, Any] | None  # None: could not be rendered, `error` says why
    content_hash: str
    changed: bool
    key: str | None  # ConfigMaps: the data key we own
    restart_hash: str | None  # workloads: the pod-template hash annotation value we want
    changed_nodes: list[str]  # node-config: nodes whose entry changed
    error: Any  # a Problem (field, reason, message) or None

    def patch(self) -> dict[str, Any]: ...


TargetKey = tuple[str, str, str]


def key_of(target: Target) -> TargetKey:
    return target.kind, target.namespace, target.name


def describe(target: Target) -> str:
    return f"{target.kind} {target.namespace}/{target.name}"


@dataclass(frozen=True)
class Previous:
    """What the last reconcile left in status for one target."""

    hash: str
    state: str


@dataclass(frozen=True)
class Decision:
    """One target's outcome: whether to write it, and the state/hash status will show."""

    target: Target
    write: bool
    repair: bool
    state: TargetState
    hash: str  # the content hash the cluster holds after this reconcile, as far as we know
    message: str


@dataclass(frozen=True)
class Restart:
    kind: RestartKind
    target: str
    reason: str
    hash: str = ""


@dataclass(frozen=True)
class PlannedEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    decisions: list[Decision]
    restarts: list[Restart] = field(default_factory=list)
    recreate_plugin_pods_on: list[str] = field(default_factory=list)
    events: list[PlannedEvent] = field(default_factory=list)

    def done(self, recreated_on: Collection[str]) -> list[Restart]:
        """The planned restarts that happened, once applied: a plugin pod counts only on a node
        where one was really deleted (a node may have none yet, or it was gone already)."""
        return [r for r in self.restarts if r.kind != "plugin-pod" or r.target in recreated_on]

    @property
    def writes(self) -> list[Target]:
        return [decision.target for decision in self.decisions if decision.write]

    @property
    def drifted(self) -> list[Decision]:
        return [d for d in self.decisions if d.state in ("Drifted", "Missing")]


def previous_from_status(status: Mapping[str, Any] | None) -> dict[TargetKey, Previous]:
    """Index status.targets (as stored on the policy) by (kind, namespace, name)."""
    result: dict[TargetKey, Previous] = {}
    for entry in (status or {}).get("targets") or []:
        if isinstance(entry, Mapping):
            key = (str(entry.get("kind", "")), str(entry.get("namespace", "")), str(entry.get("name", "")))
            result[key] = Previous(hash=str(entry.get("hash") or ""), state=str(entry.get("state") or ""))
    return result


def _decide(target: Target, previous: Previous | None, enforce: bool, paused: bool) -> Decision:
    last_applied = previous.hash if previous else ""
    if target.error is not None or target.desired is None:
        return Decision(target, False, False, "Error", last_applied, str(target.error or "not rendered"))
    if not target.changed:
        return Decision(target, False, False, "InSync", target.content_hash, "")
    hand_edited = bool(last_applied) and last_applied == target.content_hash
    gone = target.live is None
    if paused:
        state: TargetState = "Missing" if gone else "Drifted"
        return Decision(target, False, False, state, last_applied,
                        "paused: differs from the policy, not written")
    if not hand_edited:
        message = "created" if gone else "updated to the policy"
        return Decision(target, True, False, "Updated", target.content_hash, message)
    if enforce:
        message = "recreated after it was deleted by hand" if gone else "repaired a hand edit"
        return Decision(target, True, True, "Updated", target.content_hash, message)
    message = "deleted by hand" if gone else "changed by hand"
    return Decision(target, False, False, "Missing" if gone else "Drifted", last_applied,
                    f"{message}; driftPolicy Report leaves it")


def _template_annotation(obj: dict[str, Any] | None, key: str) -> str | None:
    value = template_annotations(obj).get(key)
    return None if value is None else str(value)


def _is_node_config(target: Target) -> bool:
    return target.kind == "ConfigMap" and target.key == node_config.CONFIGMAP_KEY


def _restarts(decisions: Sequence[Decision], builtin_plugin: bool) -> tuple[list[Restart], list[str]]:
    restarts: list[Restart] = []
    node_changes: list[str] = []
    daemonset_rolls = False
    for decision in decisions:
        if not decision.write:
            continue
        target = decision.target
        if target.kind == "Deployment":
            before, after = _template_annotation(target.live, SCHEDULER_HASH), target.restart_hash
            if after is not None and before != after:
                restarts.append(Restart("scheduler", describe(target), "scheduler config changed", after))
        elif target.kind == "DaemonSet":
            before, after = _template_annotation(target.live, PLUGIN_HASH), target.restart_hash
            if after is not None and before != after:
                daemonset_rolls = True
                restarts.append(Restart("daemonset", describe(target), "device plugin config changed", after))
        elif _is_node_config(target):
            node_changes = list(target.changed_nodes)
    if builtin_plugin or daemonset_rolls:
        node_changes = []
    restarts += [Restart("plugin-pod", node, "node-config entry changed") for node in node_changes]
    return restarts, node_changes


def _events(decisions: Sequence[Decision], previous: Mapping[TargetKey, Previous]) -> list[PlannedEvent]:
    events: list[PlannedEvent] = []
    for decision in decisions:
        target = decision.target
        if decision.repair:
            events.append(PlannedEvent("Warning", "DriftRepaired", f"{describe(target)}: {decision.message}"))
        elif decision.write:
            events.append(PlannedEvent("Normal", "Applied", f"{describe(target)}: {decision.message}"))
        elif decision.state in ("Drifted", "Missing"):
            before = previous.get(key_of(target))
            if before is None or before.state != decision.state:  # report a drift once, not every resync
                message = f"{describe(target)}: {decision.message}"
                events.append(PlannedEvent("Warning", "DriftDetected", message))
    return events


def restart_events(restarts: Sequence[Restart]) -> list[PlannedEvent]:
    """Events for restarts that happened (see `Plan.done`): one per rollout, one for all pods."""
    events = [PlannedEvent("Normal", "Restarted", f"{restart.target}: rollout ({restart.reason})")
              for restart in restarts if restart.kind != "plugin-pod"]
    nodes = [restart.target for restart in restarts if restart.kind == "plugin-pod"]
    if nodes:
        message = f"device plugin pods recreated on {len(nodes)} node(s): {', '.join(nodes[:10])}"
        events.append(PlannedEvent("Normal", "Restarted", message))
    return events


def make_plan(targets: Sequence[Target], previous: Mapping[TargetKey, Previous], *, enforce: bool,
              paused: bool, builtin_plugin: bool) -> Plan:
    """Decide writes, restarts and events for one reconcile of the active policy."""
    decisions = [_decide(target, previous.get(key_of(target)), enforce, paused) for target in targets]
    restarts, nodes = _restarts(decisions, builtin_plugin)
    return Plan(decisions=decisions, restarts=restarts, recreate_plugin_pods_on=nodes,
                events=_events(decisions, previous))
