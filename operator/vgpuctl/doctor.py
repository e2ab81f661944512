"""`vgpuctl doctor`: every inconsistency across the four places, nodes, versions and failed pods.

Pure: `ClusterFacts` in, a `Report` (findings, versions, names, node and pod diagnoses) out.
Each finding names the place and field, says what goes wrong, and gives the fix. Severities:
`error` (vGPU pods fail or the scheduler/plugin misbehaves), `warning` (works today by luck, or
breaks on the next change), `info` (harmless, shown for completeness). The exit code counts
errors and warnings only. Codes, severities and fixes come from the rules catalogue
(`vgpu_operator.rules`), which the operator's validation uses too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import pydantic
from vgpu_formats import FormatError
from vgpu_formats import annotations as ann
from vgpu_formats import device_config as dc
from vgpu_formats.quantity import quantity_or_zero
from vgpu_operator import rules, versions
from vgpu_operator.api import KIND, VGPUPolicy
from vgpu_operator.decide import decide
from vgpu_operator.plan import Plan
from vgpu_operator.registry import load_observed_from_manifests
from vgpu_operator.render import device_plugin as dp
from vgpu_operator.render import scheduler_conf
from vgpu_operator.validate import unknown_action_effect
from vgpu_operator.view import view_of

from vgpuctl.facts import (
    CONFIG_KEY,
    DEFAULT_NAMES,
    FLAG_RESOURCE,
    NAME_ATTR,
    ClusterFacts,
    show_version,
)
from vgpuctl.manifests import Prefilter, trim_document

ERROR, WARNING, INFO = "error", "warning", "info"
MAX_NAMES_SHOWN = 5  # nodes named per grouped finding; a 5,000-node cluster must stay readable

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Finding:
    severity: str
    code: str  # stable identifier for scripts, e.g. resource-name-mismatch
    place: str  # e.g. "DaemonSet kube-system/volcano-device-plugin"
    field: str  # e.g. "args --resource-name"
    message: str
    fix: str


def finding(rule: rules.Rule, place: str, field_name: str, message: str, case: str = "", /,
            **fix: Any) -> Finding:
    """A finding of a catalogue rule: its code, its severity (in `case`), its fix (`fix` fills
    the rule's template)."""
    return Finding(rule.at(case), rule.code, place, field_name, message, rule.fix_text(**fix))


@dataclass
class PodDiagnosis:
    pod: str  # namespace/name
    state: str  # phase / reason
    requests: dict[str, str]
    causes: list[str]
    fix: str
    found: bool = True  # False: nothing in the configuration explains it


@dataclass
class Report:
    versions: dict[str, str]
    names: dict[str, dict[str, str]]  # side -> kind -> name
    places: dict[str, str]  # role -> "Kind ns/name (found|missing)"
    findings: list[Finding] = field(default_factory=list)
    nodes: dict[str, int] = field(default_factory=dict)  # gpu nodes, registered, mismatched
    pods: list[PodDiagnosis] = field(default_factory=list)

    @property
    def problems(self) -> int:
        """Errors and warnings, plus pods whose failure the configuration explains."""
        findings = sum(1 for f in self.findings if f.severity in (ERROR, WARNING))
        return findings + sum(p.found for p in self.pods)

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.problems == 0,
            "versions": self.versions,
            "places": self.places,
            "resourceNames": self.names,
            "nodes": self.nodes,
            "findings": [asdict(f) for f in self.findings],
            "pods": [asdict(p) for p in self.pods],
        }


# --- the scheduler conf -------------------------------------------------------------------


def check_scheduler(facts: ClusterFacts) -> list[Finding]:
    s = facts.scheduler
    place = str(s.conf)
    if not s.conf.found:
        return [finding(rules.SCHEDULER_CONF_MISSING, place, "",
                        "the Volcano scheduler ConfigMap is not there")]
    if s.conf_error:
        return [finding(rules.SCHEDULER_CONF_INVALID, place, "volcano-scheduler.conf", s.conf_error)]
    out: list[Finding] = []
    if s.deviceshare is None:
        out.append(finding(rules.DEVICESHARE_MISSING, place, "tiers[].plugins",
                           "the deviceshare plugin is not enabled: the scheduler treats vGPU requests as "
                           "plain extended resources and writes no device annotations"))
        return out
    if not s.vgpu_enable:
        value = s.deviceshare.get(scheduler_conf.VGPU_ENABLE)
        quoted = f" ({_quoted_bool(value, s.version)})" if isinstance(value, str) else ""
        out.append(finding(rules.VGPU_DISABLED, place, "deviceshare.VGPUEnable",
                           f"deviceshare.VGPUEnable is not true{quoted}: vGPU pods get no device annotations "
                           "and fail at the kubelet with 'device request not found'"))
    # The checks the operator runs too (vgpu_operator.rules), on the conf as it is.
    conf = rules.SchedulerConf(tuple(s.plugins), s.deviceshare, s.actions)
    # With the version unknown a quoted "true" may be on (v1.15+): a gpushare conflict next to it
    # would make the scheduler exit, so it is checked as if it were.
    maybe_on = scheduler_conf.reads_true(s.deviceshare, scheduler_conf.VGPU_ENABLE, s.version,
                                         if_unknown=True)
    for hit in rules.check_scheduler_conf(conf, maybe_on, s.version):
        if hit.rule is rules.GPUSHARE_CONFLICT:
            when = "" if s.vgpu_enable else (
                "if this Volcano is v1.15 or later (its version is unknown), the quoted VGPUEnable is on "
                "and then ")
            out.append(finding(hit.rule, place, hit.subject, f"{when}{hit.subject} together with VGPUEnable "
                               "makes the scheduler exit (klog.Fatal)", argument=hit.subject))
        elif hit.rule is rules.UNKNOWN_ACTION:
            out.append(finding(hit.rule, place, "actions", f"action {hit.subject!r} is not one Volcano "
                               f"{s.version or '(version unknown)'} has: {unknown_action_effect(hit.case)}",
                               hit.case, argument=repr(hit.subject)))
        else:
            out.append(finding(hit.rule, place, "tiers[].plugins",
                               "the predicates plugin is not enabled: only it performs the device Allocate, "
                               "so no GPU is ever assigned"))
    if not s.cm_namespace_set:
        out.append(finding(rules.CM_NAMESPACE_UNSET, place, "deviceshare.KnownGeometriesCMNamespace",
                           f"not set: the scheduler reads device-config only from {s.cm_namespace} (the "
                           f"default) while the device plugin tries kube-system, then volcano-system; the "
                           f"two can read different copies",
                           namespace=facts.scheduler_config.place.namespace))
    return out


def _quoted_bool(value: object, version: versions.Version | None) -> str:
    """Why a string VGPUEnable reads as false, and the fix."""
    if version is not None and versions.reads_string_bools(version):
        return f"it is the string {value!r}, which Go's ParseBool does not take as true: write true"
    return (f"it is the string {value!r}; Volcano {version or 'of an unknown version'} reads only a "
            "YAML bool there before v1.15: write true without quotes")


# --- device-config ------------------------------------------------------------------------


def check_device_config(facts: ClusterFacts) -> list[Finding]:
    out: list[Finding] = []
    sc, pc = facts.scheduler_config, facts.plugin_config
    if not sc.place.found and pc.place.found:
        out.append(finding(rules.DEVICE_CONFIG_SPLIT, str(sc.place), "deviceshare.KnownGeometriesCMNamespace",
                           f"the scheduler reads {sc.place}, which does not exist, so it runs on built-in "
                           f"defaults; the device plugin reads {pc.place}",
                           how=f"set deviceshare.KnownGeometriesCMNamespace: {pc.place.namespace}"))
    elif not sc.place.found or sc.error:
        what = "is missing" if not sc.place.found else f"cannot be used: {sc.error}"
        out.append(finding(rules.DEVICE_CONFIG_UNREADABLE, str(sc.place), dc.CONFIGMAP_KEY,
                           f"the ConfigMap the scheduler reads {what}; the scheduler silently falls back to "
                           f"built-in defaults (vgpu-memory-percentage ignored, no MIG geometries)",
                           "" if sc.place.found else rules.MISSING))
    if sc.place.found and pc.place.found and sc.place != pc.place and sc.text != pc.text:
        out.append(finding(rules.DEVICE_CONFIG_SPLIT, f"{sc.place} and {pc.place}", dc.CONFIGMAP_KEY,
                           f"the scheduler reads {sc.place} but the device plugin reads {pc.place}, and "
                           f"their contents differ",
                           how="keep one copy and point deviceshare.KnownGeometriesCMNamespace at it"))
    if sc.parsed is not None and sc.parsed.nvidia is not None and facts.scheduler.reads_config_names:
        nvidia = sc.parsed.nvidia
        for kind in ("count", "memory"):
            if getattr(nvidia, NAME_ATTR[kind]) in (None, ""):
                out.append(finding(rules.RESOURCE_NAME_EMPTY, str(sc.place), f"nvidia.{CONFIG_KEY[kind]}",
                                   f"{CONFIG_KEY[kind]} is absent: the scheduler does not fill in defaults, "
                                   f"so it looks for an empty resource name and no pod counts as a vGPU pod",
                                   key=CONFIG_KEY[kind], default=DEFAULT_NAMES[kind]))
    return out


# --- names: scheduler vs plugin vs versions -----------------------------------------------


def check_names(facts: ClusterFacts) -> list[Finding]:
    out: list[Finding] = []
    plugin = facts.plugin
    if not plugin.daemonset.found:
        return [finding(rules.PLUGIN_MISSING, str(plugin.daemonset), "",
                        "no volcano-device-plugin DaemonSet found: nothing registers vGPU resources")]
    sched_names = facts.scheduler_names()
    plugin_names = facts.plugin_names()
    s = facts.scheduler
    sched_where = (f"{facts.scheduler_config.place}: nvidia.%s" if s.reads_config_names
                   else f"hard-coded in Volcano {show_version(s.version)}")
    for kind in ("count", "memory", "cores"):
        want, (have, source) = sched_names[kind], plugin_names[kind]
        if not want or want == have:
            continue
        setting = sched_where % CONFIG_KEY[kind] if "%s" in sched_where else sched_where
        if plugin.generation == "legacy":
            how = (f"add `{FLAG_RESOURCE[kind]}={want}` to the args of container {plugin.container} in "
                   f"{plugin.daemonset}, or set {CONFIG_KEY[kind]}: {have}")
            field_name = f"{CONFIG_KEY[kind]} vs {FLAG_RESOURCE[kind]}"
        else:
            how = f"use a name in the volcano.sh/ domain in {CONFIG_KEY[kind]}"
            field_name = CONFIG_KEY[kind]
        out.append(finding(
            rules.RESOURCE_NAME_MISMATCH, str(plugin.daemonset), field_name,
            f"the scheduler's {kind} resource is {want} ({setting}), but the device plugin "
            f"({show_version(plugin.version)}, {plugin.generation}) registers {have} ({source}); pods asking "
            f"for {want} find no allocatable, pods asking for {have} are not vGPU pods to the scheduler and "
            f"fail with UnexpectedAdmissionError 'device request not found'", how=how))
    accepted = plugin.traits.flags
    unknown = dp.edit_argv([], plugin.args, {}, None, accepted).dropped if accepted is not None else []
    if unknown and plugin.known_generation is None:
        # Guessed from the flags, not known: a v1.11 binary takes these.
        out.append(finding(rules.LEGACY_FLAGS, str(plugin.daemonset), "args " + " ".join(unknown),
                           f"the plugin generation cannot be told from image {plugin.image!r}; if it is "
                           f"v1.12+, it does not define {', '.join(unknown)} and exits on them",
                           rules.GUESSED, how="use an image tagged with its version (e.g. v1.12.0), or "
                                              "remove the flags if it is v1.12+"))
    elif unknown:
        out.append(finding(rules.LEGACY_FLAGS, str(plugin.daemonset), "args " + " ".join(unknown),
                           f"plugin {show_version(plugin.version)} does not define {', '.join(unknown)}: it "
                           f"rejects unknown flags and exits",
                           how="remove them (names and sizing come from device-config)"))
    out.extend(_check_custom_names(facts))
    # The checks the operator runs on the policy's names (vgpu_operator.rules). memoryPercentage
    # is the scheduler's alone: the plugin never registers it.
    registered = {k: sched_names[k] for k in CONFIG_KEY if sched_names.get(k)}
    if any(hit.rule is rules.NAME_OUTSIDE_DOMAIN
           for hit in rules.check_registered_names(plugin.generation, registered)):
        out.append(finding(rules.NAME_OUTSIDE_DOMAIN, str(facts.plugin_config.place),
                           "nvidia.resource*Name", "plugin v1.12+ prefixes names outside volcano.sh/ "
                           "(nvidia.com/gpu becomes volcano.sh/nvidia.com/gpu), so they never match"))
    longest = plugin.traits.max_resource_name
    names = {kind: name for kind, (name, _) in plugin_names.items()}
    too_long = [names[hit.subject] for hit in rules.check_registered_names(plugin.generation, names)
                if hit.rule is rules.NAME_TOO_LONG]
    if too_long:
        out.append(finding(rules.NAME_TOO_LONG, str(facts.plugin_config.place), "nvidia.resource*Name",
                           f"plugin {show_version(plugin.version)} silently skips resource names longer than "
                           f"{longest} characters (volcano.sh/ included): {', '.join(too_long)} never "
                           "appear on the nodes"))
    out.extend(_check_version_skew(facts))
    out.extend(_check_sizing_flags(facts))
    return out


def _check_custom_names(facts: ClusterFacts) -> list[Finding]:
    """Custom names in the scheduler's device-config that its Volcano does not take: the check the
    operator runs on the policy's names (vgpu_operator.rules), one finding per way it fails."""
    s = facts.scheduler
    view = dc.scheduler_view(facts.scheduler_config.parsed) if facts.scheduler_config.parsed else None
    configured = {kind: getattr(view, NAME_ATTR[kind]) or "" for kind in CONFIG_KEY} if view else {}
    hits = rules.check_custom_names(s.version, configured)
    out: list[Finding] = []
    for case in (rules.NODES_IGNORED, rules.HARD_CODED):
        custom = [configured[hit.subject] for hit in hits if hit.case == case]
        if not custom:
            continue
        if case == rules.NODES_IGNORED:
            message = (f"Volcano {show_version(s.version)} ignores nodes unless volcano.sh/vgpu-number, "
                       f"-memory and -cores are allocatable, so custom names ({', '.join(custom)}) make "
                       "every GPU node invisible")
        else:
            message = (f"Volcano {show_version(s.version)} hard-codes volcano.sh/vgpu-*: the custom "
                       f"names {', '.join(custom)} in device-config are ignored")
        out.append(finding(rules.CUSTOM_NAMES_UNSUPPORTED, str(s.deployment), "image", message, case))
    return out


def _check_version_skew(facts: ClusterFacts) -> list[Finding]:
    s, p = facts.scheduler, facts.plugin
    if s.version is None or p.version is None:
        return []
    if versions.needs_handshake(s.version) and not versions.plugin_writes_handshake(p.version):
        return [finding(rules.VERSION_SKEW, str(p.daemonset), "image",
                        f"Volcano {show_version(s.version)} needs the volcano.sh/node-vgpu-handshake "
                        f"annotation, which plugin {show_version(p.version)} no longer writes: every GPU "
                        f"node is ignored",
                        how="use plugin <= v1.12.0 with this Volcano, or Volcano >= 1.15.1")]
    if versions.needs_six_field_register(s.version) and not versions.plugin_writes_six_fields(p.version):
        return [finding(rules.VERSION_SKEW, str(p.daemonset), "image",
                        f"plugin {show_version(p.version)} writes 5-field register records; Volcano "
                        f"{show_version(s.version)} needs 6 and rejects the node", how="upgrade the plugin")]
    return []


def _check_sizing_flags(facts: ClusterFacts) -> list[Finding]:
    """Sizing as the plugin runs with it (`versions.effective_sizing`): a flag value it rejects, a
    flag that beats the device-config the scheduler reads, a value it cannot run with."""
    p = facts.plugin
    parsed = facts.plugin_config.parsed
    configured = parsed.nvidia.to_yaml_dict() if parsed is not None and parsed.nvidia is not None else {}
    # A generation guessed from the flags (unknown image tag) makes no error.
    case, guessed = ("", "") if p.known_generation is not None else (
        rules.GUESSED, f" (if it is {p.generation}: its image does not tell)")
    out: list[Finding] = []
    if p.shell:
        out.append(finding(rules.FLAGS_IN_SHELL_SCRIPT, str(p.daemonset), "command",
                           f"container {p.container!r} runs the device plugin from a shell script, whose "
                           "flags cannot be read: the sizing it runs with where a flag decides it is not "
                           "checked, nor can the operator edit them",
                           "" if p.traits.flags is not None else rules.SWITCH_ONLY))
    for flag, key in versions.SIZING_KEYS.items():
        if flag == "device-cores-scaling" and not p.traits.applies_core_scaling:
            continue  # 100 core devices per GPU whatever it says
        if facts.sizing_hidden(flag):
            continue  # not the flag's default: the script may set it
        found, where = facts.sizing(flag)
        value = configured.get(key)
        if found.value is None:
            kind = "a number" if flag == "device-cores-scaling" else "a whole number of 0 or more"
            out.append(finding(rules.SIZING_FLAG_REJECTED, str(p.daemonset), f"--{flag}",
                               f"{where}: the plugin ({show_version(p.version)}) parses it as {kind}, "
                               f"rejects it and exits {1 if p.traits.go_flags else 2} at start{guessed}",
                               case, flag=flag))
        elif found.source in ("flag", "flag default") and value is not None and value != found.value:
            ignored = ("ignores the ConfigMap value" if p.traits.sizing == "flags"
                       else "a given flag overrides the ConfigMap, which the scheduler reads")
            fix = (f"set `--{flag}={value}` in the plugin args" if p.traits.sizing == "flags"
                   else f"remove --{flag} from the plugin's args")
            out.append(finding(rules.SIZING_MISMATCH, str(p.daemonset), f"{key} vs --{flag}",
                               f"device-config says {key}: {value}, but the {p.generation} plugin uses "
                               f"{where}: it {ignored}", how=fix))
        elif found.value == 0 and flag == "gpu-memory-factor":
            out.append(finding(rules.MEMORY_FACTOR_ZERO, str(facts.plugin_config.place), key,
                               f"the plugin ({show_version(p.version)}) runs with {key} 0 ({where}) and "
                               f"divides device memory by it: it panics at start{guessed}", case,
                               key=key, place=facts.plugin_config.place))
        elif found.value == 0 and flag == "device-cores-scaling":
            out.append(finding(rules.CORE_SCALING_ZERO, str(facts.plugin_config.place), key,
                               f"the plugin ({show_version(p.version)}) runs with {key} 0 ({where}) and "
                               "registers 100 x 0 = no core devices: pods asking for vGPU cores never fit",
                               key=key, place=facts.plugin_config.place))
    return out


def _listed(names: list[str]) -> str:
    """The first MAX_NAMES_SHOWN of `names`, and how many more."""
    more = len(names) - MAX_NAMES_SHOWN
    return ", ".join(names[:MAX_NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")


def check_memory_only(facts: ClusterFacts) -> list[Finding]:
    """Containers of Volcano's pods asking the scheduler's memory resource without its count
    resource, where the device plugin in place does not serve them: upstream's answers their
    Allocate empty (the container runs with no limit and without libvgpu.so, on the GPUs its
    image names, while the scheduler counts a share for an app container; its pod never leaves
    bind-phase allocating); ours serves app containers but refuses init containers."""
    names = facts.scheduler_names()
    memory, count = names.get("memory"), names.get("count")
    plugin_names = facts.plugin_names()
    # Under other memory names no node has that allocatable: the name mismatch, reported as
    # such (check_names).
    if not memory or not count or not facts.plugin.daemonset.found or plugin_names["memory"][0] != memory:
        return []
    # Asking memory alone: besides it, only the cores or memory-percentage names; a container
    # asking any other extended resource (an old count name, say) is a naming problem.
    alone = {memory, names.get("cores"), names.get("memoryPercentage"), plugin_names["cores"][0]} - {None, ""}
    upstream = facts.plugin.generation != "builtin"
    found: list[str] = []
    for pod in facts.pods:
        spec = pod.get("spec") or {}
        if spec.get("schedulerName") != "volcano" or (pod.get("status") or {}).get("phase") in (
                "Succeeded", "Failed"):
            continue
        for key in ("initContainers", "containers") if upstream else ("initContainers",):
            for c in spec.get(key) or []:
                limits = (c.get("resources") or {}).get("limits") or {}
                if quantity_or_zero(limits.get(memory)) > 0 and all(
                        key in alone for key in limits if "/" in key):
                    found.append(f"{pod_key(pod)} container {c.get('name', '')}")
    if not found:
        return []
    shown = _listed(found)
    if not upstream:
        return [finding(rules.MEMORY_ONLY_CONTAINER, "Pods", "resources.limits",
                        f"init containers asking for {memory} without {count}: {shown}. Such a container "
                        "has no share of its own, and the device plugin refuses its pod",
                        how=f"add {count}: 1 to those init containers' limits (they then borrow the "
                            "first share)")]
    plugin = facts.plugin
    guessed = plugin.known_generation is None
    which = (f"the device plugin ({show_version(plugin.version)}, {plugin.generation}"
             + (f", guessed from image {plugin.image!r}: if it is upstream's" if guessed else "") + ")")
    return [finding(rules.MEMORY_ONLY_CONTAINER, "Pods", "resources.limits",
                    f"containers asking for {memory} without {count}: {shown}. The scheduler gives each "
                    f"app container one GPU (an init container none), but {which} answers their "
                    "Allocate empty, so they run with no memory or SM limit (and without libvgpu.so), on "
                    "whatever GPUs their image names (a pod with such an app container never leaves "
                    "bind-phase allocating)",
                    rules.GUESSED if guessed else "",
                    how=f"add {count}: 1 to those containers' limits, or deploy this project's device "
                        "plugin (chart value devicePlugin.enabled), which serves them")]


# --- nodes --------------------------------------------------------------------------------


# Node findings are grouped by (rule, field, message, fix).
NodeGroups = dict[tuple[rules.Rule, str, str, str], list[str]]


def _grouped(rule: rules.Rule, field_name: str, message: str, fix: str, nodes: list[str]) -> Finding:
    shown = _listed(nodes)
    noun = "Node" if len(nodes) == 1 else f"{len(nodes)} nodes"
    return Finding(rule.severity, rule.code, f"{noun} {shown}", field_name, message, fix)


def check_nodes(facts: ClusterFacts) -> tuple[list[Finding], dict[str, int]]:
    """Node advertisement vs names, register annotations, split counts; grouped per problem."""
    sched = facts.scheduler_names()
    plugin_names = _registered(facts)
    groups: NodeGroups = defaultdict(list)
    counts = {"gpuNodes": 0, "registered": 0, "withProblems": 0}
    names = set(plugin_names.values()) | {v for v in sched.values() if v}
    for node in facts.nodes:
        meta = node.get("metadata") or {}
        name = str(meta.get("name", ""))
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        raw = (meta.get("annotations") or {}).get(ann.NODE_REGISTER)
        if raw is None and not any(n in allocatable for n in names):
            continue
        counts["gpuNodes"] += 1
        before = sum(len(v) for v in groups.values())
        _check_one_node(facts, name, raw, allocatable, sched, plugin_names, groups)
        counts["registered"] += raw is not None
        counts["withProblems"] += sum(len(v) for v in groups.values()) > before
    findings = [_grouped(*key, nodes=nodes) for key, nodes in groups.items()]
    present = {str((n.get("metadata") or {}).get("name")) for n in facts.nodes}
    if facts.node_config_parsed is not None:
        stale = [e.name for e in facts.node_config_parsed.nodeconfig if e.name not in present]
        if stale:
            findings.append(finding(rules.NODE_CONFIG_STALE, str(facts.node_config), "config.json nodeconfig",
                                    f"entries for nodes that do not exist: "
                                    f"{', '.join(stale[:MAX_NAMES_SHOWN])}"))
    if facts.node_config_parsed is not None:
        # The check the operator runs on the policy's overrides (vgpu_operator.rules); entries of
        # nodes not there are node-config-stale.
        ignored = [e.name for e in facts.node_config_parsed.nodeconfig
                   if e.name in present and rules.check_node_settings(
                       facts.plugin.generation, e.devicesplitcount,
                       [*e.filterdevices.uuid, *e.filterdevices.index] if e.filterdevices else [])]
        if ignored:
            findings.append(finding(rules.LEGACY_IGNORES, str(facts.node_config),
                                    "config.json devicesplitcount/filterdevices",
                                    f"the legacy plugin ({show_version(facts.plugin.version)}) ignores these "
                                    f"settings for {', '.join(ignored[:MAX_NAMES_SHOWN])}: split count comes "
                                    f"from --device-split-count only (volcano-vgpu-device-plugin #87)"))
    if facts.node_config_error:
        findings.append(finding(rules.NODE_CONFIG_INVALID, str(facts.node_config), "config.json",
                                facts.node_config_error))
    return findings, counts


def _check_one_node(
    facts: ClusterFacts,
    name: str,
    raw: str | None,
    allocatable: Mapping[str, Any],
    sched: Mapping[str, str],
    plugin_names: Mapping[str, str],
    groups: NodeGroups,
) -> None:
    if raw is None:
        rule = rules.NODE_NOT_REGISTERED
        groups[(rule, ann.NODE_REGISTER,
                "advertises vGPU resources but has no register annotation: the scheduler skips its GPUs",
                rule.fix_text())].append(name)
    else:
        try:
            devices = ann.decode_node_register(raw)
        except FormatError as err:
            rule = rules.NODE_REGISTER_INVALID
            groups[(rule, ann.NODE_REGISTER, f"cannot be decoded: {err.problem}",
                    err.fix or rule.fix_text())].append(name)
            devices = []
        expected, source = facts.expected_split(name)
        splits = sorted({d.count for d in devices})
        if (devices and facts.plugin.daemonset.found and expected is not None and splits != [expected]
                and not facts.sizing_hidden("device-split-count")):
            groups[(rules.SPLIT_COUNT_MISMATCH, f"{ann.NODE_REGISTER} count",
                    f"registers split count {'/'.join(map(str, splits))}, but the plugin's settings give "
                    f"{expected} ({source}): the plugin has not restarted since the change",
                    rules.SPLIT_COUNT_MISMATCH.fix_text())].append(name)
    count, memory = sched.get("count", ""), sched.get("memory", "")
    if (count and memory and memory in plugin_names.values()
            and quantity_or_zero(allocatable.get(count, 0)) > 0
            and quantity_or_zero(allocatable.get(memory, 0)) <= 0):
        # The plugin registers memory as one device per gpuMemoryFactor MiB: past the kubelet's
        # 4 MiB gRPC message the list never arrives and the node offers none.
        groups[(rules.LIST_AND_WATCH_TOO_LARGE, f"status.allocatable[{memory}]",
                f"advertises {count} but no {memory}: every pod asking for vGPU memory waits; the plugin's "
                "memory device list is likely over the kubelet's 4 MiB gRPC message limit",
                rules.LIST_AND_WATCH_TOO_LARGE.fix_text())].append(name)
    if count and quantity_or_zero(allocatable.get(count, 0)) <= 0:
        have = [n for n in sorted(set(plugin_names.values())) if n in allocatable]
        groups[(rules.NODE_ADVERTISEMENT, f"status.allocatable[{count}]",
                f"has no allocatable {count}, the name the scheduler counts; it advertises "
                f"{', '.join(have) or 'no vGPU resource'}", rules.NODE_ADVERTISEMENT.fix_text())].append(name)
    if facts.scheduler.requires_hard_coded_allocatable:
        missing = [n for n in DEFAULT_NAMES.values() if quantity_or_zero(allocatable.get(n, 0)) <= 0]
        if missing:
            groups[(rules.NODE_IGNORED_BY_SCHEDULER, "status.allocatable",
                    f"lacks {', '.join(missing)}: Volcano {show_version(facts.scheduler.version)} "
                    f"ignores the node", rules.NODE_IGNORED_BY_SCHEDULER.fix_text())].append(name)


# --- pods ---------------------------------------------------------------------------------


def pod_key(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def _extended_requests(pod: Obj) -> dict[str, str]:
    out: dict[str, str] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        for key, value in limits.items():
            if "/" in key:
                out[key] = str(value)
    return out


# Text that every pod doctor explains unasked contains (a cheap test before parsing the pod).
# "allocating": under upstream's plugin a pod with a container asking memory alone never leaves
# that bind-phase, running (check_memory_only).
TROUBLE_MARKERS = ("UnexpectedAdmissionError", "Pending", "allocating")


def is_failed_admission(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("reason") == "UnexpectedAdmissionError"


def is_waiting(pod: Obj, names: Iterable[str]) -> bool:
    """Pending, unbound, asking for a vGPU name: explained when the configuration is the cause."""
    status = pod.get("status") or {}
    wanted = set(_extended_requests(pod))
    return status.get("phase") == "Pending" and not (pod.get("spec") or {}).get("nodeName") and bool(
        wanted & set(names))


def diagnose_pod(facts: ClusterFacts, pod: Obj) -> PodDiagnosis:
    """Why this pod fails (or would fail) with "device request not found", most specific first."""
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    requests = _extended_requests(pod)
    sched = facts.scheduler_names()
    plugin = _registered(facts)
    s = facts.scheduler
    causes: list[str] = []
    fixes: list[str] = []
    recognised = [n for n in requests if n in (sched["count"], sched["memory"]) and n]
    registered = [n for n in requests if n in plugin.values()]
    state = f"{status.get('phase', 'Unknown')}" + (f" ({status['reason']})" if status.get("reason") else "")

    if spec.get("schedulerName") != "volcano":
        causes.append(f"schedulerName is {spec.get('schedulerName') or 'default-scheduler'}, not volcano: no "
                      f"scheduler writes {ann.DEVICES_TO_ALLOCATE}")
        fixes.append("set spec.schedulerName: volcano")
    if s.deviceshare is None or not s.vgpu_enable:
        causes.append(f"the scheduler's deviceshare.VGPUEnable is off ({s.conf}): it writes no device "
                      f"annotations")
        fixes.append("enable deviceshare.VGPUEnable")
    elif not s.predicates:
        causes.append("the scheduler's predicates plugin is off: no device is ever assigned")
        fixes.append("enable the predicates plugin")
    if requests and not recognised:
        causes.append(
            f"the pod asks for {', '.join(sorted(requests))}; the scheduler (Volcano "
            f"{show_version(s.version)}, reading {facts.scheduler_config.place}) counts vGPU pods by "
            f"{sched['count']} or {sched['memory']}, so it is not a vGPU pod and gets no "
            f"{ann.DEVICES_TO_ALLOCATE}")
    for key in requests:
        if key in recognised and key not in plugin.values():
            kind = next(k for k in ("count", "memory") if sched[k] == key)
            causes.append(
                f"the scheduler counts {key}, but the device plugin ({show_version(facts.plugin.version)}, "
                f"{facts.plugin.generation}) registers {plugin.get(kind, '?')} "
                f"({facts.plugin_names()[kind][1] if plugin else 'no plugin'}): no node has {key} "
                f"allocatable from this plugin")
            if facts.plugin.generation == "legacy":
                fixes.append(f"add --resource-name={key} to {facts.plugin.daemonset} "
                             f"(container {facts.plugin.container})" if kind == "count" else
                             f"add {FLAG_RESOURCE[kind]}={key} to {facts.plugin.daemonset}")
    for key in registered:
        if key not in recognised and sched.get("count") != key:
            causes.append(f"{key} is registered by the plugin but unknown to the scheduler: the kubelet "
                          f"calls Allocate, which finds no NVIDIA entry: 'device request not found'")
    if recognised and not annotations.get(ann.DEVICES_TO_ALLOCATE) and status.get("reason") == (
            "UnexpectedAdmissionError"):
        causes.append(
            f"the pod has no {ann.DEVICES_TO_ALLOCATE}: the scheduler did not allocate devices for it. The "
            f"scheduler reads device-config once at start; if {facts.scheduler_config.place} was edited "
            f"after that, it still uses the old names")
        fixes.append(f"restart the scheduler (kubectl -n {s.conf.namespace} rollout restart deployment "
                     f"{s.deployment.name if s.deployment else 'volcano-scheduler'})")
    if annotations.get(ann.BIND_PHASE) == ann.BIND_PHASE_SUCCESS and status.get("reason") == (
            "UnexpectedAdmissionError"):
        causes.append(f"{ann.DEVICES_TO_ALLOCATE} was already consumed (bind-phase success): a second "
                      "Allocate, e.g. an init container asking for the count resource")
    if any(set((c.get("resources") or {}).get("limits") or {}) & {sched["count"]}
           for c in spec.get("initContainers") or []):
        causes.append(f"an init container asks for {sched['count']}: it consumes the first app container's "
                      "devices and the next Allocate fails")
        fixes.append("remove vGPU resources from init containers")
    found = bool(causes)
    if not found:
        causes.append("no cause found in the configuration: the four places agree for this pod")
    if status.get("phase") == "Failed":
        fixes.append("then delete and recreate the pod: a Failed pod is not retried")
    fix = "; ".join(dict.fromkeys(fixes))
    if found:
        fix = rules.APPLY_POLICY + (f"; or by hand: {fix}" if fix else "")
    return PodDiagnosis(pod=pod_key(pod), state=state, requests=requests, causes=causes, fix=fix, found=found)


# --- the report ---------------------------------------------------------------------------


def diagnose(facts: ClusterFacts, pod: str | None = None, extra: Iterable[Finding] = ()) -> Report:
    """The whole report; `pod` ("ns/name") adds that pod's diagnosis even if it looks fine;
    `extra` findings (the policy's validation) are sorted in with the rest."""
    s, p = facts.scheduler, facts.plugin
    plugin_names = _registered(facts)
    report = Report(
        versions={
            "volcano": f"{show_version(s.version)} ({s.image or 'scheduler Deployment not found'})",
            "devicePlugin": f"{show_version(p.version)} {p.generation} ({p.image or 'DaemonSet not found'})",
        },
        names={"scheduler": facts.scheduler_names(), "devicePlugin": plugin_names},
        places={
            "schedulerConf": _shown(s.conf),
            "deviceConfig (scheduler)": _shown(facts.scheduler_config.place),
            "deviceConfig (plugin)": _shown(facts.plugin_config.place),
            "devicePlugin": _shown(p.daemonset),
            "nodeConfig": _shown(facts.node_config),
        },
    )
    report.findings += check_scheduler(facts)
    report.findings += check_device_config(facts)
    report.findings += check_names(facts)
    report.findings += check_memory_only(facts)
    node_findings, report.nodes = check_nodes(facts)
    report.findings += node_findings
    report.findings += extra
    watched = {n for n in (*report.names["scheduler"].values(), *plugin_names.values()) if n}
    for obj in facts.pods:
        if pod_key(obj) == pod or is_failed_admission(obj):
            report.pods.append(diagnose_pod(facts, obj))
        elif is_waiting(obj, watched):
            diagnosis = diagnose_pod(facts, obj)
            if diagnosis.found:
                report.pods.append(diagnosis)
    order = {ERROR: 0, WARNING: 1, INFO: 2}
    report.findings.sort(key=lambda f: order.get(f.severity, 3))
    return report


def policy_findings(objects: list[dict[str, Any]]) -> list[Finding]:
    """The operator's own validation of each VGPUPolicy found, as findings."""
    out: list[Finding] = []
    for obj in objects:
        if obj.get("kind") != KIND:
            continue
        name = str((obj.get("metadata") or {}).get("name", ""))
        try:
            policy = VGPUPolicy.from_object(dict(obj))
        except pydantic.ValidationError as err:
            first = err.errors()[0]
            where = ".".join(map(str, first["loc"]))
            out.append(finding(rules.POLICY_INVALID, f"VGPUPolicy {name}", where, first["msg"]))
            continue
        view = view_of(load_observed_from_manifests(objects, policy.spec), policy)
        decision = decide(policy, view)  # what the operator does with it, the same decision
        for problem in decision.found:
            out.append(Finding(problem.severity, f"policy-{problem.reason}", f"VGPUPolicy {name}",
                               problem.field + (f" [{problem.object}]" if problem.object else ""),
                               problem.message, "edit the policy (the message says how)"))
        out += _plan_findings(name, decision.plan)
    return out


def _plan_findings(name: str, plan: Plan | None) -> list[Finding]:
    """What the operator's next reconcile writes, leaves (drift under driftPolicy Report, paused)
    and restarts: the plan the operator computes, not a second opinion."""
    if plan is None:
        return []
    out: list[Finding] = []
    for decision in plan.decisions:
        if decision.write or decision.state in ("Drifted", "Missing"):
            verb = ("repair" if decision.repair else "write") if decision.write else "leave"
            out.append(finding(rules.POLICY_PLAN, f"VGPUPolicy {name}", decision.target.ref,
                               f"{verb}: {decision.message}"))
    if plan.restarts:
        restarts = ", ".join(r.target if r.kind != "plugin-pod" else f"plugin pod on {r.target}"
                             for r in plan.restarts[:MAX_NAMES_SHOWN])
        more = len(plan.restarts) - MAX_NAMES_SHOWN
        out.append(finding(rules.POLICY_PLAN, f"VGPUPolicy {name}", "restarts",
                           f"restart {restarts}" + (f" and {more} more" if more > 0 else "")))
    return out


class DoctorPrefilter(Prefilter):
    """What doctor reads: Nodes trimmed to name, labels, annotations and allocatable; only the
    pods it may explain (see TROUBLE_MARKERS, or the one named with --pod); everything else whole."""

    NODE_FIELDS: ClassVar[dict[str, frozenset[str] | None]] = {
        "apiVersion": None, "kind": None,
        "metadata": frozenset({"name", "labels", "annotations"}),
        "status": frozenset({"allocatable"}),
    }

    def __init__(self, pod: str | None = None) -> None:
        self.markers = (*TROUBLE_MARKERS, pod.rsplit("/", 1)[-1]) if pod else TROUBLE_MARKERS

    def __call__(self, kind: str, text: str) -> str | None:
        if kind == "Node":
            return trim_document(text, self.NODE_FIELDS)
        if kind == "Pod":
            return text if any(marker in text for marker in self.markers) else None
        return text


def _registered(facts: ClusterFacts) -> dict[str, str]:
    """The names the plugin registers (count, memory, cores); none without a plugin."""
    if not facts.plugin.daemonset.found:
        return {}
    return {kind: name for kind, (name, _) in facts.plugin_names().items()}


def _shown(place: Any) -> str:
    return f"{place} ({'found' if place.found else 'missing'})"
