"""The Kubernetes calls the plugin makes, behind a small protocol (tests use an in-memory fake).

Objects travel as plain JSON dicts. Pods are only ever listed with the field selector
`spec.nodeName=<this node>`: never a cluster-wide list, so the cost of Allocate follows the pods on
this node, not the size of the cluster. Patches are JSON merge patches of annotations only.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"


class KubeError(RuntimeError):
    """An API call failed; the message names the object and the status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubeClient(Protocol):
    async def get_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        """The ConfigMap's `data`, or None when it does not exist."""
        ...

    def watch_configmaps(self, namespaces: tuple[str, ...], names: tuple[str, ...]) -> AsyncIterator[None]:
        """Yield once per change to any of the named ConfigMaps (re-read them with get)."""
        ...

    async def list_pods_on_node(self, node: str) -> list[dict[str, Any]]: ...

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...

    async def get_node(self, name: str) -> dict[str, Any]: ...

    async def patch_node(self, name: str, patch: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...


class ApiKubeClient:
    """KubeClient over kubernetes-asyncio (kubeconfig file, or in-cluster when none is given)."""

    def __init__(self, api: client.ApiClient, watch_retry: float = 5.0) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._watch_retry = watch_retry

    @classmethod
    async def connect(cls, kubeconfig: str | None) -> ApiKubeClient:
        if kubeconfig:
            cfg = client.Configuration()
            await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            config.load_incluster_config()
            cfg = client.Configuration.get_default_copy()
        return cls(client.ApiClient(cfg))

    async def close(self) -> None:
        await self._api.close()

    async def _json(self, call: Any, what: str, **kwargs: Any) -> Any:
        """Raw JSON (no model objects: a 110-pod list parses 10x faster). Raises KubeError."""
        try:
            resp = await call(_preload_content=False, **kwargs)
            body = await resp.read()
        except ApiException as exc:
            raise KubeError(f"{what}: HTTP {exc.status} {exc.reason}", exc.status) from exc
        except (TimeoutError, OSError) as exc:
            raise KubeError(f"{what}: {exc}") from exc
        if resp.status >= 400:
            raise KubeError(f"{what}: HTTP {resp.status} {body[:200].decode(errors='replace')}", resp.status)
        return json.loads(body)

    async def get_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            obj = await self._json(self._core.read_namespaced_config_map, f"ConfigMap {namespace}/{name}",
                                   name=name, namespace=namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(obj.get("data") or {})

    async def watch_configmaps(
        self, namespaces: tuple[str, ...], names: tuple[str, ...]
    ) -> AsyncIterator[None]:
        queue: asyncio.Queue[None] = asyncio.Queue()
        tasks = [asyncio.create_task(self._watch_one(ns, name, queue)) for ns in namespaces for name in names]
        try:
            while True:
                await queue.get()
                yield None
        finally:
            for task in tasks:
                task.cancel()

    async def _watch_one(self, namespace: str, name: str, queue: asyncio.Queue[None]) -> None:
        version = ""
        while True:
            try:
                kwargs: dict[str, Any] = {"namespace": namespace, "field_selector": f"metadata.name={name}",
                                          # as text: the client would send "True"
                                          "watch": "true", "timeout_seconds": 300}
                if version:
                    kwargs["resource_version"] = version
                resp: Any = await self._core.list_namespaced_config_map(_preload_content=False, **kwargs)
                async for line in resp.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":  # e.g. 410 Gone: start over from now
                        version = ""
                        break
                    version = event["object"]["metadata"].get("resourceVersion", "")
                    queue.put_nowait(None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the watch is best effort; the next one re-reads
                log.warning("watch of ConfigMap %s/%s failed (%s); retrying", namespace, name, exc)
                await asyncio.sleep(self._watch_retry)

    async def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        obj = await self._json(self._core.list_pod_for_all_namespaces, f"pods on node {node}",
                               field_selector=f"spec.nodeName={node}")
        return list(obj.get("items") or [])

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self._json(self._core.patch_namespaced_pod, f"Pod {namespace}/{name}", name=name,
                         namespace=namespace, body=patch, _content_type=MERGE_PATCH)

    async def get_node(self, name: str) -> dict[str, Any]:
        return dict(await self._json(self._core.read_node, f"Node {name}", name=name))

    async def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        await self._json(self._core.patch_node, f"Node {name}", name=name, body=patch,
                         _content_type=MERGE_PATCH)
