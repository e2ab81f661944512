"""Render the device plugin DaemonSet: args right for its generation, and a config hash.

* legacy (<= v1.11): sizing and resource names come from flags only, so `LEGACY_FLAGS` are set to
  the policy's values (replaced in place, `--flag=value` or `--flag value` form kept; missing ones
  appended as `--flag=value`).
* current (v1.12+): `--resource-*` flags make it exit and explicit sizing flags override the
  ConfigMap, so all of `LEGACY_FLAGS` are removed; sizing comes from device-config.
* builtin (ours): the same removal; our plugin watches the ConfigMaps itself. Where it reads
  them (`--device-config-*`, `--node-config-*`) is set to the policy's targets, so it reads exactly what the
  scheduler reads; a flag that would only repeat the plugin's own default is not added.

Every other arg keeps its value and order. `vgpu.io/plugin-config-hash` on the pod template covers
what the plugin reads only at start (args, plus device-config content for legacy/current; builtin
watches the ConfigMap). Env, volumes, other containers and other annotations are untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from vgpu_formats import device_config as dc_fmt
from vgpu_formats import node_config as nc_fmt

from vgpu_operator.api import VGPUPolicySpec
from vgpu_operator.observed import Observed
from vgpu_operator.render import device_config
from vgpu_operator.render.inputs import (
    InputError,
    Problem,
    check_workload,
    describe,
    find_container,
    short_hash,
)
from vgpu_operator.render.target import TargetRender, failed_target, missing_target, workload_target
from vgpu_operator.versions import Generation, plugin_generation

ANNOTATION = "vgpu.io/plugin-config-hash"
LEGACY_FLAGS = ("resource-name", "resource-memory-name", "resource-core-name", "device-split-count",
                "gpu-memory-factor", "device-cores-scaling")
# What the legacy binary uses for an absent flag (VVDP v1.11.0 cmd/vgpu/main.go, util.GlobalFlagSet).
LEGACY_DEFAULTS = {"resource-name": "volcano.sh/vgpu-number",
                   "resource-memory-name": "volcano.sh/vgpu-memory",
                   "resource-core-name": "volcano.sh/vgpu-cores",
                   "device-split-count": "2", "gpu-memory-factor": "1", "device-cores-scaling": "1"}


def builtin_defaults(spec: VGPUPolicySpec) -> dict[str, str]:
    """What our plugin reads without a location flag. Without --device-config-namespace it tries
    kube-system first; without --node-config-namespace it looks where device-config was found."""
    return {"device-config-name": dc_fmt.CONFIGMAP_NAME,
            "device-config-namespace": dc_fmt.PLUGIN_NAMESPACES[0],
            "node-config-name": nc_fmt.CONFIGMAP_NAME,
            "node-config-namespace": spec.targets.device_config.namespace}


def _number(value: float) -> str:
    return f"{value:g}"


def desired_flags(spec: VGPUPolicySpec, generation: Generation) -> dict[str, str | None]:
    """flag name (no dashes) -> value; None removes the flag."""
    if generation == "builtin":
        targets = spec.targets
        return {**dict.fromkeys(LEGACY_FLAGS),
                "device-config-name": targets.device_config.name,
                "device-config-namespace": targets.device_config.namespace,
                "node-config-name": targets.node_config.name,
                "node-config-namespace": targets.node_config.namespace}
    if generation != "legacy":
        return dict.fromkeys(LEGACY_FLAGS)
    return {
        "resource-name": spec.resources.count,
        "resource-memory-name": spec.resources.memory,
        "resource-core-name": spec.resources.cores,
        "device-split-count": str(spec.device.device_split_count),
        "gpu-memory-factor": str(spec.device.gpu_memory_factor),
        "device-cores-scaling": _number(spec.device.device_core_scaling),
    }


def edit_args(args: list[str], flags: dict[str, str | None],
              defaults: dict[str, str] | None = None) -> list[str]:
    """`args` with `flags` set or removed; other args untouched, in order; a repeated flag of ours
    keeps its first position only. A missing flag whose value equals its entry in `defaults` is
    not added (the binary already uses that value)."""
    out: list[str] = []
    seen: set[str] = set()
    index = 0
    while index < len(args):
        token = args[index]
        index += 1
        dashes = len(token) - len(token.lstrip("-"))
        name, eq, _ = token[dashes:].partition("=")
        if not dashes or name not in flags:
            out.append(token)
            continue
        separate = not eq and index < len(args) and not args[index].startswith("-")
        if separate:
            index += 1  # the value token goes with its flag
        value = flags[name]
        if name in seen or value is None:
            continue
        seen.add(name)
        out += [token, value] if separate else [f"{token[:dashes]}{name}={value}"]
    defaults = defaults or {}
    out += [f"--{name}={value}" for name, value in flags.items()
            if value is not None and name not in seen and defaults.get(name) != value]
    return out


def render_device_plugin_target(spec: VGPUPolicySpec, observed: Observed,
                                running: Mapping[str, str | None] | None = None) -> TargetRender:
    plugin = spec.device_plugin
    where = describe("DaemonSet", plugin.namespace, plugin.daemon_set)
    live = observed.device_plugin
    if live is None:
        return missing_target("DaemonSet", plugin.namespace, plugin.daemon_set, "spec.devicePlugin.daemonSet",
                              "DevicePluginNotFound",
                              "install the device plugin or set spec.devicePlugin.namespace/daemonSet")
    try:
        check_workload(live, where, "spec.devicePlugin.daemonSet")
        index, container = find_container(live, plugin.container, where)
    except InputError as err:
        return failed_target("DaemonSet", plugin.namespace, plugin.daemon_set, live, err.problem)
    found = plugin_generation(plugin.generation, live, plugin.container)
    if found.generation is None:
        return failed_target("DaemonSet", plugin.namespace, plugin.daemon_set, live, Problem(
            "spec.devicePlugin.generation", "PluginGenerationUnknown",
            f"{found.detail}; set spec.devicePlugin.generation to legacy (<= v1.11), current (v1.12+) "
            "or builtin", object=where))
    live_args = [str(a) for a in container.get("args") or []]
    defaults = builtin_defaults(spec) if found.generation == "builtin" else LEGACY_DEFAULTS
    args = edit_args(live_args, desired_flags(spec, found.generation), defaults)
    containers = copy.deepcopy(live["spec"]["template"]["spec"]["containers"])
    if args != live_args:
        containers[index]["args"] = args
    wanted: dict[str, Any] = {"args": args}
    inputs_changed = args != live_args
    if found.generation != "builtin":
        wanted["deviceConfig"] = device_config.owned_section(spec)
        inputs_changed |= (device_config.plugin_reads(device_config.live_config(observed))
                           != device_config.plugin_reads(device_config.desired_config(spec)))
    return workload_target("DaemonSet", live, ANNOTATION, short_hash(wanted), inputs_changed, containers,
                           running)
