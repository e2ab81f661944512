"""Test helpers: an in-memory KubeClient fake and the fixture objects."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml
from vgpu_deviceplugin.kube import KubeError
from vgpu_emulator import merge_patch
from vgpu_formats import annotations as ann

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE_NODE = "dev-app-2-150-master-1"


def load_docs(relative: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((FIXTURES / relative).read_text()) if d]


def fixture_pod() -> dict[str, Any]:
    return copy.deepcopy(load_docs("cluster/pods.yaml")[0])


def fixture_node() -> dict[str, Any]:
    nodes = load_docs("cluster/nodes.yaml")
    return copy.deepcopy(next(n for n in nodes if n["metadata"]["name"] == FIXTURE_NODE))


class FakeKube:
    """KubeClient in memory. Records every write; `fail` makes the next matching call raise."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.configmaps: dict[tuple[str, str], dict[str, str]] = {}
        self.writes: list[tuple[str, str, dict[str, Any]]] = []
        self.fail: dict[str, list[str]] = {}  # method name -> messages of the next failures
        self.lost_replies = 0  # the next swaps that take but whose reply is lost (a timeout)
        self.late_swaps = 0  # the next swaps that time out and take only after the next pod list
        self._late: list[tuple[str, str, str]] = []
        self._watchers: list[asyncio.Queue[None]] = []
        self._pod_watchers: list[asyncio.Queue[tuple[str, dict[str, Any]]]] = []

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
        self._pod_event("ADDED", pod)
        return pod

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        for queue in self._pod_watchers:
            queue.put_nowait((kind, copy.deepcopy(pod)))

    def set_configmap(self, namespace: str, name: str, data: dict[str, str] | None) -> None:
        if data is None:
            self.configmaps.pop((namespace, name), None)
        else:
            self.configmaps[(namespace, name)] = dict(data)
        for queue in self._watchers:
            queue.put_nowait(None)

    def fail_next(self, method: str, message: str, times: int = 1) -> None:
        self.fail[method] = [message] * times

    def _check(self, method: str) -> None:
        if self.fail.get(method):
            raise KubeError(self.fail[method].pop())

    async def get_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        self._check("get_configmap")
        found = self.configmaps.get((namespace, name))
        return dict(found) if found is not None else None

    async def watch_configmaps(self, configmaps: tuple[tuple[str, str], ...]) -> AsyncIterator[None]:
        queue: asyncio.Queue[None] = asyncio.Queue()
        self._watchers.append(queue)
        try:
            while True:
                await queue.get()
                yield None
        finally:
            self._watchers.remove(queue)

    async def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        self._check("list_pods_on_node")
        listed = [copy.deepcopy(p) for p in self.pods.values() if p.get("spec", {}).get("nodeName") == node]
        while self._late:  # a timed-out swap the server applies late, after this list was read
            namespace, name, new = self._late.pop()
            late = {"metadata": {"annotations": {ann.DEVICES_TO_ALLOCATE: new}}}
            await self.patch_pod(namespace, name, late)
        return listed

    async def pod_events(self, node: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._pod_watchers.append(queue)
        try:
            yield ("RESET", {})
            for pod in await self.list_pods_on_node(node):
                yield ("ADDED", pod)
            yield ("SYNCED", {})
            while True:
                kind, pod = await queue.get()
                if pod.get("spec", {}).get("nodeName") == node:
                    yield kind, pod
        finally:
            self._pod_watchers.remove(queue)

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self._check("patch_pod")
        key = (namespace, name)
        if key not in self.pods:
            raise KubeError(f"Pod {namespace}/{name}: HTTP 404 Not Found", 404)
        self.pods[key] = merge_patch(self.pods[key], patch)
        self.writes.append(("pod", f"{namespace}/{name}", patch))
        self._pod_event("MODIFIED", self.pods[key])

    async def consume_devices(self, namespace: str, name: str, old: str, new: str,
                              phase: str | None = None) -> dict[str, Any]:
        self._check("consume_devices")
        key = (namespace, name)
        if self.late_swaps:
            self.late_swaps -= 1
            self._late.append((namespace, name, new))
            raise KubeError(f"Pod {namespace}/{name}: TimeoutError()")
        if key not in self.pods:
            raise KubeError(f"Pod {namespace}/{name}: HTTP 404 Not Found", 404)
        if self.pods[key]["metadata"]["annotations"].get(ann.DEVICES_TO_ALLOCATE) != old or (
                phase and (self.pods[key].get("status") or {}).get("phase") != phase):
            raise KubeError(f"Pod {namespace}/{name}: HTTP 422 test failed", 422)
        await self.patch_pod(namespace, name, {"metadata": {"annotations": {ann.DEVICES_TO_ALLOCATE: new}}})
        if self.lost_replies:
            self.lost_replies -= 1
            raise KubeError(f"Pod {namespace}/{name}: ServerDisconnectedError('Server disconnected')")
        return copy.deepcopy(self.pods[key])

    async def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self._check("patch_node")
        self.nodes[name] = merge_patch(self.nodes.get(name, {"metadata": {"name": name}}), patch)
        self.writes.append(("node", name, patch))

    async def close(self) -> None:
        pass

    def pod_writes(self, ref: str) -> list[dict[str, Any]]:
        return [p for kind, name, p in self.writes if kind == "pod" and name == ref]


