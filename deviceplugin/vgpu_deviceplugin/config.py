"""Flags + ConfigMaps -> the settings the plugin runs with. Pure: no I/O here.

Precedence, one rule for every setting (documented in deviceplugin/README.md):

1. node-config `config.json`, the entry named like this node (per-node overrides, as upstream);
2. the device-config ConfigMap, the single source the Volcano scheduler reads too;
3. a command-line flag, only for fields the ConfigMap leaves out (legacy manifests keep working);
4. the defaults (names volcano.sh/vgpu-*, split 10, factor 1, scaling 1): the Volcano scheduler's
   built-in ones, so plugin and scheduler agree without a ConfigMap (upstream plugins do not:
   v1.11 splits 2, v1.12 0).

A flag that contradicts the ConfigMap loses and produces a loud warning: a flag winning is exactly
how legacy plugins registered `volcano.sh/vgpu-number` while the scheduler looked for another
name, and pods failed late with `UnexpectedAdmissionError ... device request not found`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from vgpu_formats import device_config as dc
from vgpu_formats import device_fields
from vgpu_formats import node_config as nc
from vgpu_formats.annotations import MODE_HAMI_CORE

DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_HOOK_PATH = "/usr/local/vgpu"
DEFAULT_CACHE_ROOT = "/tmp/vgpu"  # the monitor reads <root>/containers
DEFAULT_REGISTER_INTERVAL = 30.0

T = TypeVar("T")


@dataclass(frozen=True)
class Flags:
    """Command-line values. `None` means "not given" so a default never overrides the ConfigMap."""

    node_name: str
    device_plugin_dir: str = DEFAULT_DEVICE_PLUGIN_DIR
    device_config_name: str = dc.CONFIGMAP_NAME
    device_config_namespace: str | None = None  # None: kube-system, then volcano-system
    node_config_name: str = nc.CONFIGMAP_NAME
    node_config_namespace: str | None = None  # None: where the device-config was found
    mock_gpus: str | None = None
    hook_path: str = DEFAULT_HOOK_PATH
    cache_root: str = DEFAULT_CACHE_ROOT
    register_interval: float = DEFAULT_REGISTER_INTERVAL
    handshake: bool = True
    kubeconfig: str | None = None
    # Honour a container's CUDA_DISABLE_CONTROL (no libvgpu.so, so no cap): the admin's choice.
    allow_disable_control: bool = False
    # Legacy flags: honoured only where the ConfigMap is silent.
    resource_name: str | None = None
    resource_memory_name: str | None = None
    resource_core_name: str | None = None
    device_split_count: int | None = None
    gpu_memory_factor: int | None = None
    device_cores_scaling: float | None = None
    mig_strategy: str = "none"
    # Upstream flags served (deviceplugin/README.md): the Allocate answer's form.
    pass_device_specs: bool = False
    device_id_strategy: str = "uuid"  # or "index": NVIDIA_VISIBLE_DEVICES as NVML indexes

    def device_config_namespaces(self) -> tuple[str, ...]:
        """Where to look for the device-config, in order (upstream plugin lookup)."""
        if self.device_config_namespace:
            return (self.device_config_namespace,)
        return dc.PLUGIN_NAMESPACES

    def watched_configmaps(self) -> tuple[tuple[str, str], ...]:
        """(namespace, name) of every ConfigMap the plugin may read: each where it may live, and
        nowhere else (the chart grants exactly these; a watch elsewhere is a 403 retried forever)."""
        device = tuple((ns, self.device_config_name) for ns in self.device_config_namespaces())
        node_namespaces = ((self.node_config_namespace,) if self.node_config_namespace
                           else self.device_config_namespaces())  # beside the device-config found
        return device + tuple((ns, self.node_config_name) for ns in node_namespaces)


@dataclass(frozen=True)
class ResourceNames:
    count: str
    memory: str
    cores: str


@dataclass(frozen=True)
class Settings:
    """Everything the running plugin needs, resolved once per configuration change."""

    node_name: str
    names: ResourceNames
    split_count: int
    memory_factor: int
    core_scaling: float
    disable_core_limit: bool
    mode: str
    filter_uuids: frozenset[str] = frozenset()
    filter_indexes: frozenset[int] = frozenset()
    # Where the settings came from and what was overridden, for the log and for tests.
    warnings: tuple[str, ...] = ()
    source: str = ""

    @property
    def cores_per_gpu(self) -> int:
        return int(100 * self.core_scaling)


@dataclass
class _Resolver:
    """Collects warnings while picking each value by the precedence rule above."""

    warnings: list[str] = field(default_factory=list)

    def pick(self, key: str, configmap: T | None, flag: T | None, default: T, flag_name: str) -> T:
        if configmap is not None:
            if flag is not None and flag != configmap:
                self.warnings.append(
                    f"IGNORED FLAG {flag_name}={flag}: device-config sets {key}={configmap}, and the "
                    f"scheduler reads the ConfigMap; remove the flag or change the ConfigMap"
                )
            return configmap
        return flag if flag is not None else default


def resolve_settings(
    flags: Flags,
    device_config: dc.DeviceConfig | None,
    node_config: nc.NodeConfig | None,
    source: str = "",
) -> Settings:
    """Merge node-config > device-config > flags > defaults. `None` configs mean "not found"."""
    given = device_config.nvidia if device_config and device_config.nvidia else dc.NvidiaConfig()
    r = _Resolver()
    # Each flagged key (vgpu_formats.device_fields): the ConfigMap's value, else the flag, else the
    # default (the scheduler's built-in one).
    picked = {f.key: r.pick(f.key, getattr(given, f.attr), getattr(flags, f.flag_dest), f.default,
                            str(f.flag)) for f in device_fields.FLAGGED}
    names = ResourceNames(**{kind: picked[f.key] for kind, f in device_fields.NAME_FIELDS.items()})
    split, factor, scaling = (picked[device_fields.SIZING_FIELDS[flag].key] for flag in
                              ("device-split-count", "gpu-memory-factor", "device-cores-scaling"))
    mode = MODE_HAMI_CORE
    uuids: frozenset[str] = frozenset()
    indexes: frozenset[int] = frozenset()
    entry = node_config.entry_for(flags.node_name) if node_config else None
    if entry is not None:
        # Upstream applies a node value only when it is set and positive.
        if entry.devicesplitcount:
            split = entry.devicesplitcount
        if entry.devicecorescaling:
            scaling = entry.devicecorescaling
        if entry.operatingmode:
            mode = entry.operatingmode
        if entry.filterdevices:
            uuids = frozenset(entry.filterdevices.uuid)
            indexes = frozenset(entry.filterdevices.index)
    if factor <= 0:
        # Upstream divides by it (and panics on 0); the scheduler's view is the same factor.
        r.warnings.append(f"gpuMemoryFactor={factor} is not usable; using 1 (set it to 1 or more)")
        factor = 1
    if split <= 0:
        r.warnings.append(f"deviceSplitCount={split} advertises no devices; using 1 (set it to 1 or more)")
        split = 1
    if int(100 * scaling) <= 0:
        # No core devices at all: Volcano v1.14.3 and later then pass the node over (the
        # scheduler itself caps cores at 100 a GPU whatever this says).
        r.warnings.append(f"deviceCoreScaling={scaling} advertises no {names.cores} devices; using 1 "
                          "(set it to 0.01 or more; the scheduler counts 100 cores a GPU regardless)")
        scaling = 1.0
    if flags.mig_strategy != "none":
        r.warnings.append(
            f"--mig-strategy={flags.mig_strategy} is not supported (upstream's static MIG strategies "
            "do not work either); serving vGPU resources as with 'none'"
        )
    for name in (names.count, names.memory, names.cores):
        if not name.startswith("volcano.sh/"):
            r.warnings.append(
                f"resource {name!r} is outside volcano.sh/: registered as given (so kubelet and the "
                "ConfigMap agree), but Volcano >= v1.15.1 only sees nodes with the default "
                "volcano.sh/vgpu-* names; `vgpuctl doctor` explains the pairing"
            )
    return Settings(
        node_name=flags.node_name,
        names=names,
        split_count=split,
        memory_factor=factor,
        core_scaling=scaling,
        disable_core_limit=bool(given.disable_core_limit),
        mode=mode,
        filter_uuids=uuids,
        filter_indexes=indexes,
        warnings=tuple(r.warnings),
        source=source,
    )
