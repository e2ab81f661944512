"""Rules that need the cluster: `validate(policy, observed) -> list[Problem]`.

The schema and CEL catch what a policy alone gets wrong; these rules combine the policy with what
the operator observed (Volcano version, plugin generation, the live scheduler conf, nodes).
Errors block every write; warnings are reported. Each Problem names the policy field, the object
concerned and the fix. Facts behind the rules: docs/upstream.md §1-§4.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from vgpu_formats import annotations as ann
from vgpu_formats import device_config as dc_fmt
from vgpu_formats import device_fields
from vgpu_formats import list_and_watch as lw
from vgpu_formats.errors import FormatError

from vgpu_operator import rules, versions
from vgpu_operator.api import VGPUPolicy, VGPUPolicySpec
from vgpu_operator.observed import Observed
from vgpu_operator.registry import RenderResult, render_targets
from vgpu_operator.render import device_config, device_plugin, scheduler_conf
from vgpu_operator.render.inputs import (
    InputError,
    Problem,
    Severity,
    check_workload,
    describe,
    find_container,
    find_plugin,
    pod_template,
    tier_plugins,
    updated_on_delete,
)
from vgpu_operator.render.selectors import node_name, override_nodes
from vgpu_operator.render.target import TargetRender
from vgpu_operator.view import ClusterView, view_of

__all__ = ["Problem", "errors", "validate"]

DEFAULT_NAMES = versions.DEFAULT_NAMES

Rule = Callable[[VGPUPolicySpec, ClusterView], Iterable[Problem]]


def validate(policy: VGPUPolicy | VGPUPolicySpec, observed: Observed,
             rendered: RenderResult | None = None) -> list[Problem]:
    """Every problem, errors first, in rule order. `rendered`: the caller's `render_all` of the
    same policy and observed state, whose target errors are then used instead of rendering again."""
    view = view_of(observed, policy)
    targets = (rendered or render_targets(view)).targets
    found = [*edited_object_errors(targets), *(p for rule in RULES for p in rule(view.spec, view))]
    return sorted(found, key=lambda p: p.severity != "error")


def errors(problems: Iterable[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


# A condition carries errors and warnings only: no rule the operator reports is `info`.
_SEVERITIES: dict[str, Severity] = {"error": "error", "warning": "warning"}


def _problem(rule: rules.Rule, field: str, message: str, where: str = "", case: str = "") -> Problem:
    """A Problem of a catalogue rule: its reason, its severity (in `case`)."""
    return Problem(field, rule.reason, message, _SEVERITIES[rule.at(case)], where)


# --- versions and resource names -----------------------------------------------------------------


def _custom_names(spec: VGPUPolicySpec) -> dict[str, str]:
    """Resource names (field -> value) that differ from upstream's hard-coded ones."""
    return {key: value for key, value in _plugin_names(spec).items() if value != DEFAULT_NAMES[key]}


def check_volcano_version(spec: VGPUPolicySpec, observed: ClusterView) -> Iterable[Problem]:
    found = observed.volcano
    custom = _custom_names(spec)
    where = describe("Deployment", spec.scheduler.namespace, spec.scheduler.deployment)
    if found.version is None:
        yield _problem(rules.VOLCANO_VERSION_UNKNOWN, "spec.scheduler.volcanoVersion",
                       f"{found.detail}; set spec.scheduler.volcanoVersion (e.g. v1.13.0) so the operator "
                       "can check which resource names this Volcano honours", where,
                       "" if custom else rules.DEFAULT_NAMES)
        return
    version = found.version
    if not versions.has_deviceshare(version):
        yield _problem(rules.VOLCANO_TOO_OLD, "spec.scheduler.volcanoVersion",
                       f"Volcano {version} has no deviceshare plugin (vGPU was enabled by "
                       "predicate.VGPUEnable before v1.9); upgrade Volcano to v1.9 or later", where)
        return
    for hit in rules.check_custom_names(version, custom):
        key, value = hit.subject, custom[hit.subject]
        if hit.case == rules.HARD_CODED:
            why = (f"Volcano {version} hard-codes {DEFAULT_NAMES[key]} (names come from the config "
                   "from v1.13.0)")
        else:
            why = (f"Volcano {version} only considers nodes whose allocatable has the hard-coded "
                   "volcano.sh/vgpu-* names, so every vGPU node would be ignored")
        yield _problem(hit.rule, f"spec.resources.{key}",
                       f"{value!r}: {why}. Use {DEFAULT_NAMES[key]!r}; custom names work only with Volcano "
                       "v1.13.0-v1.14.2 and v1.15.0", where, hit.case)


def check_plugin_generation(spec: VGPUPolicySpec, observed: ClusterView) -> Iterable[Problem]:
    plugin = spec.device_plugin
    where = describe("DaemonSet", plugin.namespace, plugin.daemon_set)
    found = observed.plugin
    if found.generation is None:
        if found.source != "none":  # a missing DaemonSet or container is reported on its own
            yield _problem(rules.PLUGIN_GENERATION_UNKNOWN, "spec.devicePlugin.generation",
                           f"{found.detail}; set spec.devicePlugin.generation to legacy (<= v1.11), "
                           "current (v1.12+) or builtin", where)
        return
    traits = versions.plugin_traits(found.generation)
    yield from _registered_names(spec, found.generation, where)
    yield from _dropped_flags(spec, observed, found.generation, where)
    yield from _ignored_by_legacy(spec, found.generation, where)
    if spec.device.disable_core_limit and not traits.applies_disable_core_limit:
        yield _problem(rules.IGNORED_BY_UPSTREAM_PLUGIN, "spec.device.disableCoreLimit",
                       "the upstream device plugin (v1.11 and v1.12) loads disableCoreLimit but never sets "
                       "GPU_CORE_UTILIZATION_POLICY, so SM limits stay on; use this project's plugin "
                       "(generation builtin) or drop the setting", where)
    if not traits.applies_core_scaling:
        scaled = [("spec.device.deviceCoreScaling", spec.device.device_core_scaling)] + [
            (f"spec.nodeOverrides[{i}].deviceCoreScaling", o.device_core_scaling)
            for i, o in enumerate(spec.node_overrides)]
        for field, value in scaled:
            if value is not None and value != 1:
                yield _problem(rules.LEGACY_IGNORES, field,
                               "device plugins <= v1.11 register 100 core devices per GPU whatever "
                               "deviceCoreScaling says (and never set CUDA_OVERSUBSCRIBE); upgrade the "
                               "plugin to v1.12+ or set it to 1", where)
    yield from _unimplemented_modes(spec, traits, where)


def _unimplemented_modes(spec: VGPUPolicySpec, traits: versions.PluginTraits,
                         where: str) -> Iterable[Problem]:
    """Node settings the target plugin ignores (no plugin applies devicememoryscaling or mps; ours
    refuses dynamic MIG)."""
    modes = [mode for mode, works in (("hami-core", True), ("mig", traits.implements_mig)) if works]
    for index, override in enumerate(spec.node_overrides):
        if override.device_memory_scaling is not None and not traits.applies_memory_scaling:
            yield _problem(rules.IGNORED_BY_DEVICE_PLUGIN, f"spec.nodeOverrides[{index}].deviceMemoryScaling",
                           "the device plugin reads devicememoryscaling but never applies it (registered "
                           "memory is not scaled); drop the setting", where)
        if override.operating_mode == "mps" and not traits.implements_mps:
            yield _problem(rules.MPS_NOT_IMPLEMENTED, f"spec.nodeOverrides[{index}].operatingMode",
                           f"the device plugin does not implement mps mode; use {' or '.join(modes)}", where)
        if override.operating_mode == "mig" and not traits.implements_mig:
            yield _problem(rules.MIG_NOT_IMPLEMENTED, f"spec.nodeOverrides[{index}].operatingMode",
                           "this project's device plugin refuses the dynamic MIG instances the scheduler "
                           "assigns in mig mode (pods fail at Allocate); use hami-core, or the upstream "
                           "plugin (generation current)", where)


def _registered_names(spec: VGPUPolicySpec, generation: versions.Generation,
                      where: str) -> Iterable[Problem]:
    """The names the plugin registers (memoryPercentage is the scheduler's alone) as it spells them."""
    longest = versions.plugin_traits(generation).max_resource_name
    names = _plugin_names(spec)
    for hit in rules.check_registered_names(generation, names):
        key, value = hit.subject, names[hit.subject]
        if hit.rule is rules.NAME_OUTSIDE_DOMAIN:
            message = (f"{value!r}: device plugin v1.12+ prefixes every name with volcano.sh/, so "
                       f"the kubelet would reject it. Use a volcano.sh/ name")
        else:
            message = (f"{value!r} has {len(value)} characters: device plugin v1.12+ silently skips a "
                       f"resource whose name is longer than {longest}, so the node "
                       f"would never offer it. Use a shorter name")
        yield _problem(hit.rule, f"spec.resources.{key}", message, where)


def _dropped_flags(spec: VGPUPolicySpec, observed: ClusterView, generation: versions.Generation,
                   where: str) -> Iterable[Problem]:
    """Flags the render removes because the plugin binary does not define them."""
    plugin = spec.device_plugin
    try:
        live = observed.device_plugin or {}
        check_workload(live, where, "spec.devicePlugin.daemonSet")
        _, container = find_container(live, plugin.container, where)
    except InputError:
        return  # reported by the render
    edited = device_plugin.edited_container_argv(spec, container, generation)
    for flag in edited.dropped:
        yield _problem(rules.UNKNOWN_FLAG_DROPPED, "spec.devicePlugin",
                       f"{where} passes {flag!r}, which device plugin v1.12+ does not define (it would exit "
                       "1); the operator removes it from the container's command line", where)
    for written in edited.stray_values:
        switch, value = written.split(" ", 1)
        yield _problem(rules.UNKNOWN_FLAG_DROPPED, "spec.devicePlugin",
                       f"{where} passes {written!r}: {switch} is a switch in device plugin v1.12+ and takes "
                       f"no separate value, so Go's flag parsing stops at {value!r} and ignores every flag "
                       f"after it; the operator removes {value!r} (write {switch}={value} to set it)", where)
    if edited.shell:
        yield _shell_problem(generation, plugin.container, where)


def _shell_problem(generation: versions.Generation, container: str, where: str) -> Problem:
    """A shell runs the plugin: the flags in its script are out of the operator's reach."""
    if versions.plugin_traits(generation).flags is not None:
        return _problem(rules.FLAGS_IN_SHELL_SCRIPT, "spec.devicePlugin.container",
                        f"container {container!r} of {where} runs the device plugin from a shell script, "
                        "whose flags the operator cannot read or edit: device plugin v1.12+ exits 1 on a "
                        "flag it does not define, and sizing flags there override device-config. Put the "
                        "plugin binary in command and its flags in args, not in a shell script", where)
    wanted = ("names and sizing flags" if versions.plugin_traits(generation).sizing == "flags"
              else "device-config and node-config locations")
    return _problem(rules.FLAGS_IN_SHELL_SCRIPT, "spec.devicePlugin.container",
                    f"container {container!r} of {where} runs the device plugin from a shell script, whose "
                    f"flags the operator cannot edit, so the policy's {wanted} are not applied. Put the "
                    "plugin binary in command and its flags in args, not in a shell script", where,
                    rules.SWITCH_ONLY)


# What a legacy plugin does with each per-node setting it ignores (rules.check_node_settings).
_IGNORED_NODE_SETTING = {
    "filterDevices": "device plugins <= v1.11 parse filterdevices but ignore it; upgrade the plugin to "
                     "v1.12+ or remove the filter",
    "deviceSplitCount": "device plugins <= v1.11 take the split count from --device-split-count only "
                        "(upstream issue #87), so this node keeps spec.device.deviceSplitCount; upgrade "
                        "the plugin to v1.12+"}


def _ignored_by_legacy(spec: VGPUPolicySpec, generation: versions.Generation,
                       where: str) -> Iterable[Problem]:
    """Legacy plugins size from their flags: per-node split counts and filters never apply."""
    for index, override in enumerate(spec.node_overrides):
        hidden = override.filter_devices
        for hit in rules.check_node_settings(generation, override.device_split_count,
                                             [*hidden.uuid, *hidden.index] if hidden else []):
            yield _problem(hit.rule, f"spec.nodeOverrides[{index}].{hit.subject}",
                           _IGNORED_NODE_SETTING[hit.subject], where)


def _plugin_names(spec: VGPUPolicySpec) -> dict[str, str]:
    """The names the plugin registers (count, memory, cores: vgpu_formats.device_fields)."""
    return {kind: getattr(spec.resources, kind) for kind in device_fields.NAME_FIELDS}


# --- observed objects ----------------------------------------------------------------------------


def _scheduler_conf(spec: VGPUPolicySpec, observed: ClusterView) -> dict[str, Any] | None:
    try:
        return observed.scheduler_conf()
    except InputError:
        return None


def edited_object_errors(targets: Iterable[TargetRender]) -> Iterable[Problem]:
    """Objects the operator edits must exist and be usable: the renderers' own errors (an unknown
    plugin generation is reported by `check_plugin_generation`; node-config never fails to render,
    whatever its live text, so every error comes from an edited object)."""
    for target in targets:
        if target.error is not None and target.error.reason != "PluginGenerationUnknown":
            # The catalogue decides the severity of the rules it lists (the renderer's otherwise).
            error = target.error
            severity = _SEVERITIES[rules.severity_of_reason(error.reason, error.severity)]
            yield error if severity == error.severity else dataclasses.replace(error, severity=severity)


def scheduler_conf_facts(conf: dict[str, Any]) -> rules.SchedulerConf:
    """What the rules catalogue checks of a parsed scheduler conf (deviceshare: the last entry's
    arguments, which Volcano uses)."""
    plugin = find_plugin(conf, scheduler_conf.PLUGIN)
    arguments = plugin.get("arguments") if plugin is not None else None
    return rules.SchedulerConf(tuple(str(p.get("name", "")) for p in tier_plugins(conf)),
                               None if plugin is None else arguments if isinstance(arguments, dict) else {},
                               scheduler_conf.actions_of(conf))


def unknown_action_effect(case: str) -> str:
    """What the scheduler does with an action it does not have (rules.UNKNOWN_ACTION's cases)."""
    if case == rules.IGNORED:
        return "this version logs it and runs the other actions"
    if case == rules.UNKNOWN_VERSION:
        return ("Volcano v1.12 and v1.13 skip it, every other version rejects the whole file and keeps "
                "its previous configuration (at start one without deviceshare)")
    return "it rejects the whole file and keeps its previous configuration (at start one without deviceshare)"


def check_scheduler_conf(spec: VGPUPolicySpec, observed: ClusterView) -> Iterable[Problem]:
    conf = _scheduler_conf(spec, observed)
    if conf is None:
        return
    where = describe("ConfigMap", spec.scheduler.namespace, spec.scheduler.config_map)
    # The operator turns VGPUEnable on: a gpushare argument conflicts whatever VGPUEnable says now.
    for hit in rules.check_scheduler_conf(scheduler_conf_facts(conf), vgpu_enabled=True,
                                          version=observed.volcano.version):
        if hit.rule is rules.GPUSHARE_CONFLICT:
            key = hit.subject
            message = (f"{where} sets {key}: true; together with deviceshare.VGPUEnable the scheduler "
                       f"exits (klog.Fatal) and crash-loops. Remove {key} from the deviceshare arguments "
                       "(gpushare and vGPU cannot run together)")
        elif hit.rule is rules.UNKNOWN_ACTION:
            yield _problem(hit.rule, "spec.scheduler", f"{where} lists action {hit.subject!r}, which "
                           f"Volcano {observed.volcano.version or '(version unknown)'} does not have; "
                           + unknown_action_effect(hit.case) + f". Fix or remove {hit.subject!r}",
                           where, case=hit.case)
            continue
        else:
            message = (f"{where} does not enable the predicates plugin; only predicates performs device "
                       "Allocate, so vGPU pods would bind without devices. Add `- name: predicates` to a "
                       "tier")
        yield _problem(hit.rule, "spec.scheduler", message, where)
    sched = spec.scheduler
    if sched.schedule_policy != "unset" and sched.schedule_weight == 0:
        yield _problem(rules.SCHEDULE_WEIGHT_ZERO, "spec.scheduler.scheduleWeight",
                       f"schedulePolicy {sched.schedule_policy} orders GPUs within a node, but with "
                       "scheduleWeight 0 it never affects which node is chosen; set scheduleWeight (e.g. 10)")
    if sched.schedule_policy == "unset" and sched.schedule_weight > 0:
        yield _problem(rules.SCHEDULE_WEIGHT_WITHOUT_POLICY, "spec.scheduler.scheduleWeight",
                       "scheduleWeight has no effect without schedulePolicy binpack or spread; set one")


def check_target_namespaces(spec: VGPUPolicySpec, observed: ClusterView) -> Iterable[Problem]:
    ref = spec.targets.device_config
    generation = observed.generation
    fixed = generation is not None and versions.plugin_traits(generation).fixed_device_config_place
    if fixed and ref.namespace not in dc_fmt.PLUGIN_NAMESPACES:
        yield _problem(rules.DEVICE_CONFIG_NAMESPACE_UNREAD, "spec.targets.deviceConfig.namespace",
                       f"the upstream device plugin reads {dc_fmt.CONFIGMAP_NAME} only from kube-system or "
                       f"volcano-system, not {ref.namespace!r}; use kube-system")
    elif fixed and ref.name != dc_fmt.CONFIGMAP_NAME:
        yield _problem(rules.DEVICE_CONFIG_NAME_UNREAD, "spec.targets.deviceConfig.name",
                       f"the upstream device plugin reads the hard-coded name {dc_fmt.CONFIGMAP_NAME}, not "
                       f"{ref.name!r}; use that name")
    shadow = observed.device_config_shadow_text()
    if fixed and shadow is not None:
        yield from _shadowed(spec, observed, shadow)
    if observed.device_plugin is not None:
        pod = pod_template(observed.device_plugin).get("spec")
        volumes = pod.get("volumes") if isinstance(pod, dict) else None
        mounted = {str(v["configMap"].get("name")) for v in volumes or []
                   if isinstance(v, dict) and isinstance(v.get("configMap"), dict)}
        if spec.targets.node_config.name not in mounted:
            where = describe("DaemonSet", spec.device_plugin.namespace, spec.device_plugin.daemon_set)
            yield _problem(rules.NODE_CONFIG_NOT_MOUNTED, "spec.targets.nodeConfig.name",
                           f"{where} mounts no ConfigMap named {spec.targets.node_config.name!r}, so node "
                           "overrides never reach the plugin; mount it at /config or set "
                           "spec.targets.nodeConfig.name to the mounted one", where)


def _shadowed(spec: VGPUPolicySpec, observed: ClusterView, shadow_text: str) -> Iterable[Problem]:
    """A kube-system copy the upstream plugin reads before the volcano-system target: harmless
    while it says the same, a scheduler/plugin split when it does not."""
    shadow = dc_fmt.load_device_config(shadow_text)
    wanted = device_config.desired_config(observed)
    generation = observed.generation
    if device_config.plugin_reads(generation, shadow) == device_config.plugin_reads(generation, wanted):
        return
    ref = spec.targets.device_config
    first = dc_fmt.PLUGIN_NAMESPACES[0]
    where = describe("ConfigMap", first, dc_fmt.CONFIGMAP_NAME)
    yield _problem(rules.DEVICE_CONFIG_SPLIT, "spec.targets.deviceConfig.namespace",
                   f"{where} exists and says something else than this policy; the upstream device plugin "
                   f"reads it before {describe('ConfigMap', ref.namespace, ref.name)}, so the plugin and "
                   f"the scheduler would disagree. Delete the {first} copy (kubectl -n {first} delete "
                   f"configmap {dc_fmt.CONFIGMAP_NAME}) or set spec.targets.deviceConfig.namespace: {first}",
                   where)


# --- node overrides and GPU sizes ----------------------------------------------------------------


def check_node_overrides(spec: VGPUPolicySpec, observed: ClusterView) -> Iterable[Problem]:
    """A node may match at most one override: upstream applies one entry per node. Two overrides
    naming one node is an error in the spec; an overlap through a selector comes from the node's
    labels, a warning (the first override applies)."""
    owner: dict[str, int] = {}
    targets = override_nodes(spec.node_overrides, observed.nodes)
    for index, names in enumerate(targets):
        for name in names:
            if name not in owner:
                owner[name] = index
                continue
            first = owner[name]
            if spec.node_overrides[index].node_selector is None and \
                    spec.node_overrides[first].node_selector is None:
                yield _problem(rules.OVERLAPPING_NODE_OVERRIDES, f"spec.nodeOverrides[{index}]",
                               f"node {name!r} is also named by spec.nodeOverrides[{first}]; a node may "
                               "match one override only. Remove the name from one of the two",
                               f"Node {name}")
            else:
                yield _problem(rules.OVERLAPPING_NODE_SELECTORS, f"spec.nodeOverrides[{index}]",
                               f"node {name!r} (by its labels) is also matched by "
                               f"spec.nodeOverrides[{first}], which applies to it; this override does not. "
                               "Narrow the selectors",
                               f"Node {name}")
    known = {node_name(n) for n in observed.nodes}
    for index, (override, names) in enumerate(zip(spec.node_overrides, targets, strict=True)):
        if override.node_selector is not None and not names:
            yield _problem(rules.OVERRIDE_MATCHES_NO_NODES, f"spec.nodeOverrides[{index}].nodeSelector",
                           "the selector matches no node now; check the labels (the override applies as soon "
                           "as a node matches)")
        missing = sorted(set(override.node_names or []) - known)
        if missing:
            yield _problem(rules.NODE_NOT_FOUND, f"spec.nodeOverrides[{index}].nodeNames",
                           f"no node named {', '.join(missing)} exists now; check the spelling (the entry is "
                           "written anyway and applies when the node joins)")
    known_geometries = spec.device.known_mig_geometries
    for index, override in enumerate(spec.node_overrides):
        if override.operating_mode == "mig" and known_geometries == []:
            yield _problem(rules.MIG_WITHOUT_GEOMETRIES, f"spec.nodeOverrides[{index}].operatingMode",
                           "operatingMode mig needs spec.device.knownMigGeometries for the node's GPU model; "
                           "without them the scheduler falls back to hami-core")
        if override.mig_strategy == "single":
            yield _problem(rules.MIG_STRATEGY_UNUSED, f"spec.nodeOverrides[{index}].migStrategy",
                           "the upstream plugin ignores migstrategy from node config (and panics on a single "
                           "--mig-strategy flag); use operatingMode mig for dynamic MIG")


def _node_gpus(node: dict[str, Any], live_factor: int) -> list[tuple[str, int]]:
    """(UUID, total MiB) of each GPU of a node, from the register annotation (devmem x factor)."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ann.NODE_REGISTER)
    if not text:
        return []
    try:
        return [(device.uuid, device.devmem * live_factor) for device in ann.decode_node_register(text)]
    except FormatError:
        return []


def _memory_list(generation: versions.Generation | None, gpus: list[tuple[str, int]], factor: int) -> int:
    return versions.memory_list_bytes(generation, [(uuid, mib // factor) for uuid, mib in gpus])


def _live_memory_factor(spec: VGPUPolicySpec, observed: ClusterView,
                        generation: versions.Generation | None) -> int:
    """The gpuMemoryFactor the running plugin divided devmem by: its flag or the device-config, as
    its generation takes them (unusable, 0 or a flag it rejects: 1)."""
    try:
        _, container = find_container(observed.device_plugin or {}, spec.device_plugin.container, "")
    except InputError:
        container = {}
    flag = versions.decisive_flag(generation, "gpu-memory-factor", [
        value for name, value in device_plugin.flag_pairs(device_plugin.binary_args(container))
        if name == "--gpu-memory-factor"])
    live = versions.effective_sizing(generation, "gpu-memory-factor", flag,
                                     observed.live_device_config)
    return int(live.value or 1) or 1


def check_gpu_memory_factor(spec: VGPUPolicySpec, observed: ClusterView) -> Iterable[Problem]:
    factor = spec.device.gpu_memory_factor
    generation = observed.generation
    live_factor = _live_memory_factor(spec, observed, generation)
    worst: tuple[int, str, list[tuple[str, int]]] = (0, "", [])
    for node in observed.nodes:
        gpus = _node_gpus(node, live_factor)
        if not gpus:
            continue
        largest = max(mib for _, mib in gpus)
        if factor > largest:
            yield _problem(rules.GPU_MEMORY_FACTOR_TOO_LARGE, "spec.device.gpuMemoryFactor",
                           f"gpuMemoryFactor {factor} exceeds the largest GPU on node {node_name(node)} "
                           f"({largest} MiB): its memory would register as 0. Use at most {largest}",
                           f"Node {node_name(node)}")
        size = _memory_list(generation, gpus, factor)
        if size > worst[0]:
            worst = (size, node_name(node), gpus)
    size, name, gpus = worst
    if size <= lw.MESSAGE_LIMIT:
        return
    fits = next(f for f in range(factor + 1, max(mib for _, mib in gpus) + 2)
                if _memory_list(generation, gpus, f) <= lw.MESSAGE_LIMIT)
    traits = versions.plugin_traits(generation)
    ids = "<UUID>-memory-<i>" if traits.memory_ids == "uuid" else "<index>-<i>"
    outcome = ("the plugin advertises only part of the node's memory" if traits.caps_memory_list
               else "the kubelet drops the list and the node offers no vGPU memory")
    devices = sum(mib // factor for _, mib in gpus)
    yield _problem(rules.LIST_AND_WATCH_TOO_LARGE, "spec.device.gpuMemoryFactor",
                   f"node {name} would advertise {devices} memory devices (MiB / gpuMemoryFactor per GPU), "
                   f"a {size}-byte ListAndWatch message with this plugin's {ids} ids, over the kubelet's "
                   f"{lw.MESSAGE_LIMIT}-byte limit: {outcome}; set gpuMemoryFactor to {fits} "
                   "or more", f"Node {name}")


def check_plugin_update_strategy(spec: VGPUPolicySpec, observed: ClusterView) -> Iterable[Problem]:
    """The operator restarts the plugin for a change of its arguments by a template annotation:
    a DaemonSet updated OnDelete ignores it, and its pods keep the old arguments until deleted."""
    if observed.device_plugin is not None and updated_on_delete(observed.device_plugin):
        where = describe("DaemonSet", spec.device_plugin.namespace, spec.device_plugin.daemon_set)
        yield _problem(rules.PLUGIN_ON_DELETE, "spec.devicePlugin.daemonSet",
                       f"{where} has updateStrategy OnDelete: a change of the plugin's arguments "
                       "reaches its pods only once they are deleted (node-config changes still "
                       f"restart their nodes' pods); {rules.PLUGIN_ON_DELETE.fix}", where)


# In this order, after `edited_object_errors`.
RULES: tuple[Rule, ...] = (
    check_volcano_version,
    check_plugin_generation,
    check_scheduler_conf,
    check_target_namespaces,
    check_node_overrides,
    check_gpu_memory_factor,
    check_plugin_update_strategy,
)
