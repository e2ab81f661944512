"""What a reconcile should do, decided from the render, the cluster and what we applied before.

Pure: no I/O. `make_plan` classifies every target:

* live == desired                                  -> InSync, no write (a steady state writes nothing)
* differs, and desired is what we last applied     -> drift (someone edited or deleted it by hand):
  Enforce writes it back (a repair), Report only reports it (Drifted / Missing)
* differs otherwise (policy changed, first adoption) -> write (Updated)
* paused                                            -> nothing is written, differences are reported
* not rendered (bad input, `error` set)             -> Error, nothing written

Restarts follow from the writes, by each target's restart rule in `registry.TARGETS`: the
renderers put the config hash into the pod templates, so writing a changed hash *is* the scheduler
or DaemonSet rollout (`Rollout`); device-plugin pods are deleted only on nodes whose node-config
entry changed (`PluginPods`), only for plugins that read node-config at start (not the builtin one,
which watches the ConfigMap), and not when the DaemonSet is rolling anyway.

A restart follows the ConfigMap write that causes it, so an operator that dies between the two
would leave the restart undone and the next one none the wiser (the inputs it reads are current
already). Every ConfigMap write of a reconcile that restarts something therefore carries the
restarts it announces (`Pending`, annotation `vgpu.io/pending-restarts`) in the same request; the
reconcile that finishes them removes it. A later reconcile that finds one finishes the job:
workloads whose pod template is not at the announced hash are rolled (`unfinished`), plugin pods on
the announced nodes are recreated (`make_plan(pending_nodes=...)`).
"""

from __future__ import annotations

import base64
import json
import logging
import zlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from vgpu_operator import api
from vgpu_operator.api import TargetState
from vgpu_operator.registry import BY_SLOT, ROLLOUTS, Key, PluginPods, RestartKind, Rollout
from vgpu_operator.render.inputs import describe as describe_object
from vgpu_operator.render.inputs import template_annotations, updated_on_delete
from vgpu_operator.render.target import TargetRender

logger = logging.getLogger(__name__)

PENDING_ANNOTATION = "vgpu.io/pending-restarts"
# Node names beyond this many characters are announced compressed (zlib, base64: node names share
# long prefixes, so thousands fit), and beyond MAX_PENDING_COMPRESSED_CHARS of that as "every
# node": an object's annotations share 256 KiB, and node-config itself may be most of a
# ConfigMap's 1 MiB. "Every node" would restart pods the change never touched if the reconcile
# that announced them failed half-way.
MAX_PENDING_NODE_CHARS = 32 * 1024
MAX_PENDING_COMPRESSED_CHARS = 64 * 1024
MAX_PENDING_INFLATED_BYTES = 1024 * 1024  # what a compressed list may inflate to (5,000 long names: 330 KB)
MAX_PENDING_NODES = 100_000


def key_of(target: TargetRender) -> Key:
    return target.kind, target.namespace, target.name


def describe(target: TargetRender) -> str:
    return describe_object(target.kind, target.namespace, target.name)


def parse_ref(ref: str) -> Key:
    """(kind, namespace, name) of a `describe` ref, `Deployment ns/name`: restarts keep their
    target as that text, the form the pending-restarts annotation carries."""
    kind, _, where = ref.partition(" ")
    namespace, _, name = where.partition("/")
    return kind, namespace, name


@dataclass(frozen=True)
class Previous:
    """What the last reconcile left in status for one target."""

    hash: str
    state: str


@dataclass(frozen=True)
class TargetDecision:
    """One target's outcome: whether to write it, and the state/hash status will show."""

    target: TargetRender
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
    decisions: list[TargetDecision]
    restarts: list[Restart] = field(default_factory=list)
    recreate_plugin_pods_on: list[str] = field(default_factory=list)
    events: list[PlannedEvent] = field(default_factory=list)

    def done(self, recreated_on: Collection[str], written: Collection[str] | None = None) -> list[Restart]:
        """The planned restarts that happened: a plugin pod counts only on a node where one was
        really deleted (a node may have none yet, or it was gone already), a rollout only if its
        workload (ref) was written (`written`, an apply may stop part way; None: all it planned)."""
        return [r for r in self.restarts if (r.target in recreated_on if r.kind == "plugin-pod"
                                             else written is None or r.target in written)]

    @property
    def writes(self) -> list[TargetRender]:
        return [decision.target for decision in self.decisions if decision.write]

    @property
    def drifted(self) -> list[TargetDecision]:
        return [d for d in self.decisions if d.state in ("Drifted", "Missing")]


def previous_from_status(status: api.VGPUPolicyStatus | None) -> dict[Key, Previous]:
    """Index the stored status's targets by (kind, namespace, name)."""
    return {(t.kind, t.namespace, t.name): Previous(t.hash or "", t.state or "")
            for t in (status.targets if status else [])}


def _decide_target(target: TargetRender, previous: Previous | None, enforce: bool,
                   paused: bool) -> TargetDecision:
    last_applied = previous.hash if previous else ""
    if target.error is not None or target.desired is None:
        error = str(target.error or "not rendered")
        return TargetDecision(target, False, False, "Error", last_applied, error)
    if not target.changed:
        return TargetDecision(target, False, False, "InSync", target.content_hash, "")
    hand_edited = bool(last_applied) and last_applied == target.content_hash
    gone = target.live is None
    if paused:
        state: TargetState = "Missing" if gone else "Drifted"
        return TargetDecision(target, False, False, state, last_applied,
                        "paused: differs from the policy, not written")
    if not hand_edited:
        message = "created" if gone else "updated to the policy"
        return TargetDecision(target, True, False, "Updated", target.content_hash, message)
    if enforce:
        message = "recreated after it was deleted by hand" if gone else "repaired a hand edit"
        return TargetDecision(target, True, True, "Updated", target.content_hash, message)
    message = "deleted by hand" if gone else "changed by hand"
    return TargetDecision(target, False, False, "Missing" if gone else "Drifted", last_applied,
                    f"{message}; driftPolicy Report leaves it")


def _template_annotation(obj: dict[str, Any] | None, key: str) -> str | None:
    value = template_annotations(obj).get(key)
    return None if value is None else str(value)


def _restarts(decisions: Sequence[TargetDecision], builtin_plugin: bool,
              pending_nodes: Collection[str] = ()) -> tuple[list[Restart], list[str]]:
    restarts: list[Restart] = []
    node_changes: list[str] = []
    daemonset_rolls = False
    for decision in decisions:
        if not decision.write:
            continue
        target = decision.target
        rule = BY_SLOT[target.slot].restart
        if isinstance(rule, Rollout):
            before, after = _template_annotation(target.live, rule.annotation), target.restart_hash
            if after is not None and before != after:
                if rule.kind == "daemonset" and updated_on_delete(target.live):
                    continue  # no pod restarts: not reported as a restart (validate warns)
                daemonset_rolls = daemonset_rolls or rule.kind == "daemonset"
                why = ("scheduler config changed" if rule.kind == "scheduler"
                       else "device plugin config changed")
                restarts.append(Restart(rule.kind, describe(target), why, after))
        elif isinstance(rule, PluginPods):
            # A repair restarts the nodes whose entry was edited too: a pod may have restarted
            # on the edit, or a restart still owed may have gone with a deleted ConfigMap's
            # pending-restarts annotation (once too often, never a restart lost).
            node_changes = list(target.changed_nodes)
    if pending_nodes:
        node_changes = sorted(set(node_changes) | set(pending_nodes))
    if builtin_plugin or daemonset_rolls:
        node_changes = []
    restarts += [Restart("plugin-pod", node, "node-config entry changed") for node in node_changes]
    return restarts, node_changes


def _events(decisions: Sequence[TargetDecision],
            previous: Mapping[Key, Previous]) -> list[PlannedEvent]:
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


@dataclass(frozen=True)
class Pending:
    """Restarts a ConfigMap write announced and no reconcile has finished yet.

    `workloads`: "Deployment ns/name" -> the restart hash its pod template must reach; `nodes`:
    nodes whose device plugin pod must be recreated; `all_nodes`: every node's (too many to name).
    """

    workloads: Mapping[str, str] = field(default_factory=dict)
    nodes: frozenset[str] = frozenset()
    all_nodes: bool = False

    def __bool__(self) -> bool:
        return bool(self.workloads or self.nodes or self.all_nodes)

    @classmethod
    def of(cls, restarts: Iterable[Restart]) -> Pending:
        restarts = list(restarts)
        return cls({r.target: r.hash for r in restarts if r.kind != "plugin-pod"},
                   frozenset(r.target for r in restarts if r.kind == "plugin-pod"))

    @classmethod
    def parse(cls, text: str | None) -> Pending:
        """The annotation's value; an unreadable one announces every node (the safe side: a
        plugin pod restarted once too often, never a restart lost)."""
        if not text:
            return cls()
        try:
            data = json.loads(text)
            workloads = {str(ref): str(value) for ref, value in dict(data.get("workloads") or {}).items()}
            nodes = _inflate(str(data["nodesZ"])) if "nodesZ" in data else data.get("nodes") or []
            if len(nodes) > MAX_PENDING_NODES:
                raise ValueError(f"more than {MAX_PENDING_NODES} node names")
            if nodes == "*":
                return cls(workloads, frozenset(), True)
            return cls(workloads, frozenset(str(node) for node in nodes))
        except (ValueError, TypeError, AttributeError, RecursionError, zlib.error):
            logger.warning("unreadable %s annotation (%d characters, %r...): recreating every plugin pod",
                           PENDING_ANNOTATION, len(text), text[:120])
            return cls(all_nodes=True)

    def text(self) -> str:
        names = sorted(self.nodes)
        raw = json.dumps(names, separators=(",", ":")).encode()  # what the reader inflates
        body: dict[str, Any] = {"workloads": dict(sorted(self.workloads.items())), "nodes": names}
        if self.all_nodes or len(raw) > MAX_PENDING_INFLATED_BYTES or len(names) > MAX_PENDING_NODES:
            body["nodes"] = "*"
        elif len(raw) > MAX_PENDING_NODE_CHARS:
            packed = base64.b64encode(zlib.compress(raw, 9)).decode()
            # "nodes": "*" beside it: an operator of the version before reads that (every node)
            # rather than no node at all.
            body["nodes"] = "*"
            if len(packed) <= MAX_PENDING_COMPRESSED_CHARS:
                body["nodesZ"] = packed
        return json.dumps(body, separators=(",", ":"))

    def merged(self, other: Pending) -> Pending:
        """Both announcements; where both name a workload, `other`'s (newer) hash."""
        return Pending({**self.workloads, **other.workloads}, self.nodes | other.nodes,
                       self.all_nodes or other.all_nodes)


def _inflate(packed: str) -> list[str]:
    """The node names of a compressed announcement (ValueError or zlib.error if it is not one)."""
    if len(packed) > MAX_PENDING_COMPRESSED_CHARS:
        raise ValueError("the compressed node list is longer than any this operator writes")
    inflater = zlib.decompressobj()
    raw = inflater.decompress(base64.b64decode(packed, validate=True), MAX_PENDING_INFLATED_BYTES)
    if inflater.unconsumed_tail or not inflater.eof:
        raise ValueError("the compressed node list inflates past its bound, or is cut short")
    names = json.loads(raw)
    if not isinstance(names, list):
        raise ValueError("the compressed node list is not a list")
    return [str(name) for name in names]


def pending_of(configmaps: Iterable[Mapping[str, Any] | None]) -> Pending:
    """Every restart announced on these (live) ConfigMaps."""
    pending = Pending()
    for cm in configmaps:
        annotations = ((cm or {}).get("metadata") or {}).get("annotations") or {}
        if PENDING_ANNOTATION in annotations:
            pending = pending.merged(Pending.parse(str(annotations[PENDING_ANNOTATION])))
    return pending


def unfinished(pending: Pending,
               workloads: Iterable[dict[str, Any] | None]) -> tuple[list[str], list[Restart]]:
    """Split the announced workload restarts: (refs still to roll: the pod template is not at the
    announced hash; restarts that did happen, the template is there). A workload that is gone
    has nothing left to roll: new pods read the current configuration."""
    live: dict[str, dict[str, Any]] = {}
    for obj in workloads:
        if obj is not None:
            meta = obj.get("metadata") or {}
            ref = describe_object(str(obj.get("kind")), str(meta.get("namespace")), str(meta.get("name")))
            live[ref] = obj
    todo: list[str] = []
    done: list[Restart] = []
    for ref, wanted in sorted(pending.workloads.items()):
        kind = parse_ref(ref)[0]
        rule = ROLLOUTS.get(kind)
        if ref not in live or rule is None:
            continue
        if _template_annotation(live[ref], rule.annotation) == wanted:
            done.append(Restart(rule.kind, ref, "config changed (rolled by an interrupted reconcile)",
                                wanted))
        else:
            todo.append(ref)
    return todo, done


def restart_events(restarts: Sequence[Restart]) -> list[PlannedEvent]:
    """Events for restarts that happened (see `Plan.done`): one per rollout, one for all pods."""
    events = [PlannedEvent("Normal", "Restarted", f"{restart.target}: rollout ({restart.reason})")
              for restart in restarts if restart.kind != "plugin-pod"]
    nodes = [restart.target for restart in restarts if restart.kind == "plugin-pod"]
    if nodes:
        message = f"device plugin pods recreated on {len(nodes)} node(s): {', '.join(nodes[:10])}"
        events.append(PlannedEvent("Normal", "Restarted", message))
    return events


def make_plan(targets: Sequence[TargetRender], previous: Mapping[Key, Previous], *, enforce: bool,
              paused: bool, builtin_plugin: bool, pending_nodes: Collection[str] = ()) -> Plan:
    """Decide writes, restarts and events for one reconcile of the active policy.
    `pending_nodes`: plugin pods an interrupted reconcile announced and did not recreate."""
    decisions = [_decide_target(target, previous.get(key_of(target)), enforce, paused) for target in targets]
    restarts, nodes = _restarts(decisions, builtin_plugin, pending_nodes)
    return Plan(decisions=decisions, restarts=restarts, recreate_plugin_pods_on=nodes,
                events=_events(decisions, previous))
