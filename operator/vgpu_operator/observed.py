"""What the operator read from the cluster: the input of validation and rendering.

Each object is the plain dict the API returned (or a manifest), None when it does not exist. The
runtime fills an `Observed` from API reads; `vgpuctl` and the tests fill it from manifests with
`load_observed_from_manifests`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vgpu_formats import device_config, node_config, yamlio

from vgpu_operator.api import VGPUPolicySpec


@dataclass
class Observed:
    """The live objects a policy renders against."""

    scheduler_configmap: dict[str, Any] | None = None
    scheduler_deployment: dict[str, Any] | None = None
    device_config: dict[str, Any] | None = None
    node_config: dict[str, Any] | None = None
    device_plugin: dict[str, Any] | None = None
    # kube-system's device-config when the policy targets volcano-system: an upstream plugin
    # reads kube-system first, so a leftover copy there shadows the target.
    device_config_shadow: dict[str, Any] | None = None
    nodes: list[dict[str, Any]] = field(default_factory=list)

    def scheduler_conf_text(self, key: str) -> str | None:
        """The scheduler conf text under `key`, None when the ConfigMap or key is missing."""
        return _data(self.scheduler_configmap, key)

    def device_config_text(self) -> str | None:
        return _data(self.device_config, device_config.CONFIGMAP_KEY)

    def device_config_shadow_text(self) -> str | None:
        return _data(self.device_config_shadow, device_config.CONFIGMAP_KEY)

    def node_config_text(self) -> str | None:
        return _data(self.node_config, node_config.CONFIGMAP_KEY)


def _data(configmap: dict[str, Any] | None, key: str) -> str | None:
    if configmap is None:
        return None
    value = (configmap.get("data") or {}).get(key)
    return None if value is None else str(value)


def object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    """(kind, namespace, name) of an object; namespace "" for cluster-scoped ones."""
    meta = obj.get("metadata") or {}
    return str(obj.get("kind", "")), str(meta.get("namespace") or ""), str(meta.get("name", ""))


def wanted_objects(spec: VGPUPolicySpec) -> dict[str, tuple[str, str, str]]:
    """Which object fills which `Observed` slot, per the policy."""
    wanted = {
        "scheduler_configmap": ("ConfigMap", spec.scheduler.namespace, spec.scheduler.config_map),
        "scheduler_deployment": ("Deployment", spec.scheduler.namespace, spec.scheduler.deployment),
        "device_config": ("ConfigMap", spec.targets.device_config.namespace, spec.targets.device_config.name),
        "node_config": ("ConfigMap", spec.targets.node_config.namespace, spec.targets.node_config.name),
        "device_plugin": ("DaemonSet", spec.device_plugin.namespace, spec.device_plugin.daemon_set),
    }
    first = device_config.PLUGIN_NAMESPACES[0]
    if spec.targets.device_config.namespace in device_config.PLUGIN_NAMESPACES[1:]:
        wanted[SHADOW] = ("ConfigMap", first, device_config.CONFIGMAP_NAME)
    return wanted


SHADOW = "device_config_shadow"
# Read when it can be: a namespace outside the operator's RBAC leaves it unknown, not an error.
OPTIONAL_SLOTS = frozenset({SHADOW})


def load_observed_from_manifests(docs: Iterable[dict[str, Any] | None], spec: VGPUPolicySpec) -> Observed:
    """Pick the policy's objects out of manifests (`kind: List` items included); a later
    document with the same kind/namespace/name wins, as `kubectl apply` of the files in order."""
    by_key: dict[tuple[str, str, str], dict[str, Any]] = {}
    nodes: dict[str, dict[str, Any]] = {}
    for doc in _flatten(docs):
        key = object_key(doc)
        if key[0] == "Node":
            nodes[key[2]] = doc
        else:
            by_key[key] = doc
    observed = Observed(nodes=list(nodes.values()))
    for slot, key in wanted_objects(spec).items():
        setattr(observed, slot, by_key.get(key))
    return observed


def _flatten(docs: Iterable[dict[str, Any] | None]) -> Iterable[dict[str, Any]]:
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        items = yamlio.list_items(doc)
        if items is not None:
            yield from _flatten(items)
        else:
            yield doc
