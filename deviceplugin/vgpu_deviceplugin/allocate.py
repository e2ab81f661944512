"""Allocate: which pod, which container, which answer. Pure.

The kubelet's Allocate carries only fake device ids. The real GPUs come from the scheduler's
annotations on the pod being admitted, so the plugin must find that pod:

* only pods on this node (`spec.nodeName`, `volcano.sh/vgpu-node`), with bind-phase `allocating`;
* whose *next* GPU call asks for as many devices as the kubelet asked for (upstream HEAD compares
  the pod-wide total and so never matches a pod with two 1-GPU containers);
* the oldest `volcano.sh/vgpu-time` first;
* and never anything else: upstream v1.11 fell back to an arbitrary pod of the cluster and marked
  it failed. Here "no pod" is its own error and patches nothing.

The scheduler writes one `devices-to-allocate` part per container of `spec.containers` that has
the count or the memory resource in its limits, in order. The kubelet calls Allocate for every
container (init containers first) that asks for at least one of the count resource. An init
container has no part: it gets the devices of the first pending part of a container with the
count resource (with none, of a memory-only one) without consuming them (init containers finish
before app containers start, so the scheduler's accounting still holds); the plugin counts the
init calls it has answered per pod. Two init containers break that accounting and are refused,
naming the pod and the container: one that asks for more GPUs than the first part holds, and a
sidecar (`restartPolicy: Always`), which runs beside the app containers on the same share.
A pod the kubelet has already ended (phase Failed or Succeeded, say rejected by an admission
check before Allocate) is never a candidate: its part would go to the next pod in line.

A container with the memory resource and no count resource is one GPU to the scheduler, which
writes it a part; the kubelet calls only the memory plugin for it. Upstream answers that call
empty, so the container ran with no limit at all (and the image's NVIDIA_VISIBLE_DEVICES). Here
the memory call serves it: the kubelet calls the memory plugin once per container with the
memory resource, in its order, so the plugin counts those calls per pod and knows which
container the next one is for (`decide_memory`). Calls for containers that also have the count
resource are counted and answered empty, as upstream: the count call answers them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpu_formats import FormatError
from vgpu_formats import annotations as ann
from vgpu_formats.quantity import quantity_or_zero

from vgpu_deviceplugin.config import ResourceNames, Settings
from vgpu_deviceplugin.monitor.region import MAX_DEVICES as HOOK_MAX_DEVICES

# Container paths HAMi-core and the images expect (upstream, identical in every version).
LIBVGPU_CONTAINER_PATH = "/usr/local/vgpu/libvgpu.so"
PRELOAD_CONTAINER_PATH = "/etc/ld.so.preload"
CACHE_CONTAINER_DIR = "/tmp/vgpu"
# Our libvgpu.so's settings file (hook/src/settings.h): mounted read-only, it replaces the
# environment, which any process of the container can change or drop (env -i, the pod's own env).
SETTINGS_CONTAINER_PATH = "/usr/local/vgpu/vgpu.env"
SETTINGS_FILE_NAME = "vgpu.env"
DISABLE_CONTROL_ENV = "CUDA_DISABLE_CONTROL"
# Not mounted: upstream's node lock dir /tmp/vgpulock (HAMi-core's cross-container lock file).
# Our libvgpu.so never opens it, and a 1777 host directory shared by every vGPU container of
# the node is room for any of them to fill the node's disk or meddle with another's files.

Pod = Mapping[str, Any]


class AllocateError(Exception):
    """Allocate cannot be answered. `pod` is set when that pod must be marked failed; `final` when
    the call already changed the cluster (a part consumed), so deciding again would serve another
    container with this call."""

    def __init__(self, message: str, pod: PodRef | None = None, final: bool = False) -> None:
        super().__init__(message)
        self.pod = pod
        self.final = final


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Call:
    """One Allocate call the kubelet will make for a pod."""

    container: str
    is_init: bool
    part: int  # index into devices-to-allocate
    devices: tuple[ann.ContainerDevice, ...]
    asked: int | None = None  # the ids the kubelet's call carries, where not len(devices): what
    # an init container asks, or the memory units of a memory-only container (`by_memory`)
    refusal: str = ""  # why this call cannot be answered (plan() refuses it, naming the pod)
    by_memory: bool = False  # a memory-only container: the memory plugin's call, `asked` its units

    @property
    def amount(self) -> int:
        return len(self.devices) if self.asked is None else self.asked


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class Plan:
    """What to answer and what to write for one Allocate call."""

    pod: PodRef
    call: Call
    envs: dict[str, str]
    mounts: tuple[Mount, ...]
    cache_dir: str  # host directory of the container's region (the monitor reads it)
    cache_file: str  # host region file to create before answering: the one thing mounted writable
    settings_file: str  # host settings file to write before answering (mounted read-only)
    settings_text: str  # its content: the hook's variables of `envs`
    devices_to_allocate: str | None  # new annotation value; None: unchanged (init call)
    done: bool  # no call left: patch bind-phase success and release the node lock
    device_specs: tuple[str, ...] = ()  # device nodes to pass (--pass-device-specs), host = container


@dataclass
class _Candidate:
    pod: Pod
    ref: PodRef
    time: int
    calls: list[Call] = field(default_factory=list)
    error: FormatError | None = None


def pod_ref(pod: Pod) -> PodRef:
    meta = pod.get("metadata") or {}
    return PodRef(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")))


def _limits(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((container.get("resources") or {}).get("limits")) or {}


def pending_calls(pod: Pod, names: ResourceNames, init_served: int = 0) -> list[Call]:
    """The Allocate calls still to come for `pod`, in the kubelet's order (the count plugin's, and
    the memory plugin's for memory-only containers). Raises FormatError."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    parts = ann.decode_pod_devices(annotations.get(ann.DEVICES_TO_ALLOCATE, ""))
    spec = pod.get("spec") or {}
    gpu_containers = [c for c in spec.get("containers") or []
                      if names.count in _limits(c) or names.memory in _limits(c)]
    if len(parts) > len(gpu_containers):
        raise FormatError(
            f"annotation {ann.DEVICES_TO_ALLOCATE}",
            f"has {len(parts)} container parts but the pod has {len(gpu_containers)} containers "
            f"requesting {names.count} or {names.memory}",
            "the scheduler and this plugin disagree on resource names; compare the device-config ConfigMap",
        )
    app_calls: list[Call] = []
    for j, c in enumerate(gpu_containers[: len(parts)]):
        devices = tuple(d for d in parts[j] if d.type == ann.DEVICE_TYPE_NVIDIA)
        if not devices:
            continue
        if _counted(c, names):
            app_calls.append(Call(str(c.get("name")), False, j, devices))
        elif (units := quantity_or_zero(_limits(c).get(names.memory))) > 0:
            # The kubelet calls only the memory plugin for it, asking that many memory units.
            app_calls.append(Call(str(c.get("name")), False, j, devices, units, by_memory=True))
    # The kubelet calls Allocate only for a container that asks for at least one device: an init
    # container asking for 0 gets no call, and left in the list it blocked every call after it.
    init_with_gpu = [c for c in spec.get("initContainers") or []
                     if _counted(c, names)]
    init_calls: list[Call] = []
    if app_calls:
        # The first part of a container with the count resource, as before memory-only
        # containers were served; a pod with none lends its first memory-only part.
        first = next((c for c in app_calls if not c.by_memory), app_calls[0])
        for c in init_with_gpu[init_served:]:
            wanted = quantity_or_zero(_limits(c).get(names.count))
            init_calls.append(Call(str(c.get("name")), True, first.part, first.devices[:wanted],
                                   wanted, _init_refusal(c, wanted, len(first.devices), names)))
    return init_calls + app_calls


def _counted(container: Mapping[str, Any], names: ResourceNames) -> bool:
    """Whether the kubelet calls the count plugin for `container` (it asks at least one)."""
    return quantity_or_zero(_limits(container).get(names.count)) > 0


def _init_refusal(container: Mapping[str, Any], wanted: int, first: int, names: ResourceNames) -> str:
    """Why an init container cannot borrow the first GPU container's share, or "" if it can."""
    if container.get("restartPolicy") == "Always":
        return ("is a sidecar (restartPolicy: Always): it runs beside the app containers, and "
                "the scheduler accounts no share for it; take the GPU request off the sidecar")
    if wanted > first:
        return (f"asks for {wanted} {names.count} but the first GPU container's share has "
                f"{first}: an init container runs on that share; ask for at most {first}")
    return ""


# A pod in one of these will never be admitted: the kubelet rejected it (or it ran) already.
ENDED_PHASES = frozenset({"Failed", "Succeeded"})


def _gone(pod: Pod) -> bool:
    """Being deleted, or ended: the kubelet admits it no more."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")
                or (pod.get("status") or {}).get("phase") in ENDED_PHASES)
# The bind-phases of a pod under admission: success once its last part is consumed, which a
# memory call of its last container may follow.
ADMITTING_PHASES = frozenset({ann.BIND_PHASE_ALLOCATING, ann.BIND_PHASE_SUCCESS})


def _waiting(pods: Sequence[Pod], node: str) -> list[tuple[int, PodRef, Pod]]:
    """The pods bound to `node` that wait for Allocate, oldest vgpu-time first. Not one the kubelet
    has admitted already (`status.startTime`, which it writes only after admission): a pod whose
    part was never consumed (its allocation went astray) stays `allocating` for good, and would
    otherwise take the calls of every later pod asking alike."""
    out: list[tuple[int, PodRef, Pod]] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        status = pod.get("status") or {}
        if (annotations.get(ann.VGPU_NODE) != node
                or (pod.get("spec") or {}).get("nodeName") != node
                or annotations.get(ann.BIND_PHASE) != ann.BIND_PHASE_ALLOCATING
                or _gone(pod)
                or status.get("startTime")):
            continue
        out.append((ann.decode_vgpu_time(annotations.get(ann.VGPU_TIME)), pod_ref(pod), pod))
    out.sort(key=lambda w: (w[0], w[1].namespace, w[1].name))
    return out


def select(
    pods: Sequence[Pod], node: str, amount: int, names: ResourceNames, init_served: Mapping[str, int]
) -> tuple[PodRef, Pod, Call]:
    """The pod this count-resource Allocate is for and its next call. Raises AllocateError."""
    candidates: list[_Candidate] = []
    for time, ref, pod in _waiting(pods, node):
        cand = _Candidate(pod, ref, time)
        try:
            # The memory plugin serves memory-only containers: a count call is never theirs.
            cand.calls = [c for c in pending_calls(pod, names, init_served.get(ref.uid, 0))
                          if not c.by_memory]
        except FormatError as exc:
            cand.error = exc
        candidates.append(cand)
    for cand in candidates:
        if cand.calls and cand.calls[0].amount == amount:
            return cand.ref, cand.pod, cand.calls[0]
    broken = [c for c in candidates if c.error is not None]
    if broken:
        # It is waiting on this node and can never be served: fail it rather than leave it hanging.
        raise AllocateError(f"pod {broken[0].ref}: {broken[0].error}", broken[0].ref)
    waiting = ", ".join(f"{c.ref} (next container wants {c.calls[0].amount})" for c in candidates if c.calls)
    raise AllocateError(
        f"no pod on node {node} is waiting for {amount} {names.count} device(s) "
        f"(annotations {ann.VGPU_NODE}={node}, {ann.BIND_PHASE}={ann.BIND_PHASE_ALLOCATING}); "
        + (f"waiting pods: {waiting}. " if waiting else "")
        + "Usually the pod was not scheduled by Volcano with deviceshare.VGPUEnable, or the scheduler "
        f"reads other resource names than this plugin registered ({names.count}, {names.memory}, "
        f"{names.cores}) from the device-config ConfigMap"
    )


@dataclass(frozen=True)
class MemoryUse:
    """A container asking for the count or the memory resource, with the memory units it asks;
    the kubelet calls the memory plugin for it when that is at least one (`memory_uses`)."""

    container: str
    is_init: bool
    units: int  # the memory units it asks: the memory call's device count
    counted: bool  # it asks for the count resource too: the count plugin's call answers it


def memory_uses(pod: Pod, names: ResourceNames) -> list[MemoryUse]:
    """The memory plugin's calls for `pod`, in the kubelet's order (init containers first)."""
    return [use for use in _gpu_uses(pod, names) if use.units > 0]


def _first_call_use(pod: Pod, names: ResourceNames) -> MemoryUse | None:
    """The memory use the kubelet's first call for `pod` may be: that of its first container
    asking for either resource (None when that one asks for no memory: its count call comes first)."""
    first = next(iter(_gpu_uses(pod, names)), None)
    return first if first is not None and first.units > 0 else None


def _gpu_uses(pod: Pod, names: ResourceNames) -> list[MemoryUse]:
    """Every container asking for at least one of the count or the memory resource, in the
    kubelet's order, with the memory units it asks (maybe 0)."""
    spec = pod.get("spec") or {}
    uses: list[MemoryUse] = []
    for key, is_init in (("initContainers", True), ("containers", False)):
        for c in spec.get(key) or []:
            units = quantity_or_zero(_limits(c).get(names.memory))
            if units > 0 or _counted(c, names):
                uses.append(MemoryUse(str(c.get("name")), is_init, units, _counted(c, names)))
    return uses


@dataclass(frozen=True)
class Deferred:
    """A memory call answered empty and counted for no pod yet: the count call that follows it
    names the pod (one of `pods`, the uids it may be of) and counts it (`memory_seen_after`)."""

    units: int
    pods: frozenset[str]


@dataclass(frozen=True)
class MemoryDecision:
    """What one memory-resource call is.

    * `ref` None: no pod explains it; answered empty, as upstream. `deferred` set: it is the
      first call of a container with the count resource in a pod not told yet (`decide_memory`).
    * Else it is `use`'s call, answered by serving `call` (a memory-only container's part), or
      empty when `call` is None (the count call answers the container; a memory-only container
      whose part holds no GPU). `unstarted`: the pod had no call before this one."""

    ref: PodRef | None = None
    pod: Pod | None = None
    use: MemoryUse | None = None
    call: Call | None = None
    deferred: Deferred | None = None
    unstarted: bool = False


def decide_memory(
    pods: Sequence[Pod], node: str, units: int, names: ResourceNames,
    memory_seen: Mapping[str, int], last: str | None,
) -> MemoryDecision:
    """Which container a memory-resource call of `units` is for. `memory_seen`: the memory calls
    counted per pod uid; a pod has an entry once any call of it was answered (or it failed).
    `last`: the uid of the pod of the last call answered, None after a failed one.

    The kubelet admits one pod at a time, calling Allocate for its containers in order, so the
    call is the next memory use of the pod under admission (`last`; its last container's memory
    call may even follow the count call that finished it), or the first call of a pod none of
    whose calls has come yet ("unstarted"). Among unstarted pods only age would tell them apart,
    so no guess is made: a call whose candidates all ask for the count resource too is answered
    empty and counted by the count call that must follow it (`deferred`; `memory_seen_after`),
    and a memory-only container is served only when its pod is the one candidate. Else the call
    is refused (AllocateError, no pod patched: the kubelet rejects the pod it was admitting).
    Raises AllocateError (pod set) for a memory-only init container or a pod whose annotation
    cannot be read."""
    found = _use_of_last(pods, units, names, memory_seen, last)
    if found is not None:
        return _decision(*found, names)
    candidates = [(ref, pod, use) for _, ref, pod in _waiting(pods, node)
                  if ref.uid not in memory_seen
                  and (use := _first_call_use(pod, names)) is not None and use.units == units]
    if all(use.counted for _, _, use in candidates):
        return MemoryDecision(deferred=Deferred(units, frozenset(ref.uid for ref, _, _ in candidates))
                              if candidates else None)
    if len(candidates) > 1:
        raise AllocateError(
            f"pods {', '.join(str(ref) for ref, _, _ in candidates)} all wait on node {node} for a "
            f"first {names.memory} call of {units} units, and one of them would be served as a "
            f"container asking for {names.memory} alone: which pod the kubelet is admitting cannot "
            "be told, and a guess could give one pod's share to another's container. Nothing was "
            "allocated; the kubelet rejects the pod it was admitting (its controller makes it "
            f"again). Asking {names.count}: 1 beside the memory avoids it")
    return dataclasses.replace(_decision(*candidates[0], names), unstarted=True)


def _decision(ref: PodRef, pod: Pod, use: MemoryUse, names: ResourceNames) -> MemoryDecision:
    if use.counted:
        return MemoryDecision(ref, pod, use)
    return MemoryDecision(ref, pod, use, memory_call(pod, ref, use, names))


def _use_of_last(
    pods: Sequence[Pod], units: int, names: ResourceNames, memory_seen: Mapping[str, int],
    last: str | None,
) -> tuple[PodRef, Pod, MemoryUse] | None:
    """The next memory use of the pod under admission, if this call fits it."""
    if last is None:
        return None
    for pod in pods:
        if (pod.get("metadata") or {}).get("uid") != last:
            continue
        ref = pod_ref(pod)
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if _gone(pod) or annotations.get(ann.BIND_PHASE) not in ADMITTING_PHASES:
            return None
        uses = memory_uses(pod, names)
        seen = memory_seen.get(ref.uid, 0)
        if seen < len(uses) and uses[seen].units == units:
            return ref, pod, uses[seen]
    return None


def memory_call(pod: Pod, ref: PodRef, use: MemoryUse, names: ResourceNames) -> Call | None:
    """The call that serves memory-only container `use`, or None when there is nothing to serve
    (its part holds no GPU). Raises AllocateError (pod set) for a memory-only init container: it
    has no part, and lending it another container's share would give it that container's
    memory, not what it asks."""
    if use.is_init:
        raise AllocateError(
            f"pod {ref}: init container {use.container} asks for {names.memory} without "
            f"{names.count}; the scheduler gives it no share of its own. Add {names.count}: 1 to "
            "its limits (it then runs on the first GPU container's share)", ref)
    try:
        calls = pending_calls(pod, names)
    except FormatError as exc:
        raise AllocateError(f"pod {ref}: {exc}", ref) from exc
    return next((c for c in calls if c.by_memory and c.container == use.container), None)


def memory_seen_after(pod: Pod, names: ResourceNames, call: Call, seen: int,
                      deferred: Deferred | None) -> int:
    """The memory calls counted for `pod` once the count plugin answered `call`. Every container
    before it has had its memory call, and its own may have come: `seen` is kept within that.
    `deferred`: the memory call just before, counted for no pod: this container's, when it asks
    as many units and `pod` is one that call may be of."""
    for i, use in enumerate(memory_uses(pod, names)):
        if use.container == call.container and use.is_init == call.is_init:
            if deferred is not None and deferred.units == use.units and pod_ref(pod).uid in deferred.pods:
                return i + 1
            return min(max(seen, i), i + 1)
    return seen


def plan(
    pod: Pod,
    ref: PodRef,
    call: Call,
    settings: Settings,
    gpus: Mapping[str, int],
    hook_path: str,
    cache_root: str,
    cache_id: str,
    allow_disable_control: bool = False,
) -> Plan:
    """Build the response and the annotation update for `call`. `gpus`: this node's healthy GPUs
    and their memory in MiB. `allow_disable_control`: a container env CUDA_DISABLE_CONTROL drops
    the preload (upstream's opt-out), else it is refused. Raises AllocateError (pod set)."""
    if call.refusal:
        raise AllocateError(f"pod {ref}: init container {call.container} {call.refusal}", ref)
    if len(call.devices) > HOOK_MAX_DEVICES:
        # The region keeps one record per GPU: libvgpu.so reads no limit past the 16th.
        raise AllocateError(
            f"pod {ref}: annotation {ann.DEVICES_TO_ALLOCATE} gives container {call.container} "
            f"{len(call.devices)} GPUs; libvgpu.so keeps the limits of {HOOK_MAX_DEVICES} at most, "
            "so the others would run without a cap and it is not started", ref)
    seen: set[str] = set()
    for dev in call.devices:
        if "[" in dev.uuid:
            raise AllocateError(
                f"pod {ref}: device {dev.uuid} asks for dynamic MIG, which this plugin does not "
                "implement; set the node's operatingmode to hami-core", ref)
        if dev.uuid not in gpus:
            raise AllocateError(
                f"pod {ref}: GPU {dev.uuid} from {ann.DEVICES_TO_ALLOCATE} is not a healthy GPU "
                f"of node {settings.node_name} (healthy GPUs here: {', '.join(sorted(gpus)) or 'none'})",
                ref)
        if dev.uuid in seen:
            # Visible devices are deduplicated, limits are not: the limits would shift onto
            # the wrong GPUs.
            raise AllocateError(
                f"pod {ref}: annotation {ann.DEVICES_TO_ALLOCATE} names GPU {dev.uuid} twice for "
                f"container {call.container}; each GPU may appear once in a container's part", ref)
        seen.add(dev.uuid)
        problem = _no_limit_problem(dev) or _beyond_gpu_problem(dev, settings, gpus[dev.uuid])
        if problem:
            raise AllocateError(
                f"pod {ref}: annotation {ann.DEVICES_TO_ALLOCATE} gives GPU {dev.uuid} {problem}; "
                "the container would run without that limit, so it is not started", ref)
    container = _container(pod, call)
    opted_out = any(e.get("name") == DISABLE_CONTROL_ENV for e in container.get("env") or [])
    if opted_out and not allow_disable_control:
        # Without the preload nothing loads libvgpu.so: the container would hold the whole GPU
        # that the scheduler shares out, on a line of its own pod spec.
        raise AllocateError(
            f"pod {ref}: container {call.container} sets {DISABLE_CONTROL_ENV}, which would run it "
            "without libvgpu.so: no memory or SM limit on a shared GPU. This node's device plugin "
            "does not allow that (--allow-disable-control, chart value "
            "devicePlugin.allowDisableControl); remove the variable from the container's env", ref)
    envs = hami_core_env(call.devices, settings, cache_id)
    cache_dir = f"{cache_root}/containers/{ref.uid}_{call.container}"
    # Only the region file is mounted, not its directory: the container cannot create files on
    # the host (the plugin creates this one before answering; its size is kept to the region's
    # by the cleanup loop), and CUDA_DEVICE_MEMORY_SHARED_CACHE names the same path inside.
    cache_file = f"{cache_dir}/{cache_id}.cache"
    settings_file = f"{cache_dir}/{SETTINGS_FILE_NAME}"
    mounts = [
        Mount(LIBVGPU_CONTAINER_PATH, f"{hook_path}/libvgpu.so", True),
        Mount(SETTINGS_CONTAINER_PATH, settings_file, True),
        Mount(envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"], cache_file, False),
    ]
    if not opted_out:
        mounts.append(Mount(PRELOAD_CONTAINER_PATH, f"{hook_path}/ld.so.preload", True))
    new_value: str | None = None
    done = False
    if not call.is_init:
        parts = ann.decode_pod_devices(pod["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE])
        parts[call.part] = [d for d in parts[call.part] if d.type != ann.DEVICE_TYPE_NVIDIA]
        new_value = ann.encode_pod_devices(parts)
        rest = dict(pod)
        rest["metadata"] = {**pod["metadata"],
                            "annotations": {**pod["metadata"]["annotations"],
                                            ann.DEVICES_TO_ALLOCATE: new_value}}
        done = not pending_calls(rest, settings.names, 0)
    return Plan(ref, call, envs, tuple(mounts), cache_dir, cache_file, settings_file,
                settings_text(envs, ref, call.container), new_value, done)


def settings_text(envs: Mapping[str, str], ref: PodRef, container: str) -> str:
    """The settings file: the variables of `envs` libvgpu.so reads, one NAME=VALUE per line (the
    same values as the environment, so the two agree wherever the environment is intact),
    including the GPUs assigned (NVIDIA_VISIBLE_DEVICES, UUIDs in the limits' order: the library
    matches each CUDA device to its limits by UUID). The node monitor reports limits and GPUs
    from this file, which the container cannot write, rather than from the region, which it
    can."""
    lines = [f"# vgpu-device-plugin: pod {ref} container {container}; read by libvgpu.so, which "
             "ignores the environment's limits while this file is there"]
    lines += [f"{name}={value}" for name, value in envs.items() if name in HOOK_SETTINGS
              or name == "NVIDIA_VISIBLE_DEVICES"
              or name.startswith(("CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_"))]
    return "\n".join(lines) + "\n"


def _no_limit_problem(dev: ann.ContainerDevice) -> str:
    """Why libvgpu.so would read this share as "no limit", or "" when it would not.

    usedmem 0 becomes CUDA_DEVICE_MEMORY_LIMIT_<i>=0m (0 means no cap to the hook); usedcores
    outside 0-100 becomes an SM limit the hook rejects (and then applies none). usedcores 0 is
    the scheduler's "no SM limit" and stays allowed."""
    if dev.usedmem <= 0:
        return f"usedmem {dev.usedmem} (a 0 MiB limit is read as no memory cap)"
    if not 0 <= dev.usedcores <= 100:
        return f"usedcores {dev.usedcores} (not a percentage 0-100: no SM limit would apply)"
    return ""


def limit_mib(dev: ann.ContainerDevice, settings: Settings) -> int:
    """The memory cap of a share in MiB, as the answer writes it and the checks test it."""
    return dev.usedmem * settings.memory_factor


def _beyond_gpu_problem(dev: ann.ContainerDevice, settings: Settings, memory_mib: int) -> str:
    """A memory share larger than the GPU (the scheduler never assigns one: the node annotation
    registers the GPU's own memory) is no cap at all; "" when it fits."""
    limit = limit_mib(dev, settings)
    if limit > memory_mib:
        return f"usedmem {dev.usedmem} ({limit} MiB, more than the GPU's {memory_mib} MiB: no cap)"
    return ""


def _container(pod: Pod, call: Call) -> Mapping[str, Any]:
    key = "initContainers" if call.is_init else "containers"
    for c in (pod.get("spec") or {}).get(key) or []:
        if c.get("name") == call.container:
            return dict(c)
    return {}


# What libvgpu.so reads (hook/README.md), besides the per-device CUDA_DEVICE_*_LIMIT_<i>.
HOOK_SETTINGS = frozenset({"CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT",
                           "CUDA_DEVICE_MEMORY_SHARED_CACHE", "GPU_CORE_UTILIZATION_POLICY"})


def hami_core_env(
    devices: tuple[ann.ContainerDevice, ...], settings: Settings, cache_id: str
) -> dict[str, str]:
    """The environment libvgpu.so reads (upstream names, units and suffixes)."""
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(dict.fromkeys(d.uuid for d in devices))}
    for i, dev in enumerate(devices):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{limit_mib(dev, settings)}m"
    if devices:
        envs["CUDA_DEVICE_SM_LIMIT"] = str(devices[0].usedcores)
    for i, dev in enumerate(devices):
        # Upstream sets the first GPU's cores for all; a GPU given other cores gets its own.
        if dev.usedcores != devices[0].usedcores:
            envs[f"CUDA_DEVICE_SM_LIMIT_{i}"] = str(dev.usedcores)
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{CACHE_CONTAINER_DIR}/{cache_id}.cache"  # mounted there
    if settings.disable_core_limit:
        # Upstream loads disableCoreLimit but never emits this; the ConfigMap field should work.
        envs["GPU_CORE_UTILIZATION_POLICY"] = "disable"
    return envs


# Passed with --pass-device-specs where present, as upstream (not every driver creates them all).
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


def device_specs(minors: Sequence[int], exists: Callable[[str], bool]) -> tuple[str, ...]:
    """The device nodes of GPUs `minors` and the control nodes that `exists` (upstream
    --pass-device-specs: for runtimes that do not create them from NVIDIA_VISIBLE_DEVICES)."""
    gpus = [f"/dev/nvidia{m}" for m in dict.fromkeys(minors)]
    return (*gpus, *(path for path in CONTROL_DEVICES if exists(path)))


def visible_devices(devices: Sequence[ann.ContainerDevice], index_of: Mapping[str, int]) -> str:
    """NVIDIA_VISIBLE_DEVICES for --device-id-strategy index: NVML indexes, in the devices' order."""
    return ",".join(dict.fromkeys(str(index_of[d.uuid]) for d in devices))


def success_patch() -> dict[str, Any]:
    return {"metadata": {"annotations": {ann.BIND_PHASE: ann.BIND_PHASE_SUCCESS,
                                         ann.VGPU_TIME: ann.VGPU_TIME_DONE}}}


def failed_patch() -> dict[str, Any]:
    return {"metadata": {"annotations": {ann.BIND_PHASE: ann.BIND_PHASE_FAILED,
                                         ann.VGPU_TIME: ann.VGPU_TIME_DONE}}}


def release_lock_patch() -> dict[str, Any]:
    return {"metadata": {"annotations": {ann.NODE_LOCK: None}}}
