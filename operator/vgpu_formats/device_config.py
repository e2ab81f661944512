"""`device-config.yaml`: the vGPU settings the Volcano scheduler and the device plugin both read.

The ConfigMap `volcano-vgpu-device-config` (key `device-config.yaml`) holds one YAML document with
an `nvidia:` section and, on clusters that also share Ascend NPUs, a `vnpus:` section. Upstream
parses it with Go's non-strict yaml.v2 into `NvidiaConfig` (volcano
`pkg/scheduler/api/devices/config/vgpu.go`); a type error in any field makes the whole load fail.

Two readings of the same text matter, and they differ:

* `scheduler_view` is what Volcano's scheduler uses: absent fields keep Go zero values (an absent
  `resourceCountName` is the empty string, which disables vGPU detection); only a failed load
  gives the built-in defaults (and those leave `resourceMemoryPercentageName` empty).
* `plugin_view` is what a device plugin uses: each absent field filled with the plugin's own
  defaults, which differ by plugin (upstream ones keep Go zero values, `go_zero_values`; this
  project's uses `builtin_plugin_defaults`); `vgpu_operator.versions.plugin_config_view` picks them.

Every field of `NvidiaConfig` is Optional, so "absent" stays distinguishable from a value.
Parsing is strict (a wrong type is a `FormatError` naming ``device-config.yaml: nvidia.<key>``);
rendering is deterministic (upstream key order, absent fields left out).
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vgpu_formats import yamlio
from vgpu_formats.errors import FormatError

CONFIGMAP_NAME = "volcano-vgpu-device-config"
CONFIGMAP_KEY = "device-config.yaml"
# The scheduler reads only deviceshare.KnownGeometriesCMNamespace (default kube-system); the
# plugin tries kube-system, then volcano-system.
DEFAULT_NAMESPACE = "kube-system"
PLUGIN_NAMESPACES = ("kube-system", "volcano-system")

DEFAULT_COUNT_NAME = "volcano.sh/vgpu-number"
DEFAULT_MEMORY_NAME = "volcano.sh/vgpu-memory"
DEFAULT_MEMORY_PERCENTAGE_NAME = "volcano.sh/vgpu-memory-percentage"
DEFAULT_CORE_NAME = "volcano.sh/vgpu-cores"
# The scheduler's built-in split count (and our plugin's); upstream plugins use their own
# (`vgpu_operator.versions.effective_sizing`).
DEFAULT_SPLIT_COUNT = 10

class _Strict(BaseModel):
    """Strict types (no "10" for 10), YAML spellings as aliases, Python names accepted too."""

    model_config = ConfigDict(strict=True, populate_by_name=True, frozen=False)


class MigTemplate(_Strict):
    """One MIG instance shape of a geometry: `1g.10gb` with 10240 MiB, `count` of them."""

    name: str
    memory: int = Field(ge=0, description="MiB of one instance")
    count: int = Field(ge=0)


class MigGeometry(_Strict):
    """A named way to cut a GPU. `group` must not contain `-` (the scheduler splits MIG ids on it)."""

    group: str
    geometries: list[MigTemplate] = Field(default_factory=list)


class AllowedMigGeometries(_Strict):
    """Geometries for GPUs whose model string contains one of `models` (first match wins)."""

    models: list[str] = Field(default_factory=list)
    allowed_geometries: list[MigGeometry] = Field(default_factory=list, alias="allowedGeometries")


class NvidiaConfig(_Strict):
    """The `nvidia:` section, every upstream key with its exact YAML spelling as alias.

    Keys upstream ignores but someone wrote are kept (`model_extra`) and rendered back.
    """

    model_config = ConfigDict(strict=True, populate_by_name=True, extra="allow")

    resource_count_name: str | None = Field(default=None, alias="resourceCountName")
    resource_memory_name: str | None = Field(default=None, alias="resourceMemoryName")
    resource_memory_percentage_name: str | None = Field(default=None, alias="resourceMemoryPercentageName")
    resource_core_name: str | None = Field(default=None, alias="resourceCoreName")
    resource_priority_name: str | None = Field(default=None, alias="resourcePriorityName")
    overwrite_env: bool | None = Field(default=None, alias="overwriteEnv")
    default_memory: int | None = Field(default=None, ge=0, alias="defaultMemory")
    default_cores: int | None = Field(default=None, ge=0, alias="defaultCores")
    default_gpu_num: int | None = Field(default=None, ge=0, alias="defaultGPUNum")
    device_split_count: int | None = Field(default=None, ge=0, alias="deviceSplitCount")
    device_memory_scaling: float | None = Field(default=None, alias="deviceMemoryScaling")
    device_core_scaling: float | None = Field(default=None, alias="deviceCoreScaling")
    disable_core_limit: bool | None = Field(default=None, alias="disableCoreLimit")
    gpu_memory_factor: int | None = Field(default=None, ge=0, alias="gpuMemoryFactor")
    known_mig_geometries: list[AllowedMigGeometries] | None = Field(default=None, alias="knownMigGeometries")
    # Parsed by plugin HEAD, unused; listed so it is not mistaken for a foreign key.
    pass_device_specs: bool | None = Field(default=None, alias="passDeviceSpecs")

    def to_yaml_dict(self) -> dict[str, Any]:
        """The section as YAML keys, upstream order, absent fields left out, foreign keys last."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class DeviceConfig(BaseModel):
    """The whole document: `nvidia` (None when the section is absent) plus every other top-level
    section (`vnpus`, ...) kept verbatim in `others`, in the order they came."""

    model_config = ConfigDict(strict=True)

    nvidia: NvidiaConfig | None = None
    others: dict[str, Any] = Field(default_factory=dict)


def error_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a path a person reads: `a.b[0].c`."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def _format_error(exc: ValidationError, prefix: str) -> FormatError:
    first = exc.errors()[0]
    path = error_path(first["loc"])
    return FormatError(
        f"{CONFIGMAP_KEY}: {prefix}.{path}" if path else f"{CONFIGMAP_KEY}: {prefix}",
        first["msg"],
        "use the type upstream expects (Go parses this file strictly: one bad field discards the whole "
        "file and the scheduler falls back to built-in defaults)",
    )


def parse_device_config(text: str) -> DeviceConfig:
    """Parse `device-config.yaml` text. Raises `FormatError` naming the first bad field."""
    try:
        doc = yamlio.load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise FormatError(CONFIGMAP_KEY, yamlio.describe(exc), "fix the YAML") from exc
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise FormatError(CONFIGMAP_KEY, f"expected a mapping at the top, got {type(doc).__name__}",
                          "start the document with `nvidia:`")
    others = {str(k): v for k, v in doc.items() if k != "nvidia"}
    section = doc.get("nvidia")
    if section is None:
        return DeviceConfig(nvidia=None, others=others)
    if not isinstance(section, dict):
        raise FormatError(f"{CONFIGMAP_KEY}: nvidia", f"expected a mapping, got {type(section).__name__}",
                          "write the nvidia settings as `key: value` lines under `nvidia:`")
    try:
        nvidia = NvidiaConfig.model_validate(section, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise _format_error(exc, "nvidia") from exc
    return DeviceConfig(nvidia=nvidia, others=others)


def device_config_dict(cfg: DeviceConfig) -> dict[str, Any]:
    """The document as plain data: `nvidia` first, then the other sections in their order."""
    doc: dict[str, Any] = {}
    if cfg.nvidia is not None:
        doc["nvidia"] = cfg.nvidia.to_yaml_dict()
    doc.update(cfg.others)
    return doc


def render_device_config(cfg: DeviceConfig) -> str:
    """Deterministic YAML text of `cfg` (same model, same bytes)."""
    return render_device_config_dict(device_config_dict(cfg))


def render_device_config_dict(doc: dict[str, Any]) -> str:
    """Deterministic YAML text of `device_config_dict` output."""
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)


def plugin_view(cfg: DeviceConfig | None, defaults: NvidiaConfig) -> NvidiaConfig:
    """What a device plugin uses: each absent field (all of them when `cfg` is None, a failed
    load) taken from `defaults`, that plugin's."""
    given = cfg.nvidia if cfg is not None and cfg.nvidia is not None else NvidiaConfig()
    return _fill(given, defaults)


def builtin_plugin_defaults() -> NvidiaConfig:
    """This project's device plugin's values for absent fields (deviceplugin/vgpu_deviceplugin/
    config.py): the scheduler's built-in defaults, so both agree without a ConfigMap, except
    gpuMemoryFactor 1 (0 would divide by zero)."""
    return _builtin_scheduler_defaults().model_copy(update={"gpu_memory_factor": 1})


def _builtin_scheduler_defaults() -> NvidiaConfig:
    """volcano `GetDefaultDevicesConfig`: used only when the whole load fails."""
    return NvidiaConfig(
        resource_count_name=DEFAULT_COUNT_NAME,
        resource_memory_name=DEFAULT_MEMORY_NAME,
        resource_memory_percentage_name="",
        resource_core_name=DEFAULT_CORE_NAME,
        resource_priority_name="",
        overwrite_env=False,
        default_memory=0,
        default_cores=0,
        default_gpu_num=1,
        device_split_count=DEFAULT_SPLIT_COUNT,
        device_memory_scaling=1.0,
        device_core_scaling=1.0,
        disable_core_limit=False,
        gpu_memory_factor=0,
        known_mig_geometries=[],
    )


def go_zero_values() -> NvidiaConfig:
    """Go's zero value of every field: what an absent key reads as in upstream's yaml.v2 decoding."""
    return NvidiaConfig(
        resource_count_name="", resource_memory_name="", resource_memory_percentage_name="",
        resource_core_name="", resource_priority_name="", overwrite_env=False, default_memory=0,
        default_cores=0, default_gpu_num=0, device_split_count=0, device_memory_scaling=0.0,
        device_core_scaling=0.0, disable_core_limit=False, gpu_memory_factor=0, known_mig_geometries=[],
    )


def scheduler_view(cfg: DeviceConfig | None) -> NvidiaConfig:
    """What Volcano's scheduler uses. `cfg=None` means the load failed (ConfigMap or key missing,
    YAML or type error): built-in defaults. Otherwise absent fields are Go zero values."""
    if cfg is None:
        return _builtin_scheduler_defaults()
    given = cfg.nvidia if cfg.nvidia is not None else NvidiaConfig()
    return _fill(given, go_zero_values())


def load_device_config(text: str | None) -> DeviceConfig | None:
    """`text` as its readers load it: None when the ConfigMap or key is missing (`text` None) or
    the load fails, which is what `scheduler_view` and `plugin_view` take None to mean."""
    if text is None:
        return None
    try:
        return parse_device_config(text)
    except FormatError:
        return None


def scheduler_view_of_text(text: str | None) -> NvidiaConfig:
    """`scheduler_view` of raw ConfigMap text (None: ConfigMap or key missing)."""
    return scheduler_view(load_device_config(text))


def reader_views(cfg: DeviceConfig | None) -> tuple[dict[str, Any], ...]:
    """What the scheduler and each kind of device plugin (upstream's, ours) read from `cfg`, as
    YAML data with foreign keys included. `cfg=None` means the load failed."""
    return tuple(view.to_yaml_dict() for view in (
        scheduler_view(cfg), plugin_view(cfg, go_zero_values()), plugin_view(cfg, builtin_plugin_defaults())))


def same_meaning(a: DeviceConfig | None, b: DeviceConfig | None) -> bool:
    """True when every reader sees the same settings in `a` and `b` and the other sections are
    equal: spelling differences (an absent `disableCoreLimit` vs `false`, `1` vs `1.0`, key order)
    do not count."""
    others_a = a.others if a is not None else {}
    others_b = b.others if b is not None else {}
    return others_a == others_b and reader_views(a) == reader_views(b)


def _fill(given: NvidiaConfig, defaults: NvidiaConfig) -> NvidiaConfig:
    values = {name: getattr(given, name) for name in NvidiaConfig.model_fields}
    for name, value in values.items():
        if value is None:
            values[name] = getattr(defaults, name)
    result = NvidiaConfig.model_construct(**values)
    if given.model_extra:
        result.__pydantic_extra__ = dict(given.model_extra)
    return result
