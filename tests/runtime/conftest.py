"""End-to-end harness: the emulator loaded with the fixture cluster (plus device plugin pods),
and the operator running in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import pathlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from vgpu_emulator import Emulator, RunningEmulator, run_emulator
from vgpu_operator.metrics import Metrics
from vgpu_operator.runtime.run import run_operator
from vgpu_operator.runtime.worker import Tuning

from tests.support.waiting import eventually

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
NODES = ("dev-app-2-150-master-1", "test-app-64-46-msxf")
PLUGIN_NS = "kube-system"
RESYNC = 0.25


def _pod(name: str, node: str, labels: dict[str, str], owners: list[dict[str, Any]]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": PLUGIN_NS, "labels": labels}
    if owners:
        meta["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node},
            "status": {"phase": "Running"}}


def plugin_pods(emulator: Emulator) -> None:
    """One device plugin pod per node (owned by the DaemonSet), and two unrelated pods beside each:
    one with other labels, one a hand-made copy of the plugin's (its labels, no owner)."""
    ds = emulator.get_object("DaemonSet", PLUGIN_NS, "volcano-device-plugin")
    assert ds is not None
    owner = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": "volcano-device-plugin",
        "uid": ds["metadata"]["uid"],
        "controller": True,
    }
    plugin = {"name": "volcano-device-plugin"}
    for node in NODES:
        emulator.apply(_pod(f"volcano-device-plugin-{node}", node, plugin, [owner]))
        emulator.apply(_pod(f"bystander-{node}", node, {"name": "something-else"}, []))
        emulator.apply(_pod(f"plugin-debug-{node}", node, plugin, []))


@dataclass
class Cluster:
    running: RunningEmulator
    metrics: Metrics

    @property
    def emulator(self) -> Emulator:
        return self.running.emulator

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        found = self.emulator.get_object(kind, namespace, name)
        return copy.deepcopy(found) if found is not None else None

    def edit(
        self, kind: str, namespace: str | None, name: str, change: Callable[[dict[str, Any]], None]
    ) -> None:
        """A hand edit through the API server (watchers see it)."""
        obj = self.get(kind, namespace, name)
        assert obj is not None, f"{kind} {namespace}/{name} missing"
        change(obj)
        self.emulator.apply(obj)

    def create_policy(self, name: str = "default", spec: dict[str, Any] | None = None) -> None:
        self.emulator.apply(
            {
                "apiVersion": "vgpu.io/v1alpha1",
                "kind": "VGPUPolicy",
                "metadata": {"name": name},
                "spec": spec or {},
            }
        )

    def set_spec(self, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        self.edit("VGPUPolicy", None, name, lambda obj: change(obj.setdefault("spec", {})))

    def status(self, name: str = "default") -> dict[str, Any]:
        policy = self.get("VGPUPolicy", None, name)
        return (policy or {}).get("status") or {}

    def condition(self, type_: str, name: str = "default") -> dict[str, Any]:
        return next((c for c in self.status(name).get("conditions", []) if c["type"] == type_), {})

    async def ready(self, name: str = "default", generation: int | None = None) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            status = self.status(name)
            if generation is not None and status.get("observedGeneration") != generation:
                return None
            return status if self.condition("Ready", name).get("status") == "True" else None

        return await eventually(check, what=f"{name} Ready")

    async def settle(self, name: str = "default") -> None:
        """Wait until a full resync passes without any write (our own writes echo once)."""
        quiet_for = 0.0
        count = len(self.emulator.writes())
        while quiet_for < 3 * RESYNC:
            await asyncio.sleep(0.05)
            now = len(self.emulator.writes())
            quiet_for = 0.0 if now != count else quiet_for + 0.05
            count = now

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """An API call as kubectl would make it (JSON merge patch for PATCH)."""
        headers = {
            "Content-Type": "application/merge-patch+json" if method == "PATCH" else "application/json"
        }
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, self.running.url + path, json=body, headers=headers) as resp,
        ):
            return resp.status, await resp.json()

    async def delete(self, path: str) -> None:
        status, body = await self.request("DELETE", path)
        assert status == 200, body

    def data(self, name: str, key: str, namespace: str = PLUGIN_NS) -> str:
        cm = self.get("ConfigMap", namespace, name)
        return str(((cm or {}).get("data") or {}).get(key, ""))

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.emulator.list_objects("Event") if e.get("reason") == reason]

    def writes_to(self, fragment: str) -> int:
        return len(self.emulator.writes(fragment))


@contextlib.asynccontextmanager
async def operator_on(running: RunningEmulator, **options: Any) -> AsyncIterator[Cluster]:
    """The operator running on this emulator (`options` go to `run_operator`) until the block ends."""
    metrics = Metrics()
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_operator(str(running.kubeconfig), stop, metrics=metrics, tuning=Tuning(resync_seconds=RESYNC),
                     **options)
    )
    try:
        yield Cluster(running, metrics)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


@contextlib.asynccontextmanager
async def operating(*manifests: pathlib.Path) -> AsyncIterator[Cluster]:
    """The emulator with these manifests and device plugin pods, and the operator running on it."""
    async with run_emulator(*manifests) as running:
        plugin_pods(running.emulator)
        async with operator_on(running) as cluster:
            yield cluster


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with operating(FIXTURES / "cluster") as running:
        yield running


@pytest.fixture
async def seed001() -> AsyncIterator[Cluster]:
    """The cluster with the seed-001 breakage: device-config says nvidia.com/gpu, the legacy plugin
    registers volcano.sh/vgpu-number."""
    scenario = FIXTURES / "scenarios" / "seed001-resource-name-mismatch.yaml"
    async with operating(FIXTURES / "cluster", scenario) as c:
        yield c
