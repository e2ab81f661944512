"""`config.json` of the ConfigMap `volcano-vgpu-node-config`: per-node device plugin settings.

The device plugin reads `/config/config.json` once at start and applies only the entry whose
`name` equals its `NODE_NAME` (exact match; upstream knows no selectors). Keys are the upstream
lower-case JSON spellings (`DevicePluginConfigs` in volcano-vgpu-device-plugin `pkg/util`).
Keys upstream does not know (HAMi adds some) are kept and rendered back.

Parsing is strict (a string where a number belongs is a `FormatError` naming
``config.json: nodeconfig[0].devicesplitcount``); rendering is deterministic JSON with entries
sorted by node name, one per line.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vgpu_formats import yamlio
from vgpu_formats.device_config import error_path
from vgpu_formats.errors import FormatError

# One encoder for every entry: json.dumps with options would build a new one per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False)

CONFIGMAP_NAME = "volcano-vgpu-node-config"
CONFIGMAP_KEY = "config.json"

OperatingMode = Literal["hami-core", "mig", "mps"]
MigStrategy = Literal["none", "single", "mixed"]


class FilterDevices(BaseModel):
    """GPUs the plugin must not advertise on this node, by UUID or NVML index (plugin v1.12+)."""

    model_config = ConfigDict(strict=True, extra="allow")

    uuid: list[str] = Field(default_factory=list)
    index: list[int] = Field(default_factory=list)


class NodeConfigEntry(BaseModel):
    """One node's settings. None means "not set": the plugin keeps its ConfigMap/flag value."""

    model_config = ConfigDict(strict=True, extra="allow")

    name: str = Field(min_length=1)
    operatingmode: OperatingMode | None = None
    devicememoryscaling: float | None = Field(default=None, gt=0)
    devicecorescaling: float | None = Field(default=None, gt=0)
    devicesplitcount: int | None = Field(default=None, ge=0)
    migstrategy: MigStrategy | None = None
    filterdevices: FilterDevices | None = None


class NodeConfig(BaseModel):
    """The whole `config.json` document."""

    model_config = ConfigDict(strict=True, extra="allow")

    nodeconfig: list[NodeConfigEntry] = Field(default_factory=list)

    def entry_for(self, node_name: str) -> NodeConfigEntry | None:
        """The entry the plugin on `node_name` applies (the first with that name), or None."""
        for entry in self.nodeconfig:
            if entry.name == node_name:
                return entry
        return None


def parse_node_config(text: str) -> NodeConfig:
    """Parse `config.json` text. Raises `FormatError` naming the first bad field."""
    try:
        doc = yamlio.load_json(text) if text.strip() else {}
    except yamlio.RefusedText as exc:
        raise FormatError(CONFIGMAP_KEY, str(exc), "write the entries flat, as upstream reads them") from exc
    except json.JSONDecodeError as exc:
        raise FormatError(CONFIGMAP_KEY, f"not valid JSON: {exc}", "fix the JSON syntax") from exc
    if not isinstance(doc, dict):
        raise FormatError(CONFIGMAP_KEY, f"expected an object at the top, got {type(doc).__name__}",
                          'write {"nodeconfig": [...]}')
    try:
        return NodeConfig.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = error_path(first["loc"])
        raise FormatError(f"{CONFIGMAP_KEY}: {path}", first["msg"],
                          "use the JSON type upstream expects (numbers unquoted; operatingmode one of "
                          "hami-core, mig, mps; migstrategy one of none, single, mixed)") from exc


def node_config_dict(cfg: NodeConfig) -> dict[str, Any]:
    """Plain data, entries sorted by name, unset fields left out."""
    data = cfg.model_dump(exclude_none=True, mode="json")
    data["nodeconfig"] = sorted(data["nodeconfig"], key=lambda e: e["name"])
    return data


def render_node_config(cfg: NodeConfig) -> str:
    """Deterministic JSON text: entries sorted by name, one entry per line (readable diffs, and
    the C JSON encoder does the work: 5,000 entries render in milliseconds)."""
    return node_config_text(node_config_dict(cfg))


def _entry_line(entry: dict[str, Any], bodies: dict[Any, str]) -> str:
    """`encode(entry)`, with the settings part encoded once per distinct settings: thousands of
    nodes share the few settings of their override."""
    if next(iter(entry), None) != "name":  # the line below puts the name first: encode it whole
        return _ENCODER.encode(entry)
    rest = tuple((key, type(value), value) for key, value in entry.items() if key != "name")
    try:
        body = bodies.get(rest)
    except TypeError:  # a list or dict value: not hashable, encode it whole
        return _ENCODER.encode(entry)
    if body is None:
        body = bodies[rest] = _ENCODER.encode({key: value for key, _, value in rest})[1:-1]
    name = _ENCODER.encode(entry["name"])
    return f'{{"name": {name}, {body}}}' if body else f'{{"name": {name}}}'


def node_config_text(data: dict[str, Any]) -> str:
    """The text of `node_config_dict` output (see `render_node_config`)."""
    entries = data.get("nodeconfig") or []
    others = {k: v for k, v in data.items() if k != "nodeconfig"}
    bodies: dict[Any, str] = {}
    if entries:
        lines = ["{", '  "nodeconfig": [', *(f"    {_entry_line(entry, bodies)}," for entry in entries)]
        lines[-1] = lines[-1][:-1]
        lines.append("  ]" + ("," if others else ""))
    else:
        lines = ["{", '  "nodeconfig": []' + ("," if others else "")]
    lines += [f"  {_ENCODER.encode(k)}: {_ENCODER.encode(v)}," for k, v in others.items()]
    if others:
        lines[-1] = lines[-1][:-1]
    lines.append("}")
    return "\n".join(lines) + "\n"
