"""What a cluster runs today, read from its objects: the four places, the versions, the names.

Pure: a list of Kubernetes objects (from a live cluster or manifest files) in, a `ClusterFacts`
out. `doctor` judges these facts and `import` turns them into a VGPUPolicy. Upstream behaviour
encoded here (with the section of docs/upstream.md that states it):

* the scheduler reads device-config from deviceshare.KnownGeometriesCMName/Namespace only
  (default kube-system), once per process (docs/upstream.md §2.1, §1.3);
* Volcano < 1.13 uses hard-coded resource names, >= 1.13 the ConfigMap's (docs/upstream.md §3.1);
* a legacy plugin (<= v1.11) registers names from its --resource-* flags, defaulting to
  volcano.sh/vgpu-*; a current one (>= v1.12) from the ConfigMap it finds first in kube-system,
  then volcano-system, with the volcano.sh/ prefix forced (docs/upstream.md §3.4, §3.5).

What each plugin generation does (flag defaults, the prefix, split defaults) comes from
`vgpu_operator.versions`, the one place those rules live; the plugin's flags are read from its
`command` (after the binary) and `args` as the operator's render reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import yaml
from vgpu_formats import FormatError, device_fields, yamlio
from vgpu_formats import device_config as dc
from vgpu_formats import node_config as nc
from vgpu_operator import versions
from vgpu_operator.render import device_plugin as dp
from vgpu_operator.render import scheduler_conf as sc
from vgpu_operator.render.inputs import duplicated_plugin, tier_plugins
from vgpu_operator.versions import Version

from vgpuctl.manifests import object_key

Obj = Mapping[str, Any]

SCHEDULER_CONF_NAME = "volcano-scheduler-configmap"
SCHEDULER_CONF_KEY = "volcano-scheduler.conf"
SCHEDULER_DEPLOYMENT = "volcano-scheduler"
PLUGIN_DAEMONSET = "volcano-device-plugin"
PLUGIN_CONTAINER = "volcano-device-plugin"

# Legacy plugin flags and what they set (docs/upstream.md §4.1).
# Per resource kind (count, memory, cores): the flag, the device-config key and the NvidiaConfig
# attribute, from the one field table (vgpu_formats.device_fields).
FLAG_RESOURCE = {kind: str(f.flag) for kind, f in device_fields.NAME_FIELDS.items()}
DEFAULT_NAMES = versions.DEFAULT_NAMES
CONFIG_KEY = {kind: f.key for kind, f in device_fields.NAME_FIELDS.items()}
NAME_ATTR = {kind: f.attr for kind, f in device_fields.NAME_FIELDS.items()}  # kind -> NvidiaConfig attribute


def show_version(version: Version | None) -> str:
    return "unknown" if version is None else str(version)


@dataclass(frozen=True)
class Place:
    """Where an object is: kind, namespace, name, and whether it exists."""

    kind: str
    namespace: str
    name: str
    found: bool

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass
class SchedulerFacts:
    conf: Place
    conf_error: str = ""
    plugins: list[str] = field(default_factory=list)  # every plugin name in every tier
    deviceshare: dict[str, Any] | None = None  # its arguments, None when the plugin is absent
    actions: str = ""  # the `actions` line
    deployment: Place | None = None
    image: str = ""
    version: Version | None = None

    @property
    def vgpu_enable(self) -> bool:
        return sc.reads_true(self.deviceshare, sc.VGPU_ENABLE, self.version)

    @property
    def predicates(self) -> bool:
        return "predicates" in self.plugins

    def _string_arg(self, key: str, default: str) -> str:
        """A string argument as Volcano's GetString reads it: other YAML types are ignored."""
        value = (self.deviceshare or {}).get(key)
        return value if isinstance(value, str) and value else default

    @property
    def cm_namespace(self) -> str:
        return self._string_arg(sc.CM_NAMESPACE, dc.DEFAULT_NAMESPACE)

    @property
    def cm_namespace_set(self) -> bool:
        return isinstance((self.deviceshare or {}).get(sc.CM_NAMESPACE), str)

    @property
    def cm_name(self) -> str:
        return self._string_arg(sc.CM_NAME, dc.CONFIGMAP_NAME)

    @property
    def schedule_policy(self) -> str:
        return self._string_arg(sc.SCHEDULE_POLICY, "")

    @property
    def schedule_weight(self) -> int:
        value = (self.deviceshare or {}).get(sc.SCHEDULE_WEIGHT)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def reads_config_names(self) -> bool:
        """Volcano >= 1.13 takes request names from device-config (unknown version: assume so)."""
        return self.version is None or versions.reads_custom_resource_names(self.version)

    @property
    def requires_hard_coded_allocatable(self) -> bool:
        return self.version is not None and versions.requires_builtin_resource_names(self.version)


@dataclass
class PluginFacts:
    daemonset: Place
    container: str = PLUGIN_CONTAINER
    image: str = ""
    version: Version | None = None
    args: list[str] = field(default_factory=list)  # what the binary gets: flags in `command`, then `args`
    known_generation: versions.Generation | None = None  # None: cannot tell from the image
    shell: bool = False  # a shell script runs the binary: its flags cannot be read (`args` empty)

    @property
    def generation(self) -> versions.Generation:
        """legacy (<= v1.11: --resource-* flags), current (>= v1.12: names from the ConfigMap) or
        builtin (ours); from the image, else guessed from the flags."""
        if self.known_generation is not None:
            return self.known_generation
        return "legacy" if any(f in self.flags for f in FLAG_RESOURCE.values()) else "current"

    def device_config_places(self) -> list[tuple[str, str]]:
        """(namespace, name) of each device-config copy the plugin tries, in order: upstream
        plugins have them hard-coded; ours is told by flags (unset: the same places)."""
        flags = self.flags if self.generation == "builtin" else {}
        name = flags.get("--device-config-name") or dc.CONFIGMAP_NAME
        namespace = flags.get("--device-config-namespace")
        return [(namespace, name)] if namespace else [(ns, name) for ns in dc.PLUGIN_NAMESPACES]

    @property
    def flags(self) -> dict[str, str]:
        """`--flag=value` and `--flag value` args as a dict (bare flags map to "true")."""
        return dp.flag_values(self.args)

    @property
    def traits(self) -> versions.PluginTraits:
        return versions.plugin_traits(self.generation)

    def flag(self, name: versions.SizingFlag) -> str | None:
        """A sizing flag's value as written (None: not given): the last one, which wins, unless
        the binary rejects an earlier one (it exits there)."""
        values = [value for flag, value in dp.flag_pairs(self.args) if flag == f"--{name}"]
        return versions.decisive_flag(self.generation, name, values)


@dataclass(frozen=True)
class ConfigCopy:
    """One device-config ConfigMap: where, its text (None: key missing), its parse error if any."""

    place: Place
    text: str | None
    parsed: dc.DeviceConfig | None
    error: str = ""


@dataclass
class ClusterFacts:
    scheduler: SchedulerFacts
    plugin: PluginFacts
    scheduler_config: ConfigCopy  # what the scheduler reads
    plugin_config: ConfigCopy  # what the plugin finds first (kube-system, then volcano-system)
    node_config: Place
    node_config_parsed: nc.NodeConfig | None = None
    node_config_error: str = ""
    nodes: list[Obj] = field(default_factory=list)
    pods: list[Obj] = field(default_factory=list)
    policies: list[Obj] = field(default_factory=list)

    # Asked once per pod or node: worked out once (the facts are not changed after `gather`).
    def scheduler_names(self) -> dict[str, str]:
        """Resource names the scheduler recognises (count, memory, memory-percentage, cores)."""
        return dict(self._scheduler_names)

    def plugin_names(self) -> dict[str, tuple[str, str]]:
        """Names the plugin registers with the kubelet, each with where it comes from."""
        return dict(self._plugin_names)

    @cached_property
    def _scheduler_names(self) -> dict[str, str]:
        if not self.scheduler.reads_config_names:
            return {**DEFAULT_NAMES, "memoryPercentage": dc.DEFAULT_MEMORY_PERCENTAGE_NAME}
        view = dc.scheduler_view(self.scheduler_config.parsed)
        return {
            "count": view.resource_count_name or "",
            "memory": view.resource_memory_name or "",
            "memoryPercentage": view.resource_memory_percentage_name or "",
            "cores": view.resource_core_name or "",
        }

    @cached_property
    def _plugin_names(self) -> dict[str, tuple[str, str]]:
        out: dict[str, tuple[str, str]] = {}
        if self.plugin.generation == "legacy":
            flags = self.plugin.flags
            for kind, flag in FLAG_RESOURCE.items():
                if flag in flags:
                    out[kind] = (flags[flag], f"{flag}={flags[flag]}")
                else:
                    out[kind] = (DEFAULT_NAMES[kind], f"{flag} not set, default")
            return out
        if self.plugin.generation == "builtin":
            # Ours reads the scheduler's copy with its own defaults (ARCHITECTURE.md, the contract).
            effective = versions.plugin_config_view("builtin", self.scheduler_config.parsed)
            where = f"{self.scheduler_config.place}: "
            return {k: (getattr(effective, NAME_ATTR[k]) or "", where + CONFIG_KEY[k]) for k in CONFIG_KEY}
        nvidia = self.plugin_config.parsed.nvidia if self.plugin_config.parsed else None
        for kind, key in CONFIG_KEY.items():
            value = getattr(nvidia, NAME_ATTR[kind]) if nvidia is not None else None
            given = value or ""
            name = versions.registered_name(self.plugin.generation, given)
            source = f"{self.plugin_config.place}: {key}"
            if name != given:
                source += f" ({given or 'empty'}, volcano.sh/ prefix forced)"
            out[kind] = (name, source)
        return out

    def sizing(self, flag: versions.SizingFlag, node_name: str | None = None) -> tuple[versions.Sizing, str]:
        """A sizing setting as the plugin runs with it (on `node_name`, when given), and the
        setting that decides it, in words."""
        entry = self.node_config_entry(node_name) if node_name is not None else None
        found = versions.effective_sizing(self.plugin.generation, flag, self.plugin.flag(flag),
                                          self.plugin_config.parsed, entry)
        key = versions.SIZING_KEYS[flag]
        where = {
            "node-config": f"{self.node_config}: {node_name}.{key.lower()}",
            "flag": f"--{flag}={self.plugin.flag(flag)}",
            "flag default": f"--{flag} not set (default {versions.LEGACY_FLAG_DEFAULTS[flag]})",
            "device-config": f"{self.plugin_config.place}: {key}",
            "default": f"{key} not in {self.plugin_config.place} (the plugin's default)",
        }[found.source]
        return found, where

    def sizing_hidden(self, flag: versions.SizingFlag) -> bool:
        """Would a flag decide this setting, in a shell script no reader can see? Then what the
        plugin runs with cannot be told (not the flag's default)."""
        return self.plugin.shell and self.sizing(flag)[0].source == "flag default"

    def expected_split(self, node_name: str) -> tuple[int | None, str]:
        """The split count the plugin registers on a node (None: it exits on its flag), and which
        setting decides it."""
        found, where = self.sizing("device-split-count", node_name)
        return (None if found.value is None else int(found.value)), where

    def node_config_entry(self, node_name: str) -> nc.NodeConfigEntry | None:
        return self.node_config_parsed.entry_for(node_name) if self.node_config_parsed else None



def _find_by_name(objects: Iterable[Obj], kind: str, name: str) -> Obj | None:
    """The object of that kind and name, in any namespace (the first one wins)."""
    for obj in objects:
        if obj.get("kind") == kind and (obj.get("metadata") or {}).get("name") == name:
            return obj
    return None


def _place(kind: str, obj: Obj | None, namespace: str, name: str) -> Place:
    if obj is None:
        return Place(kind, namespace, name, False)
    meta = obj.get("metadata") or {}
    return Place(kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""), True)


def _containers(workload: Obj) -> list[Obj]:
    template = (workload.get("spec") or {}).get("template") or {}
    return list((template.get("spec") or {}).get("containers") or [])


def _scheduler(objects: Sequence[Obj]) -> SchedulerFacts:
    conf_obj = _find_by_name(objects, "ConfigMap", SCHEDULER_CONF_NAME)
    facts = SchedulerFacts(conf=_place("ConfigMap", conf_obj, "volcano-system", SCHEDULER_CONF_NAME))
    if conf_obj is not None:
        text = ((conf_obj.get("data") or {}).get(SCHEDULER_CONF_KEY))
        if text is None:
            facts.conf_error = f"key {SCHEDULER_CONF_KEY} is missing"
        else:
            _read_scheduler_conf(facts, text)
    deployment = _find_by_name(objects, "Deployment", SCHEDULER_DEPLOYMENT)
    facts.deployment = _place("Deployment", deployment, facts.conf.namespace, SCHEDULER_DEPLOYMENT)
    if deployment is not None:
        found = versions.volcano_version("auto", dict(deployment))
        facts.version = found.version
        facts.image = found.detail.removeprefix("from image ")
    return facts


def _read_scheduler_conf(facts: SchedulerFacts, text: str) -> None:
    try:
        conf = yamlio.load(text) or {}
    except yaml.YAMLError as err:
        facts.conf_error = f"{yamlio.describe(err)}; the scheduler keeps its previous configuration"
        return
    if not isinstance(conf, dict):
        facts.conf_error = "not a mapping; the scheduler keeps its previous configuration"
        return
    facts.actions = sc.actions_of(conf)
    duplicated = duplicated_plugin(conf, sc.PLUGIN)
    if duplicated:
        facts.conf_error = duplicated
        return
    for plugin in tier_plugins(conf):  # the operator's walk: malformed tiers and plugins skipped
        name = str(plugin.get("name", ""))
        facts.plugins.append(name)
        if name == sc.PLUGIN:
            args = plugin.get("arguments") or {}
            facts.deviceshare = dict(args) if isinstance(args, dict) else {}


def _config_copy(index: Mapping[tuple[str, str, str], Obj], namespace: str, name: str) -> ConfigCopy:
    obj = index.get(("ConfigMap", namespace, name))
    place = _place("ConfigMap", obj, namespace, name)
    if obj is None:
        return ConfigCopy(place, None, None, "not found")
    text = (obj.get("data") or {}).get(dc.CONFIGMAP_KEY)
    if text is None:
        return ConfigCopy(place, None, None, f"key {dc.CONFIGMAP_KEY} is missing")
    try:
        return ConfigCopy(place, text, dc.parse_device_config(text))
    except FormatError as err:
        return ConfigCopy(place, text, None, str(err))


def _plugin(objects: Sequence[Obj]) -> PluginFacts:
    ds = _find_by_name(objects, "DaemonSet", PLUGIN_DAEMONSET)
    facts = PluginFacts(daemonset=_place("DaemonSet", ds, "kube-system", PLUGIN_DAEMONSET))
    if ds is None:
        return facts
    containers = _containers(ds)
    container = next((c for c in containers if c.get("name") == PLUGIN_CONTAINER),
                     containers[0] if containers else {})
    facts.container = str(container.get("name", PLUGIN_CONTAINER))
    facts.image = str(container.get("image", ""))
    found = versions.generation_of_container(dict(container))
    facts.version, facts.known_generation = found.version, found.generation
    facts.args = dp.binary_args(container)
    command, _ = dp.container_argv(container)
    facts.shell = bool(command) and dp.command_flags(command) is None
    return facts


def gather(objects: Sequence[Obj]) -> ClusterFacts:
    """Read the four places, the versions, nodes, pods and VGPUPolicies from `objects`."""
    index = {object_key(obj): obj for obj in objects}
    scheduler = _scheduler(objects)
    plugin = _plugin(objects)
    scheduler_config = _config_copy(index, scheduler.cm_namespace, scheduler.cm_name)
    copies = [_config_copy(index, ns, name) for ns, name in plugin.device_config_places()]
    plugin_config = next((c for c in copies if c.place.found), copies[0])
    node_cfg_obj = _find_by_name(objects, "ConfigMap", nc.CONFIGMAP_NAME)
    facts = ClusterFacts(
        scheduler=scheduler,
        plugin=plugin,
        scheduler_config=scheduler_config,
        plugin_config=plugin_config,
        node_config=_place("ConfigMap", node_cfg_obj, "kube-system", nc.CONFIGMAP_NAME),
        nodes=[o for o in objects if o.get("kind") == "Node"],
        pods=[o for o in objects if o.get("kind") == "Pod"],
        policies=[o for o in objects if o.get("kind") == "VGPUPolicy"],
    )
    if node_cfg_obj is not None:
        text = (node_cfg_obj.get("data") or {}).get(nc.CONFIGMAP_KEY)
        if text is None:
            facts.node_config_error = f"key {nc.CONFIGMAP_KEY} is missing"
        else:
            try:
                facts.node_config_parsed = nc.parse_node_config(text)
            except FormatError as err:
                facts.node_config_error = str(err)
    return facts
