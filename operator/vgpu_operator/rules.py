"""The rules catalogue: every rule the operator's validation (`validate`) and `vgpuctl doctor` report.

Each rule is defined once: its stable code (doctor's kebab-case `code`; the operator's CamelCase
condition `reason` where the operator reports it), its severity, the field it concerns and the
fix. Severities are decided here and nowhere else: a call site names a rule (and, for the few
rules whose severity depends on what is known, a `case`) and reads the severity from it.
Severities: `error` (vGPU pods fail, or the scheduler or plugin misbehaves; the operator writes
nothing), `warning` (works today by luck, or breaks on the next change), `info` (harmless).

Where the two engines judge the same fact, the check is one function here, on inputs both can
build: the operator from the policy and `Observed`, doctor from the manifests (`vgpuctl.facts`).
Each returns `Hit`s; each engine words its own message (the object it names differs: a policy
field for the operator, a cluster object for doctor). The facts behind each rule are cited where
the rule is checked (validate.py, doctor.py) and in operator/README.md and operator/vgpuctl/README.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from vgpu_formats import device_config as dc

from vgpu_operator import versions
from vgpu_operator.render import scheduler_conf

Severity = Literal["error", "warning", "info"]
APPLY_POLICY = (
    "kubectl apply a VGPUPolicy (start from `vgpuctl import`): the operator keeps all four places consistent"
)


@dataclass(frozen=True)
class Rule:
    code: str  # stable, for scripts: doctor's finding code
    severity: Severity
    field: str  # the policy field or the setting it concerns
    fix: str  # a template: `fix_text` fills the {names} a finding knows
    reason: str = ""  # the operator's condition reason when it reports the rule ("" doctor only)
    cases: tuple[tuple[str, Severity], ...] = ()  # named cases with another severity

    def at(self, case: str = "") -> Severity:
        """The severity in `case` ("" the rule's own)."""
        return dict(self.cases).get(case, self.severity) if case else self.severity

    def fix_text(self, **values: Any) -> str:
        return self.fix.format(**values, apply=APPLY_POLICY)


def _kebab(reason: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", reason).lower()


def _operator(reason: str, severity: Severity, field: str, fix: str,
              cases: tuple[tuple[str, Severity], ...] = ()) -> Rule:
    """A rule only the operator checks (doctor reports it as `policy-<reason>`)."""
    return Rule(_kebab(reason), severity, field, fix, reason, cases)


# Case names (a rule's severity when less is known).
GUESSED = "generation guessed"  # the plugin generation is guessed from flags, not its image tag
MISSING = "missing"  # the object is not there at all (vs there and unusable)
DEFAULT_NAMES = "default names"  # the policy keeps the hard-coded volcano.sh/vgpu-* names
SWITCH_ONLY = "switch only"  # builtin/legacy: a shell script hides flags the plugin accepts anyway
IGNORED = "ignored"  # the Volcano version in use logs it and goes on
UNKNOWN_VERSION = "version unknown"  # cannot tell what the version in use does

# --- the scheduler conf ----------------------------------------------------------------------
SCHEDULER_CONF_MISSING = Rule("scheduler-conf-missing", "error", "spec.scheduler.configMap",
                              "install Volcano, or point spec.scheduler at its ConfigMap",
                              "SchedulerConfigMapNotFound")
SCHEDULER_CONF_INVALID = Rule("scheduler-conf-invalid", "error", "volcano-scheduler.conf",
                              "fix the YAML; {apply}", "SchedulerConfInvalid")
DEVICESHARE_MISSING = Rule("deviceshare-missing", "error", "tiers[].plugins",
                           "add `- name: deviceshare` with `deviceshare.VGPUEnable: true`; {apply}")
VGPU_DISABLED = Rule("vgpu-disabled", "error", "deviceshare.VGPUEnable",
                     "set deviceshare.VGPUEnable: true; {apply}")
# GPUSharingEnable/GPUNumberEnable with VGPUEnable: klog.Fatal, the scheduler crash-loops.
GPUSHARE_CONFLICT = Rule("gpushare-conflict", "error", "spec.scheduler", "remove {argument}",
                         "ConflictingDeviceShareArguments")
# Only predicates calls the devices' Allocate (render/scheduler_conf.py): without it vGPU pods bind
# with no device assigned and no annotations, whatever the version (before v1.9, `has_deviceshare`,
# vGPU lived in predicates itself). Was a warning in validate, an error in doctor: an error.
PREDICATES_MISSING = Rule("predicates-missing", "error", "spec.scheduler",
                          "add `- name: predicates` to a tier", "PredicatesPluginMissing")
# An action name Volcano does not register: v1.12 and v1.13 log it and skip it, every other version
# rejects the whole file and keeps its previous configuration (at start, one without deviceshare).
# pkg/scheduler/util.go and pkg/scheduler/actions/factory.go of each tag.
UNKNOWN_ACTION = Rule("unknown-scheduler-action", "error", "actions", "fix or remove {argument}; {apply}",
                      "SchedulerActionUnknown", ((IGNORED, "warning"), (UNKNOWN_VERSION, "warning")))
VOLCANO_ACTIONS = frozenset({"enqueue", "allocate", "backfill", "preempt", "reclaim", "shuffle"})
VOLCANO_ACTIONS_SINCE_1_15 = frozenset({"gangpreempt", "gangreclaim"})
CM_NAMESPACE_UNSET = Rule("cm-namespace-unset", "warning", "deviceshare.KnownGeometriesCMNamespace",
                          "set deviceshare.KnownGeometriesCMNamespace: {namespace} explicitly; {apply}")
SCHEDULE_WEIGHT_ZERO = _operator("ScheduleWeightZero", "warning", "spec.scheduler.scheduleWeight",
                                 "set scheduleWeight (e.g. 10)")
SCHEDULE_WEIGHT_WITHOUT_POLICY = _operator("ScheduleWeightWithoutPolicy", "warning",
                                           "spec.scheduler.scheduleWeight",
                                           "set schedulePolicy binpack or spread")

# --- device-config ---------------------------------------------------------------------------
# The scheduler and the plugin reading different copies: the shadow copy the upstream plugin
# reads first is the same fact (validate: DeviceConfigShadowed), both errors.
DEVICE_CONFIG_SPLIT = Rule("device-config-split", "error", "deviceshare.KnownGeometriesCMNamespace",
                           "{how}; {apply}", "DeviceConfigShadowed")
# Missing: the scheduler runs on defaults (works by luck); there but unusable: an error.
DEVICE_CONFIG_UNREADABLE = Rule("device-config-unreadable", "error", dc.CONFIGMAP_KEY,
                                "create it with the resource names the plugin registers; {apply}",
                                "DeviceConfigUnreadable", ((MISSING, "warning"),))
DEVICE_CONFIG_NAMESPACE_UNREAD = _operator(
    "DeviceConfigNamespaceUnread", "error", "spec.targets.deviceConfig.namespace", "use kube-system")
DEVICE_CONFIG_NAME_UNREAD = _operator("DeviceConfigNameUnread", "error", "spec.targets.deviceConfig.name",
                                      f"use {dc.CONFIGMAP_NAME}")
RESOURCE_NAME_EMPTY = Rule("resource-name-empty", "error", "nvidia.resource*Name", "set {key}: {default}")

# --- names and versions ----------------------------------------------------------------------
# Missing plugin: nothing registers vGPU resources and the operator cannot edit it. Was a warning
# in doctor, an error in the operator (render/device_plugin.py): an error.
PLUGIN_MISSING = Rule("plugin-missing", "error", "spec.devicePlugin.daemonSet",
                      "install the device plugin, or point spec.devicePlugin at it", "DevicePluginNotFound")
RESOURCE_NAME_MISMATCH = Rule("resource-name-mismatch", "error", "nvidia.resource*Name", "{how}; {apply}")
# The plugin runs with flags its binary does not define: it exits (doctor, the live state). The
# operator removes them when it writes (UNKNOWN_FLAG_DROPPED): a different fact, a warning.
LEGACY_FLAGS = Rule("legacy-flags", "error", "args", "{how}; {apply}", cases=((GUESSED, "warning"),))
UNKNOWN_FLAG_DROPPED = _operator("UnknownPluginFlagDropped", "warning", "spec.devicePlugin",
                                 "nothing: the operator removes the flag")
FLAGS_IN_SHELL_SCRIPT = _operator("PluginFlagsInShellScript", "error", "spec.devicePlugin.container",
                                  "put the plugin binary in command and its flags in args",
                                  ((SWITCH_ONLY, "warning"),))
CUSTOM_NAMES_UNSUPPORTED = Rule("custom-names-unsupported", "error", "spec.resources",
                                "keep the volcano.sh/vgpu-* names with this version, or use Volcano "
                                "v1.13.0-v1.14.2 or v1.15.0", "CustomResourceNamesUnsupported")
# A current plugin registers `volcano.sh/<name>` for a name outside volcano.sh/: an invalid
# resource name the kubelet rejects, and never the scheduler's name. Was a warning in doctor, an
# error in validate: an error.
NAME_OUTSIDE_DOMAIN = Rule("name-outside-volcano-domain", "error", "spec.resources",
                           "use names under volcano.sh/", "ResourceNameOutsideVolcanoDomain")
NAME_TOO_LONG = Rule("name-too-long", "error", "spec.resources", "use shorter names; {apply}",
                     "ResourceNameTooLong")
VERSION_SKEW = Rule("version-skew", "error", "image", "{how}")
# A container asking the memory resource without the count resource: one GPU to the scheduler,
# but the kubelet calls only the memory plugin for it. Upstream's answers that call empty (no
# limit, no libvgpu.so); ours serves it, and refuses an init container (it has no part).
MEMORY_ONLY_CONTAINER = Rule("memory-only-container", "warning", "resources.limits", "{how}",
                             cases=((GUESSED, "info"),))
VOLCANO_VERSION_UNKNOWN = _operator("VolcanoVersionUnknown", "error", "spec.scheduler.volcanoVersion",
                                    "set spec.scheduler.volcanoVersion (e.g. v1.13.0)",
                                    ((DEFAULT_NAMES, "warning"),))
VOLCANO_TOO_OLD = _operator("VolcanoTooOld", "error", "spec.scheduler.volcanoVersion",
                            "upgrade Volcano to v1.9 or later")
PLUGIN_GENERATION_UNKNOWN = _operator("PluginGenerationUnknown", "error", "spec.devicePlugin.generation",
                                      "set spec.devicePlugin.generation to legacy, current or builtin")

# --- sizing ----------------------------------------------------------------------------------
SIZING_FLAG_REJECTED = Rule("sizing-flag-rejected", "error", "args",
                            "remove --{flag} (sizing comes from device-config); {apply}",
                            cases=((GUESSED, "warning"),))
SIZING_MISMATCH = Rule("sizing-mismatch", "warning", "args", "{how}; {apply}")
MEMORY_FACTOR_ZERO = Rule("memory-factor-zero", "error", "nvidia.gpuMemoryFactor",
                          "set {key}: 1 (or more) in {place}; {apply}", cases=((GUESSED, "warning"),))
CORE_SCALING_ZERO = Rule("core-scaling-zero", "warning", "nvidia.deviceCoreScaling",
                         "set {key}: 1 in {place}; {apply}")
GPU_MEMORY_FACTOR_TOO_LARGE = _operator("GPUMemoryFactorTooLarge", "error", "spec.device.gpuMemoryFactor",
                                        "use at most the smallest GPU's MiB")
LIST_AND_WATCH_TOO_LARGE = _operator("ListAndWatchTooLarge", "warning", "spec.device.gpuMemoryFactor",
                                     "raise gpuMemoryFactor")
IGNORED_BY_UPSTREAM_PLUGIN = _operator("IgnoredByUpstreamPlugin", "warning", "spec.device.disableCoreLimit",
                                       "use this project's plugin (generation builtin) or drop the setting")
IGNORED_BY_DEVICE_PLUGIN = _operator("IgnoredByDevicePlugin", "warning",
                                     "spec.nodeOverrides[].deviceMemoryScaling", "drop the setting")
MPS_NOT_IMPLEMENTED = _operator("MpsNotImplemented", "warning", "spec.nodeOverrides[].operatingMode",
                                "use hami-core (or mig)")
MIG_NOT_IMPLEMENTED = _operator("MigNotImplemented", "warning", "spec.nodeOverrides[].operatingMode",
                                "use hami-core, or the upstream plugin (generation current)")

# --- node-config and nodes -------------------------------------------------------------------
# Per-node split counts and filters a legacy plugin ignores (and deviceCoreScaling != 1): both
# engines, a warning.
LEGACY_IGNORES = Rule("node-config-ignored", "warning", "spec.nodeOverrides[]",
                      "upgrade the plugin to v1.12+, or drop the per-node settings", "IgnoredByLegacyPlugin")
NODE_CONFIG_INVALID = Rule("node-config-invalid", "error", "config.json", "fix the JSON; {apply}")
# Entries for nodes that are not there: doctor sees what already runs (leftovers of removed nodes,
# harmless); the operator sees names a person just typed (a typo misses the node): two rules.
NODE_CONFIG_STALE = Rule("node-config-stale", "info", "config.json nodeconfig",
                         "remove them, or use nodeOverrides with a nodeSelector in a VGPUPolicy")
NODE_NOT_FOUND = _operator("NodeNotFound", "warning", "spec.nodeOverrides[].nodeNames", "check the spelling")
OVERRIDE_MATCHES_NO_NODES = _operator("OverrideMatchesNoNodes", "warning",
                                      "spec.nodeOverrides[].nodeSelector", "check the labels")
OVERLAPPING_NODE_OVERRIDES = _operator("OverlappingNodeOverrides", "error", "spec.nodeOverrides[]",
                                       "remove the name from one of the two")
# A selector overlap comes from node labels, which others change at any time: it must not stop the
# policy (every write) until someone edits it; the first override applies, as rendered.
OVERLAPPING_NODE_SELECTORS = _operator("OverlappingNodeSelectors", "warning", "spec.nodeOverrides[]",
                                       "narrow the selectors")
MIG_WITHOUT_GEOMETRIES = _operator("MigWithoutGeometries", "warning", "spec.nodeOverrides[].operatingMode",
                                   "set spec.device.knownMigGeometries")
MIG_STRATEGY_UNUSED = _operator("MigStrategyUnused", "warning", "spec.nodeOverrides[].migStrategy",
                                "use operatingMode mig for dynamic MIG")
NODE_CONFIG_NOT_MOUNTED = _operator("NodeConfigNotMounted", "warning", "spec.targets.nodeConfig.name",
                                    "mount it at /config or set spec.targets.nodeConfig.name")
PLUGIN_ON_DELETE = _operator("DevicePluginOnDelete", "warning", "spec.devicePlugin.daemonSet",
                             "set the DaemonSet's updateStrategy to RollingUpdate, or delete its pods "
                             "after each change of its arguments")
NODE_NOT_REGISTERED = Rule("node-not-registered", "error", "volcano.sh/node-vgpu-register",
                           "check the device plugin pod on the node")
NODE_REGISTER_INVALID = Rule("node-register-invalid", "error", "volcano.sh/node-vgpu-register",
                             "upgrade the device plugin")
SPLIT_COUNT_MISMATCH = Rule("split-count-mismatch", "warning", "volcano.sh/node-vgpu-register count",
                            "restart the device plugin pod on these nodes; {apply}")
NODE_ADVERTISEMENT = Rule("node-advertisement", "error", "status.allocatable",
                          "make the plugin register the scheduler's names (see resource-name-mismatch)")
NODE_IGNORED_BY_SCHEDULER = Rule("node-ignored-by-scheduler", "error", "status.allocatable",
                                 "keep the volcano.sh/vgpu-* names")

# --- what the renderers report about the objects the operator edits (render/*.py) ---------
SCHEDULER_CONF_NO_TIERS = _operator("SchedulerConfNoTiers", "error", "spec.scheduler.key",
                                    "give the scheduler conf a tiers list")
# Its kebab form would be doctor's code for a missing ConfigMap: spelled out.
SCHEDULER_CONF_KEY_MISSING = Rule("scheduler-conf-key-missing", "error", "spec.scheduler.key",
                                  "point spec.scheduler.key at the scheduler conf", "SchedulerConfMissing")
DEVICESHARE_DUPLICATED = _operator("DeviceShareDuplicated", "error", "spec.scheduler",
                                   "keep one deviceshare entry")
SCHEDULER_DEPLOYMENT_NOT_FOUND = _operator(
    "SchedulerDeploymentNotFound", "warning", "spec.scheduler.deployment",
    "set spec.scheduler.deployment to the scheduler's Deployment")
PLUGIN_CONTAINER_NOT_FOUND = _operator(
    "DevicePluginContainerNotFound", "error", "spec.devicePlugin.container",
    "set spec.devicePlugin.container to the plugin's container")
WORKLOAD_MALFORMED = _operator("WorkloadMalformed", "error", "spec", "fix the workload's pod template")

# --- doctor's own --------------------------------------------------------------------------
POLICY_INVALID = Rule("policy-invalid", "error", "spec",
                      "fix the field; `kubectl explain vgpupolicy.spec` describes it")
POLICY_PLAN = Rule("policy-plan", "info", "spec",
                   "the operator does this on its next reconcile; `vgpuctl diff` shows the changes")
POD_NOT_FOUND = Rule("pod-not-found", "warning", "--pod",
                     "give it as NAMESPACE/NAME, as `kubectl get pod -A` lists it")

CATALOGUE: tuple[Rule, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Rule))
BY_CODE: dict[str, Rule] = {rule.code: rule for rule in CATALOGUE}
BY_REASON: dict[str, Rule] = {rule.reason: rule for rule in CATALOGUE if rule.reason}


def severity_of_reason(reason: str, given: Severity) -> Severity:
    """The catalogue's severity for an operator reason (`given`: the renderer's, for reasons the
    catalogue does not list)."""
    rule = BY_REASON.get(reason)
    return rule.severity if rule is not None else given


# --- checks both engines run -----------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    """A rule that applies, about `subject` (a name kind, an argument, a setting)."""

    rule: Rule
    subject: str = ""
    case: str = ""

    @property
    def severity(self) -> Severity:
        return self.rule.at(self.case)


@dataclass(frozen=True)
class SchedulerConf:
    """The live scheduler conf as both engines read it (the operator's tier walk,
    `render.inputs.tier_plugins`): every plugin's name and deviceshare's arguments."""

    plugins: tuple[str, ...]
    deviceshare: Mapping[str, Any] | None  # None: the plugin is absent
    actions: str = ""  # the `actions` line, comma-separated names


def check_scheduler_conf(conf: SchedulerConf, vgpu_enabled: bool, version: Any | None) -> list[Hit]:
    """gpushare arguments that crash-loop the scheduler next to VGPUEnable (`vgpu_enabled`: it is
    or will be on), as that Volcano `version` reads them (None: not known), and a missing
    predicates plugin."""
    arguments = dict(conf.deviceshare or {})
    hits = [Hit(GPUSHARE_CONFLICT, key) for key in scheduler_conf.GPUSHARE_ARGUMENTS
            # not known: a crash-loop is worse than a needless refusal
            if vgpu_enabled and scheduler_conf.reads_true(arguments, key, version, if_unknown=True)]
    if "predicates" not in conf.plugins:
        hits.append(Hit(PREDICATES_MISSING, "predicates"))
    hits += [Hit(UNKNOWN_ACTION, name, _unknown_action_case(version)) for name in
             unknown_actions(conf.actions, version)]
    return hits


def unknown_actions(actions: str, version: Any | None) -> list[str]:
    """The names of `actions` that Volcano `version` (None: not known, every name some version
    has passes) does not register."""
    gang = version is None or versions.has_gang_actions(version)
    known = VOLCANO_ACTIONS | (VOLCANO_ACTIONS_SINCE_1_15 if gang else frozenset())
    return [name.strip() for name in actions.split(",") if name.strip() and name.strip() not in known]


def _unknown_action_case(version: Any | None) -> str:
    if version is None:
        return UNKNOWN_VERSION
    return IGNORED if versions.skips_unknown_actions(version) else ""


# How custom names fail, by version (versions.py): the hard-coded names only (< v1.13), or nodes
# without the hard-coded allocatable ignored (v1.14.3+, v1.15.1+).
HARD_CODED = "hard-coded"
NODES_IGNORED = "nodes ignored"


def check_custom_names(version: versions.Version | None, names: Mapping[str, str]) -> list[Hit]:
    """Names (count, memory, cores) other than the hard-coded ones that this Volcano does not take;
    `Hit.subject` is the kind, `Hit.case` says how it fails (HARD_CODED or NODES_IGNORED)."""
    if version is None or versions.custom_resource_names_work(version):
        return []
    why = HARD_CODED if not versions.reads_custom_resource_names(version) else NODES_IGNORED
    return [Hit(CUSTOM_NAMES_UNSUPPORTED, kind, why) for kind, name in names.items()
            if kind in versions.DEFAULT_NAMES and name and name != versions.DEFAULT_NAMES[kind]]


def check_registered_names(generation: versions.Generation | None, names: Mapping[str, str]) -> list[Hit]:
    """Names (count, memory, cores) the plugin cannot register as given: outside volcano.sh/ for a
    plugin that forces the prefix, or longer than it registers; `Hit.subject` is the kind."""
    longest = versions.plugin_traits(generation).max_resource_name
    hits: list[Hit] = []
    for kind, name in names.items():
        registered = versions.registered_name(generation, name)
        if name and registered != name:
            hits.append(Hit(NAME_OUTSIDE_DOMAIN, kind))
        elif longest is not None and len(registered) > longest:
            hits.append(Hit(NAME_TOO_LONG, kind))
    return hits


def check_node_settings(generation: versions.Generation | None, split_count: int | None,
                        filters: Iterable[object]) -> list[Hit]:
    """Per-node settings the plugin ignores: a legacy one takes the split count from its flag only
    and parses filterdevices without applying it (an empty filter hides nothing); `Hit.subject`
    is the policy field."""
    if versions.plugin_traits(generation).applies_node_split_and_filters:
        return []
    hits = [Hit(LEGACY_IGNORES, "filterDevices")] if any(True for _ in filters) else []
    return hits + ([Hit(LEGACY_IGNORES, "deviceSplitCount")] if split_count else [])
