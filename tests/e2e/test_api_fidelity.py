"""The API behaviours the runtime tests rely on, as one suite run against the in-process emulator
AND the real kube-apiserver: where they differ, the emulator is wrong (and the runtime tests that
use it prove nothing). Create, conflicts, JSON-patch tests, status subresource, selectors, watches
from a resourceVersion and the 410 when that version is gone, 404/409/422."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from vgpu_emulator import run_emulator
from vgpu_emulator.emulator import EVENT_LOG_SIZE
from vgpu_operator import api

from tests.support.api import Api
from tests.support.waiting import eventually_awaited

from .cluster import Cluster

JSON_PATCH = "application/json-patch+json"


@dataclass
class Backend:
    name: str
    api: Api
    namespace: str
    # Make the server forget the history before now, so a watch from an old version gets 410.
    expire_history: Callable[[], Awaitable[None]]

    @property
    def configmaps(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps"

    @property
    def pods(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    @property
    def events(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/events"


@pytest.fixture(params=["emulator", "real"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    namespace = f"fidelity-{uuid.uuid4().hex[:6]}"
    if request.param == "emulator":
        async with run_emulator() as running, aiohttp.ClientSession() as session:
            async def overflow() -> None:  # the emulator keeps the last EVENT_LOG_SIZE changes
                for i in range(EVENT_LOG_SIZE + 1):
                    running.emulator.apply({"apiVersion": "v1", "kind": "ConfigMap",
                                            "metadata": {"name": "churn", "namespace": "churn"},
                                            "data": {"i": str(i)}})
            yield Backend("emulator", Api(session, running.url, None), namespace, overflow)
        return
    cluster: Cluster = request.getfixturevalue("crd_installed")
    cluster.kubectl("create", "namespace", namespace)
    async with aiohttp.ClientSession() as session:
        real = Backend("real", cluster.api(session), namespace,
                       lambda: _compacted(real))
        try:
            yield real
        finally:
            cluster.kubectl("delete", "namespace", namespace, "--wait=false")


async def _compacted(backend: Backend) -> None:
    """The real server compacts etcd every 10 s (e2e/controlplane.py); Events have no watch cache,
    so their watches read etcd and see the compaction as soon as it happened."""
    _, first = await backend.api.call("POST", backend.events, _event("probe", backend.namespace))
    since = first["metadata"]["resourceVersion"]

    async def gone() -> bool:
        probe = _event(f"probe-{uuid.uuid4().hex[:6]}", backend.namespace)
        await backend.api.call("POST", backend.events, probe)
        events = await backend.api.watch(f"{backend.events}?resourceVersion={since}", 1, 2)
        return bool(events) and events[0]["type"] == "ERROR"

    await eventually_awaited(gone, 60, "the server forgetting its history (etcd compaction)", interval=1)


def _event(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
            "involvedObject": {"kind": "ConfigMap", "name": "a", "apiVersion": "v1", "namespace": namespace},
            "reason": "Test", "message": "fidelity", "type": "Normal"}


def _cm(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels},
            "data": {"k": "v"}}


def _pod(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}


async def test_create_fills_identity_and_a_second_create_is_409(backend: Backend) -> None:
    status, created = await backend.api.call("POST", backend.configmaps, _cm("a"))
    assert status == 201
    meta = created["metadata"]
    assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"]
    assert meta["namespace"] == backend.namespace
    status, body = await backend.api.call("POST", backend.configmaps, _cm("a"))
    assert (status, body["reason"]) == (409, "AlreadyExists")


async def test_create_with_a_resource_version_is_refused(backend: Backend) -> None:
    # A stale copy posted back (with its resourceVersion) must not come back to life.
    obj = _cm("stale")
    obj["metadata"]["resourceVersion"] = "5"
    status, body = await backend.api.call("POST", backend.configmaps, obj)
    assert status == 500 and "resourceVersion should not be set" in body["message"]
    assert (await backend.api.call("GET", f"{backend.configmaps}/stale"))[0] == 404


async def test_a_stale_resource_version_is_409_and_the_current_one_applies(backend: Backend) -> None:
    _, created = await backend.api.call("POST", backend.configmaps, _cm("a"))
    version = created["metadata"]["resourceVersion"]
    assert (await backend.api.call("PATCH", f"{backend.configmaps}/a", {"data": {"k": "1"}}))[0] == 200
    status, body = await backend.api.call(
        "PATCH", f"{backend.configmaps}/a", {"metadata": {"resourceVersion": version}, "data": {"k": "2"}})
    assert (status, body["reason"]) == (409, "Conflict")
    stale_put = {**created, "data": {"k": "3"}}
    assert (await backend.api.call("PUT", f"{backend.configmaps}/a", stale_put))[0] == 409
    _, now = await backend.api.call("GET", f"{backend.configmaps}/a")
    assert now["data"] == {"k": "1"}


async def test_a_failed_json_patch_test_is_422_and_changes_nothing(backend: Backend) -> None:
    await backend.api.call("POST", backend.configmaps, _cm("a"))
    ops = [{"op": "test", "path": "/data/k", "value": "other"},
           {"op": "replace", "path": "/data/k", "value": "x"}]
    status, _ = await backend.api.call("PATCH", f"{backend.configmaps}/a", ops, JSON_PATCH)
    assert status == 422
    _, now = await backend.api.call("GET", f"{backend.configmaps}/a")
    assert now["data"] == {"k": "v"}


async def test_missing_objects_are_404_for_every_verb(backend: Backend) -> None:
    for method, body in (("GET", None), ("PATCH", {"data": {}}), ("DELETE", None)):
        status, answer = await backend.api.call(method, f"{backend.configmaps}/nope", body)
        assert (status, answer["reason"]) == (404, "NotFound"), method


async def test_label_and_field_selectors(backend: Backend) -> None:
    for name, labels in (("a", {"app": "x"}), ("b", {"app": "y"}), ("c", {})):
        await backend.api.call("POST", backend.configmaps, _cm(name, **labels))
    await backend.api.call("POST", backend.pods, _pod("p1", "node-1"))
    await backend.api.call("POST", backend.pods, _pod("p2", "node-2"))

    async def names(path: str) -> list[str]:
        status, listed = await backend.api.call("GET", path)
        assert status == 200, listed
        # kube-root-ca.crt: the controller-manager's, in every namespace of a real cluster
        return sorted(o["metadata"]["name"] for o in listed["items"]
                      if o["metadata"]["name"] != "kube-root-ca.crt")

    assert await names(f"{backend.configmaps}?labelSelector=app%3Dx") == ["a"]
    assert await names(f"{backend.configmaps}?labelSelector=app") == ["a", "b"]
    assert await names(f"{backend.configmaps}?labelSelector=app%20notin%20(x)") == ["b", "c"]
    assert await names(f"{backend.configmaps}?fieldSelector=metadata.name%3Db") == ["b"]
    assert await names(f"{backend.pods}?fieldSelector=spec.nodeName%3Dnode-2") == ["p2"]


async def test_a_watch_from_a_version_sends_only_later_changes_in_order(backend: Backend) -> None:
    await backend.api.call("POST", backend.configmaps, _cm("old"))
    _, listed = await backend.api.call("GET", backend.configmaps)
    since = listed["metadata"]["resourceVersion"]
    await backend.api.call("POST", backend.configmaps, _cm("new"))
    await backend.api.call("PATCH", f"{backend.configmaps}/old", {"data": {"k": "2"}})
    await backend.api.call("DELETE", f"{backend.configmaps}/new")
    events = await backend.api.watch(f"{backend.configmaps}?resourceVersion={since}", count=3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "new"), ("MODIFIED", "old"), ("DELETED", "new")]


async def test_a_watch_from_a_forgotten_version_gets_410_in_the_stream(backend: Backend) -> None:
    _, created = await backend.api.call("POST", backend.events, _event("a", backend.namespace))
    assert "resourceVersion" in created["metadata"], created
    since = created["metadata"]["resourceVersion"]
    await backend.expire_history()
    events = await backend.api.watch(f"{backend.events}?resourceVersion={since}", count=1)
    assert [e["type"] for e in events] == ["ERROR"]
    assert (events[0]["object"]["code"], events[0]["object"]["reason"]) == (410, "Expired")


async def test_a_status_patch_with_a_stale_resource_version_is_409(backend: Backend) -> None:
    """The operator's status write carries the version it computed from (issue 15 item 8): a
    write to an older version must be refused, not merged over a newer status."""
    path = f"/apis/{api.GROUP}/{api.VERSION}/{api.PLURAL}"
    name = f"fidelity-{uuid.uuid4().hex[:6]}"
    policy = {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "metadata": {"name": name},
              "spec": {"paused": True}}
    _, created = await backend.api.call("POST", path, policy)
    try:
        stale = created["metadata"]["resourceVersion"]
        status, written = await backend.api.call("PATCH", f"{path}/{name}/status",
                                                  {"metadata": {"resourceVersion": stale},
                                                   "status": {"restarts": [{"target": "a", "reason": "r"}]}})
        assert status == 200, written
        erase = {"metadata": {"resourceVersion": stale}, "status": {"restarts": []}}
        status, body = await backend.api.call("PATCH", f"{path}/{name}/status", erase)
        assert (status, body["reason"]) == (409, "Conflict")
        _, now = await backend.api.call("GET", f"{path}/{name}")
        assert [(r["target"], r["reason"]) for r in now["status"]["restarts"]] == [("a", "r")]
    finally:
        await backend.api.call("DELETE", f"{path}/{name}")


async def test_status_is_a_subresource_of_the_policy(backend: Backend) -> None:
    path = f"/apis/{api.GROUP}/{api.VERSION}/{api.PLURAL}"
    name = f"fidelity-{uuid.uuid4().hex[:6]}"
    policy = {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "metadata": {"name": name},
              "spec": {"paused": True}, "status": {"drifted": 7}}
    status, created = await backend.api.call("POST", path, policy)
    try:
        assert status == 201
        assert "drifted" not in created.get("status", {}), "status is not written through the main resource"
        generation = created["metadata"]["generation"]
        _, after = await backend.api.call("PATCH", f"{path}/{name}/status",
                                          {"spec": {"paused": False}, "status": {"drifted": 1}})
        assert after["status"]["drifted"] == 1 and after["spec"]["paused"] is True
        assert after["metadata"]["generation"] == generation, "a status write is no new generation"
        _, after = await backend.api.call("PATCH", f"{path}/{name}", {"spec": {"paused": False}})
        assert after["metadata"]["generation"] == generation + 1
    finally:
        await backend.api.call("DELETE", f"{path}/{name}")
