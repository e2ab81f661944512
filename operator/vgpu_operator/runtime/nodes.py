"""Follow the cluster's Nodes into the NodeIndex: a paged list, then a watch from its version.

Nodes are watched here rather than through a kopf handler: kopf keeps per-object state and reads
the initial list in one response, which for 5,000 nodes cost about 34 MiB of the operator's
memory (bench/operator_bench.py); this loop keeps only the trimmed index. A change that matters
(labels, registration, allocatable, a node coming or going) triggers a reconcile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from vgpu_operator.k8s import Kube
from vgpu_operator.runtime.indexes import NodeIndex
from vgpu_operator.runtime.watching import BACKOFF_SECONDS, list_and_watch


async def relist(kube: Kube, index: NodeIndex, page: int = 500) -> tuple[str, bool]:
    """Read every node (paged) into the index, dropping vanished ones; (list version, changed)."""
    versions: list[str] = []
    seen: set[str] = set()
    changed = False
    async for node in kube.iter_objects("Node", page=page, versions=versions):
        seen.add(str(node["metadata"]["name"]))
        changed = index.update(node) or changed
    for gone in set(index.nodes) - seen:
        changed = index.update({"metadata": {"name": gone}}, deleted=True) or changed
    index.seeded.set()
    return (versions[-1] if versions else ""), changed


async def follow(kube: Kube, index: NodeIndex, trigger: Callable[[], None], stop: asyncio.Event,
                 backoff: tuple[float, ...] = BACKOFF_SECONDS) -> None:
    """Keep the index current until `stop` is set; API failures are retried with backoff."""
    async def listed() -> str:
        version, changed = await relist(kube, index)
        if changed:
            trigger()
        return version

    def changed(type_: str, node: dict[str, Any]) -> None:
        if index.update(node, deleted=type_ == "DELETED"):
            trigger()

    await list_and_watch(kube, "Node", "nodes", listed, changed, backoff, stop=stop)
