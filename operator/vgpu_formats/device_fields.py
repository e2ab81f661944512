"""The one table of the `nvidia:` keys a VGPUPolicy sets: policy field <-> device-config key <->
legacy plugin flag.

Each row says where the value lives in the policy (`spec.device.deviceSplitCount`), its key in
the `nvidia:` section of `device-config.yaml`, the legacy plugin flag that sets the same thing
(v1.11's, which this project's plugin also takes) with how its value parses, and what the v1.11
binary uses when that flag is absent. The built-in default (when the ConfigMap leaves the key
out) is this project's plugin's, `device_config.builtin_plugin_defaults`, which is also the
policy's.

Read by the operator's renderer (policy -> device-config), `vgpuctl import` (device-config and
flags -> policy), `vgpuctl`'s facts (which flag names which resource), `vgpu_operator.versions`
(flag defaults and sizing) and the device plugin (flag vs ConfigMap). Adding a key the policy
sets is one row here, plus the field in `device_config.NvidiaConfig` and in the policy model.
Policy values are plain data with the policy's camelCase keys (`spec_data`: the `spec` mapping).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from vgpu_formats import device_config as dc

SPEC = "spec."


@dataclass(frozen=True)
class DeviceField:
    """One `nvidia:` key the policy sets."""

    policy: str  # path in the VGPUPolicy, e.g. spec.device.deviceSplitCount
    key: str  # key in the nvidia: section, e.g. deviceSplitCount
    type: type  # the value's type in the policy; also how a flag's text parses (int("4"))
    flag: str | None = None  # legacy plugin flag, e.g. --device-split-count
    legacy_default: str | None = None  # what the v1.11 binary uses when the flag is absent
    omit_empty: bool = False  # rendered only when set (an empty resourcePriorityName is left out)

    @property
    def attr(self) -> str:
        """The `device_config.NvidiaConfig` attribute of `key`."""
        return _attributes()[self.key]

    @property
    def name(self) -> str:
        """The last part of the policy path: `count`, `deviceSplitCount`."""
        return self.policy.rsplit(".", 1)[-1]

    @property
    def flag_name(self) -> str:
        """The flag without dashes (`device-split-count`); "" when there is none."""
        return self.flag.removeprefix("--") if self.flag else ""

    @property
    def flag_dest(self) -> str:
        """The flag as an argparse destination (`device_split_count`)."""
        return self.flag_name.replace("-", "_")

    @property
    def default(self) -> Any:
        """The value used when the ConfigMap leaves the key out (this project's plugin, the
        scheduler's built-in defaults, the policy's defaults)."""
        return getattr(dc.builtin_plugin_defaults(), self.attr)

    def parse_flag(self, text: str) -> Any:
        """A flag's text as this project's plugin (argparse `type=`) reads it; ValueError if not."""
        return self.type(text)


FIELDS: tuple[DeviceField, ...] = (
    DeviceField("spec.resources.count", "resourceCountName", str, "--resource-name",
                dc.DEFAULT_COUNT_NAME),
    DeviceField("spec.resources.memory", "resourceMemoryName", str, "--resource-memory-name",
                dc.DEFAULT_MEMORY_NAME),
    DeviceField("spec.resources.memoryPercentage", "resourceMemoryPercentageName", str),
    DeviceField("spec.resources.cores", "resourceCoreName", str, "--resource-core-name",
                dc.DEFAULT_CORE_NAME),
    DeviceField("spec.resources.priority", "resourcePriorityName", str, omit_empty=True),
    DeviceField("spec.device.overwriteEnv", "overwriteEnv", bool),
    DeviceField("spec.device.defaults.memory", "defaultMemory", int),
    DeviceField("spec.device.defaults.cores", "defaultCores", int),
    DeviceField("spec.device.defaults.gpuNum", "defaultGPUNum", int),
    # v1.11 defaults: volcano-vgpu-device-plugin v1.11 main.go (operator/README.md, "Plugin generations").
    DeviceField("spec.device.deviceSplitCount", "deviceSplitCount", int, "--device-split-count", "2"),
    DeviceField("spec.device.deviceMemoryScaling", "deviceMemoryScaling", float),
    DeviceField("spec.device.deviceCoreScaling", "deviceCoreScaling", float, "--device-cores-scaling", "1"),
    DeviceField("spec.device.disableCoreLimit", "disableCoreLimit", bool),
    DeviceField("spec.device.gpuMemoryFactor", "gpuMemoryFactor", int, "--gpu-memory-factor", "1"),
    # The policy's null means "the table the plugin generation ships" (the renderer fills it).
    DeviceField("spec.device.knownMigGeometries", "knownMigGeometries", list),
)
BY_KEY: dict[str, DeviceField] = {f.key: f for f in FIELDS}
# The resource names the plugin registers (count, memory, cores), by the policy's name for them;
# memoryPercentage is the scheduler's alone.
NAME_FIELDS: dict[str, DeviceField] = {f.name: f for f in FIELDS
                                       if f.policy.startswith("spec.resources.") and f.flag}
# The sizing settings a legacy flag also sets, by flag name (device-split-count, ...).
SIZING_FIELDS: dict[str, DeviceField] = {f.flag_name: f for f in FIELDS
                                         if f.policy.startswith("spec.device.") and f.flag}
FLAGGED: tuple[DeviceField, ...] = tuple(f for f in FIELDS if f.flag)


@cache
def _attributes() -> dict[str, str]:
    return {str(info.alias or name): name for name, info in dc.NvidiaConfig.model_fields.items()}


def _path(field: DeviceField) -> list[str]:
    return field.policy.removeprefix(SPEC).split(".")


def policy_value(spec_data: Mapping[str, Any], field: DeviceField) -> Any:
    """The field's value in the policy's spec data (None: absent)."""
    value: Any = spec_data
    for part in _path(field):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def set_policy_value(spec_data: dict[str, Any], field: DeviceField, value: Any) -> None:
    """Set the field in the policy's spec data, creating the mappings on the way."""
    *parents, last = _path(field)
    node = spec_data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def to_nvidia(spec_data: Mapping[str, Any]) -> dict[str, Any]:
    """The `nvidia:` keys the policy sets, as YAML data (`omit_empty` fields left out when empty)."""
    out: dict[str, Any] = {}
    for field in FIELDS:
        value = policy_value(spec_data, field)
        if not (field.omit_empty and not value):
            out[field.key] = value
    return out


def from_nvidia(nvidia: dc.NvidiaConfig) -> dict[str, Any]:
    """The policy's spec data for each field `nvidia` sets (absent keys left out), in the
    policy's types (YAML `1` for a float field becomes 1.0)."""
    spec: dict[str, Any] = {}
    for field in FIELDS:
        value = getattr(nvidia, field.attr)
        if value is None or (field.omit_empty and not value):
            continue
        if field.type is list:
            value = [item.model_dump(by_alias=True, mode="json") for item in value]
        set_policy_value(spec, field, field.type(value))
    return spec
