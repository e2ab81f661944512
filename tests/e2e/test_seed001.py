"""Seed 001 on the real API server: the fixture cluster in its broken state (device-config names
`nvidia.com/gpu`, the legacy upstream plugin registers `volcano.sh/vgpu-number`), then the path
an admin takes: doctor names the cause, `vgpuctl import` writes the policy, the operator (under
the chart's ServiceAccount) reconciles it, our device plugin (mock NVML, under the legacy plugin's
own ServiceAccount) registers through the kubelet simulator, which publishes node status to the
real server as a kubelet does; the pod is placed, bound through the Binding subresource, and
Allocate answers with the HAMi-core environment while the plugin marks the real pod's
bind-phase success.

The real Volcano scheduler cannot be built on this machine (the Go module proxy refuses
volcano.sh/volcano), so `vgpuctl.binder`, which follows Volcano's deviceshare code, places the pod.
"""

from __future__ import annotations

import copy
import json
import pathlib
import time
from typing import Any

import aiohttp
import yaml
from vgpu_formats import annotations as ann
from vgpuctl import chain
from vgpuctl.binder import Placement
from vgpuctl.doctor import diagnose
from vgpuctl.facts import ClusterFacts, gather
from vgpuctl.importer import import_policy
from vgpuctl.live import read_cluster

from tests.support.api import Api
from tests.support.waiting import eventually

from .cluster import ROOT, Cluster, service_account_user
from .release import condition, installed

FIXTURES = ROOT / "tests" / "fixtures"
NODE = chain.DEMO_NODE
PLUGIN_SA = ("kube-system", "volcano-device-plugin")  # the legacy plugin's, from the fixture


def _fixture_pod() -> dict[str, Any]:
    pod: dict[str, Any] = yaml.safe_load((FIXTURES / "cluster" / "pods.yaml").read_text())
    return pod


async def _facts(cluster: Cluster) -> ClusterFacts:
    return gather(await read_cluster(cluster.state.kubeconfig))


async def _bind(api: Api, pod: dict[str, Any], placement: Placement) -> None:
    """What Volcano does with a placement: the device annotations, then a Binding."""
    path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"
    status, body = await api.call("PATCH", path, {"metadata": {"annotations": placement.annotations}})
    assert status == 200, body
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"]},
               "target": {"apiVersion": "v1", "kind": "Node", "name": placement.node}}
    status, body = await api.call("POST", f"{path}/binding", binding)
    assert status == 201, body


async def _publish_allocatable(api: Api, agent: chain.NodeAgent) -> None:
    """The kubelet's node status update: what the plugin advertised becomes allocatable."""
    counts = {name: str(n) for name, n in agent.advertised().items()}
    status, body = await api.call("PATCH", f"/api/v1/nodes/{agent.node}/status",
                                  {"status": {"capacity": counts, "allocatable": counts}})
    assert status == 200, body


async def test_seed001_section_3_fixed_by_a_policy_on_the_real_server(crd_installed: Cluster,
                                                                       tmp_path: pathlib.Path) -> None:
    cluster = crd_installed
    since = time.time()
    cluster.kubectl("apply", "-f", str(FIXTURES / "cluster" / "volcano-vgpu-device-plugin.yaml"))
    with installed(cluster, tmp_path, "--set", "devicePlugin.enabled=false",
                   "--set", "policy.create=false") as release:
        scenario = FIXTURES / "scenarios" / "seed001-resource-name-mismatch.yaml"
        cluster.kubectl("replace", "--force", "-f", str(scenario))
        # The seed's failed pod is removed, as doctor advises; ours replaces it below.
        cluster.kubectl("delete", "pod", "test-vgpu-compatible", "-n", "volcano-system", "--wait=false")

        # Before: doctor reads the real cluster and names the cause.
        facts = await _facts(cluster)
        assert "resource-name-mismatch" in {f.code for f in diagnose(facts).findings}

        # The admin imports the running setup as a policy and applies it.
        policy = import_policy(facts).policy
        assert policy["spec"]["resources"]["count"] == "nvidia.com/gpu"
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(policy))
        name = policy["metadata"]["name"]

        def applied() -> bool:
            return condition(cluster.get("vgpupolicy", name), "Applied").get("status") == "True"

        await eventually(applied, timeout=60, what=f"policy {name} applied (operator log: {release.log})")
        daemonset = cluster.get("daemonset", "volcano-device-plugin", "kube-system") or {}
        args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--resource-name=nvidia.com/gpu" in args

        node = cluster.get("node", NODE) or {}
        register = node["metadata"]["annotations"][ann.NODE_REGISTER]
        plugin_kubeconfig = cluster.token_kubeconfig(PLUGIN_SA[1], PLUGIN_SA[0],
                                                     tmp_path / "plugin.kubeconfig")
        async with aiohttp.ClientSession() as session, chain.plugin_agent(
                str(plugin_kubeconfig), NODE, register, tmp_path) as agent:
            api = cluster.api(session)
            assert agent.names == ["nvidia.com/gpu", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"]
            await _publish_allocatable(api, agent)

            # The fixture pod, asking the scheduler's count name, created and placed.
            facts = await _facts(cluster)
            source = gather([*(await read_cluster(cluster.state.kubeconfig)), _fixture_pod()])
            pod = chain.demo_pod(source)
            pod["metadata"]["namespace"] = "default"
            pod.pop("status", None)
            # A bound pod's deletion waits for its kubelet, and there is none: force it.
            force = ("--ignore-not-found", "--grace-period=0", "--force")
            cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", "default", *force)
            status, created = await api.call("POST", "/api/v1/namespaces/default/pods", pod)
            assert status == 201, created
            placement = chain.place(facts, created)
            assert isinstance(placement, Placement), placement
            assert placement.node == NODE
            await _bind(api, copy.deepcopy(created), placement)

            # The kubelet's Allocate: the plugin finds the bound pod on the real server.
            allocated = await chain.allocate(agent, "nvidia.com/gpu", 2)
            envs = allocated["envs"]
            assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m" and envs["CUDA_DEVICE_SM_LIMIT"] == "50"
            await eventually(lambda: (cluster.get("pod", pod["metadata"]["name"], "default") or {})
                             .get("metadata", {}).get("annotations", {}).get(ann.BIND_PHASE) == "success",
                             timeout=30, what="bind-phase success on the real pod")

        cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", "default", *force)
        plugin_user = service_account_user(*PLUGIN_SA)
        refused = [(a["verb"], a["requestURI"], a["responseStatus"]["code"])
                   for a in cluster.audit(plugin_user, since=since)
                   if a["responseStatus"]["code"] in (401, 403, 422)]
        assert refused == [], "the plugin needs no right its ServiceAccount lacks"
