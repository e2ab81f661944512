"""The policy's status, computed from what a reconcile found and did. Pure: no I/O.

Conditions follow the Kubernetes convention: `lastTransitionTime` changes only when a condition's
status changes, so an unchanged cluster yields an identical status and no status write.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from vgpu_formats import annotations as node_annotations
from vgpu_formats.errors import FormatError
from vgpu_formats.quantity import quantity_or_zero

from vgpu_operator import api, placement
from vgpu_operator.plan import Plan, PlannedEvent, Restart, TargetDecision, describe
from vgpu_operator.render.selectors import node_name

MAX_MISMATCHED = 50
MAX_RESTARTS = 20
CondStatus = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class NodeReport:
    """One node as this policy sees it."""

    name: str
    gpu: bool
    registered: bool
    converged: bool
    reason: str = ""
    gpus: int = 0
    vgpus: int = 0
    memory_mib: int = 0


@dataclass(frozen=True)
class Outcome:
    """Everything a reconcile learned; the input of `build_status`."""

    generation: int | None
    problems: Sequence[str] = ()  # validation errors, each naming the field and the fix
    warnings: Sequence[str] = ()
    conflict_with: str | None = None  # the active policy, when this one is not it
    plan: Plan | None = None
    apply_error: str | None = None  # what failed while writing, if anything
    written: frozenset[str] = frozenset()  # with apply_error: the targets written before it
    nodes: Sequence[NodeReport] = ()
    paused: bool = False
    restarts: Sequence[Restart] = ()


# ----- nodes -----------------------------------------------------------------------------------


def report_node(node: Mapping[str, Any], spec: api.VGPUPolicySpec, split: int,
                plugin_expected: bool = True) -> NodeReport:
    """Is this a GPU node, did its plugin register, does it advertise what the policy says?
    `plugin_expected`: the device plugin DaemonSet selects the node; a node it does not select
    counts only once a plugin registered there (a pool of whole GPUs under NVIDIA's own plugin is
    none of the policy's nodes)."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    text = (meta.get("annotations") or {}).get(node_annotations.NODE_REGISTER)
    wanted = spec.resources.count
    advertised = sorted(res for res in (wanted, "volcano.sh/vgpu-number", "nvidia.com/gpu")
                        if quantity_or_zero(allocatable.get(res)) > 0)
    if text is None:
        if not advertised or not plugin_expected:
            return NodeReport(name, gpu=False, registered=False, converged=False)
        return NodeReport(name, True, False, False, "no volcano.sh/node-vgpu-register annotation: the "
                          "device plugin has not registered",
                          vgpus=quantity_or_zero(allocatable.get(advertised[0])))
    try:
        devices = node_annotations.decode_node_register(str(text))
    except FormatError as exc:
        return NodeReport(name, True, False, False, f"unreadable register annotation: {exc}")
    report = dict(gpus=len(devices), vgpus=sum(d.count for d in devices),
                  memory_mib=sum(d.devmem for d in devices) * spec.device.gpu_memory_factor)
    if wanted not in advertised:
        other = ", ".join(res for res in advertised if res != wanted) or "no vGPU resource"
        reason = f"node advertises {other} but policy says {wanted}"
        return NodeReport(name, True, True, False, reason, **report)
    wrong = sorted({d.count for d in devices if d.count != split})
    if wrong:
        reason = (f"registered split {', '.join(map(str, wrong))} but policy says {split} "
                  "(device plugin pod not restarted yet?)")
        return NodeReport(name, True, True, False, reason, **report)
    return NodeReport(name, True, True, True, "", **report)


def report_nodes(nodes: Sequence[Mapping[str, Any]], spec: api.VGPUPolicySpec,
                 splits: Mapping[str, int], plugin: Mapping[str, Any] | None = None) -> list[NodeReport]:
    """`splits`: node name -> the split count its node-config entry sets (the rendered target's
    `node_splits`); other nodes use the policy's default. `plugin`: the device plugin DaemonSet,
    whose placement (nodeSelector, required node affinity, tolerations: `placement.Placement`) says
    where a plugin is expected to register (None: everywhere); a node an override names is
    expected all the same (the policy means it)."""
    default = spec.device.device_split_count
    named = {name for override in spec.node_overrides for name in override.node_names or []}
    plugin_placement = placement.Placement.of(plugin)  # its pod template read once, not per node
    reports = []
    for node in nodes:
        name = node_name(dict(node))
        expected = name in named or plugin_placement.admits(node)
        reports.append(report_node(node, spec, splits.get(name) or default, expected))
    return [report for report in reports if report.gpu]


def node_summary(reports: Sequence[NodeReport]) -> api.NodeSummary:
    mismatched = [api.NodeMismatch(name=r.name, reason=r.reason) for r in reports if not r.converged]
    converged = sum(1 for r in reports if r.converged)
    return api.NodeSummary(total=len(reports), registered=sum(1 for r in reports if r.registered),
                           converged=converged, summary=f"{converged}/{len(reports)}",
                           mismatched=sorted(mismatched, key=lambda m: m.name)[:MAX_MISMATCHED])


def capacity(reports: Sequence[NodeReport]) -> api.Capacity:
    gpus = sum(r.gpus for r in reports)
    return api.Capacity(gpus=gpus, vgpus=sum(r.vgpus for r in reports),
                        memory_mib=sum(r.memory_mib for r in reports), cores=100 * gpus)


# ----- conditions ------------------------------------------------------------------------------


def _condition(type_: api.ConditionType, status: CondStatus, reason: str, message: str,
               previous: api.VGPUPolicyStatus | None, now: str, generation: int | None) -> api.Condition:
    before = previous.condition(type_) if previous else None
    since = before.last_transition_time if before is not None and before.status == status else now
    return api.Condition(type=type_, status=status, reason=reason, message=message[:32768],
                         last_transition_time=since, observed_generation=generation)


def _summarise(items: Sequence[str], limit: int = 5) -> str:
    shown = "; ".join(items[:limit])
    return shown + (f"; and {len(items) - limit} more" if len(items) > limit else "")


ConditionRow = tuple[api.ConditionType, CondStatus, str, str]


def _conditions(outcome: Outcome, summary: api.NodeSummary) -> list[ConditionRow]:
    plan = outcome.plan
    if outcome.conflict_with is not None:
        message = (f"VGPUPolicy {outcome.conflict_with} is older and active; this one writes nothing. "
                   "Delete one of them.")
        return [("Conflict", "True", "NotActive", message), ("Ready", "False", "Conflict", message)]
    rows: list[ConditionRow] = [("Conflict", "False", "Active", "")]
    if outcome.problems:
        message = _summarise(list(outcome.problems))
        rows += [("Valid", "False", "Invalid", message),
                 ("Applied", "False", "Invalid", "nothing written: the policy is invalid"),
                 ("Ready", "False", "Invalid", message)]
        return rows
    rows.append(("Valid", "True", "Valid", _summarise(list(outcome.warnings))))
    if outcome.apply_error:
        rows.append(("Applied", "False", "ApplyFailed", outcome.apply_error))
    elif outcome.paused:
        pending = [d for d in (plan.decisions if plan else []) if d.state != "InSync"]
        rows.append(("Applied", "False" if pending else "True", "Paused",
                     f"paused: {len(pending)} target(s) differ and were not written"))
    else:
        rows.append(("Applied", "True", "Applied", ""))
    drifted = plan.drifted if plan else []
    if drifted:
        rows.append(("InSync", "False", "Drifted",
                     _summarise([f"{d.target.kind} {d.target.namespace}/{d.target.name}: {d.message}"
                                 for d in drifted])))
    else:
        rows.append(("InSync", "True", "InSync", ""))
    if summary.total == 0:
        rows.append(("NodesReady", "False", "NoGPUNodes", "no node advertises vGPUs or registered with the "
                     "device plugin"))
    elif summary.converged < summary.total:
        rows.append(("NodesReady", "False", "NodesNotConverged",
                     f"{summary.converged}/{summary.total} converged: "
                     + _summarise([f"{m.name}: {m.reason}" for m in summary.mismatched])))
    else:
        rows.append(("NodesReady", "True", "Converged", f"{summary.total} node(s) converged"))
    failing = [f"{type_}: {reason}" for type_, status, reason, _ in rows
               if type_ in ("Applied", "InSync", "NodesReady") and status != "True"]
    if failing:
        rows.append(("Ready", "False", "NotReady", "; ".join(failing)))
    else:
        rows.append(("Ready", "True", "Ready", ""))
    return rows


# ----- the whole status ------------------------------------------------------------------------


_CONDITION_ORDER = {type_: index for index, type_ in enumerate(api.CONDITION_TYPES)}


def build_status(outcome: Outcome, previous: api.VGPUPolicyStatus | None, now: str) -> api.VGPUPolicyStatus:
    """The status to store; equal to `previous` (times included) when nothing changed."""
    summary = node_summary(outcome.nodes)
    conditions = [_condition(type_, status, reason, message, previous, now, outcome.generation)
                  for type_, status, reason, message in _conditions(outcome, summary)]
    conditions.sort(key=lambda c: _CONDITION_ORDER[c.type])
    # A write the failure cut off keeps the hash last applied: the desired one would make the next
    # round take the unfinished change for a hand edit (and, under Report, leave it undone). Its
    # state Error also tells the next round to roll a workload (ClusterView.running).
    applied_before = {(t.kind, t.namespace, t.name): t.hash for t in previous.targets} if previous else {}

    def cut_off(d: TargetDecision) -> bool:
        return bool(outcome.apply_error) and d.write and describe(d.target) not in outcome.written

    targets = previous.targets if previous and outcome.plan is None else [
        api.TargetStatus(kind=d.target.kind, namespace=d.target.namespace, name=d.target.name,
                         hash=(applied_before.get((d.target.kind, d.target.namespace, d.target.name), "")
                               if cut_off(d) else d.hash),
                         state="Error" if cut_off(d) else d.state, message=d.message)
        for d in (outcome.plan.decisions if outcome.plan else [])
    ]
    restarts = list(previous.restarts) if previous else []
    restarts += [api.RestartRecord(target=r.target if r.kind != "plugin-pod" else f"Pod on node {r.target}",
                                   reason=r.reason, hash=r.hash, at=now) for r in outcome.restarts]
    settled = outcome.plan is not None and not outcome.paused and not outcome.apply_error
    last_applied = combined_hash([t.hash for t in targets]) if settled else (
        previous.last_applied_hash if previous else None)
    return api.VGPUPolicyStatus(
        observed_generation=outcome.generation,
        conditions=conditions,
        targets=targets,
        drifted=sum(1 for t in targets if t.state in ("Drifted", "Missing")),
        nodes=summary,
        capacity=capacity(outcome.nodes),
        last_applied_hash=last_applied,
        restarts=restarts[-MAX_RESTARTS:],
    )


def condition_events(previous: api.VGPUPolicyStatus | None,
                     status: api.VGPUPolicyStatus) -> list[PlannedEvent]:
    """Events for conditions that turned bad (Valid False: Rejected; Conflict True: Conflict), and
    for a new set of validation warnings; none while they stay as they were."""
    events: list[PlannedEvent] = []
    for condition in status.conditions:
        before = previous.condition(condition.type) if previous else None
        turned = before is None or before.status != condition.status
        bad = (condition.type == "Conflict") == (condition.status == "True")
        if turned and bad and condition.type in ("Valid", "Conflict"):
            reason = "Rejected" if condition.type == "Valid" else "Conflict"
            events.append(PlannedEvent("Warning", reason, condition.message))
        elif condition.type == "Valid" and condition.status == "True" and condition.message and (
                before is None or before.message != condition.message):
            events.append(PlannedEvent("Warning", "ValidationWarning", condition.message))
    return events


def failed_status(previous: api.VGPUPolicyStatus | None, generation: int | None, error: str,
                  now: str) -> api.VGPUPolicyStatus:
    """The status after a reconcile that failed before it could decide (a read failed or hung):
    everything as last reported, but Ready is Unknown, since what the cluster holds was not seen."""
    base = previous or api.VGPUPolicyStatus()
    ready = _condition("Ready", "Unknown", "ReconcileFailed", f"the last reconcile failed: {error}", previous,
                       now, generation)
    conditions = sorted([c for c in base.conditions if c.type != "Ready"] + [ready],
                        key=lambda c: _CONDITION_ORDER[c.type])
    return base.model_copy(update={"conditions": conditions})


def combined_hash(hashes: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(hashes).encode()).hexdigest()[:16]


def status_dict(status: api.VGPUPolicyStatus) -> dict[str, Any]:
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")


def parse_status(raw: Mapping[str, Any] | None) -> api.VGPUPolicyStatus | None:
    """The stored status as a model; None when absent or unreadable (then it is rebuilt)."""
    if not raw:
        return None
    try:
        return api.VGPUPolicyStatus.model_validate(api.known_fields(api.VGPUPolicyStatus, dict(raw))[0])
    except ValueError:
        return None
