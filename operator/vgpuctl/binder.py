"""A small Volcano-compatible vGPU binder: pick GPUs for a pod as the deviceshare plugin does.

Pure: Kubernetes objects as plain dicts in, a `Placement` (node, devices, the annotations the
scheduler writes) or an `Unschedulable` (one reason per node) out. It follows Volcano's rules
(docs/upstream.md §6): which pods are vGPU pods, how a container's request
resolves (count, memory, percentage, cores), the per-GPU fit checks with the fixed 100-core cap,
the device order per SchedulePolicy, and the annotation encoding.

Node filter: nodeSelector, NoSchedule/NoExecute taints, and Volcano's generic check that each
extended resource is allocatable on the node. Not modelled (the demo and doctor do not need them):
MIG nodes (refused with a reason), node locking, GPU exclusivity rules, podgroup spread, queue
accounting, affinity. Node order is the deviceshare score times ScheduleWeight, ties broken by
node name: Volcano's other node-order plugins are out of scope.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vgpu_formats import annotations as ann
from vgpu_formats import device_config as dc
from vgpu_formats.quantity import parse_quantity

DEVICE_TYPE = ann.DEVICE_TYPE_NVIDIA
CORES_PER_GPU = 100  # hard-coded by the scheduler, whatever deviceCoreScaling says
PERCENT_UNSET = 101  # Volcano's sentinel for "no percentage requested"
# Volcano >= 1.15.1 ignores a node unless these hard-coded names are allocatable and non-zero.
HARD_CODED_ALLOCATABLE = (dc.DEFAULT_COUNT_NAME, dc.DEFAULT_CORE_NAME, dc.DEFAULT_MEMORY_NAME)

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class SchedulerSettings:
    """What the scheduler uses to place vGPU pods: its device-config view plus deviceshare args.

    Defaults are the scheduler's fallback when device-config cannot be loaded (note the empty
    percentage name: `vgpu-memory-percentage` is ignored in the fallback).
    """

    count_name: str = dc.DEFAULT_COUNT_NAME
    memory_name: str = dc.DEFAULT_MEMORY_NAME
    memory_percentage_name: str = ""
    core_name: str = dc.DEFAULT_CORE_NAME
    vgpu_enable: bool = True
    schedule_policy: str = ""
    schedule_weight: int = 0
    require_allocatable: bool = False  # True for Volcano >= 1.15.1


def settings_from_view(
    view: dc.NvidiaConfig,
    *,
    vgpu_enable: bool = True,
    schedule_policy: str = "",
    schedule_weight: int = 0,
    require_allocatable: bool = False,
) -> SchedulerSettings:
    """Settings from `device_config.scheduler_view(...)` plus the deviceshare arguments."""
    return SchedulerSettings(
        count_name=view.resource_count_name or "",
        memory_name=view.resource_memory_name or "",
        memory_percentage_name=view.resource_memory_percentage_name or "",
        core_name=view.resource_core_name or "",
        vgpu_enable=vgpu_enable,
        schedule_policy=schedule_policy,
        schedule_weight=schedule_weight,
        require_allocatable=require_allocatable,
    )


@dataclass
class GPU:
    """One physical GPU as the scheduler tracks it: the register record plus usage so far."""

    index: int
    uuid: str
    number: int
    memory: int
    type: str
    health: bool
    mode: str
    used_num: int = 0
    used_mem: int = 0
    used_core: int = 0


@dataclass(frozen=True)
class ContainerRequest:
    """One GPU-requesting container's request, resolved as Volcano resolves it (docs/upstream.md §6.3)."""

    container: str
    nums: int
    memreq: int
    mem_percentage: int
    coresreq: int


@dataclass(frozen=True)
class DeviceGrant:
    uuid: str
    usedmem: int
    usedcores: int
    type: str = DEVICE_TYPE


@dataclass(frozen=True)
class Placement:
    node: str
    devices: list[list[DeviceGrant]]  # one list per GPU-requesting container
    annotations: dict[str, str]
    score: float = 0.0


@dataclass(frozen=True)
class Unschedulable:
    reasons: dict[str, str] = field(default_factory=dict)  # node name -> why it did not fit
    message: str = ""


# --- requests -----------------------------------------------------------------------------


def is_vgpu_pod(pod: Obj, settings: SchedulerSettings) -> bool:
    """Volcano's `checkVGPUResourcesInPod`: a container's limits name the count or memory resource."""
    if not settings.vgpu_enable:
        return False
    names = {n for n in (settings.count_name, settings.memory_name) if n}
    for container in (pod.get("spec") or {}).get("containers", []) or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        if names & set(limits):
            return True
    return False


def _limit_or_request(name: str, limits: Obj, requests: Obj) -> int | None:
    """The limit, else the request, of a configured resource name; None when absent or unnamed."""
    if not name:
        return None
    if name in limits:
        return parse_quantity(limits[name])
    if name in requests:
        return parse_quantity(requests[name])
    return None


def container_requests(pod: Obj, settings: SchedulerSettings) -> list[ContainerRequest]:
    """One request per container whose limits name the count or memory resource (docs/upstream.md §6.3)."""
    out: list[ContainerRequest] = []
    for container in (pod.get("spec") or {}).get("containers", []) or []:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        has_count = bool(settings.count_name) and settings.count_name in limits
        has_mem = bool(settings.memory_name) and settings.memory_name in limits
        if not (has_count or has_mem):
            continue
        nums = parse_quantity(limits[settings.count_name]) if has_count else 1
        memreq = _limit_or_request(settings.memory_name, limits, requests) or 0
        pct = _limit_or_request(settings.memory_percentage_name, limits, requests)
        mem_percentage = PERCENT_UNSET if pct is None else pct
        if mem_percentage == PERCENT_UNSET and memreq == 0:
            mem_percentage = 100  # nothing asked: the whole card
        out.append(
            ContainerRequest(
                container=str(container.get("name", "")),
                nums=nums,
                memreq=memreq,
                mem_percentage=mem_percentage,
                coresreq=_limit_or_request(settings.core_name, limits, requests) or 0,
            )
        )
    return out


# --- node state ---------------------------------------------------------------------------


def node_gpus(node: Obj, settings: SchedulerSettings) -> tuple[list[GPU], str]:
    """The node's GPUs from its register annotation, or ([], why the scheduler ignores it)."""
    meta = (node.get("metadata") or {})
    raw = (meta.get("annotations") or {}).get(ann.NODE_REGISTER)
    if not raw:
        return [], f"no {ann.NODE_REGISTER} annotation (device plugin not registered)"
    if settings.require_allocatable:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        missing = [n for n in HARD_CODED_ALLOCATABLE if parse_quantity(allocatable.get(n, 0) or 0) <= 0]
        if missing:
            return [], f"allocatable lacks {', '.join(missing)} (Volcano >= 1.15.1 needs all three)"
    try:
        records = ann.decode_node_register(raw)
    except ValueError as err:
        return [], f"{ann.NODE_REGISTER} cannot be decoded: {err}"
    gpus = [
        GPU(
            index=i,
            uuid=r.uuid,
            number=r.count,
            memory=r.devmem,
            type=r.type,
            health=r.health,
            mode="mig" if r.mode == "mig" else "hami-core",
        )
        for i, r in enumerate(records)
    ]
    if not gpus:
        return [], f"{ann.NODE_REGISTER} lists no GPU"
    return gpus, ""


def _pod_node(pod: Obj) -> str:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(ann.VGPU_NODE) or (pod.get("spec") or {}).get("nodeName") or "")


def _counts_toward_usage(pod: Obj) -> bool:
    """Terminated and deleting pods do not hold GPU shares for the scheduler (docs/upstream.md §6.7)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def add_usage(gpus: Sequence[GPU], pods: Iterable[Obj]) -> None:
    """Charge the GPUs with the devices that running pods hold (from `vgpu-ids-new`)."""
    for pod in pods:
        if not _counts_toward_usage(pod):
            continue
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ann.VGPU_IDS_NEW)
        if not raw:
            continue
        try:
            containers = ann.decode_pod_devices(raw, ann.VGPU_IDS_NEW)
        except ValueError:
            continue  # the scheduler skips undecodable entries too
        for devices in containers:
            for device in devices:
                # Volcano matches by substring (MIG ids are UUID[group-pos]).
                gpu = next((g for g in gpus if g.uuid and g.uuid in device.uuid), None)
                if gpu is not None:
                    gpu.used_num += 1
                    gpu.used_mem += device.usedmem
                    gpu.used_core += device.usedcores


# --- fit ----------------------------------------------------------------------------------


def _split(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _type_allowed(gpu_type: str, annotations: Mapping[str, str]) -> bool:
    if DEVICE_TYPE not in gpu_type:
        return False
    upper = gpu_type.upper()
    use = _split(annotations.get(ann.USE_GPU_TYPE))
    if use:
        return any(item.upper() in upper for item in use)
    nouse = _split(annotations.get(ann.NOUSE_GPU_TYPE))
    return not any(item.upper() in upper for item in nouse)


def _uuid_allowed(uuid: str, annotations: Mapping[str, str]) -> bool:
    if uuid in _split(annotations.get(ann.NOUSE_GPU_UUID)):
        return False
    use = _split(annotations.get(ann.USE_GPU_UUID))
    return not use or uuid in use


def device_order(gpus: Sequence[GPU], policy: str) -> list[GPU]:
    """binpack = most used memory first, spread = fewest tasks first, else highest index
    (docs/upstream.md §6.5)."""
    if policy == "binpack":
        return sorted(gpus, key=lambda g: (-g.used_mem, g.index))
    if policy == "spread":
        return sorted(gpus, key=lambda g: (g.used_num, g.index))
    return sorted(gpus, key=lambda g: -g.index)


def gpu_score(gpu: GPU, policy: str) -> float:
    if policy == "binpack":
        return 100.0 * gpu.used_mem / gpu.memory if gpu.memory else 0.0
    if policy == "spread":
        return 100.0 if gpu.used_num == 0 else 0.0
    return 0.0


def _why_not(gpu: GPU, memreq: int, coresreq: int, annotations: Mapping[str, str]) -> str:
    """Empty when the GPU can take this share, else the first check that fails (docs/upstream.md §6.4)."""
    if gpu.used_num >= gpu.number:
        return "split count used up"
    if gpu.memory - gpu.used_mem < memreq:
        return f"needs {memreq} MiB, {gpu.memory - gpu.used_mem} free"
    if gpu.used_core + coresreq > CORES_PER_GPU:
        return f"needs {coresreq} cores, {CORES_PER_GPU - gpu.used_core} free"
    if coresreq == CORES_PER_GPU and gpu.used_num > 0:
        return "100 cores asks for an empty card"
    if gpu.used_core == CORES_PER_GPU and coresreq == 0:
        return "card fully used by cores"
    if not _type_allowed(gpu.type, annotations):
        return f"type {gpu.type!r} not allowed"
    if gpu.mode == "mig":
        return "MIG mode is not modelled by this binder"
    return ""


def fit_node(
    pod: Obj, gpus: list[GPU], settings: SchedulerSettings
) -> tuple[list[list[DeviceGrant]], float, str]:
    """Assign GPUs container by container on one node; mutates `gpus` only on success.

    Returns (devices per container, score, "") or ([], 0, reason).
    """
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    wanted_mode = annotations.get(ann.VGPU_MODE)
    node_mode = gpus[-1].mode if gpus else "hami-core"  # the last record decides (docs/upstream.md §6.1)
    if wanted_mode and wanted_mode != node_mode:
        return [], 0.0, f"pod asks vgpu-mode {wanted_mode}, node is {node_mode}"
    trial = [replace(g) for g in gpus]
    grants: list[list[DeviceGrant]] = []
    score = 0.0
    for request in container_requests(pod, settings):
        if request.nums > len(trial):
            return [], 0.0, f"container {request.container} wants {request.nums} GPUs, node has {len(trial)}"
        chosen: list[DeviceGrant] = []
        reasons: list[str] = []
        uuid_matched = False
        for gpu in device_order(trial, settings.schedule_policy):
            if len(chosen) == request.nums:
                break
            if not _uuid_allowed(gpu.uuid, annotations):
                continue
            uuid_matched = True
            memreq = request.memreq
            if request.mem_percentage != PERCENT_UNSET:
                memreq = gpu.memory * request.mem_percentage // 100
            why = _why_not(gpu, memreq, request.coresreq, annotations)
            if why:
                reasons.append(f"GPU {gpu.index}: {why}")
                continue
            gpu.used_num += 1
            gpu.used_mem += memreq
            gpu.used_core += request.coresreq
            chosen.append(DeviceGrant(uuid=gpu.uuid, usedmem=memreq, usedcores=request.coresreq))
            score += gpu_score(gpu, settings.schedule_policy)
        if len(chosen) < request.nums:
            if not uuid_matched:
                return [], 0.0, "no GPU matches the pod's UUID constraints"
            detail = "; ".join(reasons[:3])
            return [], 0.0, f"container {request.container}: not enough GPUs fit ({detail})"
        grants.append(chosen)
    for gpu, tried in zip(gpus, trial, strict=True):
        gpu.used_num, gpu.used_mem, gpu.used_core = tried.used_num, tried.used_mem, tried.used_core
    return grants, score, ""


# --- node filter and bind -----------------------------------------------------------------


def _selector_matches(pod: Obj, node: Obj) -> str:
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in selector.items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    return ""


def _tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol.get("key") == taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _scalar_requests(pod: Obj, settings: SchedulerSettings) -> dict[str, int]:
    """The extended resources the pod asks for, summed over its containers (worked out once per
    pod, checked against each node by `_insufficient`).

    One unit per container (Kubernetes counts requests per container). The percentage name is left
    out: no plugin advertises it, and Volcano would then reject such pods everywhere, as read from
    its code, not observed (docs/upstream.md §6.8).
    """
    wanted: dict[str, int] = {}
    percentage = (settings.memory_percentage_name, dc.DEFAULT_MEMORY_PERCENTAGE_NAME)
    for container in (pod.get("spec") or {}).get("containers", []) or []:
        for name, value in ((container.get("resources") or {}).get("limits") or {}).items():
            if "/" in name and name not in percentage:
                wanted[name] = wanted.get(name, 0) + parse_quantity(value)
    return dict(sorted(wanted.items()))


def _insufficient(wanted: Mapping[str, int], node: Obj) -> str:
    """Volcano's generic scalar check: each extended resource the pod asks for must be allocatable
    (usage by other pods is not subtracted here)."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    for name, amount in wanted.items():
        have = parse_quantity(allocatable.get(name, 0) or 0)
        if have < amount:
            return f"Insufficient {name} (allocatable {have}, asked {amount})"
    return ""


def _taints_block(pod: Obj, node: Obj) -> str:
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, tolerations):
            return f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"
    return ""


def encode_grants(grants: Sequence[Sequence[DeviceGrant]]) -> str:
    return ann.encode_pod_devices(
        [[ann.ContainerDevice(uuid=g.uuid, type=g.type, usedmem=g.usedmem, usedcores=g.usedcores)
          for g in container] for container in grants]
    )


def bind(
    pod: Obj,
    nodes: Sequence[Obj],
    pods: Iterable[Obj],
    settings: SchedulerSettings,
    now: int,
) -> Placement | Unschedulable:
    """Choose a node and GPUs for `pod` and return the scheduler's annotations.

    `pods` are the pods already in the cluster (their `vgpu-ids-new` is the GPU usage);
    `now` is the Unix time written into vgpu-time and bind-time.
    """
    if not is_vgpu_pod(pod, settings):
        if not settings.vgpu_enable:
            return Unschedulable(message="deviceshare.VGPUEnable is off: the scheduler ignores vGPU requests")
        names = f"{settings.count_name} or {settings.memory_name}"
        return Unschedulable(message=f"not a vGPU pod: no container limits name {names}")
    existing = list(pods)
    wanted = _scalar_requests(pod, settings)
    reasons: dict[str, str] = {}
    best: tuple[float, str, list[list[DeviceGrant]]] | None = None
    for node in sorted(nodes, key=lambda n: str((n.get("metadata") or {}).get("name", ""))):
        name = str((node.get("metadata") or {}).get("name", ""))
        why = _selector_matches(pod, node) or _taints_block(pod, node) or _insufficient(wanted, node)
        if why:
            reasons[name] = why
            continue
        gpus, why = node_gpus(node, settings)
        if why:
            reasons[name] = why
            continue
        add_usage(gpus, (p for p in existing if _pod_node(p) == name))
        grants, score, why = fit_node(pod, gpus, settings)
        if why:
            reasons[name] = why
            continue
        weighted = float(int(score + 0.5) * settings.schedule_weight)
        if best is None or weighted > best[0]:
            best = (weighted, name, grants)
    if best is None:
        return Unschedulable(reasons=reasons, message=f"0/{len(nodes)} nodes fit the vGPU request")
    score, node_name, grants = best
    devices = encode_grants(grants)
    stamp = str(now)
    return Placement(
        node=node_name,
        devices=grants,
        score=score,
        annotations={
            ann.VGPU_NODE: node_name,
            ann.DEVICES_TO_ALLOCATE: devices,
            ann.VGPU_IDS_NEW: devices,
            ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING,
            ann.VGPU_TIME: stamp,
            ann.BIND_TIME: stamp,
        },
    )
