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
        self.fail: dict[str, str] = {}  # method name -> message
        self.pod_lists = 0
        self._watchers: list[asyncio.Queue[None]] = []

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
        return pod

    def set_configmap(self, namespace: str, name: str, data: dict[str, str] | None) -> None:
        if data is None:
            self.configmaps.pop((namespace, name), None)
        else:
            self.configmaps[(namespace, name)] = dict(data)
        for queue in self._watchers:
            queue.put_nowait(None)

    def _check(self, method: str) -> None:
        if method in self.fail:
            raise KubeError(self.fail.pop(method))

    async def get_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        self._check("get_configmap")
        found = self.configmaps.get((namespace, name))
        return dict(found) if found is not None else None

    async def watch_configmaps(
        self, namespaces: tuple[str, ...], names: tuple[str, ...]
    ) -> AsyncIterator[None]:
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
        self.pod_lists += 1
        return [copy.deepcopy(p) for p in self.pods.values() if p.get("spec", {}).get("nodeName") == node]

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self._check("patch_pod")
        key = (namespace, name)
        if key not in self.pods:
            raise KubeError(f"Pod {namespace}/{name}: HTTP 404 Not Found")
        self.pods[key] = merge_patch(self.pods[key], patch)
        self.writes.append(("pod", f"{namespace}/{name}", patch))

    async def get_node(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.nodes[name])

    async def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self._check("patch_node")
        self.nodes[name] = merge_patch(self.nodes.get(name, {"metadata": {"name": name}}), patch)
        self.writes.append(("node", name, patch))

    async def close(self) -> None:
        pass

    def pod_writes(self, ref: str) -> list[dict[str, Any]]:
        return [p for kind, name, p in self.writes if kind == "pod" and name == ref]


