"""Node and pod annotations of the Volcano vGPU protocol (scheduler <-> device plugin).

Wire formats, exactly as upstream writes them:

* node `volcano.sh/node-vgpu-register`: one record per GPU, each *terminated* by ``:``::

      UUID,count,devmem,type,health,mode:UUID,...:

* pod `volcano.sh/devices-to-allocate` / `volcano.sh/vgpu-ids-new`: containers *joined* by ``;``,
  each container a concatenation of device records *terminated* by ``:``::

      GPU-a,NVIDIA,3000,50:;GPU-b,NVIDIA,2000,0:GPU-c,NVIDIA,2000,0:

* node `volcano.sh/node-vgpu-handshake`: ``Reported <time>``, ``Requesting_<YYYY.MM.DD hh:mm:ss>``
  or ``Deleted_<YYYY.MM.DD hh:mm:ss>`` (Volcano <= v1.15.0 only).
* node lock `hamivgpu`: an RFC 3339 timestamp.

Decoding is strict: garbage or truncated text raises `FormatError` naming the annotation and the
position, never an IndexError. Encoding refuses values the other side could not split back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from vgpu_formats.errors import FormatError

# --- annotation keys -----------------------------------------------------------------------------

# Node, written by the device plugin.
NODE_REGISTER = "volcano.sh/node-vgpu-register"
NODE_HANDSHAKE = "volcano.sh/node-vgpu-handshake"
# Node, set by the scheduler (deviceshare.NodeLockEnable) and removed by the plugin after Allocate.
# The key is literally the device name `hamivgpu`, not a volcano.sh/ key.
NODE_LOCK = "hamivgpu"

# Pod, written by the scheduler at bind time.
VGPU_NODE = "volcano.sh/vgpu-node"
VGPU_TIME = "volcano.sh/vgpu-time"
VGPU_IDS_NEW = "volcano.sh/vgpu-ids-new"
DEVICES_TO_ALLOCATE = "volcano.sh/devices-to-allocate"
BIND_PHASE = "volcano.sh/bind-phase"
BIND_TIME = "volcano.sh/bind-time"

# Pod, set by users to steer the scheduler.
VGPU_MODE = "volcano.sh/vgpu-mode"
USE_GPU_TYPE = "nvidia.com/use-gputype"
NOUSE_GPU_TYPE = "nvidia.com/nouse-gputype"
USE_GPU_UUID = "volcano.sh/vgpu-use-gpuuuid"
NOUSE_GPU_UUID = "volcano.sh/vgpu-nouse-gpuuuid"
PODGROUP_POLICY = "volcano.sh/vgpu-podgroup-policy"

# Every key this module knows, for tools that list or strip them.
POD_BIND_KEYS = (VGPU_NODE, VGPU_TIME, VGPU_IDS_NEW, DEVICES_TO_ALLOCATE, BIND_PHASE, BIND_TIME)
NODE_KEYS = (NODE_REGISTER, NODE_HANDSHAKE, NODE_LOCK)

# --- values --------------------------------------------------------------------------------------

BIND_PHASE_ALLOCATING = "allocating"
BIND_PHASE_SUCCESS = "success"
BIND_PHASE_FAILED = "failed"

# The plugin writes MaxUint64 into vgpu-time once a pod is done (success or failure), so it
# sorts last among pending pods.
VGPU_TIME_DONE = "18446744073709551615"
MAX_UINT64 = 2**64 - 1

DEVICE_TYPE_NVIDIA = "NVIDIA"
MODE_HAMI_CORE = "hami-core"
MODE_MIG = "mig"
MODE_MPS = "mps"

HANDSHAKE_REPORTED = "Reported"
HANDSHAKE_REQUESTING = "Requesting"
HANDSHAKE_DELETED = "Deleted"
# Go layout "2006.01.02 15:04:05" used by the scheduler's Requesting_/Deleted_ values.
_HANDSHAKE_TIME_FORMAT = "%Y.%m.%d %H:%M:%S"

# The scheduler treats a lock older than this as expired and takes it again.
NODE_LOCK_TTL = timedelta(minutes=5)

_UINT32_MAX = 2**32 - 1
GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_SEPARATORS = (",", ":", ";")


# --- node register -------------------------------------------------------------------------------

# A registered GPU's `type` is its NVML name behind this prefix, as upstream's plugin writes it; the
# monitor labels its host series with the same text, so the two can be joined.
DEVICE_TYPE_PREFIX = "NVIDIA-"


def device_type(nvml_name: str) -> str:
    """The `type` of a GPU NVML names `nvml_name`: `NVIDIA-NVIDIA L4`."""
    return DEVICE_TYPE_PREFIX + nvml_name


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One physical GPU as the plugin registers it on the node.

    `count` is the split count (tasks that may share the GPU); `devmem` is MiB divided by
    gpuMemoryFactor; `type` is ``NVIDIA-<NVML name>`` (`device_type`); `mode` is ``hami-core`` or ``mig``.
    """

    uuid: str
    count: int
    devmem: int
    type: str
    health: bool
    mode: str = MODE_HAMI_CORE


def encode_node_register(devices: list[DeviceInfo]) -> str:
    """Render `volcano.sh/node-vgpu-register`; every record ends with ``:``."""
    out: list[str] = []
    for i, dev in enumerate(devices):
        where = f"annotation {NODE_REGISTER}, device {i}"
        _check_token(dev.uuid, f"{where} uuid")
        _check_token(dev.type, f"{where} type")
        _check_token(dev.mode, f"{where} mode")
        _check_uint(dev.count, f"{where} count")
        _check_uint(dev.devmem, f"{where} devmem")
        health = "true" if dev.health else "false"
        out.append(f"{dev.uuid},{dev.count},{dev.devmem},{dev.type},{health},{dev.mode}:")
    return "".join(out)


def decode_node_register(text: str) -> list[DeviceInfo]:
    """Parse `volcano.sh/node-vgpu-register`. An empty value means a node without GPUs."""
    devices: list[DeviceInfo] = []
    for i, (record, pos) in enumerate(_records(text, f"annotation {NODE_REGISTER}")):
        where = f"annotation {NODE_REGISTER}, device {i} (char {pos})"
        fields = record.split(",")
        if len(fields) != 6:
            fix = "expected UUID,count,devmem,type,health,mode"
            if len(fields) == 5:
                fix += "; a 5-field record comes from a device plugin older than v1.10, upgrade it"
            raise FormatError(where, f"has {len(fields)} fields: {record!r}", fix)
        uuid, count, devmem, dev_type, health, mode = fields
        devices.append(
            DeviceInfo(
                uuid=_require(uuid, f"{where} uuid"),
                count=_parse_uint(count, f"{where} count"),
                devmem=_parse_uint(devmem, f"{where} devmem"),
                type=_require(dev_type, f"{where} type"),
                health=_parse_go_bool(health, f"{where} health"),
                mode=_require(mode, f"{where} mode"),
            )
        )
    return devices


# --- pod devices ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One GPU share the scheduler gave a container.

    `usedmem` is in gpuMemoryFactor units of MiB, `usedcores` a percentage (0 = no limit).
    In dynamic-MIG mode the uuid carries a ``[group-pos]`` suffix.
    """

    uuid: str
    type: str
    usedmem: int
    usedcores: int


# One entry per GPU-requesting container, in spec.containers order; an entry the plugin has
# already served is an empty list.
PodDevices = list[list[ContainerDevice]]


def encode_pod_devices(pod_devices: PodDevices, annotation: str = DEVICES_TO_ALLOCATE) -> str:
    """Render the pod device string: containers joined by ``;``, devices terminated by ``:``."""
    parts: list[str] = []
    for c, container in enumerate(pod_devices):
        records: list[str] = []
        for d, dev in enumerate(container):
            where = f"annotation {annotation}, container {c}, device {d}"
            _check_token(dev.uuid, f"{where} uuid")
            _check_token(dev.type, f"{where} type")
            _check_uint(dev.usedmem, f"{where} usedmem", _UINT32_MAX)
            _check_uint(dev.usedcores, f"{where} usedcores", _UINT32_MAX)
            records.append(f"{dev.uuid},{dev.type},{dev.usedmem},{dev.usedcores}:")
        parts.append("".join(records))
    return ";".join(parts)


def decode_pod_devices(text: str, annotation: str = DEVICES_TO_ALLOCATE) -> PodDevices:
    """Parse a pod device string. ``""`` (nothing pending) decodes to ``[]``.

    Empty container parts are kept, so part indexes still line up with the GPU containers.
    """
    if text == "":
        return []
    pod: PodDevices = []
    offset = 0
    for c, part in enumerate(text.split(";")):
        container: list[ContainerDevice] = []
        for d, (record, pos) in enumerate(_records(part, f"annotation {annotation}, container {c}", offset)):
            where = f"annotation {annotation}, container {c}, device {d} (char {pos})"
            fields = record.split(",")
            if len(fields) != 4:
                raise FormatError(
                    where,
                    f"has {len(fields)} fields: {record!r}",
                    "expected UUID,type,usedmem,usedcores",
                )
            uuid, dev_type, usedmem, usedcores = fields
            container.append(
                ContainerDevice(
                    uuid=_require(uuid, f"{where} uuid"),
                    type=_require(dev_type, f"{where} type"),
                    usedmem=_parse_uint(usedmem, f"{where} usedmem", _UINT32_MAX),
                    usedcores=_parse_uint(usedcores, f"{where} usedcores", _UINT32_MAX),
                )
            )
        pod.append(container)
        offset += len(part) + 1
    return pod


def decode_vgpu_time(text: str | None) -> int:
    """`volcano.sh/vgpu-time` as upstream orders pods: missing or unparseable sorts last."""
    # isascii: str.isdigit() also accepts digits int() refuses ("²").
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 20:
        return MAX_UINT64
    return min(int(text), MAX_UINT64)


# --- handshake -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Handshake:
    """`volcano.sh/node-vgpu-handshake`: `state` is Reported, Requesting or Deleted.

    `time` is parsed for Requesting/Deleted (the scheduler's layout, read as UTC); for Reported
    it is whatever the plugin wrote and is kept only as text in `raw`.
    """

    state: str
    time: datetime | None
    raw: str


def encode_handshake_reported(now: datetime) -> str:
    """The plugin's value. The scheduler only checks that it is neither Requesting nor Deleted."""
    return f"{HANDSHAKE_REPORTED} {_aware(now).strftime('%Y-%m-%d %H:%M:%S.%f %z %Z')}"


def encode_handshake_scheduler(state: str, now: datetime) -> str:
    """The scheduler's Requesting_/Deleted_ value (used by the emulated scheduler and tests)."""
    if state not in (HANDSHAKE_REQUESTING, HANDSHAKE_DELETED):
        raise FormatError(
            f"annotation {NODE_HANDSHAKE}", f"unknown state {state!r}", "use Requesting or Deleted"
        )
    stamp = _aware(now).astimezone(UTC).strftime(_HANDSHAKE_TIME_FORMAT)
    return f"{state}_{stamp}"


def decode_handshake(text: str) -> Handshake:
    """Parse the handshake the way Volcano <= v1.15.0 does (substring checks, UTC times)."""
    where = f"annotation {NODE_HANDSHAKE}"
    for state in (HANDSHAKE_REQUESTING, HANDSHAKE_DELETED):
        if state in text:
            _, sep, stamp = text.partition("_")
            if not sep:
                raise FormatError(where, f"{text!r} has no '_<time>'", f"expected {state}_<time>")
            try:
                when = datetime.strptime(stamp, _HANDSHAKE_TIME_FORMAT).replace(tzinfo=UTC)
            except ValueError:
                raise FormatError(
                    where, f"time {stamp!r} is not YYYY.MM.DD hh:mm:ss", "rewrite it or delete it"
                ) from None
            return Handshake(state=state, time=when, raw=text)
    if text.startswith(HANDSHAKE_REPORTED):
        return Handshake(state=HANDSHAKE_REPORTED, time=None, raw=text)
    raise FormatError(
        where, f"unknown value {text!r}", "expected 'Reported ...', 'Requesting_...' or 'Deleted_...'"
    )


# --- node lock -----------------------------------------------------------------------------------


def encode_node_lock(now: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, as Go's time.RFC3339 writes it."""
    return _aware(now).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def decode_node_lock(text: str) -> datetime:
    """Parse the `hamivgpu` lock value into an aware datetime."""
    if not _RFC3339.match(text):
        raise FormatError(
            f"annotation {NODE_LOCK}",
            f"{text!r} is not an RFC 3339 time",
            "the scheduler writes e.g. 2026-01-02T15:04:05Z; remove the annotation to unlock",
        )
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def node_lock_expired(text: str, now: datetime) -> bool:
    """True when the scheduler would consider the lock stale (older than NODE_LOCK_TTL)."""
    return _aware(now) - decode_node_lock(text) > NODE_LOCK_TTL


# --- helpers -------------------------------------------------------------------------------------


def _records(text: str, where: str, offset: int = 0) -> list[tuple[str, int]]:
    """Split ``a:b:`` into [(a, pos), (b, pos)]; a missing final ``:`` means truncated text.

    `where` names the annotation (and container); positions count from the annotation's start.
    """
    if text == "":
        return []
    pieces = text.split(":")
    if pieces[-1] != "":
        pos = offset + len(text) - len(pieces[-1])
        raise FormatError(
            f"{where}, device {len(pieces) - 1} (char {pos})",
            f"record {pieces[-1]!r} does not end with ':' (truncated value?)",
            "every record ends with ':'",
        )
    out: list[tuple[str, int]] = []
    pos = offset
    for piece in pieces[:-1]:
        if piece == "":
            raise FormatError(
                f"{where}, device {len(out)} (char {pos})",
                "empty record ('::')",
                "remove the extra ':'",
            )
        out.append((piece, pos))
        pos += len(piece) + 1
    return out


def _require(value: str, where: str) -> str:
    if value.strip() == "":
        raise FormatError(where, "is empty", "fill it in")
    return value


def _parse_uint(value: str, where: str, maximum: int = MAX_UINT64) -> int:
    if not value.isascii() or not value.isdigit():
        raise FormatError(where, f"{value!r} is not a non-negative integer", "write a number")
    number = int(value)
    if number > maximum:
        raise FormatError(where, f"{value} is larger than {maximum}", "use a smaller number")
    return number


def _parse_go_bool(value: str, where: str) -> bool:
    if value in GO_TRUE:
        return True
    if value in GO_FALSE:
        return False
    raise FormatError(where, f"{value!r} is not a boolean", "write true or false")


def _check_token(value: str, where: str) -> None:
    """What encode writes, decode must read back: no separators, not blank."""
    if value.strip() == "" or any(sep in value for sep in _SEPARATORS):
        raise FormatError(where, f"{value!r} is blank or contains ',', ':' or ';'", "rename it")


def _check_uint(value: int, where: str, maximum: int = MAX_UINT64) -> None:
    if isinstance(value, bool) or not 0 <= value <= maximum:
        raise FormatError(where, f"{value!r} is not an integer in 0..{maximum}", "fix the value")


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
