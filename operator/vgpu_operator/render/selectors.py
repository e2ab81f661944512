"""Label selectors matched against many nodes through an index, not node by node.

Expanding 50 selector overrides over 5,000 nodes node-by-node costs overrides x nodes x terms
label lookups. Instead `LabelIndex` maps each (label key, value) and each label key to the set of
node names once (nodes x labels), and a selector becomes set intersections and differences whose
cost follows the size of the sets involved (Kubernetes semantics: NotIn and DoesNotExist also
match nodes without the key; an empty selector matches every node).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from vgpu_operator.api import LabelSelector


def node_name(node: dict[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


class LabelIndex:
    """Node names by label key and by (key, value), for the label keys the selectors use."""

    def __init__(self, nodes: list[dict[str, Any]], keys: set[str]) -> None:
        self._by_pair: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._by_key: dict[str, set[str]] = defaultdict(set)
        names: list[str] = []
        for node in nodes:
            meta = node.get("metadata") or {}
            name = str(meta.get("name", ""))
            names.append(name)
            labels = meta.get("labels")
            if not isinstance(labels, dict):
                continue
            for key in keys:
                value = labels.get(key)
                if value is not None:
                    self._by_pair[(key, str(value))].add(name)
                    self._by_key[key].add(name)
        self.names = frozenset(names)

    def _with_any(self, key: str, values: list[str]) -> set[str]:
        found: set[str] = set()
        for value in values:
            found |= self._by_pair.get((key, value), set())
        return found

    def select(self, selector: LabelSelector) -> set[str]:
        """Names of the nodes `selector` matches."""
        pairs = selector.match_labels.items()
        required: list[set[str]] = [self._by_pair.get((k, v), set()) for k, v in pairs]
        excluded: list[set[str]] = []
        for req in selector.match_expressions:
            if req.operator == "In":
                required.append(self._with_any(req.key, req.values))
            elif req.operator == "Exists":
                required.append(self._by_key.get(req.key, set()))
            elif req.operator == "NotIn":
                excluded.append(self._with_any(req.key, req.values))
            else:  # DoesNotExist
                excluded.append(self._by_key.get(req.key, set()))
        if required:
            required.sort(key=len)
            matched = set(required[0]).intersection(*required[1:])
        else:
            matched = set(self.names)
        for names in excluded:
            matched -= names
        return matched


def override_nodes(overrides: list[Any], nodes: list[dict[str, Any]]) -> list[list[str]]:
    """For each override (api.NodeOverride), the node names it targets: selector matches among
    `nodes`, or its nodeNames as given (a named node may join later). Sorted, unique."""
    selectors = [o.node_selector for o in overrides if o.node_selector is not None]
    keys = {k for s in selectors for k in s.match_labels}
    keys |= {r.key for s in selectors for r in s.match_expressions}
    index = LabelIndex(nodes, keys) if selectors else None
    result: list[list[str]] = []
    for override in overrides:
        if override.node_selector is not None and index is not None:
            result.append(sorted(index.select(override.node_selector)))
        else:
            result.append(sorted(set(override.node_names or [])))
    return result
