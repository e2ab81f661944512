"""`vgpuctl import`: a VGPUPolicy that describes what the cluster runs today.

Pure: `ClusterFacts` in, a VGPUPolicy manifest (dict) and notes out. Each setting takes the value
the component that uses it actually runs with:

* resource names: the scheduler's device-config copy (what decides which pods are vGPU pods);
* split count, memory factor, core scaling: the device plugin's effective values (a legacy plugin
  runs on its flags, not on the ConfigMap);
* node overrides: one per node-config entry, by node name;
* scheduler and plugin locations, deviceshare arguments: as found.

Where the cluster disagrees with itself (what `vgpuctl doctor` reports), the policy follows the
scheduler's device-config and a note says what applying the policy will change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, cast

from vgpu_formats import device_config as dc
from vgpu_formats import device_fields
from vgpu_operator import versions
from vgpu_operator.api import API_VERSION, DNS_NAME_PATTERN, KIND, NAME_MAX, VGPUPolicy
from vgpu_operator.render import scheduler_conf as sc

from vgpuctl.errors import UsageError
from vgpuctl.facts import ClusterFacts


@dataclass
class Imported:
    policy: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _given(first: dc.DeviceConfig | None, then: dc.DeviceConfig | None) -> dict[str, Any]:
    """The policy's spec data for every key the first device-config copy found sets (the field
    table, vgpu_formats.device_fields, says which key is which field); absent keys are left to
    the policy's defaults, which are this project's plugin's."""
    parsed = first or then
    return device_fields.from_nvidia(parsed.nvidia if parsed is not None and parsed.nvidia is not None
                                     else dc.NvidiaConfig())


def _resources(facts: ClusterFacts, notes: list[str]) -> dict[str, Any]:
    given = _given(facts.scheduler_config.parsed, facts.plugin_config.parsed)
    out: dict[str, Any] = (given.get("resources") or {})
    for key, name_field in device_fields.NAME_FIELDS.items():
        if not out.get(key):
            notes.append(f"device-config has no {name_field.attr}: the policy uses the default "
                         f"{name_field.default} (the scheduler currently sees an empty name)")
            out[key] = name_field.default
    plugin = facts.plugin_names() if facts.plugin.daemonset.found else {}
    for key in device_fields.NAME_FIELDS:
        if key in plugin and plugin[key][0] != out[key]:
            notes.append(f"the device plugin registers {plugin[key][0]} ({plugin[key][1]}) but the scheduler "
                         f"counts {out[key]}: the policy keeps {out[key]}, so applying it changes the plugin")
    return out


def _sizing(facts: ClusterFacts, flag: versions.SizingFlag, fallback: float, notes: list[str]) -> float:
    """What the plugin runs with (`fallback`, the policy's default, without a plugin); a value the
    policy cannot hold (0, or a flag the plugin rejects) becomes `fallback`, with a note."""
    if not facts.plugin.daemonset.found:
        return fallback
    if facts.sizing_hidden(flag):
        notes.append(f"the device plugin runs from a shell script, whose --{flag} cannot be read: the "
                     f"policy sets {versions.SIZING_KEYS[flag]} {fallback:g} (device-config's, or the "
                     "default); check the script")
        return fallback
    found, where = facts.sizing(flag)
    if found.value is not None and found.value > 0:
        return found.value
    runs = "exits on its flag" if found.value is None else f"runs with {versions.SIZING_KEYS[flag]} 0"
    notes.append(f"the device plugin {runs} ({where}): the policy sets {versions.SIZING_KEYS[flag]} "
                 f"{fallback:g}, so applying it changes the plugin")
    return fallback


def _device(facts: ClusterFacts, notes: list[str]) -> dict[str, Any]:
    # The scheduler's copy, as for the names: the policy renders that one (geometries, say, are
    # the scheduler's to read); where the plugin reads another copy that differs, a note.
    spec = _given(facts.scheduler_config.parsed, facts.plugin_config.parsed)
    scheduler_reads = spec.get("device") or {}
    plugin_reads = _given(facts.plugin_config.parsed, facts.scheduler_config.parsed).get("device") or {}
    sizing_keys = {f.policy.rsplit(".", 1)[1] for f in device_fields.SIZING_FIELDS.values()}
    for key in sorted(set(scheduler_reads) | set(plugin_reads)):
        theirs, ours = plugin_reads.get(key), scheduler_reads.get(key)
        if theirs == ours or (key in sizing_keys and None in (theirs, ours)):
            continue
        keeps = "what the plugin runs with" if key in sizing_keys else "the scheduler's"
        notes.append(f"the device plugin reads {facts.plugin_config.place}, whose {key} differs from "
                     f"the scheduler's {facts.scheduler_config.place}: the policy keeps {keeps}")
    # Sizing as the plugin runs with it (a legacy one on its flags, whatever the ConfigMap says).
    for flag, sizing_field in device_fields.SIZING_FIELDS.items():
        given = device_fields.policy_value(spec, sizing_field)
        fallback = (sizing_field.default if given is None else given) or 1
        device_fields.set_policy_value(spec, sizing_field, sizing_field.type(
            _sizing(facts, cast(versions.SizingFlag, flag), fallback, notes)))
    device: dict[str, Any] = spec["device"]
    if not device.get("deviceMemoryScaling"):
        device.pop("deviceMemoryScaling", None)  # 0 is no scaling the policy can hold: its default
    # Absent in the ConfigMap means no geometries for the scheduler: keep it that way.
    device.setdefault("knownMigGeometries", [])
    return device


def _node_overrides(facts: ClusterFacts, notes: list[str]) -> list[dict[str, Any]]:
    overrides: list[dict[str, Any]] = []
    seen: set[str] = set()
    for entry in facts.node_config_parsed.nodeconfig if facts.node_config_parsed else []:
        if entry.name in seen:
            notes.append(f"node-config lists {entry.name} twice: the plugin applies the first, "
                         f"so does the policy")
            continue
        seen.add(entry.name)
        override: dict[str, Any] = {"nodeNames": [entry.name]}
        for key, value in (("operatingMode", entry.operatingmode),
                           ("deviceSplitCount", entry.devicesplitcount or None),
                           ("deviceMemoryScaling", entry.devicememoryscaling),
                           ("deviceCoreScaling", entry.devicecorescaling),
                           ("migStrategy", entry.migstrategy)):
            if value is not None:
                override[key] = value
        if entry.filterdevices is not None:
            override["filterDevices"] = {"uuid": list(entry.filterdevices.uuid),
                                         "index": list(entry.filterdevices.index)}
        if len(override) == 1:
            notes.append(f"node-config entry {entry.name} sets nothing: left out")
            continue
        overrides.append(override)
    return overrides


def _scheduler(facts: ClusterFacts, notes: list[str]) -> dict[str, Any]:
    s = facts.scheduler
    args = s.deviceshare or {}
    # As the scheduler reads it: Volcano 1.15+ takes a quoted "true" (unknown version: so taken).
    node_lock = sc.reads_true(args, sc.NODE_LOCK, s.version, if_unknown=True)
    if isinstance(args.get(sc.NODE_LOCK), str):
        notes.append(f"{sc.NODE_LOCK} is the string {args[sc.NODE_LOCK]!r} (Volcano before "
                     f"1.15 reads it as off): the policy holds {str(node_lock).lower()} and renders a bool")
    out: dict[str, Any] = {
        "namespace": s.conf.namespace,
        "configMap": s.conf.name,
        "deployment": s.deployment.name if s.deployment else "volcano-scheduler",
        "schedulePolicy": s.schedule_policy if s.schedule_policy in ("binpack", "spread") else "unset",
        "scheduleWeight": s.schedule_weight,
        "nodeLockEnable": node_lock,
    }
    rules = args.get(sc.EXCLUSIVE_RULES)
    if isinstance(rules, list):
        out["gpuExclusiveRules"] = [{str(k): str(v) for k, v in r.items()}
                                    for r in rules if isinstance(r, dict)]
    return out


def _namespaces_named(facts: ClusterFacts) -> None:
    """The policy names the namespace of each object it targets: one read from a manifest
    without `metadata.namespace` (a chart's templated output) cannot be guessed."""
    found = [(facts.plugin.daemonset, "the device plugin's DaemonSet"),
             (facts.scheduler.conf, "the scheduler's conf ConfigMap"),
             (facts.scheduler_config.place, "the scheduler's device-config ConfigMap"),
             (facts.node_config, "the node-config ConfigMap")]
    for place, what in found:
        if place.found and not place.namespace:
            raise UsageError(f"{what}, {place.kind} {place.name}, has no metadata.namespace in the "
                             "manifests: add the namespace it runs in (`helm template -n NS` "
                             "leaves it out), or read the cluster itself")


def import_policy(facts: ClusterFacts, name: str = "default") -> Imported:
    """The policy, validated against the API model (so `kubectl apply` accepts it). Raises
    UsageError for a name the API server would refuse or a target without a namespace."""
    if not re.match(DNS_NAME_PATTERN, name) or len(name) > NAME_MAX:
        raise UsageError(f"--name {name!r}: a VGPUPolicy's name must be a DNS-1123 subdomain "
                         "(lower-case letters, digits, '-' and '.', starting and ending with a letter "
                         "or digit, at most 253 characters)")
    _namespaces_named(facts)
    notes: list[str] = []
    plugin = facts.plugin
    spec: dict[str, Any] = {
        "resources": _resources(facts, notes),
        "device": _device(facts, notes),
        "nodeOverrides": _node_overrides(facts, notes),
        "scheduler": _scheduler(facts, notes),
        "devicePlugin": {
            "namespace": plugin.daemonset.namespace,
            "daemonSet": plugin.daemonset.name,
            "container": plugin.container,
        },
        "targets": {
            "deviceConfig": {"namespace": facts.scheduler_config.place.namespace,
                             "name": facts.scheduler_config.place.name},
            "nodeConfig": {"namespace": plugin.daemonset.namespace, "name": facts.node_config.name},
        },
    }
    if facts.node_config.found and facts.node_config.namespace != plugin.daemonset.namespace:
        notes.append(f"{facts.node_config} is not in the plugin's namespace {plugin.daemonset.namespace}, "
                     f"so the plugin cannot mount it; the policy renders it beside the plugin")
    if not facts.scheduler.vgpu_enable:
        notes.append("deviceshare.VGPUEnable is off today: applying the policy turns vGPU scheduling on")
    manifest = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}
    policy = VGPUPolicy.from_object(manifest)  # raises if we built something the API rejects
    return Imported(policy={**manifest, "spec": policy.spec_dict()}, notes=notes)
