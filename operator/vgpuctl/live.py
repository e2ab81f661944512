"""Read the objects vgpuctl needs from a live cluster (kubeconfig), as plain dicts.

Read-only: list calls only, paginated, so it needs nothing beyond `get`/`list` RBAC on nodes,
pods, configmaps, daemonsets, deployments and vgpupolicies. The result has the same shape as
manifests read from files, so every command runs the same pure code on both.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

# (API path prefix, plural, apiVersion, kind, required)
COLLECTIONS: tuple[tuple[str, str, str, str, bool], ...] = (
    ("/api/v1", "nodes", "v1", "Node", True),
    ("/api/v1", "pods", "v1", "Pod", True),
    ("/api/v1", "configmaps", "v1", "ConfigMap", True),
    ("/apis/apps/v1", "daemonsets", "apps/v1", "DaemonSet", True),
    ("/apis/apps/v1", "deployments", "apps/v1", "Deployment", True),
    ("/apis/vgpu.io/v1alpha1", "vgpupolicies", "vgpu.io/v1alpha1", "VGPUPolicy", False),
)
PAGE = 500


class ClusterError(RuntimeError):
    """The cluster cannot be read; the message says which call and what to check."""


async def _list(api: ApiClient, prefix: str, plural: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        query: list[tuple[str, Any]] = [("limit", PAGE)] + ([("continue", token)] if token else [])
        response = await api.call_api(
            f"{prefix}/{plural}", "GET", query_params=query, auth_settings=["BearerToken"],
            _preload_content=False, response_types_map={},
        )
        body = await response.json()
        items.extend(body.get("items") or [])
        token = (body.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


async def read_cluster(kubeconfig: str | None = None, context: str | None = None) -> list[dict[str, Any]]:
    """Every object of the collections above; VGPUPolicies are skipped when the CRD is absent."""
    try:
        api = await kube_config.new_client_from_config(config_file=kubeconfig, context=context)
    except (OSError, kube_config.ConfigException) as err:
        raise ClusterError(f"cannot load kubeconfig {kubeconfig or '(default)'}: {err}; "
                           f"pass --kubeconfig or use -f/--cluster-dir with manifests") from err
    objects: list[dict[str, Any]] = []
    async with api:
        for prefix, plural, api_version, kind, required in COLLECTIONS:
            try:
                items = await _list(api, prefix, plural)
            except ApiException as err:
                if err.status == 404 and not required:
                    continue
                raise ClusterError(f"GET {prefix}/{plural}: HTTP {err.status} {err.reason}; "
                                   f"vgpuctl needs list on {plural}") from err
            except OSError as err:
                raise ClusterError(f"GET {prefix}/{plural}: {err}; is the API server reachable?") from err
            for item in items:
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
            objects.extend(items)
    return objects


def read_cluster_sync(kubeconfig: str | None = None, context: str | None = None) -> list[dict[str, Any]]:
    return asyncio.run(read_cluster(kubeconfig, context))
