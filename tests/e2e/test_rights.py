"""Least privilege on the real API server: the chart installed, the operator running under its
ServiceAccount, and then each role's needed writes allowed and its forbidden ones refused, by the
chart's RBAC or, where RBAC cannot name the object, by its ValidatingAdmissionPolicies.

The device plugin authenticates as the kubelet would have it: a token bound to its own pod on its
node (the node name travels in the token). Everything here is a real request, not `can-i`."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from vgpu_deviceplugin import allocate
from vgpu_formats import annotations as ann
from vgpuctl import chain

from tests.support.api import Api
from tests.support.waiting import eventually_sync

from .cluster import Cluster
from .release import OPERATOR_SA, PLUGIN_SA, Release, installed

HERE, THERE = chain.DEMO_NODE, "test-app-64-46-msxf"  # the fixture's two GPU nodes
MERGE, JSON_PATCH = "application/merge-patch+json", "application/json-patch+json"
RBAC = "forbidden: User"  # RBAC's refusal; the policies' messages are their own
UNBOUND = "token bound to a pod on a node"


@dataclass
class World:
    release: Release
    workloads: str  # namespace of the test's workload pods
    plugin_token: str  # bound to the plugin's pod on HERE, as the kubelet projects it
    unbound_plugin_token: str  # same ServiceAccount, no pod behind it
    operator_token: str

    @property
    def cluster(self) -> Cluster:
        return self.release.cluster

    def pod_path(self, name: str) -> str:
        return f"/api/v1/namespaces/{self.workloads}/pods/{name}"


def _pod(name: str, namespace: str, node: str, annotations: dict[str, str] | None = None,
         service_account: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": "gpu"},
                         "annotations": annotations or {}},
            "spec": {"nodeName": node, "serviceAccountName": service_account,
                     "containers": [{"name": "cuda", "image": "cuda:12"}]}}


def _scheduled(node: str) -> dict[str, str]:
    """What the scheduler leaves on a pod it placed on `node` with one vGPU."""
    return {ann.VGPU_NODE: node, ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING, ann.VGPU_TIME: "1",
            ann.DEVICES_TO_ALLOCATE: "GPU-0,NVIDIA,1000,30:;", "example.com/team": "ml"}


@pytest.fixture(scope="module")
def release(crd_installed: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    with installed(crd_installed, tmp_path_factory.mktemp("rights")) as release:
        release.ready()
        yield release


@pytest.fixture(scope="module")
def world(release: Release) -> Iterator[World]:
    cluster, namespace = release.cluster, release.namespace
    workloads = cluster.namespace("rights")
    pods = [_pod("plugin-here", namespace, HERE, service_account=PLUGIN_SA),
            _pod("gpu-here", workloads, HERE, _scheduled(HERE)),
            _pod("gpu-there", workloads, THERE, _scheduled(THERE))]
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    cluster.kubectl("annotate", "node", HERE, "example.com/rack=r1", "--overwrite")

    try:
        yield World(release, workloads, cluster.token(PLUGIN_SA, namespace, bound_pod="plugin-here"),
                    cluster.token(PLUGIN_SA, namespace), cluster.token(OPERATOR_SA, namespace))
    finally:
        cluster.kubectl("annotate", "node", HERE, "example.com/rack-", check=False)
        cluster.kubectl("delete", "pod", "plugin-here", "-n", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", workloads, "--wait=false", check=False)


@asynccontextmanager
async def as_token(cluster: Cluster, token: str) -> AsyncIterator[Api]:
    context = ssl.create_default_context(cafile=cluster.state.ca)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        yield Api(session, cluster.state.server, context)


async def _call(api: Api, method: str, path: str, body: Any = None,
                content_type: str = MERGE) -> tuple[int, str]:
    status, answer = await api.call(method, path, body, content_type=content_type)
    return status, str((answer or {}).get("message", "")) if isinstance(answer, dict) else str(answer)


def _annotations(obj: dict[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})


# ----- the device plugin -----

async def test_the_plugin_writes_what_it_needs_on_its_own_node(world: World) -> None:
    cluster = world.cluster
    cluster.kubectl("annotate", "node", HERE, f"{ann.NODE_LOCK}=2026-01-01T00:00:00Z", "--overwrite")
    register = _annotations(cluster.get("node", HERE))[ann.NODE_REGISTER]
    async with as_token(cluster, world.plugin_token) as api:
        # Registration and handshake on its Node; the node lock released after Allocate.
        node_register = {"metadata": {"annotations": {ann.NODE_REGISTER: register,
                                                      ann.NODE_HANDSHAKE: "Reported 2026.01.01 00:00:00"}}}
        assert await _call(api, "PATCH", f"/api/v1/nodes/{HERE}", node_register) == (200, "")
        assert await _call(api, "PATCH", f"/api/v1/nodes/{HERE}", allocate.release_lock_patch()) == (200, "")
        # Allocate: devices consumed by compare-and-swap (the phase read included: a JSON patch's
        # test reads the stored pod, status too), then bind-phase success.
        key = "/metadata/annotations/" + ann.DEVICES_TO_ALLOCATE.replace("/", "~1")
        swap = [{"op": "test", "path": "/status/phase", "value": "Pending"},
                {"op": "test", "path": key, "value": "GPU-0,NVIDIA,1000,30:;"},
                {"op": "replace", "path": key, "value": ";"}]
        stale = [{**swap[0], "value": "Failed"}, *swap[1:]]
        assert (await _call(api, "PATCH", world.pod_path("gpu-here"), stale, JSON_PATCH))[0] == 422
        assert await _call(api, "PATCH", world.pod_path("gpu-here"), swap, JSON_PATCH) == (200, "")
        assert await _call(api, "PATCH", world.pod_path("gpu-here"), allocate.success_patch()) == (200, "")
        # Reads: the pods of its node, the two ConfigMaps by name.
        status, _ = await _call(api, "GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{HERE}")
        assert status == 200
        for namespace, name in (("kube-system", "volcano-vgpu-device-config"),
                                (world.release.namespace, "volcano-vgpu-node-config")):
            assert (await _call(api, "GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}"))[0] == 200
    node = cluster.get("node", HERE)
    assert ann.NODE_LOCK not in _annotations(node)
    assert _annotations(node)[ann.NODE_HANDSHAKE] == "Reported 2026.01.01 00:00:00"
    pod = _annotations(cluster.get("pod", "gpu-here", world.workloads))
    assert (pod[ann.DEVICES_TO_ALLOCATE], pod[ann.BIND_PHASE]) == (";", ann.BIND_PHASE_SUCCESS)


PLUGIN_REFUSED: list[tuple[str, str, str, Any, str]] = [
    # (id, method, path: {here} {there} {pod:NAME} filled in, body (a list: JSON patch), what the
    # refusal says)
    ("another-node", "PATCH", "/api/v1/nodes/{there}",
     {"metadata": {"annotations": {ann.NODE_HANDSHAKE: "Reported 2026.01.01 00:00:00"}}},
     f"device plugin on node {HERE} may write only its own Node"),
    ("own-node-label", "PATCH", "/api/v1/nodes/{here}", {"metadata": {"labels": {"gpu": "off"}}},
     "may change only the annotations"),
    ("own-node-spec", "PATCH", "/api/v1/nodes/{here}", {"spec": {"unschedulable": True}},
     "may change only the annotations"),
    ("own-node-other-annotation", "PATCH", "/api/v1/nodes/{here}",
     {"metadata": {"annotations": {"example.com/rack": "r2"}}}, "may change only the annotations"),
    ("own-node-annotation-removed", "PATCH", "/api/v1/nodes/{here}",
     {"metadata": {"annotations": {"example.com/rack": None}}}, "may change only the annotations"),
    ("pod-of-another-node", "PATCH", "{pod:gpu-there}", allocate.success_patch(),
     f"device plugin on node {HERE} may write only the pods bound to it"),
    ("pod-image", "PATCH", "{pod:gpu-here}", [{"op": "replace", "path": "/spec/containers/0/image",
                                              "value": "evil:1"}], "may change only the annotations"),
    ("pod-label", "PATCH", "{pod:gpu-here}", {"metadata": {"labels": {"app": "other"}}},
     "may change only the annotations"),
    ("pod-other-annotation", "PATCH", "{pod:gpu-here}",
     {"metadata": {"annotations": {"example.com/team": "x"}}}, "may change only the annotations"),
    ("pod-annotation-removed", "PATCH", "{pod:gpu-here}",
     {"metadata": {"annotations": {"example.com/team": None}}}, "may change only the annotations"),
    ("pod-status", "PATCH", "{pod:gpu-here}/status", {"status": {"phase": "Failed"}}, RBAC),
    ("pod-get", "GET", "{pod:gpu-here}", None, RBAC),
    ("pod-delete", "DELETE", "{pod:gpu-here}", None, RBAC),
    ("pod-create", "POST", "/api/v1/namespaces/{workloads}/pods", _pod("new", "x", HERE), RBAC),
    ("node-get", "GET", "/api/v1/nodes/{here}", None, RBAC),
    ("node-list", "GET", "/api/v1/nodes", None, RBAC),
    ("other-configmap", "GET", "/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt", None, RBAC),
    ("configmap-list", "GET", "/api/v1/namespaces/kube-system/configmaps", None, RBAC),
    ("configmap-write", "PATCH", "/api/v1/namespaces/kube-system/configmaps/volcano-vgpu-device-config",
     {"data": {"x": "y"}}, RBAC),
    ("secrets", "GET", "/api/v1/namespaces/{release}/secrets", None, RBAC),
]


def _fill(world: World, path: str) -> str:
    if path.startswith("{pod:"):
        name, _, rest = path[len("{pod:"):].partition("}")
        return world.pod_path(name) + rest
    return path.format(here=HERE, there=THERE, workloads=world.workloads, release=world.release.namespace)


@pytest.mark.parametrize(("method", "path", "body", "says"), [case[1:] for case in PLUGIN_REFUSED],
                         ids=[case[0] for case in PLUGIN_REFUSED])
async def test_the_plugin_may_not(world: World, method: str, path: str, body: Any, says: str) -> None:
    before = {name: world.cluster.get("pod", name, world.workloads) for name in ("gpu-here", "gpu-there")}
    async with as_token(world.cluster, world.plugin_token) as api:
        status, message = await _call(api, method, _fill(world, path), body,
                                      JSON_PATCH if isinstance(body, list) else MERGE)
    assert status == 403, message
    assert says in message
    for name, pod in before.items():
        now = world.cluster.get("pod", name, world.workloads)
        assert now is not None and pod is not None
        assert now["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"], f"{name} changed"


async def test_a_plugin_token_not_bound_to_a_pod_writes_nothing(world: World) -> None:
    # A long-lived Secret token or one minted by hand carries no node: every write refused.
    async with as_token(world.cluster, world.unbound_plugin_token) as api:
        handshake = {"metadata": {"annotations": {ann.NODE_HANDSHAKE: "x"}}}
        writes = ((f"/api/v1/nodes/{HERE}", handshake), (world.pod_path("gpu-here"), allocate.failed_patch()))
        for path, body in writes:
            status, message = await _call(api, "PATCH", path, body)
            assert status == 403 and UNBOUND in message, message


# ----- the operator -----

async def test_the_operator_recreates_its_configmaps_and_no_other(world: World) -> None:
    cluster, since = world.cluster, time.time()
    # Allowed: the rendered ConfigMap, deleted by hand, is created again (its named watch sees it go).
    cluster.kubectl("delete", "configmap", "volcano-vgpu-device-config", "-n", "kube-system")
    eventually_sync(lambda: cluster.get("configmap", "volcano-vgpu-device-config", "kube-system"),
                    what="device-config created again by the operator")
    created = eventually_sync(lambda: [
        a for a in cluster.audit(world.release.user, since=since)
        if a["verb"] == "create" and a.get("objectRef", {}).get("resource") == "configmaps"],
        what="the operator's create in the audit log")
    assert [(a["objectRef"]["namespace"], a["responseStatus"]["code"]) for a in created] == [
        ("kube-system", 201)]
    # Refused: any other name, in the same namespaces the create is granted in.
    async with as_token(cluster, world.operator_token) as api:
        for namespace in ("kube-system", world.release.namespace):
            other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-rendered"}}
            status, message = await _call(api, "POST", f"/api/v1/namespaces/{namespace}/configmaps", other)
            assert status == 403, message
            assert "may create only the ConfigMaps it renders" in message
            assert f"not {namespace}/not-rendered" in message
    assert cluster.get("configmap", "not-rendered", "kube-system") is None


async def test_the_operator_deletes_only_the_plugins_pods(world: World) -> None:
    cluster, namespace = world.cluster, world.release.namespace
    selector = "app.kubernetes.io/component=device-plugin"
    plugin_pods = eventually_sync(lambda: cluster.items("pods", namespace, selector),
                                  what="the DaemonSet's pods (Pending: no scheduler)")
    async with as_token(cluster, world.operator_token) as api:
        # Refused: a pod of the same namespace that the DaemonSet does not own (the plugin-here
        # pod of this test, a stand-in for anything else living there).
        status, message = await _call(api, "DELETE", f"/api/v1/namespaces/{namespace}/pods/plugin-here")
        assert status == 403 and "may delete only pods of the DaemonSet" in message, message
        # Allowed: what a node-config change does, deleting a plugin pod so its node's plugin restarts.
        victim = plugin_pods[0]["metadata"]["name"]
        status, message = await _call(api, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{victim}")
        assert status == 200, message
    assert cluster.get("pod", "plugin-here", namespace) is not None


OPERATOR_REFUSED: list[tuple[str, str, str, Any]] = [
    ("policy-create", "POST", "/apis/vgpu.io/v1alpha1/vgpupolicies",
     {"apiVersion": "vgpu.io/v1alpha1", "kind": "VGPUPolicy", "metadata": {"name": "other"}, "spec": {}}),
    ("policy-delete", "DELETE", "/apis/vgpu.io/v1alpha1/vgpupolicies/default", None),
    ("pods-cluster-wide", "GET", "/api/v1/pods", None),
    ("pods-elsewhere", "GET", "/api/v1/namespaces/kube-system/pods", None),
    ("configmap-list", "GET", "/api/v1/namespaces/kube-system/configmaps", None),
    ("configmap-other", "GET", "/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt", None),
    ("configmap-other-patch", "PATCH", "/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt",
     {"data": {"x": "y"}}),
    ("daemonset-list", "GET", "/apis/apps/v1/namespaces/{release}/daemonsets", None),
    ("deployment-other", "GET", "/apis/apps/v1/namespaces/{release}/deployments/{operator}", None),
    ("namespaces", "GET", "/api/v1/namespaces", None),
    ("crds", "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", None),
    ("node-patch", "PATCH", "/api/v1/nodes/{here}", {"metadata": {"labels": {"x": "y"}}}),
    ("events-elsewhere", "POST", "/api/v1/namespaces/{release}/events",
     {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "x."},
      "involvedObject": {"kind": "Pod", "name": "x"}}),
    ("secrets", "GET", "/api/v1/namespaces/{release}/secrets", None),
]


@pytest.mark.parametrize(("method", "path", "body"), [case[1:] for case in OPERATOR_REFUSED],
                         ids=[case[0] for case in OPERATOR_REFUSED])
async def test_the_operator_may_not(world: World, method: str, path: str, body: Any) -> None:
    path = path.format(here=HERE, release=world.release.namespace, operator=OPERATOR_SA)
    async with as_token(world.cluster, world.operator_token) as api:
        status, message = await _call(api, method, path, body)
    assert status == 403 and RBAC in message, message
    assert world.cluster.get("vgpupolicy", "default") is not None
