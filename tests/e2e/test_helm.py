"""The chart's default install on a real server: it converges, `kubectl get` shows it, every
Event lands under the chart's RBAC and no request is refused, drift is repaired."""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Iterator

import pytest
import yaml
from vgpu_deviceplugin import main as plugin_main
from vgpu_formats import annotations as ann
from vgpuctl import chain

from tests.support.waiting import eventually, eventually_sync

from .cluster import Cluster, service_account_user
from .release import CHART, PLUGIN_SA, SCHEDULER_NS, Release, condition, installed

PLUGIN = PLUGIN_SA  # the chart's plugin DaemonSet and its ServiceAccount share the name
NODE = chain.DEMO_NODE


@pytest.fixture(scope="module")
def default_install(crd_installed: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    with installed(crd_installed, tmp_path_factory.mktemp("default")) as release:
        release.ready()
        yield release


def test_default_values_converge_to_ready(default_install: Release) -> None:
    policy = default_install.ready()
    for type_ in ("Valid", "Applied", "InSync", "NodesReady"):
        assert condition(policy, type_).get("status") == "True", type_
    cluster = default_install.cluster
    node_config = cluster.get("configmap", "volcano-vgpu-node-config", default_install.namespace)
    assert node_config is not None, "node-config is rendered beside the chart's device plugin"
    device_config = cluster.data("volcano-vgpu-device-config", "kube-system", "device-config.yaml")
    assert "resourceCountName" in device_config
    conf = yaml.safe_load(cluster.data("volcano-scheduler-configmap", SCHEDULER_NS, "volcano-scheduler.conf"))
    plugins = [p["name"] for tier in conf["tiers"] for p in tier["plugins"]]
    assert "deviceshare" in plugins


def test_kubectl_get_shows_the_columns_filled(default_install: Release) -> None:
    default_install.ready()
    table = default_install.cluster.kubectl("get", "vgpupolicy", "default").stdout.splitlines()
    assert table[0].split() == ["NAME", "READY", "DRIFT", "NODES", "GPUS", "VGPUS", "AGE"]
    name, ready, drift, nodes, gpus, vgpus, _ = table[1].split()
    assert (name, ready, drift, nodes, gpus, vgpus) == ("default", "True", "0", "2/2", "16", "160")


def test_every_event_lands_and_no_request_is_refused(default_install: Release) -> None:
    cluster = default_install.cluster
    default_install.ready()
    events = eventually_sync(lambda: [
        e for e in cluster.items("events", "default")
        if e["involvedObject"].get("kind") == "VGPUPolicy" and e["involvedObject"].get("name") == "default"],
        what="an Event about the VGPUPolicy in namespace default")
    assert {e["reason"] for e in events} >= {"Applied"}
    # The audit log is written in batches: wait until it holds the Events' creation.
    audited = eventually_sync(lambda: [
        a for a in cluster.audit(default_install.user, since=default_install.started)
        if a.get("objectRef", {}).get("resource") == "events" and a["verb"] == "create"],
        what="the operator's Event creation in the audit log")
    assert all(a["responseStatus"]["code"] == 201 for a in audited), audited
    refused = [(a["verb"], a["requestURI"], a["responseStatus"]["code"])
               for a in cluster.audit(default_install.user, since=default_install.started)
               if a["responseStatus"]["code"] in (401, 403, 422)]
    assert refused == []


def test_a_hand_edit_is_repaired(default_install: Release) -> None:
    cluster = default_install.cluster
    default_install.ready()
    cluster.kubectl("patch", "configmap", "volcano-vgpu-device-config", "-n", "kube-system", "--type=merge",
                    "-p", json.dumps({"data": {"device-config.yaml": "nvidia: {}\n"}}))
    eventually_sync(lambda: "resourceCountName" in cluster.data("volcano-vgpu-device-config", "kube-system",
                                                                "device-config.yaml"),
                    what="device-config restored")




async def test_the_charts_plugin_runs_under_its_own_service_account(default_install: Release,
                                                                   tmp_path: pathlib.Path) -> None:
    # Our device plugin with the installed DaemonSet's own arguments and a token of the chart's
    # plugin ServiceAccount: it reads both ConfigMaps, registers, annotates its node, follows a
    # node-config change, and the server refuses none of its requests.
    cluster, namespace = default_install.cluster, default_install.namespace
    default_install.ready()
    daemonset = cluster.get("daemonset", PLUGIN, namespace) or {}
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    container = next(c for c in containers if c["name"] == "device-plugin")
    args = [a.replace("$(NODE_NAME)", NODE) for a in container["args"]]
    flags = plugin_main.flags_from(plugin_main.parser().parse_args(args))
    where = {k: getattr(flags, k) for k in ("device_config_name", "device_config_namespace",
                                            "node_config_name", "node_config_namespace")}
    assert where["node_config_namespace"] == namespace
    # The kubelet's token is bound to the plugin's pod on its node: stand one in, bound to NODE
    # (the DaemonSet's own pods stay Pending here, with no node, as there is no scheduler).
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plugin-on-node", "namespace": namespace},
           "spec": {"nodeName": NODE, "serviceAccountName": PLUGIN,
                    "containers": [{"name": "device-plugin", "image": container["image"]}]}}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    kubeconfig = cluster.token_kubeconfig(PLUGIN, namespace, tmp_path / "plugin.kubeconfig",
                                          bound_pod="plugin-on-node")
    register = (cluster.get("node", NODE) or {})["metadata"]["annotations"][ann.NODE_REGISTER]
    since = time.time()
    async with chain.plugin_agent(str(kubeconfig), NODE, register, tmp_path, **where) as agent:
        assert agent.names == ["volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"]
        before = len(agent.sim.registrations)
        cluster.kubectl("patch", "vgpupolicy", "default", "--type=merge", "-p", json.dumps(
            {"spec": {"nodeOverrides": [{"nodeNames": [NODE], "deviceSplitCount": 4}]}}))
        await eventually(lambda: len(agent.sim.registrations) >= before + 3 and
                         len(agent.sim.devices.get("volcano.sh/vgpu-number", {})) == 8 * 4,
                         timeout=60, what="the plugin re-registered with the node's new split")
    user = service_account_user(namespace, PLUGIN)
    audited = cluster.audit(user, since=since)
    assert audited, "the plugin's requests are in the audit log"
    assert [(a["verb"], a["requestURI"], a["responseStatus"]["code"]) for a in audited
            if a["responseStatus"]["code"] in (401, 403, 422)] == []


def test_the_longest_names_the_chart_takes_are_accepted_by_a_real_server(crd_installed: Cluster) -> None:
    """Service names are DNS labels of at most 63 characters; the chart names its objects from
    the release name (or fullnameOverride), which helm lets run to 53 (63 with the override)."""
    namespace = "vgpu-e2e-longest-names"
    crd_installed.ensure_namespace(namespace)
    crd_installed.ensure_namespace(SCHEDULER_NS)
    try:
        for release, values in (("gpu-platform-vgpu-operator-production-eu-west", []),
                                ("x", ["--set", "fullnameOverride=" + "f" * 63])):
            manifest = crd_installed.helm("template", release, str(CHART), "-n", namespace, *values).stdout
            applied = crd_installed.kubectl("apply", "--dry-run=server", "-f", "-",
                                            stdin=manifest, check=False)
            assert applied.returncode == 0, applied.stderr
            assert "-device-plugin-monitor" in applied.stdout
    finally:
        crd_installed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
