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
3. current: tag version >= v1.12.0 (sizing from the ConfigMap; unknown flags make it exit).
4. otherwise: cannot tell.

Volcano facts (research: volcano-scheduler.md §6):

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
from typing import Any, Literal

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
# separate value). urfave/cli exits 1 on any other flag; its own `-h`/`--help` and `-v`/`--version`
# are left out on purpose: they make the plugin print and exit, and `-v=4` (klog's verbosity to
# v1.11) is "invalid boolean value".
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
# What the v1.11 binary uses for an absent sizing or name flag.
LEGACY_FLAG_DEFAULTS: dict[str, str] = {
    "resource-name": "volcano.sh/vgpu-number", "resource-memory-name": "volcano.sh/vgpu-memory",
    "resource-core-name": "volcano.sh/vgpu-cores", "device-split-count": "2", "gpu-memory-factor": "1",
    "device-cores-scaling": "1"}
VOLCANO_PREFIX = "volcano.sh/"
# grpc-go's default receive limit, which the kubelet keeps for ListAndWatch.
KUBELET_MESSAGE_LIMIT = 4 * 1024 * 1024
_HEALTHY = "Healthy"

MigTable = Literal["v1.11", "v1.12"]


@dataclass(frozen=True)
class PluginTraits:
    """What one device plugin generation does with the settings the operator renders."""

    flags: dict[str, bool] | None  # the flags its binary accepts (True: a switch); None: any
    split_default: int  # split count with neither a flag nor a ConfigMap value
    memory_ids: Literal["index", "uuid"]  # memory device ids `<index>-<i>` or `<UUID>-memory-<i>`
    caps_memory_list: bool  # shrinks an oversized ListAndWatch list (else the kubelet drops it)
    max_resource_name: int | None  # longest name it registers, prefix included (None: Kubernetes')
    forces_volcano_prefix: bool  # registers `volcano.sh/<name>` for a name outside volcano.sh/
    applies_core_scaling: bool  # deviceCoreScaling changes its cores list and CUDA_OVERSUBSCRIBE
    applies_disable_core_limit: bool  # disableCoreLimit reaches GPU_CORE_UTILIZATION_POLICY
    applies_memory_scaling: bool  # node-config devicememoryscaling scales registered memory
    applies_node_split_and_filters: bool  # node-config devicesplitcount and filterdevices apply
    implements_mps: bool
    fixed_device_config_place: bool  # reads only volcano-vgpu-device-config in kube-/volcano-system
    mig_table: MigTable  # the knownMigGeometries table its manifest ships


PLUGIN_TRAITS: dict[Generation, PluginTraits] = {
    "legacy": PluginTraits(
        flags=None, split_default=int(LEGACY_FLAG_DEFAULTS["device-split-count"]), memory_ids="index",
        caps_memory_list=False, max_resource_name=None, forces_volcano_prefix=False,
        applies_core_scaling=False, applies_disable_core_limit=False, applies_memory_scaling=False,
        applies_node_split_and_filters=False, implements_mps=False, fixed_device_config_place=True,
        mig_table="v1.11"),
    "current": PluginTraits(
        flags=CURRENT_FLAGS, split_default=0, memory_ids="uuid", caps_memory_list=False,
        max_resource_name=63, forces_volcano_prefix=True, applies_core_scaling=True,
        applies_disable_core_limit=False, applies_memory_scaling=False,
        applies_node_split_and_filters=True, implements_mps=False, fixed_device_config_place=True,
        mig_table="v1.12"),
    # Ours: split 10 is the Volcano scheduler's own default, so both sides agree without a ConfigMap.
    "builtin": PluginTraits(
        flags=None, split_default=10, memory_ids="index", caps_memory_list=True, max_resource_name=None,
        forces_volcano_prefix=False, applies_core_scaling=True, applies_disable_core_limit=True,
        applies_memory_scaling=True, applies_node_split_and_filters=True, implements_mps=True,
        fixed_device_config_place=False, mig_table="v1.12"),
}


def plugin_traits(generation: Generation | None) -> PluginTraits:
    """The traits of `generation`; cannot tell (None): current's, the strictest."""
    return PLUGIN_TRAITS[generation or "current"]


def registered_name(generation: Generation | None, name: str) -> str:
    """The resource name the plugin registers for a configured `name`."""
    if plugin_traits(generation).forces_volcano_prefix and not name.startswith(VOLCANO_PREFIX):
        return VOLCANO_PREFIX + name
    return name


def memory_list_bytes(generation: Generation | None, gpus: list[tuple[str, int]]) -> int:
    """Wire size of the memory resource's ListAndWatch message: `gpus` is (UUID, devices) per GPU
    in NVML index order. Each entry is Device{ID, health "Healthy"} in field 1, every length one
    byte (ids stay under 128 bytes)."""
    uuid_ids = plugin_traits(generation).memory_ids == "uuid"
    total = 0
    for index, (uuid, units) in enumerate(gpus):
        prefix = len(f"{uuid}-memory-") if uuid_ids else len(f"{index}-")
        for digits in range(1, len(str(max(units, 1))) + 1):
            count = max(0, min(units, 10 ** digits) - (10 ** (digits - 1) if digits > 1 else 0))
            total += count * (2 + 2 + prefix + digits + 2 + len(_HEALTHY))
    return total
