"""Read the objects vgpuctl needs from a live cluster (kubeconfig), as plain dicts.

Read-only: list calls only, paginated, so it needs nothing beyond `get`/`list` RBAC on nodes,
pods, configmaps, daemonsets, deployments and vgpupolicies. The result has the same shape as
manifests read from files, so every command runs the same pure code on both.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from vgpu_formats import kubeapi
from vgpu_formats.kubeapi import ApiException, KubeApi
from vgpu_formats.kubeconfig import KubeconfigError, locate
from vgpu_formats.kubeconfig import read as read_kubeconfig

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


async def _list(api: KubeApi, prefix: str, plural: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        query = {"limit": str(PAGE), **({"continue": token} if token else {})}
        body = await api.request("GET", f"{prefix}/{plural}", query=query)
        items.extend(body.get("items") or [])
        token = (body.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


async def connect(kubeconfig: str | None = None, context: str | None = None) -> tuple[KubeApi, str]:
    """A client for the kubeconfig kubectl would use, and the server it talks to.

    `vgpu_formats.kubeconfig` finds the file ($KUBECONFIG honoured) and checks the context, so a
    bad kubeconfig is one line naming the fix; `vgpu_formats.kubeapi` logs in with its token,
    client certificate, basic auth or exec plugin (auth providers are refused, saying so).
    """
    try:
        path = locate(kubeconfig)
        if path is None:  # in a pod without a kubeconfig: its service account
            endpoint = kubeapi.in_cluster()
        else:
            connection = read_kubeconfig(path, context, allow_context_flag=True)
            if connection.external_login:  # a one-shot command may run the exec plugin, as kubectl does
                connection = kubeapi.exec_login(connection, path)
            endpoint = kubeapi.from_connection(connection, path)
    except KubeconfigError as err:
        raise ClusterError(str(err)) from err
    except (OSError, ValueError) as err:  # a CA or certificate unreadable, not PEM (ssl.SSLError), not text
        raise ClusterError(f"kubeconfig {path}: {_one_line(err)}") from err
    return KubeApi(endpoint), endpoint.server


def _refused(err: ApiException, where: str, plural: str) -> ClusterError:
    if err.status == 401:
        return ClusterError(f"GET {where}: HTTP 401: the kubeconfig's credentials were refused; log in "
                            f"again or pick another --context")
    if err.status == 403:
        return ClusterError(f"GET {where}: HTTP 403: vgpuctl needs get/list on {plural}")
    return ClusterError(f"GET {where}: HTTP {err.status} {err.reason}")


async def read_cluster(kubeconfig: str | None = None, context: str | None = None) -> list[dict[str, Any]]:
    """Every object of the collections above; VGPUPolicies are skipped when the CRD is absent."""
    api, server = await connect(kubeconfig, context)
    objects: list[dict[str, Any]] = []
    async with api:
        for prefix, plural, api_version, kind, required in COLLECTIONS:
            try:
                items = await _list(api, prefix, plural)
            except ApiException as err:
                if err.status == 404 and not required:
                    continue
                raise _refused(err, f"{prefix}/{plural}", plural) from err
            except (OSError, aiohttp.ClientError, TimeoutError) as err:
                raise ClusterError(f"cannot reach the API server {server} ({_one_line(err)}); is it "
                                   f"running, and is this the right --context?") from err
            for item in items:
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
            objects.extend(items)
    return objects


def read_cluster_sync(kubeconfig: str | None = None, context: str | None = None) -> list[dict[str, Any]]:
    return asyncio.run(read_cluster(kubeconfig, context))
