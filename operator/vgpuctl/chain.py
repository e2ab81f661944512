"""The whole chain, step by step, on an in-process cluster: what `vgpuctl demo` shows and
`tests/chain` asserts.

    policy -> operator renders the four places -> device plugin registers with a (simulated)
    kubelet -> Volcano-compatible binder annotates the pod -> kubelet calls Allocate -> the
    container's environment -> libvgpu.so enforces the memory cap

Each step is a small async function returning plain data; nothing here prints. Everything runs in
one event loop against `vgpu_emulator` on 127.0.0.1; files go to one temporary work directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from vgpu_deviceplugin.config import Flags
from vgpu_deviceplugin.gpus.mock import MockBackend
from vgpu_deviceplugin.runner import run_plugin
from vgpu_deviceplugin.testing.kubelet_sim import KubeletSim
from vgpu_emulator import RunningEmulator, run_emulator, waiting
from vgpu_formats import annotations as ann
from vgpu_formats import device_config as dc
from vgpu_operator.runtime.run import run_operator
from vgpu_operator.runtime.worker import Tuning

from vgpuctl.binder import Placement, Unschedulable, bind, settings_from_view
from vgpuctl.facts import ClusterFacts, gather
from vgpuctl.live import read_cluster

DEMO_CLUSTER = Path(__file__).resolve().parent / "demo_cluster"
REPO_ROOT = Path(__file__).resolve().parents[2]
HOOK_BUILD = Path(os.environ.get("VGPU_HOOK_BUILD", REPO_ROOT / "hook" / "build"))
DEMO_NODE = "dev-app-2-150-master-1"
DEMO_POD = "vgpu-test"  # the fixture pod: 2 vGPUs, 3000 MiB and 50 % cores each
STEP_TIMEOUT = 15.0


class ChainError(RuntimeError):
    """A step did not reach its expected state in time; the message says what was missing."""


async def wait_until(check: Callable[[], Any], what: str, timeout: float = STEP_TIMEOUT) -> Any:
    """Poll `check` until it returns something truthy (the emulator's loop, failing as a step)."""
    return await waiting.wait_until(check, what, timeout, ChainError)


# --- cluster and operator -----------------------------------------------------------------


@contextlib.asynccontextmanager
async def cluster(*manifests: Path) -> AsyncIterator[RunningEmulator]:
    """The emulator loaded with `manifests` (default: the embedded seed-001 broken cluster)."""
    async with run_emulator(*(manifests or (DEMO_CLUSTER,))) as running:
        yield running


async def read_facts(running: RunningEmulator) -> ClusterFacts:
    """What the cluster runs, read over HTTP exactly as `vgpuctl doctor --kubeconfig` does."""
    return gather(await read_cluster(str(running.kubeconfig)))


@contextlib.asynccontextmanager
async def operator(running: RunningEmulator) -> AsyncIterator[None]:
    """The real kopf operator, in this event loop, until the block ends."""
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_operator(
        str(running.kubeconfig), stop, ready_flag=ready, liveness_port=None,
        tuning=Tuning(resync_seconds=2.0)))
    try:
        await asyncio.wait_for(ready.wait(), STEP_TIMEOUT)
        yield
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)


def policy_status(running: RunningEmulator, name: str) -> dict[str, Any]:
    obj = running.emulator.get_object("VGPUPolicy", None, name) or {}
    return dict(obj.get("status") or {})


def condition(status: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


async def apply_policy(running: RunningEmulator, policy: dict[str, Any]) -> dict[str, Any]:
    """Create the VGPUPolicy and wait until the operator reports it Applied."""
    running.emulator.apply(policy)
    name = policy["metadata"]["name"]

    def applied() -> dict[str, Any] | None:
        status = policy_status(running, name)
        return status if condition(status, "Applied").get("status") == "True" else None

    result: dict[str, Any] = await wait_until(applied, f"VGPUPolicy {name} to be Applied")
    return result


def writes(running: RunningEmulator) -> list[str]:
    """The writes the API served so far, `PATCH /api/v1/...`, status updates and events left out."""
    return [f"{w.method} {w.path}" for w in running.emulator.writes()
            if not w.path.endswith("/status") and "/events" not in w.path]


# --- device plugin on a simulated kubelet -------------------------------------------------


@dataclass
class NodeAgent:
    """The device plugin for one node, on mock GPUs, registered with a simulated kubelet."""

    node: str
    sim: KubeletSim
    stop: asyncio.Event
    task: asyncio.Task[None]
    names: list[str] = field(default_factory=list)

    def advertised(self) -> dict[str, int]:
        return {name: len(ids) for name, ids in self.sim.devices.items()}


@contextlib.asynccontextmanager
async def node_agent(running: RunningEmulator, node_name: str, workdir: Path) -> AsyncIterator[NodeAgent]:
    """Start kubelet simulator + device plugin for `node_name`; the GPUs are the node's as registered."""
    node = running.emulator.get_object("Node", None, node_name)
    if node is None:
        raise ChainError(f"node {node_name} is not in the cluster")
    register = node["metadata"]["annotations"][ann.NODE_REGISTER]
    async with plugin_agent(str(running.kubeconfig), node_name, register, workdir) as agent:
        yield agent


@contextlib.asynccontextmanager
async def plugin_agent(kubeconfig: str, node_name: str, register: str, workdir: Path,
                       **flags: Any) -> AsyncIterator[NodeAgent]:
    """Kubelet simulator + our device plugin for `node_name` against any API server (the emulator
    or a real one), on mock GPUs as `register` describes them; `flags` override plugin flags."""
    base = workdir / node_name
    # Unix socket paths are limited to 107 bytes: the kubelet directory gets a short name of its own.
    plugin_dir = Path(tempfile.mkdtemp(prefix="vgpu-kubelet-"))
    for sub in (base / "vgpu", base / "cache"):
        sub.mkdir(parents=True, exist_ok=True)
    sim = KubeletSim(str(plugin_dir))
    await sim.start()
    plugin_flags = Flags(**{
        "node_name": node_name, "device_plugin_dir": str(plugin_dir), "hook_path": str(base / "vgpu"),
        "cache_root": str(base / "cache"), "register_interval": 0.5,
        "kubeconfig": kubeconfig, **flags})
    stop = asyncio.Event()
    backend = MockBackend.from_register_annotation(register)
    task = asyncio.create_task(run_plugin(plugin_flags, stop, backend=backend))
    agent = NodeAgent(node_name, sim, stop, task)
    try:
        await wait_until(lambda: len(sim.plugins) >= 3 or task.done(), "the plugin to register 3 resources")
        if task.done():
            task.result()  # raises the plugin's error
        await sim.wait_for(list(sim.plugins), timeout=STEP_TIMEOUT)
        agent.names = [r.resource_name for r in sim.registrations]
        yield agent
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        await sim.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


def publish_allocatable(running: RunningEmulator, agent: NodeAgent) -> dict[str, str]:
    """What the kubelet does with advertised devices: node status capacity and allocatable."""
    node = copy.deepcopy(running.emulator.get_object("Node", None, agent.node) or {})
    counts = {name: str(n) for name, n in agent.advertised().items()}
    status = node.setdefault("status", {})
    for key in ("capacity", "allocatable"):
        status[key] = {**(status.get(key) or {}), **counts}
    running.emulator.apply(node)
    return counts


# --- scheduling ---------------------------------------------------------------------------


def demo_pod(facts: ClusterFacts, node_name: str = DEMO_NODE) -> dict[str, Any]:
    """The fixture pod before scheduling, asking for the count resource under the scheduler's name,
    tolerating the GPU node's taint and pinned to it (as in the seed)."""
    source = next(p for p in facts.pods if p["metadata"]["name"] == DEMO_POD)
    pod = copy.deepcopy(dict(source))
    meta = pod["metadata"]
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items()
                           if k not in ann.POD_BIND_KEYS}
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        meta.pop(key, None)
    meta["name"] = "vgpu-demo"
    spec = pod["spec"]
    spec.pop("nodeName", None)
    spec["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    spec["tolerations"] = [{"key": "volcano.sh/vgpu", "operator": "Exists", "effect": "NoSchedule"}]
    count = facts.scheduler_names()["count"]
    for container in spec["containers"]:
        limits = container["resources"]["limits"]
        container["resources"]["limits"] = {count if k == dc.DEFAULT_COUNT_NAME else k: v
                                             for k, v in limits.items()}
    pod["status"] = {"phase": "Pending"}
    return pod


def place(facts: ClusterFacts, pod: Mapping[str, Any]) -> Placement | Unschedulable:
    """Where the Volcano-compatible binder puts `pod`, with the scheduler settings the cluster's
    objects give (the cluster read as `facts`, the pod among its pods or not yet)."""
    settings = settings_from_view(
        dc.scheduler_view(facts.scheduler_config.parsed), vgpu_enable=facts.scheduler.vgpu_enable,
        schedule_policy=facts.scheduler.schedule_policy, schedule_weight=facts.scheduler.schedule_weight,
        require_allocatable=facts.scheduler.requires_hard_coded_allocatable)
    others = [p for p in facts.pods if p["metadata"]["name"] != pod["metadata"]["name"]]
    return bind(dict(pod), facts.nodes, others, settings, now=int(time.time()))


async def schedule(running: RunningEmulator, pod: dict[str, Any]) -> Placement | Unschedulable:
    """Create the pod, let the binder place it with the cluster's scheduler settings, and bind it
    (annotations plus spec.nodeName, as Volcano's Binding carries them)."""
    running.emulator.apply(pod)
    result = place(await read_facts(running), pod)
    if isinstance(result, Placement):
        bound = copy.deepcopy(running.emulator.get_object("Pod", pod["metadata"]["namespace"],
                                                          pod["metadata"]["name"]) or pod)
        annotations = bound["metadata"].get("annotations") or {}
        bound["metadata"]["annotations"] = {**annotations, **result.annotations}
        bound["spec"]["nodeName"] = result.node
        running.emulator.apply(bound)
    return result


async def delete_pod(running: RunningEmulator, namespace: str, name: str) -> bool:
    """DELETE the pod through the API, as `kubectl delete pod` does; False if it was not there."""
    async with aiohttp.ClientSession() as session, session.delete(
            f"{running.url}/api/v1/namespaces/{namespace}/pods/{name}") as response:
        return response.status == 200


async def allocate(agent: NodeAgent, resource: str, count: int) -> dict[str, Any]:
    """The kubelet's Allocate for one container: `count` device ids of `resource`."""
    ids = agent.sim.free_ids(resource, count)
    response = await agent.sim.allocate(resource, ids)
    container = response.container_responses[0]
    return {
        "envs": dict(sorted(container.envs.items())),
        "mounts": [{"container": m.container_path, "host": m.host_path, "readOnly": m.read_only}
                   for m in container.mounts],
    }


# --- the hook -----------------------------------------------------------------------------


@dataclass
class HookRun:
    ran: bool
    reason: str = ""  # why it was skipped or failed
    output: list[str] = field(default_factory=list)
    returncode: int | None = None


def hook_artifacts(build: Path = HOOK_BUILD) -> tuple[Path, Path, Path] | str:
    """(libvgpu.so, fake driver dir, demo program) or why the hook step cannot run."""
    lib, fake, program = build / "libvgpu.so", build / "fake", build / "vgpu-demo-alloc"
    missing = [str(p) for p in (lib, fake, program) if not p.exists()]
    if missing:
        return f"hook not built ({', '.join(missing)} missing; `make -C hook all fakes` builds them)"
    return lib, fake, program


def run_hook(envs: Mapping[str, str], workdir: Path, build: Path = HOOK_BUILD,
             timeout: float = 20) -> HookRun:
    """Run the hook's demo program under libvgpu.so over the fake driver with Allocate's env."""
    found = hook_artifacts(build)
    if isinstance(found, str):
        return HookRun(False, found)
    lib, fake, program = found
    cache = workdir / "container-cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **envs,
        # Inside a container the plugin's mount puts the cache at /tmp/vgpu; here it is a temp dir.
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache / Path(envs.get("CUDA_DEVICE_MEMORY_SHARED_CACHE",
                                                                          "demo.cache")).name),
        "LD_PRELOAD": str(lib),
        "LD_LIBRARY_PATH": str(fake),
    }
    try:
        done = subprocess.run([str(program)], env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return HookRun(False, f"{program} did not run: {err}")
    lines = (done.stdout + done.stderr).strip().splitlines()
    failed = "" if done.returncode == 0 else f"exit code {done.returncode}"
    return HookRun(True, failed, lines, done.returncode)

