"""Discovery data the emulator serves: the built-in resources the project touches, and CRDs.

kmock only answers discovery for what it was told exists, and kopf silently starts no watchers
for resources it cannot discover, so every resource the operator, the device plugin or the demo
uses is declared here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import kmock

VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


@attrs.frozen
class ResourceSpec:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool = False
    shortnames: tuple[str, ...] = ()
    custom: bool = False  # served from a CustomResourceDefinition (create drops its status)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """The resource key used for stores and kmock: `apps/v1/daemonsets`, `v1/pods`."""
        return f"{self.group}/{self.version}/{self.plural}" if self.group else f"{self.version}/{self.plural}"


VGPUPOLICY = ResourceSpec(
    "vgpu.io", "v1alpha1", "vgpupolicies", "VGPUPolicy", namespaced=False,
    status_subresource=True, shortnames=("vgp",), custom=True,
)

BUILTINS: tuple[ResourceSpec, ...] = (
    ResourceSpec("", "v1", "configmaps", "ConfigMap", namespaced=True, shortnames=("cm",)),
    ResourceSpec("", "v1", "nodes", "Node", namespaced=False, status_subresource=True),
    ResourceSpec("", "v1", "pods", "Pod", namespaced=True, status_subresource=True),
    ResourceSpec("", "v1", "events", "Event", namespaced=True),
    ResourceSpec("", "v1", "namespaces", "Namespace", namespaced=False, status_subresource=True),
    ResourceSpec("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True),
    ResourceSpec("", "v1", "services", "Service", namespaced=True),
    ResourceSpec("", "v1", "secrets", "Secret", namespaced=True),
    ResourceSpec("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    ResourceSpec("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
                 namespaced=False),
    ResourceSpec("rbac.authorization.k8s.io", "v1", "roles", "Role", namespaced=True),
    ResourceSpec("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", namespaced=True),
    ResourceSpec("apps", "v1", "daemonsets", "DaemonSet", namespaced=True, status_subresource=True),
    ResourceSpec("apps", "v1", "deployments", "Deployment", namespaced=True, status_subresource=True),
    ResourceSpec("events.k8s.io", "v1", "events", "Event", namespaced=True),
    ResourceSpec("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
    ResourceSpec(
        "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
        namespaced=False, status_subresource=True,
    ),
    ResourceSpec("kopf.dev", "v1", "clusterkopfpeerings", "ClusterKopfPeering", namespaced=False,
                 custom=True),
    ResourceSpec("kopf.dev", "v1", "kopfpeerings", "KopfPeering", namespaced=True, custom=True),
    VGPUPOLICY,
)


def specs_from_crd(crd: Mapping[str, Any]) -> list[ResourceSpec]:
    """One ResourceSpec per served version of a CustomResourceDefinition manifest."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    result = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        result.append(ResourceSpec(
            group=spec["group"], version=version["name"], plural=names["plural"], kind=names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            status_subresource="status" in (version.get("subresources") or {}),
            shortnames=tuple(names.get("shortNames") or ()), custom=True,
        ))
    return result


def resource_info(spec: ResourceSpec) -> kmock.ResourceInfo:
    return kmock.ResourceInfo(
        namespaced=spec.namespaced, kind=spec.kind, singular=spec.kind.lower(), verbs=set(VERBS),
        shortnames=set(spec.shortnames), subresources={"status"} if spec.status_subresource else set(),
    )
