"""The I/O of each command: objects in, pure core called, text out, exit code returned."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any

import pydantic
import yaml
from vgpu_operator import rules
from vgpu_operator.api import KIND, VGPUPolicy, VGPUPolicyStatus
from vgpu_operator.decide import Decision, decide
from vgpu_operator.plan import TargetDecision
from vgpu_operator.registry import BY_SLOT, PluginPods, RenderResult, load_observed_from_manifests
from vgpu_operator.render.inputs import Problem
from vgpu_operator.render.target import TargetRender
from vgpu_operator.view import view_of

from vgpuctl import output
from vgpuctl.diffing import target_diff
from vgpuctl.doctor import Finding, Report, diagnose, finding, policy_findings
from vgpuctl.errors import EXIT_FOUND, EXIT_OK, UsageError
from vgpuctl.facts import gather
from vgpuctl.importer import import_policy
from vgpuctl.manifests import ManifestError, iter_file
from vgpuctl.output import Style

WIDTH = 100


def _wrapped(text: str, indent: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


def doctor_text(report: Report, style: Style) -> str:
    """The report for a person: summary, versions, names side by side, findings, pods."""
    errors = sum(1 for f in report.findings if f.severity == "error")
    warnings = sum(1 for f in report.findings if f.severity == "warning")
    verdict = style("healthy", "green") if report.problems == 0 else style(
        f"{errors} error(s), {warnings} warning(s)", "red" if errors else "yellow")
    lines = [f"vgpuctl doctor: {verdict}  ({report.nodes.get('gpuNodes', 0)} GPU nodes, "
             f"{len(report.pods)} pod(s) explained)", ""]
    lines.append(output.table(["component", "version"], [
        ["Volcano scheduler", report.versions["volcano"]],
        ["device plugin", report.versions["devicePlugin"]],
    ]))
    lines.append("")
    sched, plugin = report.names["scheduler"], report.names["devicePlugin"]
    rows = []
    for kind in ("count", "memory", "memoryPercentage", "cores"):
        mine, theirs = sched.get(kind, ""), plugin.get(kind, "")
        agree = kind == "memoryPercentage" or not mine or not plugin or mine == theirs
        rows.append([kind, mine or "-", theirs or ("(scheduler only)" if plugin else "-"),
                     "ok" if agree else "error"])
    lines.append(output.table(["resource", "scheduler counts", "plugin registers", "state"], rows, style))
    lines.append("")
    lines.append(output.table(["place", "object"], [[k, v] for k, v in report.places.items()]))
    if report.findings:
        lines += ["", style("Findings", "bold")]
    for found in report.findings:
        head = f"{style.severity(found.severity.upper())}  {found.code}  {found.place}"
        if found.field:
            head += f"  [{found.field}]"
        lines.append(head)
        lines.append(_wrapped(found.message, "    "))
        lines.append(_wrapped("fix: " + found.fix, "    "))
    for pod in report.pods:
        asks = ", ".join(f"{k}={v}" for k, v in pod.requests.items()) or "no extended resources"
        lines += ["", f"{style('Pod', 'bold')} {pod.pod}  {pod.state}  asks {asks}"]
        lines += [_wrapped(f"cause: {cause}", "    ") for cause in pod.causes]
        if pod.fix:
            lines.append(_wrapped("fix: " + pod.fix, "    "))
    return "\n".join(lines)


def doctor_command(args: argparse.Namespace, objects: list[dict[str, Any]], style: Style) -> int:
    report = diagnose(gather(objects), pod=args.pod, extra=policy_findings(objects))
    if args.pod and not any(p.pod == args.pod for p in report.pods):
        report.findings.append(_missing_pod(args.pod))
    if args.output == "table":
        output.write(doctor_text(report, style))
    else:
        output.write(output.dump(report.to_dict(), args.output))
    return EXIT_OK if report.problems == 0 else EXIT_FOUND


def _missing_pod(name: str) -> Finding:
    return finding(rules.POD_NOT_FOUND, f"Pod {name}", "--pod", "no such pod in the input")


# --- render and diff ------------------------------------------------------------------------


def _policy_error(where: str, err: pydantic.ValidationError) -> str:
    fields = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
    return (f"{where} is not a valid VGPUPolicy: {fields} (`kubectl explain vgpupolicy.spec` describes "
            f"each field)")


def load_policy(path: str | None, objects: list[dict[str, Any]],
                read_from: str | None = "the input") -> VGPUPolicy:
    """The policy from --policy, else the one VGPUPolicy among the input objects; `read_from` names
    where those came from (None: nowhere, an offline render)."""
    if path is not None:
        try:
            docs = [d for d in iter_file(Path(path)) if d.get("kind") == KIND]
        except ManifestError as err:
            raise UsageError(str(err)) from err
        where = path
    else:
        docs = [o for o in objects if o.get("kind") == KIND]
        where = read_from or "the input"
    if not docs and read_from is None:
        raise UsageError("no VGPUPolicy given: pass --policy FILE (render reads a cluster only with -f, "
                         "--kubeconfig or --context)")
    if not docs:
        raise UsageError(f"no VGPUPolicy in {where}: pass one with --policy FILE (`vgpuctl import` "
                         f"writes one)")
    if len(docs) > 1:
        names = ", ".join(str((d.get("metadata") or {}).get("name")) for d in docs)
        raise UsageError(f"{len(docs)} VGPUPolicies ({names}) in {where}: pass the one you mean with "
                         f"--policy")
    try:
        policy = VGPUPolicy.from_object(docs[0])
    except pydantic.ValidationError as err:
        raise UsageError(_policy_error(where, err)) from err
    return _with_live_status(policy, objects) if path is not None else policy


def _with_live_status(policy: VGPUPolicy, objects: list[dict[str, Any]]) -> VGPUPolicy:
    """The policy from a file, with the status of the same-named live policy: the status records
    what the workloads' pods run with, which decides restarts exactly as the operator will."""
    name = policy.metadata.get("name")
    live = next((o for o in objects if o.get("kind") == KIND and (o.get("metadata") or {}).get("name") == name
                 and o.get("status")), None)
    if policy.status is not None or live is None:
        return policy
    try:
        status = VGPUPolicyStatus.model_validate(live["status"])
    except pydantic.ValidationError:
        return policy  # an unreadable status proves nothing: render as for a new policy
    return policy.model_copy(update={"status": status})


def _decide(args: argparse.Namespace, objects: list[dict[str, Any]]) -> Decision:
    """What the operator would do with this policy and cluster: the same `decide` it runs."""
    policy = load_policy(args.policy, objects, getattr(args, "read_from", "the input"))
    view = view_of(load_observed_from_manifests(objects, policy.spec), policy)
    return decide(policy, view, generation=policy.metadata.get("generation"))


def _states(decision: Decision) -> dict[str, str]:
    """Target ref -> what the operator would do with it: create, update, repair, unchanged, error,
    or leave it (drifted under driftPolicy Report, or paused)."""
    rendered: RenderResult = decision.render or RenderResult([])
    if decision.plan is None:  # errors (reported beside): what each target would get once fixed
        return {t.ref: _unplanned_state(t) for t in rendered.targets}
    return {d.target.ref: _state(d) for d in decision.plan.decisions}


def _unplanned_state(target: TargetRender) -> str:
    if target.error is not None:
        return "error"
    if not target.changed:
        return "unchanged"
    return "create" if target.live is None else "update"


def _state(decision: TargetDecision) -> str:
    target = decision.target
    if decision.state == "Error":
        return "error"
    if decision.state == "InSync":
        return "unchanged"
    if not decision.write:
        return "left (paused)" if decision.message.startswith("paused") else "left (driftPolicy Report)"
    if decision.repair:
        return "repair"
    return "create" if target.live is None else "update"


def _restarts(decision: Decision) -> dict[str, str]:
    """Target ref -> the restarts its write causes, as the operator's plan has them."""
    plan = decision.plan
    if plan is None:
        return {}
    shown: dict[str, str] = {}
    nodes = ", ".join(plan.recreate_plugin_pods_on)
    for d in plan.decisions:
        if isinstance(BY_SLOT[d.target.slot].restart, PluginPods) and nodes:
            shown[d.target.ref] = nodes
        elif any(r.target == d.target.ref for r in plan.restarts):
            shown[d.target.ref] = "rollout"
    return shown


def _report_problems(problems: list[Problem], style: Style) -> bool:
    """Print validation and render problems to stderr (each once); True when one is an error."""
    for problem in dict.fromkeys(problems):  # render and validation may report the same one
        where = f"{problem.field} [{problem.object}]" if problem.object else problem.field
        line = f"{style.severity(problem.severity)}: {where}: {problem.reason}: {problem.message}"
        print(line, file=sys.stderr)
    return any(p.severity == "error" for p in problems)


def render_command(args: argparse.Namespace, objects: list[dict[str, Any]], style: Style) -> int:
    decision = _decide(args, objects)
    result = decision.render or RenderResult([])
    problems = list(decision.found)
    if not objects:
        # Without a cluster only the two ConfigMaps can be rendered; the rest edits live objects.
        print("vgpuctl render: no cluster given (-f DIR, --kubeconfig or --context): the scheduler "
              "ConfigMap, its Deployment and the device plugin DaemonSet are edits of live objects and "
              "are left out, and node-config holds only the nodeOverrides that name nodes (those by "
              "nodeSelector need the nodes)", file=sys.stderr)
        # No node was read: that none matches an override says nothing.
        unread = {rules.NODE_NOT_FOUND.reason, rules.OVERRIDE_MATCHES_NO_NODES.reason}
        problems = [p for p in problems if not p.object and p.reason not in unread]
        result.targets = [t for t in result.targets if t.error is None]
    states, restarts = _states(decision), _restarts(decision)
    if args.output == "table":
        rows = [[t.ref, states[t.ref], t.content_hash or "-", restarts.get(t.ref, "-")]
                for t in result.targets]
        output.write(output.table(["target", "state", "hash", "restarts"], rows, style))
    elif args.output == "json":
        output.write(output.dump([t.desired for t in result.targets if t.desired is not None], "json"))
    else:
        docs = []
        for t in result.targets:
            if t.desired is not None:
                docs.append(f"# {t.ref}: {states[t.ref]} (hash {t.content_hash})\n"
                            + output.dump(t.desired, "yaml"))
        output.write("---\n".join(docs))
    failed = _report_problems(problems, style)
    return EXIT_FOUND if failed else EXIT_OK


def diff_command(args: argparse.Namespace, objects: list[dict[str, Any]], style: Style) -> int:
    decision = _decide(args, objects)
    if _report_problems(list(decision.found), style) or decision.plan is None:
        print("vgpuctl diff: the policy has errors (above): the operator would write nothing until they "
              "are fixed", file=sys.stderr)
        return EXIT_FOUND
    states, restarts = _states(decision), _restarts(decision)
    diffs = [(d.target, target_diff(d.target)) for d in decision.plan.decisions]
    if args.output != "table":
        data = [{"target": t.ref, "state": states[t.ref], "restarts": restarts.get(t.ref, ""), "diff": text}
                for t, text in diffs]
        output.write(output.dump(data, args.output))
    else:
        for _, text in diffs:
            if text:
                output.write(colour_diff(text, style))
        changed = [t for t, _ in diffs if states[t.ref] != "unchanged"]
        summary = ", ".join(_summary(t.ref, states, restarts)
                            for t in changed)
        output.write(f"vgpuctl diff: {summary or 'nothing to change'}")
    return EXIT_FOUND if any(t.changed for t, _ in diffs) else EXIT_OK


def _summary(ref: str, states: dict[str, str], restarts: dict[str, str]) -> str:
    return f"{ref}: {states[ref]}" + (f" ({restarts[ref]})" if ref in restarts else "")


def colour_diff(text: str, style: Style) -> str:
    lines = []
    for line in text.splitlines():
        if line.startswith(("+++", "---")):
            lines.append(style(line, "bold"))
        elif line.startswith("+"):
            lines.append(style(line, "green"))
        elif line.startswith("-"):
            lines.append(style(line, "red"))
        elif line.startswith("@@"):
            lines.append(style(line, "blue"))
        else:
            lines.append(line)
    return "\n".join(lines)


# --- import ---------------------------------------------------------------------------------


def import_command(args: argparse.Namespace, objects: list[dict[str, Any]], style: Style) -> int:
    imported = import_policy(gather(objects), name=args.name)
    if args.output == "json":
        output.write(output.dump(imported.policy, "json"))
    else:  # yaml: the parser offers no table for a document
        header = "# VGPUPolicy imported by `vgpuctl import`: what the cluster runs today.\n"
        header += "".join(f"# note: {n}\n" for n in imported.notes)
        output.write(header + yaml.safe_dump(imported.policy, sort_keys=False))
    for note in imported.notes:
        print(f"{style.severity('warning')}: {note}", file=sys.stderr)
    return EXIT_OK
