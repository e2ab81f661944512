"""`vgpuctl demo`: the whole chain on an embedded cluster, step by step, in a few seconds.

The embedded cluster (`demo_cluster/`, the test fixtures plus the seed-001 scenario) is broken the
way seed 001 describes: device-config renames the count resource to nvidia.com/gpu, the legacy
device plugin still registers volcano.sh/vgpu-number, and a pod failed with
`UnexpectedAdmissionError ... device request not found`. The demo shows what doctor finds, what the
operator writes and restarts once a VGPUPolicy is applied, and then a pod going all the way
through: device plugin registration, scheduling, Allocate, and libvgpu.so enforcing the cap.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vgpu_emulator import RunningEmulator
from vgpu_formats import annotations as ann
from vgpu_formats.cli import StderrHandler, log_level

from vgpuctl import chain, output
from vgpuctl.binder import Placement
from vgpuctl.doctor import Report, diagnose
from vgpuctl.importer import import_policy
from vgpuctl.output import Style

STEPS = 7
WIDTH = 110


class Narrator:
    """Prints numbered steps with their duration; collects the same facts for `-o json|yaml`."""

    def __init__(self, style: Style, quiet: bool) -> None:
        self.style = style
        self.quiet = quiet
        self.started = time.monotonic()
        self.step_started = self.started
        self.record: dict[str, Any] = {"steps": []}

    def step(self, number: int, title: str) -> None:
        self.step_started = time.monotonic()
        self.record["steps"].append({"step": number, "title": title, "lines": []})
        self.say(self.style(f"[{number}/{STEPS}] {title}", "bold"), indent="")

    def say(self, text: str, indent: str = "      ") -> None:
        if self.record["steps"] and indent:
            self.record["steps"][-1]["lines"].append(text)
        if not self.quiet:
            # Long findings wrap under their own indent; commands and tables stay on one line.
            wrapped = textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                                    break_on_hyphens=False, break_long_words=False)
            print(wrapped if len(indent + text) > WIDTH else indent + text, flush=True)

    def done(self) -> None:
        elapsed = time.monotonic() - self.step_started
        if self.record["steps"]:
            self.record["steps"][-1]["seconds"] = round(elapsed, 2)
        self.say(self.style(f"({elapsed:.1f} s)", "dim"))

    def data(self, key: str, value: Any) -> None:
        self.record["steps"][-1][key] = value


def _findings(report: Report, narrator: Narrator) -> None:
    style = narrator.style
    for f in report.findings:
        if f.severity == "info":
            continue
        narrator.say(f"{style.severity(f.severity.upper())} {f.code} ({f.place}, {f.field}): {f.message}")
    for pod in report.pods:
        narrator.say(f"{style('pod', 'bold')} {pod.pod} {pod.state}: {pod.causes[0]}")
        narrator.say(f"  fix: {pod.fix}")


def get_vgpupolicy(status: dict[str, Any], name: str) -> str:
    """`kubectl get vgpupolicy` as its printer columns show it."""
    ready = chain.condition(status, "Ready").get("status", "Unknown")
    nodes = (status.get("nodes") or {}).get("summary", "")
    capacity = status.get("capacity") or {}
    return output.table(["name", "ready", "drift", "nodes", "gpus", "vgpus"], [
        [name, ready, status.get("drifted", 0), nodes or "-", capacity.get("gpus", 0),
         capacity.get("vgpus", 0)],
    ])


async def _demo(narrator: Narrator, with_hook: bool, workdir: Path) -> bool:
    say = narrator.say
    style = narrator.style
    narrator.step(1, "A cluster in the seed-001 state (in-process Kubernetes API, no real cluster)")
    async with chain.cluster() as running:
        facts = await chain.read_facts(running)
        say(f"API emulator at {running.url}, kubeconfig {running.kubeconfig}")
        say(f"Volcano {facts.scheduler.version} ({facts.scheduler.image}); device plugin "
            f"{facts.plugin.version} {facts.plugin.generation}; {len(facts.nodes)} GPU nodes")
        for pod in facts.pods:
            status = pod.get("status") or {}
            if status.get("reason"):
                say(f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']}: {status.get('phase')} "
                    f"{status['reason']}: {status.get('message', '')}")
        narrator.done()

        narrator.step(2, "What is wrong: vgpuctl doctor --kubeconfig <emulator>")
        before = diagnose(facts)
        _findings(before, narrator)
        narrator.data("doctor", before.to_dict())
        narrator.done()

        narrator.step(3, "The operator adopts the cluster: kubectl apply a VGPUPolicy (from vgpuctl import)")
        imported = import_policy(facts)
        spec = imported.policy["spec"]
        say(f"policy 'default': resources.count={spec['resources']['count']}, "
            f"deviceSplitCount={spec['device']['deviceSplitCount']}, scheduler "
            f"{spec['scheduler']['namespace']}, plugin {spec['devicePlugin']['namespace']}/"
            f"{spec['devicePlugin']['daemonSet']}")
        for note in imported.notes:
            say(f"note: {note}")
        async with chain.operator(running):
            status = await chain.apply_policy(running, imported.policy)
            for write in chain.writes(running):
                if "vgpupolicies" not in write:
                    say(f"wrote   {write}")
            for target in status.get("targets") or []:
                say(f"target  {target['kind']} {target['namespace']}/{target['name']}: {target['state']}")
            for restart in status.get("restarts") or []:
                say(f"restart {restart['target']}: {restart['reason']}")
            say("kubectl get vgpupolicy:")
            for line in get_vgpupolicy(status, "default").splitlines():
                say("  " + line)
            narrator.data("status", status)
            narrator.done()

            narrator.step(4, "Device plugin (this project's, mock NVML) on each GPU node, with a simulated "
                             "kubelet")
            async with contextlib.AsyncExitStack() as stack:
                agents = [await stack.enter_async_context(chain.node_agent(running, node, workdir))
                          for node in sorted(n["metadata"]["name"] for n in facts.nodes)]
                for agent in agents:
                    published = chain.publish_allocatable(running, agent)
                    shown = ", ".join(f"{k}={v}" for k, v in published.items())
                    say(f"{agent.node}: registered {', '.join(agent.names)}; kubelet allocatable {shown}")
                status = await _wait_nodes_ready(running)
                say("kubectl get vgpupolicy:")
                for line in get_vgpupolicy(status, "default").splitlines():
                    say("  " + line)
                narrator.done()

                narrator.step(5, "Volcano-compatible binder schedules the fixture pod")
                for failed in (p for p in facts.pods if (p.get("status") or {}).get("phase") == "Failed"):
                    meta = failed["metadata"]
                    await chain.delete_pod(running, meta["namespace"], meta["name"])
                    say(f"deleted the failed pod {meta['namespace']}/{meta['name']} (Failed pods are not "
                        f"retried)")
                facts = await chain.read_facts(running)
                pod = chain.demo_pod(facts)
                limits = pod["spec"]["containers"][0]["resources"]["limits"]
                say(f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']} asks "
                    + ", ".join(f"{k}={v}" for k, v in limits.items()))
                placement = await chain.schedule(running, pod)
                if not isinstance(placement, Placement):
                    say(style(f"not scheduled: {placement.message} {placement.reasons}", "red"))
                    return False
                say(f"bound to {placement.node}")
                for key, value in placement.annotations.items():
                    say(f"  {key}: {value}")
                narrator.data("annotations", placement.annotations)
                narrator.done()

                count = facts.scheduler_names()["count"]
                narrator.step(6, f"kubelet admits the pod: Allocate on the {count} plugin")
                agent = next(a for a in agents if a.node == placement.node)
                allocation = await chain.allocate(agent, count, len(placement.devices[0]))
                for key, value in allocation["envs"].items():
                    say(f"env   {key}={value}")
                for mount in allocation["mounts"]:
                    say(f"mount {mount['container']} <- {mount['host']}")
                meta = pod["metadata"]
                bound = running.emulator.get_object("Pod", meta["namespace"], meta["name"])
                phase = (((bound or {}).get("metadata") or {}).get("annotations") or {}).get(ann.BIND_PHASE)
                say(f"pod annotation {ann.BIND_PHASE}: {phase}")
                narrator.data("allocate", allocation)
                narrator.done()

                narrator.step(7, "libvgpu.so enforces the cap inside the container")
                if not with_hook:
                    hook = chain.HookRun(False, "skipped (--no-hook)")
                else:
                    say(f"{chain.HOOK_BUILD}/vgpu-demo-alloc with LD_PRELOAD=libvgpu.so over the fake driver "
                        f"and Allocate's env (500 MiB steps until refused)")
                    hook = await asyncio.to_thread(chain.run_hook, allocation["envs"], workdir)
                if not hook.ran:
                    say(style(f"skipped: {hook.reason}", "yellow"))
                else:
                    for line in hook.output:
                        say(line)
                    if hook.reason:
                        say(style(f"the demo program failed: {hook.reason}", "red"))
                narrator.data("hook", {"ran": hook.ran, "reason": hook.reason, "output": hook.output})
                narrator.done()

                after = diagnose(await chain.read_facts(running))
                verdict = "healthy" if after.problems == 0 else f"{after.problems} problem(s) left"
                narrator.record["doctorAfter"] = after.to_dict()
                colour = "green" if after.problems == 0 else "red"
                say(style(f"vgpuctl doctor now: {verdict}", colour), indent="")
                _findings(after, narrator)
                hook_ok = not hook.ran or not hook.reason
                return after.problems == 0 and phase == ann.BIND_PHASE_SUCCESS and hook_ok


async def _wait_nodes_ready(running: RunningEmulator) -> dict[str, Any]:
    """The operator's status once every GPU node converged (or as it stands after the timeout)."""
    def ready() -> dict[str, Any] | None:
        status = chain.policy_status(running, "default")
        return status if chain.condition(status, "NodesReady").get("status") == "True" else None

    with contextlib.suppress(chain.ChainError):
        found: dict[str, Any] = await chain.wait_until(ready, "every node to converge", timeout=10)
        return found
    return chain.policy_status(running, "default")


@contextlib.contextmanager
def _quiet_logs(args: argparse.Namespace) -> Iterator[None]:
    """Components log for operators of a real cluster; the demo narrates instead, and shows their
    logs only when asked for with --log-level info or debug (-v). Levels and formats are put back
    afterwards: `main()` may run in a process that goes on (the tests)."""
    level = log_level(args)
    names = ("", "kopf", "vgpu_operator", "vgpu_deviceplugin", "aiohttp", "asyncio")
    saved_levels = {name: logging.getLogger(name).level for name in names}
    # Only the handler vgpuctl installed: another (a test's capture) keeps its own format.
    ours = [h for h in logging.getLogger().handlers if isinstance(h, StderrHandler)]
    saved_formats = [h.formatter for h in ours]
    if level >= logging.WARNING:
        level = logging.ERROR
        logging.getLogger().setLevel(level)
    for name in names[1:]:
        logging.getLogger(name).setLevel(level)
    if args.log_format == "text":  # between the narrated steps, indented like them
        for handler in ours:
            handler.setFormatter(logging.Formatter("      log %(name)s: %(message)s"))
    try:
        yield
    finally:
        for name, saved in saved_levels.items():
            logging.getLogger(name).setLevel(saved)
        for handler, formatter in zip(ours, saved_formats, strict=True):
            handler.setFormatter(formatter)


def run_demo(args: argparse.Namespace, style: Style) -> int:
    with _quiet_logs(args):
        return _run_demo(args, style)


def _run_demo(args: argparse.Namespace, style: Style) -> int:
    machine = args.output != "table"
    narrator = Narrator(style, quiet=machine)
    if not machine:
        print(style("vgpuctl demo: Volcano + HAMi vGPU, from a broken configuration to an enforced "
                    "3000 MiB cap", "bold"), flush=True)
    with tempfile.TemporaryDirectory(prefix="vgpuctl-demo-", ignore_cleanup_errors=True) as workdir:
        try:
            ok = asyncio.run(_demo(narrator, not args.no_hook, Path(workdir)))
        except chain.ChainError as err:
            narrator.say(style(f"demo step failed: {err}", "red"), indent="")
            ok = False
    total = time.monotonic() - narrator.started
    narrator.record["ok"] = ok
    narrator.record["seconds"] = round(total, 2)
    if machine:
        output.write(output.dump(narrator.record, args.output))
    else:
        print(style(f"demo {'finished' if ok else 'FAILED'} in {total:.1f} s", "green" if ok else "red"))
    return 0 if ok else 1
