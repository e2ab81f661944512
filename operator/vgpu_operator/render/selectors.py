"""Label selectors compiled once, matched against many nodes.

Expanding 50 selector overrides over 5,000 nodes must not re-parse the selectors per node:
`compile_selector` turns each into a tuple of cheap checks, and `match` runs them against one
node's labels dict (one dict lookup per term).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vgpu_operator.api import LabelSelector

Check = Callable[[dict[str, str]], bool]


def _term(key: str, operator: str, values: frozenset[str]) -> Check:
    if operator == "In":
        return lambda labels: labels.get(key) in values
    if operator == "NotIn":
        return lambda labels: labels.get(key) not in values
    if operator == "Exists":
        return lambda labels: key in labels
    return lambda labels: key not in labels  # DoesNotExist


def compile_selector(selector: LabelSelector) -> tuple[Check, ...]:
    """The selector as checks that all must pass (Kubernetes semantics; empty matches all)."""
    checks = [_term(key, "In", frozenset([value])) for key, value in sorted(selector.match_labels.items())]
    checks += [_term(req.key, req.operator, frozenset(req.values)) for req in selector.match_expressions]
    return tuple(checks)


def match(checks: tuple[Check, ...], labels: dict[str, str]) -> bool:
    return all(check(labels) for check in checks)


def node_name(node: dict[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def node_labels(node: dict[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def override_nodes(overrides: list[Any], nodes: list[dict[str, Any]]) -> list[list[str]]:
    """For each override (api.NodeOverride), the node names it targets: selector matches among
    `nodes`, or its nodeNames as given (a named node may join later). Sorted, unique."""
    labelled = [(node_name(n), node_labels(n)) for n in nodes]
    result: list[list[str]] = []
    for override in overrides:
        if override.node_selector is not None:
            checks = compile_selector(override.node_selector)
            result.append(sorted({name for name, labels in labelled if match(checks, labels)}))
        else:
            result.append(sorted(set(override.node_names or [])))
    return result
