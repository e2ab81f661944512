"""The VGPUPolicy API (`vgpu.io/v1alpha1`, cluster-scoped): one object, the single source of truth.

Pydantic v2 models: snake_case in Python, camelCase in YAML (aliases). The CRD in `crds/` is
generated from these models (`python -m vgpu_operator.crd --write`): each field's `description`
becomes its `kubectl explain` text, `Literal`s become enums, `ge`/`le` become minimum/maximum,
and each model's `cel` rules (class variable `cel_rules`) become `x-kubernetes-validations`. The same
cross-field rules are checked here too (model validators), so `vgpuctl` rejects what the API
server would.

Defaults are upstream's (Helm chart of volcano-vgpu-device-plugin, Volcano's deviceshare plugin),
so an empty spec (`spec: {}`) describes a stock install with vGPU enabled.

Read a policy with `VGPUPolicy.from_object(obj)` (a manifest: unknown fields are errors) or
`VGPUPolicy.from_api(obj)` (as the API server returns it, whose CRD may be newer than this code);
write status with `status.model_dump(by_alias=True, exclude_none=True, mode="json")`.
"""

from __future__ import annotations

import re
import types
from typing import Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

GROUP = "vgpu.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "VGPUPolicy"
PLURAL = "vgpupolicies"
SINGULAR = "vgpupolicy"
SHORT_NAMES = ["vgp"]

# Kubernetes' own limits, also bounding the CEL cost estimate.
NAME_MAX = 253
LABEL_VALUE_MAX = 63
RESOURCE_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
DNS_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
VERSION_PATTERN = r"^(auto|v?[0-9]+\.[0-9]+(\.[0-9]+)?([-+.][0-9A-Za-z.-]+)?)$"


class ApiModel(BaseModel):
    """Base: camelCase aliases, unknown fields rejected (a typo must not be silently dropped)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              strict=True)
    # CEL rules for the CRD: list of {"rule": ..., "message": ...}.
    cel_rules: ClassVar[list[dict[str, str]]] = []


# ---------------------------------------------------------------------------------------------
# spec.resources


class ResourceNames(ApiModel):
    """Extended resource names pods request. Custom names work only with Volcano 1.13 to 1.15.0
    and, for current-generation device plugins, only inside the `volcano.sh/` domain."""

    cel_rules: ClassVar[list[dict[str, str]]] = [
        {"rule": "self.count != self.memory && self.count != self.cores && self.memory != self.cores",
         "message": "count, memory and cores must be three different resource names"},
        {"rule": "self.memoryPercentage == '' || "
                 "!(self.memoryPercentage in [self.count, self.memory, self.cores])",
         "message": "memoryPercentage must differ from count, memory and cores (or be empty to disable it)"},
    ]

    count: str = Field("volcano.sh/vgpu-number", max_length=NAME_MAX, pattern=RESOURCE_NAME_PATTERN,
                       description="Resource a pod requests for the number of vGPUs "
                                   "(device-config resourceCountName).")
    memory: str = Field("volcano.sh/vgpu-memory", max_length=NAME_MAX, pattern=RESOURCE_NAME_PATTERN,
                        description="Resource for vGPU memory in MiB per GPU (resourceMemoryName).")
    memory_percentage: str = Field(
        "volcano.sh/vgpu-memory-percentage", max_length=NAME_MAX,
        pattern=r"^$|^(" + RESOURCE_NAME_PATTERN[1:-1] + r")$",
        description="Resource for vGPU memory as a percentage of the card "
                    "(resourceMemoryPercentageName); empty disables percentage requests.")
    cores: str = Field("volcano.sh/vgpu-cores", max_length=NAME_MAX, pattern=RESOURCE_NAME_PATTERN,
                       description="Resource for the SM percentage per GPU, 0-100 (resourceCoreName).")
    priority: str = Field("", max_length=NAME_MAX,
                          description="Resource for task priority (resourcePriorityName); empty leaves it "
                                      "unset. Neither Volcano nor the plugin reads it today.")

    @model_validator(mode="after")
    def _distinct(self) -> ResourceNames:
        if len({self.count, self.memory, self.cores}) != 3:
            raise ValueError(self.cel_rules[0]["message"])
        if self.memory_percentage and self.memory_percentage in (self.count, self.memory, self.cores):
            raise ValueError(self.cel_rules[1]["message"])
        return self


# ---------------------------------------------------------------------------------------------
# spec.device


class DeviceDefaults(ApiModel):
    """What a container gets when it requests a vGPU but leaves a size out."""

    memory: int = Field(0, ge=0, description="defaultMemory: MiB per GPU when a pod names none "
                                             "(0 = the whole card). Read by the device plugin only.")
    cores: int = Field(0, ge=0, le=100, description="defaultCores: SM percentage when a pod names none.")
    gpu_num: int = Field(1, ge=0, le=64, alias="gpuNum",
                         description="defaultGPUNum: GPUs per container when only memory or cores "
                                     "are requested.")


class MigInstance(ApiModel):
    """One MIG instance shape: a profile name, its memory and how many fit."""

    name: str = Field(max_length=64, description="MIG profile name, e.g. 1g.10gb.")
    memory: int = Field(ge=1, description="Memory of one instance in MiB.")
    count: int = Field(ge=1, le=8, description="How many instances of this profile the geometry holds.")


class MigGeometry(ApiModel):
    """One way to partition a GPU."""

    group: str = Field(max_length=63, pattern=r"^[^-]+$",
                       description="Name of the geometry. Must not contain '-': the scheduler splits "
                                   "MIG device ids on it.")
    geometries: list[MigInstance] = Field(min_length=1, max_length=8,
                                          description="Instances of this geometry.")


class KnownMigGeometry(ApiModel):
    """MIG geometries for GPU models."""

    models: list[str] = Field(min_length=1, max_length=16,
                              description="GPU model substrings (e.g. A100-SXM4-80GB); a GPU matches "
                                          "when its type contains one. The first matching entry wins.")
    allowed_geometries: list[MigGeometry] = Field(min_length=1, max_length=16,
                                                  description="Geometries allowed on those models.")


class DeviceSpec(ApiModel):
    """Cluster-wide device settings, written to the device-config ConfigMap (and, for legacy
    plugins, to the DaemonSet args)."""

    device_split_count: int = Field(10, ge=1, le=100,
                                    description="deviceSplitCount: vGPU slots per physical GPU "
                                                "(tasks that may share one card).")
    device_memory_scaling: float = Field(1.0, gt=0, le=100,
                                         description="deviceMemoryScaling: memory oversubscription "
                                                     "factor (> 1 lets pods share more than the card "
                                                     "holds).")
    device_core_scaling: float = Field(1.0, gt=0, le=100,
                                       description="deviceCoreScaling: core oversubscription factor.")
    gpu_memory_factor: int = Field(1, ge=1, le=1048576,
                                   description="gpuMemoryFactor: MiB per unit of the memory resource. "
                                               "Raise it on large GPU fleets so node registration "
                                               "stays under the kubelet's 4 MiB message limit.")
    defaults: DeviceDefaults = Field(default_factory=DeviceDefaults,
                                     description="Sizes used when a pod leaves them out.")
    overwrite_env: bool = Field(False, description="overwriteEnv: overwrite CUDA_VISIBLE_DEVICES-style "
                                                   "environment of containers that set their own.")
    disable_core_limit: bool = Field(False, description="disableCoreLimit: do not throttle SM usage "
                                                        "(memory is still capped).")
    known_mig_geometries: list[KnownMigGeometry] | None = Field(
        None, max_length=32,
        description="knownMigGeometries for dynamic MIG. Leave unset for upstream's table "
                    "(A30, A100-40GB, A100-80GB); an empty list disables MIG geometries.")


# ---------------------------------------------------------------------------------------------
# spec.nodeOverrides


class LabelSelectorRequirement(ApiModel):
    """A label query term: key, operator and values, as in Kubernetes LabelSelector."""

    cel_rules: ClassVar[list[dict[str, str]]] = [
        {"rule": "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
         "message": "In and NotIn need values; Exists and DoesNotExist take none"},
    ]

    key: str = Field(min_length=1, max_length=316, description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the key relates to the values.")
    values: list[str] = Field(default_factory=list, max_length=64,
                              description="Label values, for In and NotIn.")

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            raise ValueError(self.cel_rules[0]["message"])
        return self


class LabelSelector(ApiModel):
    """Nodes whose labels match all terms (matchLabels and matchExpressions)."""

    match_labels: dict[str, str] = Field(default_factory=dict, max_length=32,
                                         description="Labels a node must carry with exactly these values.")
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=32,
                                                              description="Label query terms.")


class FilterDevices(ApiModel):
    """GPUs the device plugin must not advertise (plugin v1.12+ and ours; legacy ignores it)."""

    uuid: list[str] = Field(default_factory=list, max_length=64, description="GPU UUIDs to hide.")
    index: list[int] = Field(default_factory=list, max_length=64, description="NVML indexes to hide.")


class NodeOverride(ApiModel):
    """Per-node device plugin settings for the nodes a selector or a name list picks. The operator
    expands selectors into the name-keyed config.json entries upstream expects. A node may match
    at most one override."""

    cel_rules: ClassVar[list[dict[str, str]]] = [
        {"rule": "has(self.nodeSelector) != has(self.nodeNames)",
         "message": "set exactly one of nodeSelector or nodeNames"},
        {"rule": "has(self.operatingMode) || has(self.deviceSplitCount) || has(self.deviceMemoryScaling) "
                 "|| has(self.deviceCoreScaling) || has(self.migStrategy) || has(self.filterDevices)",
         "message": "an override must set at least one of operatingMode, deviceSplitCount, "
                    "deviceMemoryScaling, deviceCoreScaling, migStrategy, filterDevices"},
    ]

    node_selector: LabelSelector | None = Field(None, description="Nodes by label (exclusive with "
                                                                  "nodeNames).")
    node_names: list[str] | None = Field(None, min_length=1, max_length=1000,
                                         description="Nodes by name (exclusive with nodeSelector).",
                                         json_schema_extra={"x-kubernetes-list-type": "set",
                                                            "items_max_length": NAME_MAX,
                                                            "items_pattern": DNS_NAME_PATTERN})
    operating_mode: Literal["hami-core", "mig", "mps"] | None = Field(
        None, description="operatingmode: hami-core (default, memory/SM limits by libvgpu), mig "
                          "(dynamic MIG) or mps. The upstream plugin does not implement mps.")
    device_split_count: int | None = Field(None, ge=1, le=100, description="devicesplitcount on "
                                                                           "these nodes.")
    device_memory_scaling: float | None = Field(None, gt=0, le=100,
                                                description="devicememoryscaling on these nodes.")
    device_core_scaling: float | None = Field(None, gt=0, le=100,
                                              description="devicecorescaling on these nodes.")
    mig_strategy: Literal["none", "single", "mixed"] | None = Field(
        None, description="migstrategy (parsed but unused by the upstream plugin).")
    filter_devices: FilterDevices | None = Field(None, description="GPUs to hide on these nodes.")

    @model_validator(mode="after")
    def _one_target_something_set(self) -> NodeOverride:
        for index, name in enumerate(self.node_names or []):
            # An empty or malformed name matches no node, and the device plugin refuses the whole
            # config.json it would end up in.
            if len(name) > NAME_MAX or not re.fullmatch(DNS_NAME_PATTERN, name):
                raise ValueError(f"nodeNames[{index}] {name!r} is not a node name (lower-case letters, "
                                 "digits, '-' and '.'; `kubectl get nodes` lists them)")
        if (self.node_selector is None) == (self.node_names is None):
            raise ValueError(self.cel_rules[0]["message"])
        settings = (self.operating_mode, self.device_split_count, self.device_memory_scaling,
                    self.device_core_scaling, self.mig_strategy, self.filter_devices)
        if all(value is None for value in settings):
            raise ValueError(self.cel_rules[1]["message"])
        return self


# ---------------------------------------------------------------------------------------------
# spec.scheduler, spec.devicePlugin, spec.targets


class SchedulerSpec(ApiModel):
    """Where the Volcano scheduler lives and the deviceshare plugin arguments the operator owns."""

    namespace: str = Field("volcano-system", max_length=63, pattern=DNS_NAME_PATTERN,
                           description="Namespace of the scheduler ConfigMap and Deployment.")
    config_map: str = Field("volcano-scheduler-configmap", max_length=NAME_MAX, pattern=DNS_NAME_PATTERN,
                            description="ConfigMap holding the scheduler conf.")
    key: str = Field("volcano-scheduler.conf", max_length=NAME_MAX,
                     description="Key of the conf in that ConfigMap.")
    deployment: str = Field("volcano-scheduler", max_length=NAME_MAX, pattern=DNS_NAME_PATTERN,
                            description="Scheduler Deployment (restarted when device-config changes).")
    schedule_policy: Literal["binpack", "spread", "unset"] = Field(
        "unset", description="deviceshare.SchedulePolicy: binpack or spread GPUs; unset leaves the "
                             "argument out (upstream default: device order only).")
    schedule_weight: int = Field(0, ge=0, le=10000,
                                 description="deviceshare.ScheduleWeight: weight of the device score in "
                                             "node ordering. Upstream default 0 means the policy never "
                                             "affects which node is chosen.")
    node_lock_enable: bool = Field(False, description="deviceshare.NodeLockEnable: lock a node while "
                                                      "its vGPU pod is being allocated.")
    gpu_exclusive_rules: list[dict[str, str]] | None = Field(
        None, max_length=64,
        description="deviceshare.GPUExclusiveRules: label sets; pods matching the same set never share "
                    "a GPU. Unset leaves whatever the conf holds.")
    volcano_version: str = Field("auto", max_length=64, pattern=VERSION_PATTERN,
                                 description="Volcano version (e.g. v1.13.0), or auto to read it from "
                                             "the scheduler image tag.")


class DevicePluginSpec(ApiModel):
    """Where the vGPU device plugin DaemonSet lives and which generation it is."""

    namespace: str = Field("kube-system", max_length=63, pattern=DNS_NAME_PATTERN,
                           description="Namespace of the device plugin DaemonSet.")
    daemon_set: str = Field("volcano-device-plugin", max_length=NAME_MAX, pattern=DNS_NAME_PATTERN,
                            alias="daemonSet", description="Name of the DaemonSet.")
    container: str = Field("volcano-device-plugin", max_length=63,
                           description="Container of the plugin inside the DaemonSet's pods.")
    generation: Literal["auto", "legacy", "current", "builtin"] = Field(
        "auto", description="legacy (volcano-vgpu-device-plugin <= v1.11: sizing by --resource-* flags), "
                            "current (v1.12+: from the ConfigMap; unknown flags make it exit), builtin "
                            "(this project's plugin), or auto to read it from the image.")


_NAMESPACE_HELP = ("Namespace. The scheduler reads only the one named in its KnownGeometriesCMNamespace; "
                   "the plugin tries kube-system, then volcano-system.")


class DeviceConfigRef(ApiModel):
    """The device-config ConfigMap (`device-config.yaml`), read by the scheduler and the plugin."""

    namespace: str = Field("kube-system", max_length=63, pattern=DNS_NAME_PATTERN,
                           description=_NAMESPACE_HELP)
    name: str = Field("volcano-vgpu-device-config", max_length=NAME_MAX, pattern=DNS_NAME_PATTERN,
                      description="Name (the scheduler's KnownGeometriesCMName).")


class NodeConfigRef(ApiModel):
    """The node-config ConfigMap (`config.json`), mounted into the device plugin pods."""

    namespace: str = Field("kube-system", max_length=63, pattern=DNS_NAME_PATTERN,
                           description="Namespace; must be the DaemonSet's namespace (it is mounted).")
    name: str = Field("volcano-vgpu-node-config", max_length=NAME_MAX, pattern=DNS_NAME_PATTERN,
                      description="Name (the DaemonSet's config volume must mount it).")


class TargetsSpec(ApiModel):
    """The two ConfigMaps the operator renders."""

    device_config: DeviceConfigRef = Field(default_factory=DeviceConfigRef,
                                           description="device-config.yaml ConfigMap (scheduler and plugin).")
    node_config: NodeConfigRef = Field(default_factory=NodeConfigRef,
                                       description="config.json ConfigMap (per-node plugin settings).")


# ---------------------------------------------------------------------------------------------
# spec


class VGPUPolicySpec(ApiModel):
    """Desired vGPU configuration of the whole cluster."""

    cel_rules: ClassVar[list[dict[str, str]]] = [
        # `namespace` is a CEL reserved word: Kubernetes exposes the property as `__namespace__`.
        {"rule": "self.targets.nodeConfig.__namespace__ == self.devicePlugin.__namespace__",
         "message": "targets.nodeConfig.namespace must equal devicePlugin.namespace: the DaemonSet mounts "
                    "that ConfigMap from its own namespace"},
    ]

    resources: ResourceNames = Field(default_factory=ResourceNames,
                                     description="Resource names pods request.")
    device: DeviceSpec = Field(default_factory=DeviceSpec, description="Cluster-wide device settings.")
    node_overrides: list[NodeOverride] = Field(default_factory=list, max_length=100,
                                               description="Per-node settings; a node may match at most "
                                                           "one override.")
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec,
                                     description="The Volcano scheduler and its deviceshare arguments.")
    device_plugin: DevicePluginSpec = Field(default_factory=DevicePluginSpec,
                                            description="The vGPU device plugin DaemonSet.")
    targets: TargetsSpec = Field(default_factory=TargetsSpec,
                                 description="Where the rendered ConfigMaps go.")
    drift_policy: Literal["Enforce", "Report"] = Field(
        "Enforce", description="Enforce restores hand edits of owned settings; Report only reports them.")
    paused: bool = Field(False, description="Render and report, write nothing.")

    @model_validator(mode="after")
    def _node_config_beside_plugin(self) -> VGPUPolicySpec:
        if self.targets.node_config.namespace != self.device_plugin.namespace:
            raise ValueError(self.cel_rules[0]["message"])
        return self


# ---------------------------------------------------------------------------------------------
# status

ConditionType = Literal["Valid", "Applied", "InSync", "NodesReady", "Ready", "Conflict"]
CONDITION_TYPES: tuple[ConditionType, ...] = ("Valid", "Applied", "InSync", "NodesReady", "Ready", "Conflict")
TargetState = Literal["InSync", "Updated", "Drifted", "Missing", "Error"]


class Condition(ApiModel):
    """A condition in the Kubernetes shape."""

    type: ConditionType = Field(description="Valid, Applied, InSync, NodesReady, Ready or Conflict.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    # reason and lastTransitionTime are required, as in metav1.Condition: `-o wide` shows the
    # reason, and the server refuses a status without them.
    reason: str = Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                        description="CamelCase reason.")
    message: str = Field("", max_length=32768, description="What is wrong and the fix.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).",
                                      json_schema_extra={"format": "date-time"})
    observed_generation: int | None = Field(None, ge=0, description="Policy generation this was "
                                                                    "computed from.")


class TargetStatus(ApiModel):
    """One rendered object and whether the cluster matches it."""

    kind: str = Field(description="ConfigMap, Deployment or DaemonSet.")
    namespace: str = Field(description="Namespace.")
    name: str = Field(description="Name.")
    hash: str = Field("", description="Short sha256 of the content the operator owns.")
    state: TargetState = Field(description="InSync, Updated, Drifted, Missing or Error.")
    message: str = Field("", description="Details (drifted fields, the error).")


class NodeMismatch(ApiModel):
    """A node not converged to this policy, and why."""

    name: str = Field(description="Node name.")
    reason: str = Field(description="Why it does not match (e.g. split 10 != 4, not registered).")


class NodeSummary(ApiModel):
    """GPU nodes and their convergence."""

    total: int = Field(0, ge=0, description="GPU nodes (nodes with a vGPU register annotation or "
                                            "allocatable).")
    registered: int = Field(0, ge=0, description="Nodes whose register annotation decodes.")
    converged: int = Field(0, ge=0, description="Nodes whose registered settings match this policy.")
    summary: str = Field("", description="converged/total, for kubectl get.")
    mismatched: list[NodeMismatch] = Field(default_factory=list, description="Nodes not converged "
                                                                             "(at most 50 listed).")


class Capacity(ApiModel):
    """vGPU capacity from the node register annotations."""

    gpus: int = Field(0, ge=0, description="Physical GPUs.")
    vgpus: int = Field(0, ge=0, description="vGPU slots (sum of split counts).")
    memory_mib: int = Field(0, ge=0, alias="memoryMiB", description="GPU memory in MiB.")
    cores: int = Field(0, ge=0, description="Core percent units (100 per GPU).")


class RestartRecord(ApiModel):
    """A restart the operator triggered."""

    target: str = Field(description="Kind/namespace/name restarted.")
    reason: str = Field(description="What changed.")
    hash: str = Field("", description="Config hash the restart rolled out.")
    at: str | None = Field(None, description="When (RFC 3339).", json_schema_extra={"format": "date-time"})


class VGPUPolicyStatus(ApiModel):
    """What the operator observed and did."""

    observed_generation: int | None = Field(None, ge=0, description="Last generation processed.")
    conditions: list[Condition] = Field(default_factory=list, max_length=16,
                                        description="Valid, Applied, InSync, NodesReady, Ready, Conflict.",
                                        json_schema_extra={"x-kubernetes-list-type": "map",
                                                           "x-kubernetes-list-map-keys": ["type"]})
    targets: list[TargetStatus] = Field(default_factory=list, description="Per rendered object.")
    drifted: int = Field(0, ge=0, description="Targets changed by hand since the last apply.")
    nodes: NodeSummary = Field(default_factory=NodeSummary, description="Node convergence.")
    capacity: Capacity = Field(default_factory=Capacity, description="vGPU capacity.")
    last_applied_hash: str | None = Field(None, description="Hash over all rendered targets last "
                                                            "applied.")
    restarts: list[RestartRecord] = Field(default_factory=list, max_length=20,
                                          description="Recent restarts, newest last.")

    def condition(self, type_: ConditionType) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


class VGPUPolicy(ApiModel):
    """A whole VGPUPolicy object (metadata kept as a plain dict)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: VGPUPolicySpec = Field(default_factory=VGPUPolicySpec)
    status: VGPUPolicyStatus | None = None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> VGPUPolicy:
        """Parse a manifest (vgpuctl) or a policy built here. Raises pydantic ValidationError."""
        return cls.model_validate(obj)

    @classmethod
    def from_api(cls, obj: dict[str, Any]) -> tuple[VGPUPolicy, list[str]]:
        """Parse a policy as the API server returns it, and the paths of the fields this code does
        not know, left out. The server's CRD may be newer than this operator (Helm never
        downgrades crds/, so a rollback keeps the newer one), and it fills each new field's
        default into every policy: read strictly, every policy would be rejected, nothing
        reconciled. The API server validated the object against its CRD; the values of the
        fields known here are validated again. Raises pydantic ValidationError."""
        spec, unknown = known_fields(VGPUPolicySpec, obj.get("spec") or {}, "spec.")
        status, unknown_status = known_fields(VGPUPolicyStatus, obj.get("status"), "status.")
        return cls.model_validate({**obj, "spec": spec, "status": status}), unknown + unknown_status

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    def spec_dict(self) -> dict[str, Any]:
        """The spec as the API server would show it (aliases, defaults filled)."""
        return self.spec.model_dump(by_alias=True, exclude_none=True, mode="json")


def known_fields(model: type[BaseModel], data: Any, at: str = "") -> tuple[Any, list[str]]:
    """`data` (a dict the API server returned for `model`) without the keys `model` does not
    define, at any depth (nested models, lists and optional ones), and the paths of those left
    out, from `at`. Anything but a dict is returned as it is, for validation to judge."""
    if not isinstance(data, dict):
        return data, []
    annotations: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        annotations[name] = annotations[info.alias or to_camel(name)] = info.annotation
    kept: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in data.items():
        if key not in annotations:
            unknown.append(f"{at}{key}")
            continue
        kept[key], inner = _known_in(annotations[key], value, f"{at}{key}")
        unknown += inner
    return kept, unknown


def _known_in(annotation: Any, value: Any, at: str) -> tuple[Any, list[str]]:
    """`known_fields` inside one field's value, by the field's type."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return known_fields(annotation, value, f"{at}.")
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is list and args and isinstance(value, list):
        pairs = [_known_in(args[0], item, f"{at}[{i}]") for i, item in enumerate(value)]
        return [v for v, _ in pairs], [path for _, paths in pairs for path in paths]
    if origin in (Union, types.UnionType):  # an optional field: `X | None`, X a model or a list
        present = [a for a in args if a is not type(None)]
        if len(present) == 1:
            return _known_in(present[0], value, at)
    return value, []


def parse_spec(spec: dict[str, Any] | None) -> VGPUPolicySpec:
    """A spec dict (camelCase) as a model; missing fields take upstream defaults."""
    return VGPUPolicySpec.model_validate(spec or {})
