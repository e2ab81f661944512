"""Following nodes: a paged list (vanished nodes dropped), then a watch that triggers on what matters."""

from __future__ import annotations

import asyncio

import aiohttp
from vgpu_emulator import run_emulator
from vgpu_operator.k8s import Kube, new_api_client
from vgpu_operator.runtime import nodes
from vgpu_operator.runtime.indexes import NodeIndex

from tests.support.waiting import eventually

from .conftest import FIXTURES


def _node(name: str, **labels: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def _versioned(name: str, version: int, **labels: str) -> dict[str, object]:
    node = _node(name, **labels)
    node["metadata"]["resourceVersion"] = str(version)  # type: ignore[index]
    return node


def test_index_ignores_older_states_and_forgets_deleted_nodes() -> None:
    index = NodeIndex()
    assert index.update(_versioned("n", 5, pool="a"))
    assert not index.update(_versioned("n", 3, pool="old")), "an older state never replaces a newer one"
    assert index.nodes["n"]["metadata"]["labels"] == {"pool": "a"}
    assert index.update(_versioned("n", 6), deleted=True) and "n" not in index.nodes
    assert index.versions == {}, "a node churning cluster does not grow the index"
    assert index.update(_versioned("n", 7, pool="b")), "a node of the same name can come back"


async def test_relist_pages_and_drops_vanished_nodes() -> None:
    async with run_emulator(FIXTURES / "cluster") as running:
        for index in range(7):
            running.emulator.apply(_node(f"extra-{index}"))
        kube = Kube(await new_api_client(str(running.kubeconfig)))
        try:
            index = NodeIndex()
            version, changed = await nodes.relist(kube, index, page=2)
            assert changed and index.seeded.is_set() and len(index.nodes) == 9 and version
            url = f"{running.url}/api/v1/nodes/extra-0"
            async with aiohttp.ClientSession() as session, session.delete(url) as response:
                assert response.status == 200
            _, changed = await nodes.relist(kube, index, page=2)
            assert changed and "extra-0" not in index.nodes
            pages = [s for s in running.emulator.served if "limit=2" in s.query]
            assert len(pages) == 5 + 4  # 9 nodes, then 8
            assert await nodes.relist(kube, index) == (str(running.emulator.resource_version), False)
        finally:
            await kube.close()


async def test_follow_triggers_on_label_changes_only_and_survives_dropped_watches() -> None:
    async with run_emulator(FIXTURES / "cluster") as running:
        kube = Kube(await new_api_client(str(running.kubeconfig)))
        index, stop, triggers = NodeIndex(), asyncio.Event(), []
        task = asyncio.create_task(nodes.follow(kube, index, lambda: triggers.append(1), stop))
        try:
            await asyncio.wait_for(index.seeded.wait(), 5)
            triggers.clear()
            running.emulator.apply(_node("new", pool="a"))
            await eventually(lambda: "new" in index.nodes, what="the new node indexed")
            count = len(triggers)
            assert count == 1
            node = running.emulator.get_object("Node", None, "new")
            assert node is not None
            heartbeat = running.emulator.apply({**node, "status": {"conditions": [{"type": "Ready"}]}})
            seen = int(heartbeat["metadata"]["resourceVersion"])
            await eventually(lambda: index.versions["new"] >= seen, what="the heartbeat indexed")
            assert len(triggers) == count, "a heartbeat-like change does not reconcile"
            running.emulator.drop_watches("Node")
            running.emulator.apply(_node("new", pool="b"))
            await eventually(lambda: index.nodes["new"]["metadata"]["labels"] == {"pool": "b"},
                             what="the label change seen after the watch was dropped")
            assert len(triggers) == count + 1
        finally:
            stop.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await kube.close()
