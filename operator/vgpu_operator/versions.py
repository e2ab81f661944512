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
