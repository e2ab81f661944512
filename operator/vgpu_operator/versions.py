"""Which Volcano and which device plugin generation the cluster runs, and what each supports.

Versions come from image tags (`docker.io/volcanosh/vc-scheduler:v1.13.0`). A tag that is not a
version (`latest`, a digest, `my-build`) gives a "cannot tell" result (`version is None`) with a
`detail` that validation turns into a Problem asking the user to set
`spec.scheduler.volcanoVersion` / `spec.devicePlugin.generation` explicitly.

Device plugin generation rule (first match wins):

1. builtin: the container runs this project's plugin: its image repository's last path component
   is one of `BUILTIN_IMAGE_NAMES` (`vgpu-device-plugin`, `vgpu-deviceplugin`, `vgpu-operator`),
   or its command is our console script `deviceplugin`. Upstream's image is
   `volcano-vgpu-device-plugin`, which this rule does not match.
2. legacy: tag version <= v1.11.x (flags `--resource-*`, sizing from args).
3. current: tag version >= v1.12.0 (sizing from the ConfigMap unless a flag is given; unknown
   flags make it exit).
4. otherwise: cannot tell.

Volcano facts (docs/upstream.md §3):

* custom resource names are read from the device-config from v1.13.0;
* v1.14.3+, v1.15.1+ and v1.16 skip nodes whose allocatable lacks the hard-coded
  `volcano.sh/vgpu-*` names (the backport reached v1.14.3 as well as v1.15.1), so custom names
  work only on v1.13.0-v1.14.2 and v1.15.0;
* the device-config ConfigMap and KnownGeometries* arguments exist from v1.12.0.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from vgpu_formats import device_config as dc
from vgpu_formats import device_fields
from vgpu_formats import list_and_watch as lw
from vgpu_formats import node_config as nc

Generation = Literal["legacy", "current", "builtin"]
BUILTIN_IMAGE_NAMES = frozenset({"vgpu-device-plugin", "vgpu-deviceplugin", "vgpu-operator"})
BUILTIN_COMMANDS = frozenset({"deviceplugin"})
SCHEDULER_CONTAINER = "volcano-scheduler"
_SPEC_GENERATIONS: dict[str, Generation] = {"legacy": "legacy", "current": "current", "builtin": "builtin"}

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+.]([0-9A-Za-z.-]+))?$")


@dataclass(frozen=True, order=True)
class Version:
    """major.minor.patch; a pre-release (`-alpha.1`) sorts before its release."""

    major: int
    minor: int
    patch: int = 0
    release: int = 1  # 0 for a pre-release, so v1.16.0-alpha.1 < v1.16.0
    pre: str = ""

    def __str__(self) -> str:
        return f"v{self.major}.{self.minor}.{self.patch}" + (f"-{self.pre}" if self.pre else "")


def parse_version(text: str) -> Version | None:
    """`v1.13.0`, `1.13`, `v1.16.0-alpha.1` -> Version; anything else -> None."""
    match = _VERSION_RE.match(text.strip())
    if not match:
        return None
    major, minor, patch, pre = match.groups()
    return Version(int(major), int(minor), int(patch or 0), 0 if pre else 1, pre or "")


def split_image(image: str) -> tuple[str, str | None]:
    """(repository, tag or None). `reg:5000/a/b:v1@sha256:..` -> (`reg:5000/a/b`, `v1`)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1:]
    return name, None


@dataclass(frozen=True)
class VolcanoVersion:
    """The Volcano version in use, or None with the reason it cannot be told."""

    version: Version | None
    source: str  # "spec" | "image" | "none"
    detail: str


def volcano_version(spec_version: str, deployment: dict[str, Any] | None) -> VolcanoVersion:
    """From `spec.scheduler.volcanoVersion`, or (when `auto`) the scheduler Deployment's image tag."""
    if spec_version != "auto":
        parsed = parse_version(spec_version)
        if parsed is None:
            return VolcanoVersion(None, "spec", f"spec.scheduler.volcanoVersion {spec_version!r} is not a "
                                                "version like v1.13.0")
        return VolcanoVersion(parsed, "spec", f"set in the policy: {parsed}")
    if deployment is None:
        return VolcanoVersion(None, "none", "the scheduler Deployment was not found")
    container = _pick_container(deployment, SCHEDULER_CONTAINER,
                                lambda c: "scheduler" in str(c.get("image", "")))
    if container is None:
        return VolcanoVersion(None, "none", "the scheduler Deployment has no containers")
    image = str(container.get("image", ""))
    _, tag = split_image(image)
    parsed = parse_version(tag) if tag else None
    if parsed is None:
        return VolcanoVersion(None, "image", f"cannot tell the Volcano version from image {image!r}")
    return VolcanoVersion(parsed, "image", f"from image {image}")


@dataclass(frozen=True)
class PluginGeneration:
    """The device plugin generation, or None with the reason it cannot be told."""

    generation: Generation | None
    source: str  # "spec" | "image" | "none"
    detail: str
    version: Version | None = None


def plugin_generation(spec_generation: str, daemonset: dict[str, Any] | None,
                      container_name: str) -> PluginGeneration:
    """From `spec.devicePlugin.generation`, or (when `auto`) the plugin container's image."""
    explicit = _SPEC_GENERATIONS.get(spec_generation)
    if explicit is not None:
        return PluginGeneration(explicit, "spec", f"set in the policy: {explicit}")
    if daemonset is None:
        return PluginGeneration(None, "none", "the device plugin DaemonSet was not found")
    container = _pick_container(daemonset, container_name, None)
    if container is None:
        return PluginGeneration(None, "none", f"the DaemonSet has no container named {container_name!r}")
    return generation_of_container(container)


def generation_of_container(container: dict[str, Any]) -> PluginGeneration:
    """Apply the module's generation rule to one container."""
    image = str(container.get("image", ""))
    repository, tag = split_image(image)
    raw_command = container.get("command")
    command = [str(part) for part in raw_command] if isinstance(raw_command, list) else []
    if repository.rsplit("/", 1)[-1] in BUILTIN_IMAGE_NAMES or (
            command and command[0].rsplit("/", 1)[-1] in BUILTIN_COMMANDS):
        return PluginGeneration("builtin", "image", f"this project's device plugin ({image})")
    parsed = parse_version(tag) if tag else None
    if parsed is None:
        detail = f"cannot tell the device plugin generation from image {image!r}"
        return PluginGeneration(None, "image", detail)
    generation: Generation = "legacy" if (parsed.major, parsed.minor) < (1, 12) else "current"
    return PluginGeneration(generation, "image", f"{generation} (image {image})", parsed)


def _pick_container(workload: dict[str, Any], name: str,
                    fallback: Callable[[dict[str, Any]], bool] | None) -> dict[str, Any] | None:
    spec = workload.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    pod = template.get("spec") if isinstance(template, dict) else None
    found = pod.get("containers") if isinstance(pod, dict) else None
    containers = [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []
    for container in containers:
        if container.get("name") == name:
            return dict(container)
    if fallback is None:
        return None
    for container in containers:
        if fallback(container):
            return dict(container)
    return dict(containers[0]) if containers else None


# --- what a Volcano version supports -------------------------------------------------------------


def has_deviceshare(version: Version) -> bool:
    """The `deviceshare` plugin (and `deviceshare.VGPUEnable`) exists from v1.9.0; v1.8 used
    `predicate.VGPUEnable` on the predicates plugin, which this operator does not render."""
    return (version.major, version.minor) >= (1, 9)


def needs_handshake(version: Version) -> bool:
    """Does the scheduler skip nodes without a fresh `volcano.sh/node-vgpu-handshake` (v1.9.0 to
    v1.14.2, and v1.15.0; the backport removed it from v1.14.3 and v1.15.1)?"""
    key = (version.major, version.minor, version.patch)
    return (1, 9, 0) <= key < (1, 14, 3) or key == (1, 15, 0)


def reads_string_bools(version: Version) -> bool:
    """Does the scheduler's GetBool also parse a string (strconv.ParseBool)? From v1.15.0, its
    release: v1.15.0-alpha.0 does not (pkg/scheduler/framework/arguments.go of each tag)."""
    return version >= Version(1, 15, 0)


def has_gang_actions(version: Version) -> bool:
    """The gangpreempt and gangreclaim actions exist from v1.15 (pkg/scheduler/actions/factory.go)."""
    return (version.major, version.minor) >= (1, 15)


def skips_unknown_actions(version: Version) -> bool:
    """v1.12 and v1.13 log an unknown action name and skip it; every other version rejects the
    whole scheduler conf (pkg/scheduler/util.go of each tag)."""
    return (version.major, version.minor) in ((1, 12), (1, 13))


def needs_six_field_register(version: Version) -> bool:
    """Does the scheduler reject 5-field register records (v1.12.0+, the mode field)?"""
    return version >= Version(1, 12, 0)


def plugin_writes_handshake(version: Version) -> bool:
    """Upstream plugins after v1.12.0 no longer write the handshake annotation."""
    return version <= Version(1, 12, 0)


def plugin_writes_six_fields(version: Version) -> bool:
    """Upstream plugins from v1.10.0 write 6-field register records."""
    return version >= Version(1, 10, 0)


def reads_custom_resource_names(version: Version) -> bool:
    """Does the scheduler take request names from the device-config (v1.13.0+)?"""
    return (version.major, version.minor) >= (1, 13)


def requires_builtin_resource_names(version: Version) -> bool:
    """Does node discovery need allocatable under the hard-coded `volcano.sh/vgpu-*` names?"""
    key = (version.major, version.minor, version.patch)
    return key >= (1, 15, 1) or ((1, 14, 3) <= key < (1, 15, 0))


def custom_resource_names_work(version: Version) -> bool:
    """Custom names work end to end only where both sides above allow them."""
    return reads_custom_resource_names(version) and not requires_builtin_resource_names(version)


# --- what a device plugin generation does ---------------------------------------------------------
# Each fact with its upstream file and line: operator/README.md, "Plugin generations".

# Every flag the v1.12.0 binary defines, aliases included (True: a switch, which never takes a
# separate value); tests/fixtures/upstream/v1.12.0-flags.txt is the upstream list. urfave/cli exits
# 1 on any other flag; its own `-h`/`--help` and `-v`/`--version` are left out on purpose: they make
# the plugin print and exit, and `-v=4` (klog's verbosity to v1.11) is "invalid boolean value".
CURRENT_FLAGS: dict[str, bool] = {
    "mig-strategy": False, "fail-on-init-error": True, "driver-root": False, "nvidia-driver-root": False,
    "dev-root": False, "nvidia-dev-root": False, "pass-device-specs": True, "device-list-strategy": False,
    "device-id-strategy": False, "gdrcopy-enabled": True, "gds-enabled": True, "mofed-enabled": True,
    "cdi-annotation-prefix": False, "nvidia-cdi-hook-path": False, "nvidia-ctk-path": False,
    "driver-root-ctr-path": False, "container-driver-root": False, "mps-root": False,
    "device-discovery-strategy": False, "imex-channel-ids": False, "imex-required": True,
    "kubelet-socket": False, "config-file": False, "cdi-feature-flags": False,
    "device-split-count": False, "gpu-memory-factor": False, "device-cores-scaling": False,
}
# Switches of v1.11 (its own and klog's) that a v1.12 DaemonSet may still carry: dropping one must
# not take the next arg with it.
LEGACY_SWITCHES = frozenset({"debug", "fail-on-init-error", "logtostderr", "alsologtostderr",
                             "add_dir_header", "skip_headers", "skip_log_headers", "one_output"})
# Volcano's hard-coded resource names (before v1.13 it knows no others), per kind.
DEFAULT_NAMES: dict[str, str] = {"count": dc.DEFAULT_COUNT_NAME, "memory": dc.DEFAULT_MEMORY_NAME,
                                 "cores": dc.DEFAULT_CORE_NAME}
# The v1.11 flag that names each resource kind; absent, the binary uses the hard-coded name.
# Flags, keys and defaults come from the one field table, vgpu_formats.device_fields.
SizingFlag = Literal["device-split-count", "gpu-memory-factor", "device-cores-scaling"]
# Each sizing flag and the device-config key it stands for.
SIZING_KEYS: dict[SizingFlag, str] = {flag: device_fields.SIZING_FIELDS[flag].key
                                      for flag in get_args(SizingFlag)}
# What the v1.11 binary uses for an absent name or sizing flag.
LEGACY_FLAG_DEFAULTS: dict[str, str] = {f.flag_name: str(f.legacy_default) for f in device_fields.FLAGGED}
VOLCANO_PREFIX = "volcano.sh/"

MigTable = Literal["v1.11", "v1.12"]
# Which setting wins for the split count, gpuMemoryFactor and deviceCoreScaling: `flags` only (the
# ConfigMap and node-config are ignored), or node-config, then the flag or the ConfigMap first.
SizingRule = Literal["flags", "flag over config", "config over flag"]


@dataclass(frozen=True)
class PluginTraits:
    """What one device plugin generation does with the settings the operator renders."""

    flags: dict[str, bool] | None  # the flags its binary accepts (True: a switch); None: any
    sizing: SizingRule
    # An absent device-config key reads as Go's zero value (v1.12: gpuMemoryFactor 0 divides by
    # zero and panics, deviceCoreScaling 0 registers no core devices) or as our plugin's default.
    absent_config_key: Literal["zero", "default"]
    go_flags: bool  # Go's flag parsing: a negative count flag (`--device-split-count -4`) exits 1
    clamps_sizing: bool  # a split count or gpuMemoryFactor below 1 runs as 1 (else as is)
    memory_ids: Literal["index", "uuid"]  # memory device ids `<index>-<i>` or `<UUID>-memory-<i>`
    caps_memory_list: bool  # shrinks an oversized ListAndWatch list (else the kubelet drops it)
    max_resource_name: int | None  # longest name it registers, prefix included (None: Kubernetes')
    forces_volcano_prefix: bool  # registers `volcano.sh/<name>` for a name outside volcano.sh/
    applies_core_scaling: bool  # deviceCoreScaling sets how many core devices it registers per GPU
    applies_disable_core_limit: bool  # disableCoreLimit reaches GPU_CORE_UTILIZATION_POLICY
    applies_memory_scaling: bool  # node-config devicememoryscaling scales registered memory
    applies_node_split_and_filters: bool  # node-config devicesplitcount and filterdevices apply
    implements_mps: bool  # operatingmode mps
    implements_mig: bool  # operatingmode mig: Allocate of the scheduler's dynamic MIG instances
    fixed_device_config_place: bool  # reads only volcano-vgpu-device-config in kube-/volcano-system
    mig_table: MigTable  # the knownMigGeometries table its manifest ships


PLUGIN_TRAITS: dict[Generation, PluginTraits] = {
    "legacy": PluginTraits(
        flags=None, sizing="flags", absent_config_key="zero", go_flags=True, clamps_sizing=False,
        memory_ids="index", caps_memory_list=False, max_resource_name=None, forces_volcano_prefix=False,
        applies_core_scaling=False, applies_disable_core_limit=False, applies_memory_scaling=False,
        applies_node_split_and_filters=False, implements_mps=False, implements_mig=True,
        fixed_device_config_place=True, mig_table="v1.11"),
    "current": PluginTraits(
        flags=CURRENT_FLAGS, sizing="flag over config", absent_config_key="zero", go_flags=True,
        clamps_sizing=False, memory_ids="uuid", caps_memory_list=False, max_resource_name=63,
        forces_volcano_prefix=True, applies_core_scaling=True, applies_disable_core_limit=False,
        applies_memory_scaling=False, applies_node_split_and_filters=True, implements_mps=False,
        implements_mig=True, fixed_device_config_place=True, mig_table="v1.12"),
    # Ours, as deviceplugin/vgpu_deviceplugin/config.py (sizing, defaults) and allocate.py (hami-core
    # env only, dynamic MIG refused) do it; devicememoryscaling is ignored (deviceplugin/README.md).
    "builtin": PluginTraits(
        flags=None, sizing="config over flag", absent_config_key="default", go_flags=False,
        clamps_sizing=True, memory_ids="index", caps_memory_list=True, max_resource_name=None,
        forces_volcano_prefix=False, applies_core_scaling=True, applies_disable_core_limit=True,
        applies_memory_scaling=False, applies_node_split_and_filters=True, implements_mps=False,
        implements_mig=False, fixed_device_config_place=False, mig_table="v1.12"),
}


def plugin_traits(generation: Generation | None) -> PluginTraits:
    """The traits of `generation`; cannot tell (None): current's, the strictest."""
    return PLUGIN_TRAITS[generation or "current"]


def registered_name(generation: Generation | None, name: str) -> str:
    """The resource name the plugin registers for a configured `name`."""
    if plugin_traits(generation).forces_volcano_prefix and not name.startswith(VOLCANO_PREFIX):
        return VOLCANO_PREFIX + name
    return name


def plugin_config_view(generation: Generation | None, cfg: dc.DeviceConfig | None) -> dc.NvidiaConfig:
    """The `nvidia:` section as the plugin reads it (`cfg` None: missing or not loadable), each
    absent key filled as `absent_config_key` says."""
    zero = plugin_traits(generation).absent_config_key == "zero"
    return dc.plugin_view(cfg, dc.go_zero_values() if zero else dc.builtin_plugin_defaults())


_SIZING_FIELDS: dict[SizingFlag, str] = {flag: device_fields.SIZING_FIELDS[flag].attr for flag in SIZING_KEYS}
_NODE_FIELDS: dict[SizingFlag, str] = {"device-split-count": "devicesplitcount",
                                       "device-cores-scaling": "devicecorescaling"}


def parse_sizing_flag(generation: Generation | None, flag: SizingFlag, text: str) -> float | None:
    """The value the plugin's flag parsing takes from `text`; None: it rejects it and exits. Go
    (strconv.ParseUint base 0 for the counts, ParseFloat for the scaling) takes no sign on a
    count; ours (argparse int/float) takes one."""
    go = plugin_traits(generation).go_flags
    try:
        if flag == "device-cores-scaling":
            return float(text) if text == text.strip() else None
        if not go:
            return float(int(text))
        if text.startswith(("-", "+")):
            return None
        octal = len(text) > 1 and text[0] == "0" and text[1].isdigit()
        return float(int(text, 8) if octal else int(text, 0))
    except ValueError:
        return None


def decisive_flag(generation: Generation | None, flag: SizingFlag, values: list[str]) -> str | None:
    """Of a sizing flag given `values` (in order), the one that decides (None: not given): the
    first the binary rejects (it exits there), else the last (flag parsing keeps the last)."""
    rejected = [text for text in values if parse_sizing_flag(generation, flag, text) is None]
    return rejected[0] if rejected else (values[-1] if values else None)


SizingSource = Literal["node-config", "flag", "flag default", "device-config", "default"]


@dataclass(frozen=True)
class Sizing:
    """A sizing setting as the plugin runs with it, and which setting decided it."""

    value: float | None  # None: the binary rejects the flag's value and exits
    source: SizingSource


def effective_sizing(generation: Generation | None, flag: SizingFlag, flag_text: str | None,
                     cfg: dc.DeviceConfig | None, node: nc.NodeConfigEntry | None = None) -> Sizing:
    """The split count, gpuMemoryFactor or deviceCoreScaling the plugin uses, from its flag as
    written (None: not given), the device-config it reads and its node-config entry.

    legacy: the flag or its default, nothing else. current: node-config (when positive), a flag
    that is given, the ConfigMap, the zero value. builtin: node-config, the ConfigMap, the flag,
    our default; a split count or factor below 1 runs as 1."""
    traits = plugin_traits(generation)
    parsed = None if flag_text is None else parse_sizing_flag(generation, flag, flag_text)
    if flag_text is not None and parsed is None:
        return Sizing(None, "flag")
    if traits.sizing == "flags":
        if parsed is not None:
            return Sizing(parsed, "flag")
        return Sizing(float(LEGACY_FLAG_DEFAULTS[flag]), "flag default")
    nvidia = cfg.nvidia if cfg is not None else None
    given = getattr(nvidia, _SIZING_FIELDS[flag]) if nvidia is not None else None
    node_value = getattr(node, _NODE_FIELDS[flag]) if node is not None and flag in _NODE_FIELDS else None
    ordered: list[tuple[float | None, SizingSource]] = [(parsed, "flag"), (given, "device-config")]
    if traits.sizing == "config over flag":
        ordered.reverse()
    default = getattr(plugin_config_view(generation, None), _SIZING_FIELDS[flag])
    candidates = [(node_value if node_value and node_value > 0 else None, "node-config"), *ordered,
                  (default, "default")]
    value, source = next((float(v), s) for v, s in candidates if v is not None)
    if traits.clamps_sizing and flag != "device-cores-scaling" and value < 1:
        value = 1.0
    return Sizing(value, source)


def memory_list_bytes(generation: Generation | None, gpus: list[tuple[str, int]]) -> int:
    """Wire size of the memory resource's ListAndWatch message: `gpus` is (UUID, devices) per GPU
    in NVML index order, every device healthy."""
    uuid_ids = plugin_traits(generation).memory_ids == "uuid"
    return sum(lw.numbered_list_bytes(len(f"{uuid}-memory-") if uuid_ids else len(f"{index}-"), units)
               for index, (uuid, units) in enumerate(gpus))
