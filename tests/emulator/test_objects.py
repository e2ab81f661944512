"""Object metadata, create/patch/replace/delete semantics, subresources: the gaps kmock 0.8 had."""

from __future__ import annotations

import pytest
from vgpu_emulator import RunningEmulator

from tests.support.api import Api

CMS = "/api/v1/namespaces/demo/configmaps"
POLICIES = "/apis/vgpu.io/v1alpha1/vgpupolicies"


def _cm(name: str, **data: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


async def test_create_fills_uid_version_timestamp_and_namespace_from_url(api: Api) -> None:
    status, first = await api.call("POST", CMS, _cm("a", k="1"))
    assert status == 201
    _, second = await api.call("POST", CMS, _cm("b", k="1"))
    meta = first["metadata"]
    assert meta["namespace"] == "demo"
    assert meta["uid"] and meta["uid"] != second["metadata"]["uid"]
    assert int(second["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert meta["creationTimestamp"].endswith("Z")
    status, listed = await api.call("GET", CMS)
    assert [item["metadata"]["name"] for item in listed["items"]] == ["a", "b"]


async def test_create_twice_is_409_and_generate_name_makes_unique_names(api: Api) -> None:
    await api.call("POST", CMS, _cm("a"))
    status, body = await api.call("POST", CMS, _cm("a"))
    # AlreadyExists, as kube-apiserver says (tests/e2e/test_api_fidelity.py)
    assert status == 409 and body["reason"] == "AlreadyExists"
    generated = {"metadata": {"generateName": "ev-"}, "data": {}}
    _, one = await api.call("POST", CMS, generated)
    _, two = await api.call("POST", CMS, generated)
    assert one["metadata"]["name"].startswith("ev-") and one["metadata"]["name"] != two["metadata"]["name"]


async def test_every_write_grows_resource_version_and_generation_follows_spec_only(api: Api) -> None:
    policy = {
        "apiVersion": "vgpu.io/v1alpha1",
        "kind": "VGPUPolicy",
        "metadata": {"name": "p"},
        "spec": {"paused": False},
    }
    _, created = await api.call("POST", POLICIES, policy)
    assert created["metadata"]["generation"] == 1
    _, labelled = await api.call("PATCH", POLICIES + "/p", {"metadata": {"labels": {"x": "y"}}})
    assert labelled["metadata"]["generation"] == 1
    assert int(labelled["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    _, changed = await api.call("PATCH", POLICIES + "/p", {"spec": {"paused": True}})
    assert changed["metadata"]["generation"] == 2
    _, status_only = await api.call("PATCH", POLICIES + "/p/status", {"status": {"phase": "Ready"}})
    assert status_only["metadata"]["generation"] == 2
    assert status_only["status"] == {"phase": "Ready"}


async def test_status_subresource_is_kept_apart_from_the_main_resource(api: Api) -> None:
    policy = {"metadata": {"name": "p"}, "spec": {"paused": False}}
    await api.call("POST", POLICIES, policy)
    _, after_main = await api.call("PATCH", POLICIES + "/p", {"spec": {"paused": True}, "status": {"x": 1}})
    assert "status" not in after_main and after_main["spec"]["paused"] is True
    _, after_status = await api.call(
        "PATCH", POLICIES + "/p/status", {"spec": {"paused": False}, "status": {"x": 2}}
    )
    assert after_status["spec"]["paused"] is True and after_status["status"] == {"x": 2}


async def test_failed_json_patch_test_op_answers_422_and_changes_nothing(api: Api) -> None:
    _, created = await api.call("POST", CMS, _cm("a", k="1"))
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "stale"},
        {"op": "replace", "path": "/data/k", "value": "2"},
    ]
    status, body = await api.call("PATCH", CMS + "/a", ops, content_type="application/json-patch+json")
    assert status == 422 and body["reason"] == "Invalid"
    _, now = await api.call("GET", CMS + "/a")
    assert now["data"] == {"k": "1"}
    ops[0]["value"] = created["metadata"]["resourceVersion"]
    status, body = await api.call("PATCH", CMS + "/a", ops, content_type="application/json-patch+json")
    assert status == 200 and body["data"] == {"k": "2"}


async def test_merge_patch_deletes_keys_with_null_and_checks_a_given_resource_version(api: Api) -> None:
    await api.call("POST", CMS, _cm("a", k="1", j="2"))
    _, patched = await api.call("PATCH", CMS + "/a", {"data": {"k": None}})
    assert patched["data"] == {"j": "2"}
    status, _ = await api.call(
        "PATCH", CMS + "/a", {"metadata": {"resourceVersion": "1"}, "data": {"j": "3"}}
    )
    assert status == 409


async def test_server_side_apply_is_refused_not_silently_ignored(api: Api) -> None:
    await api.call("POST", CMS, _cm("a"))
    status, body = await api.call(
        "PATCH", CMS + "/a", {"data": {}}, content_type="application/apply-patch+yaml"
    )
    assert status == 415 and "server-side apply" in body["message"]


async def test_put_replaces_the_object_keeps_identity_and_checks_version(api: Api) -> None:
    _, created = await api.call("POST", CMS, _cm("a", k="1", j="2"))
    replacement = _cm("a", only="x")
    replacement["metadata"] = {"name": "a", "resourceVersion": created["metadata"]["resourceVersion"]}
    status, replaced = await api.call("PUT", CMS + "/a", replacement)
    assert status == 200 and replaced["data"] == {"only": "x"}
    assert replaced["metadata"]["uid"] == created["metadata"]["uid"]
    status, _ = await api.call("PUT", CMS + "/a", replacement)  # same, now stale, version
    assert status == 409


async def test_delete_waits_for_finalizers(api: Api) -> None:
    await api.call("POST", CMS, {"metadata": {"name": "a", "finalizers": ["x/y"]}})
    status, marked = await api.call("DELETE", CMS + "/a")
    assert status == 200 and marked["metadata"]["deletionTimestamp"]
    assert (await api.call("GET", CMS + "/a"))[0] == 200
    await api.call("PATCH", CMS + "/a", {"metadata": {"finalizers": None}})
    assert (await api.call("GET", CMS + "/a"))[0] == 404
    assert (await api.call("DELETE", CMS + "/a"))[0] == 404


async def test_fixtures_loaded_and_discovery_covers_every_resource_the_project_uses(
    api: Api,
    running: RunningEmulator,
) -> None:
    assert running.emulator.get_object("ConfigMap", "kube-system", "volcano-vgpu-device-config")
    assert running.emulator.get_object("DaemonSet", "kube-system", "volcano-device-plugin")
    for group_version, plural in [
        ("api/v1", "configmaps"),
        ("api/v1", "nodes"),
        ("api/v1", "pods"),
        ("api/v1", "events"),
        ("api/v1", "namespaces"),
        ("apis/apps/v1", "daemonsets"),
        ("apis/apps/v1", "deployments"),
        ("apis/coordination.k8s.io/v1", "leases"),
        ("apis/apiextensions.k8s.io/v1", "customresourcedefinitions"),
        ("apis/vgpu.io/v1alpha1", "vgpupolicies"),
    ]:
        status, listing = await api.call("GET", "/" + group_version)
        assert status == 200, group_version
        assert plural in {resource["name"] for resource in listing["resources"]}, plural
    _, core = await api.call("GET", "/api/v1")
    assert core["groupVersion"] == "v1"
    _, policies = await api.call("GET", "/apis/vgpu.io/v1alpha1")
    assert {"vgpupolicies", "vgpupolicies/status"} <= {r["name"] for r in policies["resources"]}


async def test_unknown_resources_answer_404(api: Api) -> None:
    status, _ = await api.call("GET", "/apis/example.com/v1/widgets")
    assert status == 404


@pytest.mark.parametrize("status_code", [409, 500])
async def test_injected_faults_hit_only_the_next_matching_requests(
    api: Api,
    running: RunningEmulator,
    status_code: int,
) -> None:
    await api.call("POST", CMS, _cm("a"))
    running.emulator.fail_next("PATCH", r"/configmaps/a$", status=status_code, times=2)
    assert (await api.call("GET", CMS + "/a"))[0] == 200  # other methods unaffected
    results = [(await api.call("PATCH", CMS + "/a", {"data": {"k": "v"}}))[0] for _ in range(3)]
    assert results == [status_code, status_code, 200]
    assert len(running.emulator.writes("/configmaps/a")) == 1  # only the PATCH that got through


async def test_lists_are_paged_when_asked(api: Api) -> None:
    for index in range(5):
        await api.call("POST", CMS, _cm(f"cm-{index}"))
    names: list[str] = []
    token = ""
    pages = 0
    while True:
        _, page = await api.call("GET", f"{CMS}?limit=2" + (f"&continue={token}" if token else ""))
        names += [item["metadata"]["name"] for item in page["items"]]
        pages += 1
        token = page["metadata"].get("continue", "")
        if not token:
            break
    assert names == [f"cm-{index}" for index in range(5)] and pages == 3


async def test_discovery_requests_are_not_kept(api: Api, running: RunningEmulator) -> None:
    for _ in range(50):
        assert (await api.call("GET", "/apis/apps/v1"))[0] == 200
    assert running.emulator._requests == [], "kmock's scan-every-request list stays empty"
    assert len(running.emulator.served) >= 50
