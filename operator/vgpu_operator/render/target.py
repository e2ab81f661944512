"""`TargetRender`: one object the operator renders, live vs desired, and the patch between them."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu_operator.render.inputs import Problem, Severity, describe, pod_template

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "vgpu-operator"


@dataclass
class TargetRender:
    """The rendering of one target object.

    `live`: the observed object or None. `desired`: the full object as it should be (live with our
    surgical changes, or a new ConfigMap when missing); None when it could not be rendered, and
    then `error` says why. `content_hash`: short sha256 of the content we own (what status shows).
    `changed`: desired differs from live in the parts we own. ConfigMaps carry `key` and `text`
    (the data we own). Workloads carry `restart_hash` (the pod-template annotation value, None when
    the adoption rule leaves it unset). The node-config target lists `changed_nodes` whose entry
    changed: their device plugin pods need recreating, and `node_splits`, the split count each
    node's entry sets (status compares the nodes' registrations with it).
    """

    kind: str
    namespace: str
    name: str
    live: dict[str, Any] | None
    desired: dict[str, Any] | None
    content_hash: str = ""
    changed: bool = False
    key: str | None = None
    text: str | None = None
    restart_hash: str | None = None
    changed_nodes: list[str] = field(default_factory=list)
    node_splits: dict[str, int] = field(default_factory=dict)
    error: Problem | None = None
    slot: str = ""  # its row in `vgpu_operator.registry` (set by `registry.render_targets`)

    @property
    def ref(self) -> str:
        return describe(self.kind, self.namespace, self.name)

    def written_part(self, obj: dict[str, Any] | None) -> Any:
        """What a write of this target replaces in `obj`: `data.<key>` of a ConfigMap, the pod
        template of a workload. Another change to the object (a controller's status write, another
        key) does not conflict with the write."""
        if obj is None:
            return None
        if self.kind == "ConfigMap":
            return (obj.get("data") or {}).get(self.key or "")
        return pod_template(obj)

    def patch(self) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386) from live to desired; {} when nothing changed.

        Missing ConfigMap: the whole desired object (create it). ConfigMap: `data.<key>` only.
        Deployment/DaemonSet: pod-template annotations we own and, when args changed, the whole
        `containers` list (a merge patch replaces lists wholesale, so the list is sent complete:
        every other container, env and volume as read). `metadata.resourceVersion` is included,
        so the write fails with 409 Conflict instead of overwriting a concurrent edit (`Kube.apply`
        writes again over a newer version whose `written_part` did not change).
        """
        if not self.changed or self.desired is None:
            return {}
        if self.live is None:
            return copy.deepcopy(self.desired)
        patch: dict[str, Any] = {}
        version = (self.live.get("metadata") or {}).get("resourceVersion")
        if version:
            patch["metadata"] = {"resourceVersion": version}
        if self.kind == "ConfigMap":
            assert self.key is not None
            patch["data"] = {self.key: self.text}
            return patch
        template: dict[str, Any] = {}
        live_t, want_t = pod_template(self.live), pod_template(self.desired)
        live_ann = (live_t.get("metadata") or {}).get("annotations") or {}
        want_ann = (want_t.get("metadata") or {}).get("annotations") or {}
        changed_ann = {k: v for k, v in want_ann.items() if live_ann.get(k) != v}
        changed_ann.update({k: None for k in live_ann if k not in want_ann})
        if changed_ann:
            template["metadata"] = {"annotations": changed_ann}
        live_c = (live_t.get("spec") or {}).get("containers")
        want_c = (want_t.get("spec") or {}).get("containers")
        if live_c != want_c:
            template["spec"] = {"containers": copy.deepcopy(want_c)}
        if template:
            patch["spec"] = {"template": template}
        return patch


def configmap_target(namespace: str, name: str, key: str, live: dict[str, Any] | None,
                     text: str | None, content_hash: str) -> TargetRender:
    """A ConfigMap target owning `data[key]`. `text` None: the live object already means what the
    policy asks, so its text is kept byte for byte (no reformatting writes; callers skip rendering
    a text nobody writes: dumping YAML is the costliest step)."""
    if text is None:
        assert live is not None, "only a live ConfigMap can already mean the same"
        live_text = str((live.get("data") or {}).get(key, ""))
        return TargetRender("ConfigMap", namespace, name, live, copy.deepcopy(live), content_hash,
                            False, key, live_text)
    if live is None:
        desired: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
            "data": {key: text},
        }
    else:
        desired = copy.deepcopy(live)
        desired["data"] = {**(desired.get("data") or {}), key: text}
    return TargetRender("ConfigMap", namespace, name, live, desired, content_hash, True, key, text)


def failed_target(kind: str, namespace: str, name: str, live: dict[str, Any] | None,
                  problem: Problem) -> TargetRender:
    """A target that could not be rendered: nothing to write, the Problem says why."""
    return TargetRender(kind, namespace, name, live, None, error=problem)


def missing_target(kind: str, namespace: str, name: str, field: str, reason: str, fix: str,
                   severity: Severity = "error") -> TargetRender:
    """An object the operator edits but never creates was not found."""
    where = describe(kind, namespace, name)
    return failed_target(kind, namespace, name, None,
                         Problem(field, reason, f"{where} not found; {fix}", severity, where))


def workload_target(kind: str, live: dict[str, Any], annotation: str, restart_hash: str,
                    inputs_changed: bool, containers: list[dict[str, Any]] | None = None,
                    running: Mapping[str, str | None] | None = None) -> TargetRender:
    """A Deployment/DaemonSet target: optional new `containers`, and the restart annotation.

    Adoption rule (so taking over a working cluster restarts nothing): the annotation is set or
    updated only when it is already there or when the start-time inputs differ from what is live
    now, unless `running` (see `ClusterView.running`) says the pods already run with
    `restart_hash`, or when `running` says the last apply failed before rolling it. Changing the
    annotation's value is what rolls the pods.
    """
    meta = live.get("metadata") or {}
    ref = describe(kind, str(meta.get("namespace", "")), str(meta.get("name", "")))
    recorded = (running or {}).get(ref, "")
    inputs_changed = (inputs_changed or recorded is None) and recorded != restart_hash
    desired = copy.deepcopy(live)
    template = desired.setdefault("spec", {}).setdefault("template", {})
    if containers is not None:
        template.setdefault("spec", {})["containers"] = containers
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    value: str | None = None
    if annotation in annotations or inputs_changed:
        template["metadata"] = {**(template.get("metadata") or {}),
                                "annotations": {**annotations, annotation: restart_hash}}
        value = restart_hash
    return TargetRender(kind, str(meta.get("namespace", "")), str(meta.get("name", "")), live, desired,
                        restart_hash, desired != live, restart_hash=value)
