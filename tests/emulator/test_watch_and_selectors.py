"""Watches (from a resourceVersion, dropped, timed out), label and field selectors, the loader."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
from vgpu_emulator import Emulator, ManifestError, RunningEmulator, iter_manifests, load_manifests
from vgpu_emulator.selectors import SelectorError, parse_field_selector, parse_label_selector

from tests.support.api import Api
from tests.support.waiting import eventually

from .conftest import FIXTURES

PODS = "/api/v1/namespaces/demo/pods"


def _pod(name: str, node: str, phase: str = "Running", **labels: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


async def _watched(running: RunningEmulator) -> None:
    """The watch a test started is open on the server (an event before that would be replayed
    or lost differently from what the test means to check)."""
    await eventually(lambda: running.emulator.open_watches("Pod"), what="the pod watch open")


async def test_watch_from_a_resource_version_sends_only_later_changes(api: Api) -> None:
    await api.call("POST", PODS, _pod("old", "n1"))
    _, listing = await api.call("GET", PODS)
    since = listing["metadata"]["resourceVersion"]
    await api.call("POST", PODS, _pod("new", "n1"))
    await api.call("PATCH", PODS + "/old", {"metadata": {"labels": {"x": "1"}}})
    events = await api.watch(f"{PODS}?resourceVersion={since}", count=2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "new"),
        ("MODIFIED", "old"),
    ]


async def test_watch_without_version_replays_existing_then_follows(
    api: Api, running: RunningEmulator
) -> None:
    await api.call("POST", PODS, _pod("a", "n1"))
    watching = asyncio.create_task(api.watch(PODS, count=3))
    await _watched(running)
    await api.call("POST", PODS, _pod("b", "n1"))
    await api.call("DELETE", PODS + "/a")
    events = await watching
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("DELETED", "a"),
    ]


async def test_watch_honours_selectors_and_namespace(api: Api, running: RunningEmulator) -> None:
    watching = asyncio.create_task(
        api.watch(f"{PODS}?labelSelector=app%3Dplugin&fieldSelector=spec.nodeName%3Dn2", 1)
    )
    await _watched(running)
    await api.call("POST", "/api/v1/namespaces/other/pods", {**_pod("x", "n2", app="plugin")})
    await api.call("POST", PODS, _pod("wrong-node", "n1", app="plugin"))
    await api.call("POST", PODS, _pod("wrong-label", "n2", app="other"))
    await api.call("POST", PODS, _pod("right", "n2", app="plugin"))
    events = await watching
    assert [e["object"]["metadata"]["name"] for e in events] == ["right"]


async def test_dropped_watch_ends_the_stream_and_a_rewatch_loses_nothing(
    api: Api, running: RunningEmulator
) -> None:
    _, listing = await api.call("GET", PODS)
    watching = asyncio.create_task(
        api.watch(f"{PODS}?resourceVersion={listing['metadata']['resourceVersion']}", 5)
    )
    await _watched(running)
    await api.call("POST", PODS, _pod("a", "n1"))
    assert running.emulator.drop_watches("Pod") == 1
    first = await watching
    assert [e["object"]["metadata"]["name"] for e in first] == ["a"]
    await api.call("POST", PODS, _pod("b", "n1"))  # happens while nobody watches
    last = first[-1]["object"]["metadata"]["resourceVersion"]
    again = await api.watch(f"{PODS}?resourceVersion={last}", 1)
    assert [e["object"]["metadata"]["name"] for e in again] == ["b"]


async def test_watch_timeout_seconds_ends_the_stream(api: Api) -> None:
    events = await api.watch(f"{PODS}?timeoutSeconds=0.2", count=1, timeout=2)
    assert events == []


async def test_list_with_label_and_field_selectors(api: Api) -> None:
    await api.call("POST", PODS, _pod("p1", "n1", "Running", app="plugin", tier="a"))
    await api.call("POST", PODS, _pod("p2", "n2", "Pending", app="plugin", tier="b"))
    await api.call("POST", PODS, _pod("p3", "n1", "Running", app="web"))

    async def names(query: str) -> list[str]:
        _, listing = await api.call("GET", f"{PODS}?{query}")
        return [item["metadata"]["name"] for item in listing["items"]]

    assert await names("labelSelector=app%3Dplugin") == ["p1", "p2"]
    assert await names("labelSelector=app%3Dplugin,tier+notin+(a)") == ["p2"]
    assert await names("labelSelector=tier") == ["p1", "p2"]
    assert await names("labelSelector=!tier") == ["p3"]
    assert await names("fieldSelector=spec.nodeName%3Dn1") == ["p1", "p3"]
    assert await names("fieldSelector=status.phase!%3DRunning") == ["p2"]
    assert await names("fieldSelector=metadata.namespace%3Ddemo,metadata.name%3Dp3") == ["p3"]
    _, everywhere = await api.call("GET", "/api/v1/pods?fieldSelector=metadata.namespace%3Ddemo")
    assert len(everywhere["items"]) == 3
    status, body = await api.call("GET", "/api/v1/pods?labelSelector=a+in+b")
    assert status == 400 and "labelSelector" in body["message"]


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=b", {"a": "b"}, True),
        ("a==b", {"a": "c"}, False),
        ("a!=b", {}, True),
        ("a in (b, c)", {"a": "c"}, True),
        ("a notin (b,c)", {"a": "c"}, False),
        ("a notin (b)", {}, True),
        ("a,!b", {"a": "1"}, True),
        ("a,!b", {"a": "1", "b": "2"}, False),
        ("", {"x": "y"}, True),
    ],
)
def test_label_selector_grammar(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(selector)({"metadata": {"labels": labels}}) is expected


def test_selector_errors_name_the_selector() -> None:
    with pytest.raises(SelectorError, match="labelSelector"):
        parse_label_selector("a in b")
    with pytest.raises(SelectorError, match="fieldSelector"):
        parse_field_selector("spec.nodeName")


def test_loader_reads_multi_document_files_and_lists(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Node, metadata: {name: n1}}\n"
        "---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
    )
    emulator = Emulator()
    assert load_manifests(emulator, tmp_path) == 2
    assert emulator.get_object("Node", None, "n1") is not None
    assert emulator.get_object("ConfigMap", "default", "c") is not None


def test_loader_errors_name_the_file_and_the_problem(tmp_path: pathlib.Path) -> None:
    (tmp_path / "bad.yaml").write_text("just: a mapping\n")
    with pytest.raises(ManifestError, match=r"bad\.yaml: document 0 has no kind"):
        list(iter_manifests(tmp_path))
    (tmp_path / "bad.yaml").write_text("apiVersion: x/v1\nkind: Widget\nmetadata: {name: w}\n")
    with pytest.raises(ManifestError, match=r"Widget w: .*unknown resource"):
        load_manifests(Emulator(), tmp_path)


def test_loading_a_crd_declares_its_resource(tmp_path: pathlib.Path) -> None:
    (tmp_path / "crd.yaml").write_text(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
        "metadata: {name: widgets.x.io}\n"
        "spec:\n  group: x.io\n  scope: Cluster\n  names: {plural: widgets, kind: Widget}\n"
        "  versions: [{name: v1, served: true, storage: true, subresources: {status: {}}}]\n"
        "---\napiVersion: x.io/v1\nkind: Widget\nmetadata: {name: w}\n"
    )
    emulator = Emulator()
    load_manifests(emulator, tmp_path)
    assert emulator.get_object("Widget", None, "w") is not None
    assert emulator.spec_for("x.io/v1/widgets").status_subresource


def test_fixture_cluster_loads_completely() -> None:
    emulator = Emulator()
    count = load_manifests(emulator, FIXTURES / "cluster", FIXTURES / "scenarios")
    assert count == len(list(iter_manifests(FIXTURES / "cluster"))) + len(
        list(iter_manifests(FIXTURES / "scenarios"))
    )
    assert len(emulator.list_objects("Node")) == 2
    # The count above is what the loader iterated; this is what the emulator actually stores.
    for obj in (*iter_manifests(FIXTURES / "cluster"), *iter_manifests(FIXTURES / "scenarios")):
        meta = obj["metadata"]
        assert emulator.get_object(obj["kind"], meta.get("namespace") or "default", meta["name"]), meta
