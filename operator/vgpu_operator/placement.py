"""Where a DaemonSet's pods run: the nodes its pod template's `nodeSelector`, required node
affinity and tolerations admit, as the DaemonSet controller decides it. Pure: no I/O.

The status needs it to tell a node whose device plugin has not registered (it should have) from
one the plugin never runs on (a pool of whole GPUs under NVIDIA's own plugin). The stock upstream
plugin selects its nodes by node affinity alone (`gpu In [on]`), the chart by `nodeSelector`,
`affinity` and `tolerations`: reading only `nodeSelector` took every GPU node for one of the
plugin's, and the policy stayed not Ready for good.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu_operator.render.inputs import pod_template

# The tolerations the DaemonSet controller adds to every DaemonSet pod, (key, effect): a node
# carrying only these taints still runs the plugin. A hostNetwork pod also tolerates
# network-unavailable (HOST_NETWORK_TOLERATED).
DAEMONSET_TOLERATED = frozenset({
    ("node.kubernetes.io/not-ready", "NoExecute"), ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"), ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"), ("node.kubernetes.io/unschedulable", "NoSchedule"),
})
HOST_NETWORK_TOLERATED = ("node.kubernetes.io/network-unavailable", "NoSchedule")


@dataclass(frozen=True)
class Placement:
    """A DaemonSet's placement fields, read from its pod template once for all the nodes asked
    about. `anywhere`: no DaemonSet known, so every node."""

    anywhere: bool = True
    selector: Any = None
    affinity: Any = None
    tolerations: Any = None
    host_network: bool = False

    @classmethod
    def of(cls, daemonset: Mapping[str, Any] | None) -> Placement:
        if daemonset is None:
            return cls()
        spec = pod_template(dict(daemonset)).get("spec") or {}
        return cls(False, spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations"),
                   spec.get("hostNetwork") is True)

    def admits(self, node: Mapping[str, Any]) -> bool:
        """Whether the DaemonSet's pods run on `node`."""
        if self.anywhere:
            return True
        meta = node.get("metadata") or {}
        found = meta.get("labels")
        labels: Mapping[str, Any] = found if isinstance(found, dict) else {}
        name = str(meta.get("name", ""))
        return (_selector_admits(self.selector, labels)
                and _affinity_admits(self.affinity, labels, name)
                and _tolerated(self.tolerations, (node.get("spec") or {}).get("taints"),
                               self.host_network))


def _selector_admits(selector: Any, labels: Mapping[str, Any]) -> bool:
    if not isinstance(selector, dict):
        return True
    return all(str(labels.get(k)) == str(v) and k in labels for k, v in selector.items())


def _affinity_admits(affinity: Any, labels: Mapping[str, Any], name: str) -> bool:
    """requiredDuringSchedulingIgnoredDuringExecution: the terms are ORed, a term's requirements
    ANDed; a term with none matches nothing (Kubernetes' NodeSelector semantics)."""
    required = (((affinity or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(terms, list) or not terms:
        return True
    fields = {"metadata.name": name}
    return any(_term_matches(term, labels, fields) for term in terms if isinstance(term, dict))


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, Any], fields: Mapping[str, str]) -> bool:
    expressions = [e for e in term.get("matchExpressions") or [] if isinstance(e, dict)]
    field_expressions = [e for e in term.get("matchFields") or [] if isinstance(e, dict)]
    if not expressions and not field_expressions:
        return False
    return (all(_requirement_holds(e, labels) for e in expressions)
            and all(_requirement_holds(e, fields) for e in field_expressions))


def _requirement_holds(expression: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
    key, operator = str(expression.get("key", "")), expression.get("operator")
    wanted = [str(v) for v in expression.get("values") or []]
    present = key in values
    value = str(values.get(key)) if present else None
    if operator == "In":
        return present and value in wanted
    if operator == "NotIn":
        return not present or value not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, bound = int(str(value)), int(wanted[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an unknown operator, or Gt/Lt on a missing or non-integer label


def _tolerated(tolerations: Any, taints: Any, host_network: bool) -> bool:
    """Every NoSchedule and NoExecute taint of the node is tolerated (PreferNoSchedule does not
    keep a DaemonSet pod away)."""
    given = [t for t in tolerations or [] if isinstance(t, dict)] if isinstance(tolerations, list) else []
    automatic = DAEMONSET_TOLERATED | ({HOST_NETWORK_TOLERATED} if host_network else set())
    for taint in taints if isinstance(taints, list) else []:
        if not isinstance(taint, dict) or taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if (taint.get("key"), taint.get("effect")) in automatic:
            continue
        if not any(_tolerates(t, taint) for t in given):
            return False
    return True


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if toleration.get("operator") == "Exists":
        return key == "" or key == taint.get("key")
    return key == taint.get("key") and str(toleration.get("value") or "") == str(taint.get("value") or "")
