"""The operator Deployment and the device plugin DaemonSet as rendered: what they run, with which
arguments (parsed by the real entry points), on which nodes, with which privileges and paths."""

from __future__ import annotations

import logging
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml
from vgpu_deviceplugin import config
from vgpu_deviceplugin import main as plugin_main
from vgpu_deviceplugin.monitor import main as monitor_main
from vgpu_operator import settings

from tests.charts import chart
from tests.charts.conftest import Renders

Obj = dict[str, Any]
HOST_PATHS = {"/usr/local/vgpu", "/tmp/vgpu/containers", "/var/lib/kubelet/device-plugins"}


def pod_spec(objs: list[Obj], kind: str) -> Obj:
    spec: Obj = chart.one(objs, kind)["spec"]["template"]["spec"]
    return spec


def container(spec: Obj, name: str) -> Obj:
    return next(c for c in spec["containers"] if c["name"] == name)


def service_named(objs: list[Obj], suffix: str) -> Obj:
    return next(s for s in chart.of_kind(objs, "Service") if s["metadata"]["name"].endswith(suffix))


def expand_env(args: list[str], **env: str) -> list[str]:
    """Substitute $(VAR) the way the kubelet does."""
    out = []
    for arg in args:
        for key, value in env.items():
            arg = arg.replace(f"$({key})", value)
        out.append(arg)
    return out


def watched_namespaces(objs: list[Obj]) -> set[str]:
    """Namespaces where the operator's Role lets kopf list ConfigMaps."""
    return {r["metadata"]["namespace"] for r in chart.of_kind(objs, "Role")
            if r["metadata"]["name"] == "vgpu-vgpu-operator"
            and any("configmaps" in rule["resources"] and "list" in rule["verbs"] for rule in r["rules"])}


# ---- operator ---------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["default", "ha", "adopt", "full"])
def test_operator_watches_exactly_where_it_is_granted(renders: Renders, profile: str) -> None:
    objs = renders(profile)
    args = container(pod_spec(objs, "Deployment"), "operator")["args"]
    parsed = settings.parse_args(args)
    assert set(parsed.namespaces) == watched_namespaces(objs)
    assert len(parsed.namespaces) == len(set(parsed.namespaces))
    assert parsed.liveness_port == 8080 and parsed.metrics_port == 9090


def test_operator_standalone_by_default(default_objects: list[Obj]) -> None:
    deployment = chart.one(default_objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    args = container(pod_spec(default_objects, "Deployment"), "operator")["args"]
    assert "--standalone" in args and not any(a.startswith("--peering") for a in args)
    assert sorted(a for a in args if a.startswith("--namespace")) == [
        "--namespace=kube-system", f"--namespace={chart.NAMESPACE}", "--namespace=volcano-system"]
    assert not chart.of_kind(default_objects, "KopfPeering")


def test_operator_ha_peers_in_every_watched_namespace(renders: Renders) -> None:
    objs = renders("ha")
    assert chart.one(objs, "Deployment")["spec"]["replicas"] == 2
    args = container(pod_spec(objs, "Deployment"), "operator")["args"]
    assert "--peering=vgpu-operator" in args and "--standalone" not in args
    peerings = {(p["metadata"]["namespace"], p["metadata"]["name"])
                for p in chart.of_kind(objs, "KopfPeering")}
    assert peerings == {(ns, "vgpu-operator") for ns in watched_namespaces(objs)}
    assert chart.one(objs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    anti = pod_spec(objs, "Deployment")["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"]
    env = {e["name"]: e for e in container(pod_spec(objs, "Deployment"), "operator")["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_operator_probes_hit_kopf_health_endpoint(default_objects: list[Obj]) -> None:
    operator = container(pod_spec(default_objects, "Deployment"), "operator")
    ports = {p["name"]: p["containerPort"] for p in operator["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        get = operator[probe]["httpGet"]
        assert get["path"] == "/healthz" and ports[get["port"]] == 8080
    service = service_named(default_objects, "-metrics")
    assert [ports[p["targetPort"]] for p in service["spec"]["ports"]] == [9090]


def test_operator_runs_locked_down(default_objects: list[Obj]) -> None:
    spec = pod_spec(default_objects, "Deployment")
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    sc = container(spec, "operator")["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in sc


# What the chart README gives for platforms that assign the uid (OpenShift's restricted SCC).
PLATFORM_UID = {"operator": {"podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None}}}


def test_the_readme_gives_those_values() -> None:
    section = (chart.CHART / "README.md").read_text().split("## OpenShift", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block is not None and yaml.safe_load(block.group(1)) == PLATFORM_UID


def test_operator_security_contexts_come_from_values(default_objects: list[Obj]) -> None:
    # The defaults render exactly as before they became values.
    spec = pod_spec(default_objects, "Deployment")
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                       "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
    assert container(spec, "operator")["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def test_a_platform_that_picks_the_uid_gets_none_of_ours() -> None:
    spec = pod_spec(chart.render(PLATFORM_UID), "Deployment")
    # null drops a key (helm merges values, so {} would keep the defaults); the rest stays.
    assert spec["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert "runAsUser" not in container(spec, "operator")["securityContext"]
    assert pod_spec(chart.render({"operator": {"podSecurityContext": {}}}), "Deployment")["securityContext"] \
        == pod_spec(chart.render(), "Deployment")["securityContext"]


def test_security_contexts_can_be_extended_or_removed() -> None:
    objs = chart.render({"operator": {"podSecurityContext": None, "securityContext": {"runAsUser": 2000}},
                         "devicePlugin": {"podSecurityContext": {"seLinuxOptions": {"type": "spc_t"}},
                                          "securityContext": {"readOnlyRootFilesystem": None}}})
    operator = pod_spec(objs, "Deployment")
    assert "securityContext" not in operator
    assert container(operator, "operator")["securityContext"]["runAsUser"] == 2000
    plugin = pod_spec(objs, "DaemonSet")
    assert plugin["securityContext"] == {"seLinuxOptions": {"type": "spc_t"},
                                         "seccompProfile": {"type": "RuntimeDefault"}}
    sc = container(plugin, "device-plugin")["securityContext"]
    assert "readOnlyRootFilesystem" not in sc and sc["capabilities"] == {"drop": ["ALL"]}
    for obj in objs:
        if obj["kind"] in ("Deployment", "DaemonSet"):
            kubernetes_validate.validate(obj, "1.30", strict=True)


@pytest.mark.parametrize("profile", list(chart.PROFILES))
def test_every_container_has_requests_and_limits(renders: Renders, profile: str) -> None:
    for kind in ("Deployment", "DaemonSet"):
        for obj in chart.of_kind(renders(profile), kind):
            spec = obj["spec"]["template"]["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                assert set(c["resources"]["requests"]) == {"cpu", "memory"}, c["name"]
                assert set(c["resources"]["limits"]) == {"cpu", "memory"}, c["name"]


# ---- device plugin ----------------------------------------------------------------------------


def test_plugin_runs_on_vgpu_nodes_as_in_the_guides(default_objects: list[Obj]) -> None:
    spec = pod_spec(default_objects, "DaemonSet")
    assert spec["nodeSelector"] == {"volcano.sh/vgpu.enabled": "true"}
    keys = {t["key"] for t in spec["tolerations"]}
    assert {"volcano.sh/vgpu", "nvidia.com/gpu", "CriticalAddonsOnly"} <= keys
    assert spec["priorityClassName"] == "system-node-critical"
    assert not spec.get("hostNetwork") and not spec.get("hostPID")


@pytest.mark.parametrize("profile", ["default", "mock-gpus", "full"])
def test_plugin_arguments_are_accepted_by_the_plugin(renders: Renders, profile: str) -> None:
    plugin = container(pod_spec(renders(profile), "DaemonSet"), "device-plugin")
    assert plugin["command"] == ["deviceplugin"]
    args = plugin_main.parser().parse_args(expand_env(plugin["args"], NODE_NAME="gpu-node-1"))
    assert args.node_name == "gpu-node-1"
    assert args.device_config_name == "volcano-vgpu-device-config"
    assert args.device_config_namespace == "kube-system"
    # node-config beside the plugin (its DaemonSet's namespace), as the CRD rule requires
    assert args.node_config_name == "volcano-vgpu-node-config"
    assert args.node_config_namespace == chart.NAMESPACE
    assert args.hook_path == "/usr/local/vgpu"
    assert args.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    assert args.mock_gpus == chart.PROFILES[profile].get("devicePlugin", {}).get("mockGpus")


def test_the_cuda_disable_control_opt_out_is_off_unless_the_admin_turns_it_on() -> None:
    # Without libvgpu.so a container has no cap: a tenant's env line must not decide that.
    def parsed(values: dict[str, Any]) -> Any:
        args = container(pod_spec(chart.render(values), "DaemonSet"), "device-plugin")["args"]
        return plugin_main.flags_from(plugin_main.parser().parse_args(expand_env(args, NODE_NAME="n")))

    assert parsed({}).allow_disable_control is False
    assert parsed({"devicePlugin": {"allowDisableControl": True}}).allow_disable_control is True


def test_plugin_paths_match_the_plugin_defaults() -> None:
    # The plugin hands these to the kubelet as host paths: the chart must mount them 1:1.
    assert {config.DEFAULT_HOOK_PATH, f"{config.DEFAULT_CACHE_ROOT}/containers",
            config.DEFAULT_DEVICE_PLUGIN_DIR} == HOST_PATHS


def test_the_cache_root_moves_every_path_that_names_it() -> None:
    # A size-limited tmpfs mounted on the nodes caps what containers' region files can hold.
    spec = pod_spec(chart.render({"devicePlugin": {"cacheRoot": "/run/vgpu"}}), "DaemonSet")
    host = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert "/run/vgpu/containers" in host and not any(p.startswith("/tmp") for p in host)
    plugin_args = expand_env(container(spec, "device-plugin")["args"], NODE_NAME="n")
    plugin = plugin_main.parser().parse_args(plugin_args)
    monitor = monitor_main.parser().parse_args(expand_env(container(spec, "monitor")["args"], NODE_NAME="n"))
    assert (plugin.cache_root, monitor.containers_dir) == ("/run/vgpu", "/run/vgpu/containers")


def test_host_paths_are_mounted_at_the_same_path(default_objects: list[Obj]) -> None:
    spec = pod_spec(default_objects, "DaemonSet")
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert set(host.values()) == HOST_PATHS
    for c in spec["initContainers"] + spec["containers"]:
        for mount in c["volumeMounts"]:
            if mount["name"] in host:
                assert mount["mountPath"] == host[mount["name"]], (c["name"], mount)
    plugin = container(spec, "device-plugin")
    hook = next(m for m in plugin["volumeMounts"] if m["mountPath"] == "/usr/local/vgpu")
    assert hook["readOnly"] is True, "only install-hook writes the host's hook directory"


def test_install_hook_replaces_files_atomically(default_objects: list[Obj]) -> None:
    (init,) = pod_spec(default_objects, "DaemonSet")["initContainers"]
    script = " ".join(init["args"])
    assert "libvgpu.so ld.so.preload" in script and "/k8s-vgpu/lib/" in script
    assert "mv -f" in script, "cp over a mapped library corrupts running workloads; rename instead"
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False


def test_plugin_is_unprivileged_unless_asked(renders: Renders) -> None:
    plugin = container(pod_spec(renders("default"), "DaemonSet"), "device-plugin")
    sc = plugin["securityContext"]
    assert not sc.get("privileged") and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False
    env = {e["name"]: e.get("value") for e in plugin["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"

    spec = pod_spec(renders("privileged-plugin"), "DaemonSet")
    assert container(spec, "device-plugin")["securityContext"] == {"privileged": True, "runAsUser": 0}
    assert spec["runtimeClassName"] == "nvidia"


@pytest.mark.parametrize("profile", ["default", "privileged-plugin"])
def test_monitor_is_never_privileged(renders: Renders, profile: str) -> None:
    monitor = container(pod_spec(renders(profile), "DaemonSet"), "monitor")
    sc = monitor["securityContext"]
    assert not sc.get("privileged") and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False
    # Not root, and the regions read-only: it only reads the plugin's files (0755/0666/0644).
    assert sc["runAsUser"] == 10001 and sc["runAsNonRoot"] is True
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in monitor["volumeMounts"]}
    assert mounts == {"/tmp/vgpu/containers": True, "/tmp": False}
    assert monitor["command"] == ["vgpu-monitor"]
    assert expand_env(monitor["args"], NODE_NAME="n1") == [
        "--port=9394", "--containers-dir=/tmp/vgpu/containers", "--node-name=n1",
        "--log-level=info", "--log-format=text"]


def test_logging_values_reach_every_daemon_and_its_parser() -> None:
    # One setting for the whole project: each daemon gets it, and each one's own parser takes it.
    objs = chart.render({"logging": {"level": "warning", "format": "json"}})
    spec = pod_spec(objs, "DaemonSet")
    operator_args = container(pod_spec(objs, "Deployment"), "operator")["args"]
    operator = settings.parse_args(operator_args)
    assert (operator.log_level, operator.log_format) == (logging.WARNING, "json")
    for name, parser in (("device-plugin", plugin_main.parser()), ("monitor", monitor_main.parser())):
        parsed = parser.parse_args(expand_env(container(spec, name)["args"], NODE_NAME="n"))
        assert (parsed.log_level, parsed.log_format) == ("warning", "json"), name


def test_monitor_can_be_left_out(renders: Renders) -> None:
    objs = renders("no-monitor")
    assert [c["name"] for c in pod_spec(objs, "DaemonSet")["containers"]] == ["device-plugin"]
    assert not [s for s in chart.of_kind(objs, "Service") if s["metadata"]["name"].endswith("-monitor")]


def test_monitor_service_scrapes_every_node(default_objects: list[Obj]) -> None:
    service = service_named(default_objects, "-monitor")
    assert service["spec"]["clusterIP"] == "None"
    daemonset = chart.one(default_objects, "DaemonSet")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_monitor_arguments_are_accepted_by_the_monitor(default_objects: list[Obj]) -> None:
    monitor = container(pod_spec(default_objects, "DaemonSet"), "monitor")
    args = monitor_main.parser().parse_args(expand_env(monitor["args"], NODE_NAME="gpu-node-1"))
    assert args.port == 9394
    assert args.containers_dir == "/tmp/vgpu/containers"
    assert args.node_name == "gpu-node-1"


@pytest.mark.parametrize("profile", ["default", "adopt"])
def test_events_of_cluster_scoped_objects_land_where_allowed(renders: Renders, profile: str) -> None:
    # The API server takes an Event about a cluster-scoped object only in `default` (422 elsewhere);
    # tests/e2e shows it landing under the chart's ServiceAccount.
    role = next(r for r in chart.of_kind(renders(profile), "Role")
                if (r["metadata"]["namespace"], r["metadata"]["name"]) == ("default", "vgpu-vgpu-operator"))
    assert any(rule["resources"] == ["events"] and "create" in rule["verbs"] for rule in role["rules"])
