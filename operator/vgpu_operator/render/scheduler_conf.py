"""Render the Volcano scheduler ConfigMap: the `deviceshare` plugin with our arguments.

Surgical: the conf is parsed as Volcano reads it (`yamlio`) and only the deviceshare plugin's
arguments we own are set (`OWNED_ARGUMENTS`); every other tier, plugin, argument, top-level key
and value type stays as it was, in its order, with its comments and anchors (`rewrite`). When
deviceshare is absent it is inserted right before `predicates` in predicates' tier: Volcano calls
device Allocate only from predicates, and the user guide lists deviceshare before it. Without
predicates it goes at the end of the last tier (validation warns). When the result means the
same as the live conf, the live text is kept.
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

import yaml
from vgpu_formats import annotations as ann
from vgpu_formats import device_config as dc_fmt
from vgpu_formats.rewrite import rewrite

from vgpu_operator import versions
from vgpu_operator.api import VGPUPolicySpec
from vgpu_operator.render.inputs import (
    DEVICESHARE,
    InputError,
    find_plugin,
    short_hash,
)
from vgpu_operator.render.target import TargetRender, configmap_target, failed_target, missing_target

if TYPE_CHECKING:
    from vgpu_operator.view import ClusterView

PLUGIN = DEVICESHARE
VGPU_ENABLE = "deviceshare.VGPUEnable"
SCHEDULE_POLICY = "deviceshare.SchedulePolicy"
SCHEDULE_WEIGHT = "deviceshare.ScheduleWeight"
NODE_LOCK = "deviceshare.NodeLockEnable"
CM_NAME = "deviceshare.KnownGeometriesCMName"
CM_NAMESPACE = "deviceshare.KnownGeometriesCMNamespace"
EXCLUSIVE_RULES = "deviceshare.GPUExclusiveRules"
OWNED_ARGUMENTS = (VGPU_ENABLE, SCHEDULE_POLICY, SCHEDULE_WEIGHT, NODE_LOCK, CM_NAME, CM_NAMESPACE,
                   EXCLUSIVE_RULES)
# The gpushare device's switches: with VGPUEnable the scheduler exits (klog.Fatal).
GPUSHARE_ARGUMENTS = ("deviceshare.GPUSharingEnable", "deviceshare.GPUNumberEnable")
# Read once per scheduler process (sync.Once): changing them needs a scheduler restart.
RESTART_ARGUMENTS = (VGPU_ENABLE, CM_NAME, CM_NAMESPACE)
# What Volcano uses for an absent argument (docs/upstream.md §1.1).
UPSTREAM_DEFAULTS: dict[str, Any] = {VGPU_ENABLE: False, SCHEDULE_WEIGHT: 0, NODE_LOCK: False,
                                     CM_NAME: dc_fmt.CONFIGMAP_NAME, CM_NAMESPACE: dc_fmt.DEFAULT_NAMESPACE}


def desired_arguments(spec: VGPUPolicySpec) -> dict[str, Any]:
    """Our deviceshare arguments; a None value means "remove the argument"."""
    sched = spec.scheduler
    return {
        VGPU_ENABLE: True,
        SCHEDULE_POLICY: None if sched.schedule_policy == "unset" else sched.schedule_policy,
        SCHEDULE_WEIGHT: sched.schedule_weight,  # an int: Volcano ignores a quoted "10"
        NODE_LOCK: sched.node_lock_enable,
        CM_NAME: spec.targets.device_config.name,
        CM_NAMESPACE: spec.targets.device_config.namespace,
        # unset leaves the live rules alone (not ours then)
        **({EXCLUSIVE_RULES: sched.gpu_exclusive_rules} if sched.gpu_exclusive_rules is not None else {}),
    }


def is_enabled(arguments: dict[str, Any] | None, key: str) -> bool:
    """A bool argument as Volcano's GetBool reads it: a YAML bool, or a string Go's
    strconv.ParseBool takes as true. Anything else (an integer 1 too) leaves the default, false."""
    value = (arguments or {}).get(key)
    if isinstance(value, bool):
        return value
    return isinstance(value, str) and value in ann.GO_TRUE


def actions_of(conf: dict[str, Any]) -> str:
    """The conf's `actions` line ("" when absent or not a string, as Volcano would not read it)."""
    actions = conf.get("actions")
    return actions if isinstance(actions, str) else ""


def reads_true(arguments: dict[str, Any] | None, key: str, version: Any | None,
               if_unknown: bool = False) -> bool:
    """A bool argument as the given Volcano (a versions.Version) reads it: a YAML bool, or from
    1.15 a string ParseBool takes as true. With the version not known, a string ParseBool takes as
    true counts as `if_unknown` (the caller picks the safe side)."""
    value = (arguments or {}).get(key)
    if isinstance(value, bool):
        return value
    if version is None:
        return if_unknown and is_enabled(arguments, key)
    return versions.reads_string_bools(version) and is_enabled(arguments, key)


def restart_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments the scheduler reads only at start, absent ones as the scheduler defaults them.
    Compared as written: a quoted VGPUEnable "true" rolls the scheduler once when the conf gets a
    real `true`, since Volcano before 1.15 reads only a YAML bool there (its GetBool) and would
    otherwise keep vGPU off until some other restart."""
    return {key: arguments.get(key, UPSTREAM_DEFAULTS[key]) for key in RESTART_ARGUMENTS}


# Absent arguments that mean their default without a word. An absent KnownGeometriesCMNamespace
# is not among them: `vgpuctl doctor` flags it (the scheduler and the plugin look for device-config
# in different places), so the operator always spells it out.
SILENT_DEFAULTS = {key: value for key, value in UPSTREAM_DEFAULTS.items() if key != CM_NAMESPACE}


def _spelled_out(conf: dict[str, Any]) -> str:
    """`conf` with absent deviceshare arguments written as their defaults, as canonical JSON: two
    confs with equal results mean the same to Volcano. JSON keeps types apart (`true` vs `1`,
    `10` vs `"10"`: Volcano ignores a wrongly typed argument)."""
    conf = copy.deepcopy(conf)
    plugin = find_plugin(conf, PLUGIN)
    if plugin is not None and isinstance(plugin.get("arguments") or {}, dict):
        plugin["arguments"] = {**SILENT_DEFAULTS, **(plugin.get("arguments") or {})}
    return json.dumps(conf, sort_keys=True, default=str)


def live_arguments(view: ClusterView) -> dict[str, Any] | None:
    """deviceshare's live arguments ({} when the plugin is absent); None when the conf is unusable."""
    try:
        conf = view.scheduler_conf()
    except InputError:
        return None
    plugin = find_plugin(conf, PLUGIN)
    arguments = (plugin or {}).get("arguments")
    return dict(arguments) if isinstance(arguments, dict) else {}


def apply_arguments(conf: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """A copy of `conf` with deviceshare present and carrying `arguments`."""
    conf = copy.deepcopy(conf)
    plugin = find_plugin(conf, PLUGIN)
    if plugin is None:
        plugin = {"name": PLUGIN}
        _insert(conf, plugin)
    current = plugin.get("arguments")
    args: dict[str, Any] = dict(current) if isinstance(current, dict) else {}
    for key, value in arguments.items():
        if value is None:
            args.pop(key, None)
        else:
            args[key] = value  # an existing key keeps its position
    plugin["arguments"] = args
    return conf


def _insert(conf: dict[str, Any], plugin: dict[str, Any]) -> None:
    tiers = conf["tiers"]
    for tier in tiers:
        plugins = tier.get("plugins") if isinstance(tier, dict) else None
        if isinstance(plugins, list):
            for index, existing in enumerate(plugins):
                if isinstance(existing, dict) and existing.get("name") == "predicates":
                    plugins.insert(index, plugin)
                    return
    with_plugins = [t for t in tiers if isinstance(t, dict) and isinstance(t.get("plugins"), list)]
    if not with_plugins:
        tiers.append({"plugins": [plugin]})
    else:
        with_plugins[-1]["plugins"].append(plugin)


def dump_conf(conf: dict[str, Any]) -> str:
    """Deterministic block YAML."""
    return yaml.safe_dump(conf, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)


def render_scheduler_conf_target(view: ClusterView) -> TargetRender:
    sched = view.spec.scheduler
    live = view.scheduler_configmap
    if live is None:
        return missing_target("ConfigMap", sched.namespace, sched.config_map, "spec.scheduler.configMap",
                              "SchedulerConfigMapNotFound", "install Volcano or point "
                              "spec.scheduler.namespace/configMap at its scheduler ConfigMap")
    try:
        conf = view.scheduler_conf()
    except InputError as err:
        return failed_target("ConfigMap", sched.namespace, sched.config_map, live, err.problem)
    arguments = desired_arguments(view.spec)
    desired = apply_arguments(conf, arguments)
    same = _spelled_out(desired) == _spelled_out(conf)
    text = None if same else rewrite(view.scheduler_conf_text(sched.key) or "", desired, dump_conf)
    return configmap_target(sched.namespace, sched.config_map, sched.key, live, text, short_hash(arguments))
