"""The Kubernetes calls the plugin makes, behind a small protocol (tests use an in-memory fake).

Plain aiohttp and JSON dicts: the generated kubernetes client alone costs ~45 MB of RSS, more than
half the plugin's budget. Pods are only ever read with the field selector `spec.nodeName=<node>`,
never cluster-wide. Annotation writes are JSON merge patches, except consuming
`devices-to-allocate`, which is a JSON patch with a `test` of the old value (compare-and-swap).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
import yaml
from vgpu_formats.annotations import DEVICES_TO_ALLOCATE

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
WATCH_SECONDS = 300
CALL_TIMEOUT = aiohttp.ClientTimeout(total=30)

# ("RESET", {}), the listed pods as ("ADDED", pod), ("SYNCED", {}), then ADDED/MODIFIED/DELETED.
PodEvent = tuple[str, dict[str, Any]]


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

    def pod_events(self, node: str) -> AsyncIterator[PodEvent]:
        """The pods on `node` as a stream (see PodEvent); after a gap it starts again with RESET."""
        ...

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...

    async def consume_devices(self, namespace: str, name: str, old: str, new: str) -> dict[str, Any]:
        """Set devices-to-allocate to `new` only if it is still `old`; the updated pod.
        Raises KubeError (status 422) when it changed, (404) when the pod is gone."""
        ...

    async def patch_node(self, name: str, patch: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...


@dataclass
class Connection:
    server: str
    ssl: ssl.SSLContext | bool
    token: str | None = None
    token_file: str | None = None  # re-read on use: projected tokens rotate

    def headers(self) -> dict[str, str]:
        token = Path(self.token_file).read_text().strip() if self.token_file else self.token
        return {"Authorization": f"Bearer {token}"} if token else {}


def in_cluster() -> Connection:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeError("not in a cluster (KUBERNETES_SERVICE_HOST unset): pass --kubeconfig")
    context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return Connection(server, context, token_file=str(SERVICE_ACCOUNT / "token"))


def from_kubeconfig(path: str) -> Connection:
    """Current context of a kubeconfig: server, CA, token or client certificate (no exec plugins)."""
    doc = yaml.safe_load(Path(path).read_text()) or {}
    base = Path(path).resolve().parent

    def named(kind: str, name: str) -> dict[str, Any]:
        for item in doc.get(f"{kind}s") or []:
            if item.get("name") == name:
                return dict(item.get(kind) or {})
        raise KubeError(f"kubeconfig {path}: no {kind} named {name!r}")

    context = named("context", doc.get("current-context", ""))
    cluster, user = named("cluster", context.get("cluster", "")), named("user", context.get("user", ""))
    if "exec" in user or "auth-provider" in user:
        raise KubeError(f"kubeconfig {path}: exec/auth-provider users are not supported; use a token")
    server = str(cluster["server"]).rstrip("/")
    tls: ssl.SSLContext | bool = False
    if server.startswith("https"):
        tls = _tls(cluster, user, base)
    token = user.get("token")
    token_file = str(base / user["tokenFile"]) if user.get("tokenFile") else None
    return Connection(server, tls, token=token, token_file=token_file)


def _tls(cluster: dict[str, Any], user: dict[str, Any], base: Path) -> ssl.SSLContext:
    if cluster.get("insecure-skip-tls-verify"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif cluster.get("certificate-authority-data"):
        pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
        context = ssl.create_default_context(cadata=pem)
    elif cluster.get("certificate-authority"):
        context = ssl.create_default_context(cafile=str(base / cluster["certificate-authority"]))
    else:
        context = ssl.create_default_context()
    if user.get("client-certificate-data"):
        # load_cert_chain wants files: write private ones, load, remove.
        with tempfile.TemporaryDirectory() as folder:
            cert, key = Path(folder) / "cert", Path(folder) / "key"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            context.load_cert_chain(cert, key)
    elif user.get("client-certificate"):
        context.load_cert_chain(base / user["client-certificate"], base / user["client-key"])
    return context


class ApiKubeClient:
    """KubeClient over aiohttp (kubeconfig file, or in-cluster when none is given)."""

    def __init__(self, connection: Connection, watch_retry: float = 5.0) -> None:
        self._conn = connection
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=connection.ssl, limit=8),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        self._watch_retry = watch_retry

    @classmethod
    async def connect(cls, kubeconfig: str | None) -> ApiKubeClient:
        return cls(from_kubeconfig(kubeconfig) if kubeconfig else in_cluster())

    async def close(self) -> None:
        await self._session.close()

    async def _call(self, method: str, path: str, what: str, *, params: dict[str, str] | None = None,
                    body: Any = None, content_type: str | None = None) -> Any:
        headers = self._conn.headers()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            data = json.dumps(body)
        try:
            async with self._session.request(method, self._conn.server + path, params=params, data=data,
                                             headers=headers, timeout=CALL_TIMEOUT) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise KubeError(f"{what}: HTTP {resp.status} {_reason(raw)}", resp.status)
                return json.loads(raw)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeError(f"{what}: {exc!r}") from exc

    async def _watch(self, path: str, params: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        """Raw watch events until the server ends the stream."""
        query = {**params, "watch": "true", "timeoutSeconds": str(WATCH_SECONDS),
                 "allowWatchBookmarks": "true"}
        async with self._session.get(self._conn.server + path, params=query, headers=self._conn.headers(),
                                     timeout=aiohttp.ClientTimeout(total=WATCH_SECONDS + 30)) as resp:
            if resp.status >= 400:
                raise KubeError(f"watch {path}: HTTP {resp.status} {_reason(await resp.read())}", resp.status)
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)

    async def get_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            obj = await self._call("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}",
                                   f"ConfigMap {namespace}/{name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(obj.get("data") or {})

    async def watch_configmaps(
        self, namespaces: tuple[str, ...], names: tuple[str, ...]
    ) -> AsyncIterator[None]:
        queue: asyncio.Queue[None] = asyncio.Queue()
        tasks = [asyncio.create_task(self._watch_configmap(ns, name, queue))
                 for ns in namespaces for name in names]
        try:
            while True:
                await queue.get()
                yield None
        finally:
            for task in tasks:
                task.cancel()

    async def _watch_configmap(self, namespace: str, name: str, queue: asyncio.Queue[None]) -> None:
        version = ""
        while True:
            try:
                params = {"fieldSelector": f"metadata.name={name}"}
                if version:
                    params["resourceVersion"] = version
                async for event in self._watch(f"/api/v1/namespaces/{namespace}/configmaps", params):
                    if event.get("type") == "ERROR":  # e.g. 410 Gone: start over from now
                        version = ""
                        break
                    version = event["object"]["metadata"].get("resourceVersion", version)
                    if event.get("type") != "BOOKMARK":
                        queue.put_nowait(None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the watch is best effort; the next one starts over
                log.warning("watch of ConfigMap %s/%s failed (%s); retrying", namespace, name, exc)
                version = ""
                await asyncio.sleep(self._watch_retry)

    async def _list_pods(self, node: str) -> dict[str, Any]:
        return dict(await self._call("GET", "/api/v1/pods", f"pods on node {node}",
                                     params={"fieldSelector": f"spec.nodeName={node}"}))

    async def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return list((await self._list_pods(node)).get("items") or [])

    async def pod_events(self, node: str) -> AsyncIterator[PodEvent]:
        while True:
            try:
                listed = await self._list_pods(node)
                yield ("RESET", {})
                for pod in listed.get("items") or []:
                    yield ("ADDED", pod)
                yield ("SYNCED", {})
                version = listed.get("metadata", {}).get("resourceVersion", "")
                while True:
                    params = {"fieldSelector": f"spec.nodeName={node}", "resourceVersion": version}
                    gone = False
                    async for event in self._watch("/api/v1/pods", params):
                        kind = event.get("type", "")
                        if kind == "ERROR":
                            gone = True
                            break
                        version = event["object"]["metadata"].get("resourceVersion", version)
                        if kind != "BOOKMARK":
                            yield (kind, event["object"])
                    if gone:
                        break  # resourceVersion too old: list again
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("watch of pods on node %s failed (%s); listing again", node, exc)
                await asyncio.sleep(self._watch_retry)

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self._call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", f"Pod {namespace}/{name}",
                         body=patch, content_type=MERGE_PATCH)

    async def consume_devices(self, namespace: str, name: str, old: str, new: str) -> dict[str, Any]:
        path = "/metadata/annotations/" + DEVICES_TO_ALLOCATE.replace("~", "~0").replace("/", "~1")
        ops = [{"op": "test", "path": path, "value": old}, {"op": "replace", "path": path, "value": new}]
        return dict(await self._call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{quote(name)}",
                                     f"Pod {namespace}/{name}", body=ops, content_type=JSON_PATCH))

    async def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        await self._call("PATCH", f"/api/v1/nodes/{name}", f"Node {name}", body=patch,
                         content_type=MERGE_PATCH)


def _reason(raw: bytes) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(raw).get("message", ""))[:300]
    return raw[:200].decode(errors="replace")
