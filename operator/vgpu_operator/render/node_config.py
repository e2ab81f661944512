"""Render the node-config ConfigMap (`config.json`): node overrides expanded to node names.

Upstream matches entries by exact node name only, so each selector override becomes one entry per
node it matches now; the operator re-renders when nodes come, go or change labels. We own the
whole `config.json` key (other data keys, labels and annotations are kept), except the keys
upstream does not know, which someone else wrote for their own reader. When two overrides
match one node, the first wins here; validation reports the overlap (an error when both name
the node, a warning when a selector matches it through its labels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vgpu_formats import node_config as fmt
from vgpu_formats.errors import FormatError

from vgpu_operator import versions
from vgpu_operator.api import NodeOverride, VGPUPolicySpec
from vgpu_operator.render.inputs import short_hash
from vgpu_operator.render.selectors import override_nodes
from vgpu_operator.render.target import TargetRender, configmap_target

if TYPE_CHECKING:
    from vgpu_operator.view import ClusterView


def entry_for(name: str, override: NodeOverride) -> fmt.NodeConfigEntry:
    filters = override.filter_devices
    return fmt.NodeConfigEntry(
        name=name,
        operatingmode=override.operating_mode,
        devicememoryscaling=override.device_memory_scaling,
        devicecorescaling=override.device_core_scaling,
        devicesplitcount=override.device_split_count,
        migstrategy=override.mig_strategy,
        filterdevices=None if filters is None else fmt.FilterDevices(uuid=filters.uuid, index=filters.index),
    )


def desired_node_data(spec: VGPUPolicySpec, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """`config.json` as plain data (`node_config_dict` shape): one entry per targeted node, sorted.
    Each override's entry is validated once and copied per node (5,000 nodes stay cheap)."""
    entries: dict[str, dict[str, Any]] = {}
    for override, names in zip(spec.node_overrides, override_nodes(spec.node_overrides, nodes), strict=True):
        settings = entry_for("-", override).model_dump(exclude_none=True, mode="json")
        del settings["name"]
        for name in names:
            if name not in entries:
                entries[name] = {"name": name, **settings}
    return {"nodeconfig": [entries[name] for name in sorted(entries)]}


def _entries_by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for entry in data["nodeconfig"]:
        found.setdefault(entry["name"], entry)
    return found


def read_fields(generation: versions.Generation | None) -> frozenset[str]:
    """The entry fields the plugin generation acts on: a change of another one (a legacy plugin
    takes its split count from its flag only; no plugin applies devicememoryscaling; foreign keys
    are someone else's) restarts no plugin pod and sets nothing the node reports."""
    traits = versions.plugin_traits(generation)
    fields = {"operatingmode", "migstrategy"}
    if traits.applies_node_split_and_filters:
        fields |= {"devicesplitcount", "filterdevices"}
    if traits.applies_memory_scaling:
        fields.add("devicememoryscaling")
    if traits.applies_core_scaling:
        fields.add("devicecorescaling")
    return frozenset(fields)


def _as_read(entry: dict[str, Any] | None, fields: frozenset[str]) -> dict[str, Any]:
    """What the plugin acts on of a node's entry ({}: no entry, or nothing it reads)."""
    return {k: v for k, v in (entry or {}).items() if k in fields and v is not None}


def with_foreign_keys(desired: dict[str, Any], live: dict[str, Any] | None) -> dict[str, Any]:
    """`desired` keeping the keys of `live` upstream does not know (HAMi and other tools add
    some): top-level ones, and those of each live entry for a node `desired` still has."""
    if live is None:
        return desired
    known = set(fmt.NodeConfigEntry.model_fields)
    foreign = {entry["name"]: {k: v for k, v in entry.items() if k not in known}
               for entry in reversed(live["nodeconfig"])}  # the first entry of a name is the one read
    entries = [{**entry, **foreign.get(entry["name"], {})} for entry in desired["nodeconfig"]]
    return {**desired, **{k: v for k, v in live.items() if k != "nodeconfig"}, "nodeconfig": entries}


def render_node_config_target(view: ClusterView) -> TargetRender:
    ref = view.spec.targets.node_config
    live_text = view.node_config_text()
    try:
        live = fmt.node_config_dict(fmt.parse_node_config(live_text)) if live_text is not None else None
    except FormatError:
        live = None  # unreadable: no plugin gets anything useful from it; we own the key
    desired = with_foreign_keys(desired_node_data(view.spec, view.nodes), live)
    text = fmt.node_config_text(desired)
    target = configmap_target(ref.namespace, ref.name, fmt.CONFIGMAP_KEY, view.node_config,
                              None if live == desired else text, short_hash(text))
    before = _entries_by_name(live) if live is not None else {}
    after = _entries_by_name(desired)
    fields = read_fields(view.generation)
    target.changed_nodes = sorted(n for n in before.keys() | after.keys()
                                  if _as_read(before.get(n), fields) != _as_read(after.get(n), fields))
    target.node_splits = {name: entry.get("devicesplitcount") or 0
                          for name, entry in after.items()} if "devicesplitcount" in fields else {}
    return target
