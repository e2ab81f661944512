"""One operator instance without kopf, for the fault suite: its own API client and Reconciler,
fed the policy and the nodes from the API as kopf and the node follower feed them, reconciling
when told. Fast (no kopf start-up) and deterministic (no watch timing), so a test can run one
reconcile, break it anywhere, and start a fresh instance on what it left behind."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from vgpu_emulator import Emulator, RunningEmulator, run_emulator
from vgpu_operator import api
from vgpu_operator.k8s import Kube, Retry, new_api_client
from vgpu_operator.metrics import Metrics
from vgpu_operator.plan import PENDING_ANNOTATION
from vgpu_operator.reconcile import Reconciler
from vgpu_operator.runtime import nodes

from .conftest import FIXTURES, NODES, PLUGIN_NS, plugin_pods

NAME = "default"
SCHEDULER_NS = "volcano-system"
TIMEOUT = 5.0  # the API deadline of a solo instance: never reached on a healthy emulator
HANG_TIMEOUT = 0.15  # ... where a test makes a call hang: it fails fast
FAST = Retry(attempts=3, first_delay=0.005, max_delay=0.02)

CONFIGMAPS = [(PLUGIN_NS, "volcano-vgpu-device-config"), (PLUGIN_NS, "volcano-vgpu-node-config"),
              (SCHEDULER_NS, "volcano-scheduler-configmap")]
WORKLOADS = [("Deployment", SCHEDULER_NS, "volcano-scheduler"),
             ("DaemonSet", PLUGIN_NS, "volcano-device-plugin")]

# The two write sequences of a first reconcile on the fixture cluster. PODS: node-config is
# missing and the policy overrides one node (create it, recreate that node's plugin pod), the
# scheduler conf gains deviceshare (a scheduler rollout). ROLL: device-config and node-config
# change, the plugin DaemonSet rolls (so no single pod is recreated) and the scheduler too.
PODS: dict[str, Any] = {"nodeOverrides": [{"nodeNames": [NODES[0]], "operatingMode": "mig"}]}
ROLL: dict[str, Any] = {"device": {"overwriteEnv": True}}
SCENARIOS = {"pods": PODS, "roll": ROLL}


class Killed(BaseException):
    """The operator process died here: nothing after it runs (no `except Exception` stops it)."""


class Mortal(Kube):
    """A Kube that dies right before its write number `lives` + 1 (GETs are free), or before the
    first write whose "METHOD path" contains `dies_at`."""

    lives = 10**9
    dies_at: str | None = None

    async def _call(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
                    content_type: str = "application/json") -> dict[str, Any]:
        if method != "GET":
            if self.lives <= 0 or (self.dies_at is not None and self.dies_at in f"{method} {path}"):
                raise Killed(f"{method} {path}")
            self.lives -= 1
        return await super()._call(method, path, body, query, content_type)


@dataclass
class Solo:
    running: RunningEmulator
    kube: Kube
    reconciler: Reconciler

    async def reconcile(self) -> bool:
        """One reconcile of the policy as the API has it now."""
        body = await self.kube.get(api.KIND, None, NAME)
        assert body is not None
        self.reconciler.policies.update(body)
        return await self.reconciler.reconcile(NAME)

    async def converge(self, rounds: int = 6) -> None:
        """Reconcile until one succeeds without writing anything (the watch echo of our own
        writes triggers that last one in a running operator)."""
        emulator = self.running.emulator
        for _ in range(rounds):
            before = len(emulator.writes())
            if await self.reconcile() and len(emulator.writes()) == before:
                return
        raise AssertionError(f"no quiet reconcile in {rounds}; last writes: {emulator.writes()[-5:]}")


@contextlib.asynccontextmanager
async def solo(running: RunningEmulator, lives: int | None = None, dies_at: str | None = None,
               timeout: float = TIMEOUT) -> AsyncIterator[Solo]:
    """A fresh operator instance; with `lives` or `dies_at`, one that dies there (`Mortal`)."""
    client = await new_api_client(str(running.kubeconfig))
    kube: Kube = Kube(client, FAST, timeout=timeout)
    if lives is not None or dies_at is not None:
        mortal = Mortal(client, FAST, timeout=timeout)
        mortal.lives = mortal.lives if lives is None else lives
        mortal.dies_at = dies_at
        kube = mortal
    reconciler = Reconciler(kube, Metrics())
    await nodes.relist(kube, reconciler.nodes)
    try:
        yield Solo(running, kube, reconciler)
    finally:
        await kube.close()


@contextlib.asynccontextmanager
async def scenario(spec: dict[str, Any]) -> AsyncIterator[RunningEmulator]:
    """The fixture cluster with plugin pods and the policy `spec` (not reconciled yet)."""
    async with run_emulator(FIXTURES / "cluster") as running:
        plugin_pods(running.emulator)
        if spec is PODS:
            running.emulator.delete_object("ConfigMap", PLUGIN_NS, "volcano-vgpu-node-config")
        running.emulator.apply({"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND,
                                "metadata": {"name": NAME}, "spec": copy.deepcopy(spec)})
        yield running


def template_annotations(emulator: Emulator, kind: str, namespace: str, name: str) -> dict[str, str]:
    obj = emulator.get_object(kind, namespace, name) or {}
    return dict(((obj.get("spec") or {}).get("template", {}).get("metadata") or {}).get("annotations") or {})


def cluster_state(emulator: Emulator) -> dict[str, Any]:
    """What the operator is responsible for: the ConfigMaps' data and annotations, the workloads'
    pod templates, which plugin pods exist."""
    state: dict[str, Any] = {}
    for namespace, name in CONFIGMAPS:
        cm = emulator.get_object("ConfigMap", namespace, name) or {}
        annotations = (cm.get("metadata") or {}).get("annotations") or {}
        state[name] = {"data": cm.get("data"), "annotations": annotations}
    for kind, namespace, name in WORKLOADS:
        state[name] = (emulator.get_object(kind, namespace, name) or {}).get("spec", {}).get("template")
    state["pods"] = sorted(p["metadata"]["name"] for p in emulator.list_objects("Pod", PLUGIN_NS))
    return state


def pending_markers(emulator: Emulator) -> list[str]:
    return [name for namespace, name in CONFIGMAPS
            if PENDING_ANNOTATION in (((emulator.get_object("ConfigMap", namespace, name) or {})
                                       .get("metadata") or {}).get("annotations") or {})]


def status(emulator: Emulator) -> dict[str, Any]:
    return dict((emulator.get_object(api.KIND, None, NAME) or {}).get("status") or {})


def condition(emulator: Emulator, type_: str) -> dict[str, Any]:
    return next((c for c in status(emulator).get("conditions") or [] if c["type"] == type_), {})
