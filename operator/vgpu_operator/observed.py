"""What the operator read from the cluster: the input of validation and rendering.

Each object is the plain dict the API returned (or a manifest), None when it does not exist. The
runtime fills an `Observed` from API reads; `vgpuctl` and the tests fill it from manifests with
`registry.load_observed_from_manifests`. Its slots are the registry's targets and inputs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vgpu_formats import device_config, node_config, yamlio


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


def flatten(docs: Iterable[dict[str, Any] | None]) -> Iterable[dict[str, Any]]:
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        items = yamlio.list_items(doc)
        if items is not None:
            yield from flatten(items)
        else:
            yield doc
