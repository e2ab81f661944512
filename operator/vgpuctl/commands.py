"""The I/O of each command: objects in, pure core called, text out, exit code returned."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from vgpuctl import output
from vgpuctl.doctor import Report, diagnose
from vgpuctl.facts import gather
from vgpuctl.output import Style

EXIT_OK, EXIT_FOUND = 0, 1
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
    for finding in report.findings:
        head = f"{style.severity(finding.severity.upper())}  {finding.code}  {finding.place}"
        if finding.field:
            head += f"  [{finding.field}]"
        lines.append(head)
        lines.append(_wrapped(finding.message, "    "))
        lines.append(_wrapped("fix: " + finding.fix, "    "))
    for pod in report.pods:
        asks = ", ".join(f"{k}={v}" for k, v in pod.requests.items()) or "no extended resources"
        lines += ["", f"{style('Pod', 'bold')} {pod.pod}  {pod.state}  asks {asks}"]
        lines += [_wrapped(f"cause: {cause}", "    ") for cause in pod.causes]
        if pod.fix:
            lines.append(_wrapped("fix: " + pod.fix, "    "))
    return "\n".join(lines)


def doctor_command(args: argparse.Namespace, objects: list[dict[str, Any]], style: Style) -> int:
    report = diagnose(gather(objects), pod=args.pod)
    if args.pod and not any(p.pod == args.pod for p in report.pods):
        report.findings.append(_missing_pod(args.pod))
    if args.output == "table":
        output.write(doctor_text(report, style))
    else:
        output.write(output.dump(report.to_dict(), args.output))
    return EXIT_OK if report.problems == 0 else EXIT_FOUND


def _missing_pod(name: str) -> Any:
    from vgpuctl.doctor import WARNING, Finding

    return Finding(WARNING, "pod-not-found", f"Pod {name}", "--pod", "no such pod in the input",
                   "give it as NAMESPACE/NAME, as `kubectl get pod -A` lists it")


def _not_landed(what: str) -> int:
    from vgpuctl.main import UsageError

    raise UsageError(f"{what} needs vgpu_operator.render.render_all, which this build does not have yet")


def render_command(args: argparse.Namespace, objects: list[dict[str, Any]], style: Style) -> int:
    return _not_landed("render")


def diff_command(args: argparse.Namespace, objects: list[dict[str, Any]], style: Style) -> int:
    return _not_landed("diff")


def import_command(args: argparse.Namespace, objects: list[dict[str, Any]], style: Style) -> int:
    return _not_landed("import")
