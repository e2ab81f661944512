"""The Kubernetes calls the plugin makes, behind a small protocol (tests use an in-memory fake).

Plain aiohttp and JSON dicts through the transport the operator and vgpuctl share
(vgpu_formats.kubeapi): the generated kubernetes client alone costs ~45 MB of RSS, more than half
the plugin's budget. Pods are only ever read with the field selector `spec.nodeName=<node>`,
never cluster-wide. Annotation writes are JSON merge patches, except consuming
`devices-to-allocate`, which is a JSON patch with a `test` of the old value (compare-and-swap).

Watches list first and watch from the list's resourceVersion. A server that no longer has that
version answers the watch with an ERROR event (410 Gone), not an HTTP error: the client then lists
again at once (so a change made meanwhile is applied) and waits before the next watch, longer each
time the server keeps failing (`Backoff`), so nothing ever re-watches in a tight loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
from vgpu_formats import kubeapi, kubeconfig
from vgpu_formats.annotations import DEVICES_TO_ALLOCATE

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
SERVICE_ACCOUNT = kubeapi.SERVICE_ACCOUNT
WATCH_SECONDS = 300
CALL_TIMEOUT = 30.0  # seconds for a plain call; a watch: kubeapi.KubeApi.stream's deadlines
WATCH_RETRY_FIRST = 1.0  # seconds before the first retry of a failed watch; doubles per failure
WATCH_RETRY_MAX = 60.0
HEALTHY_WATCH_SECONDS = 10.0  # a watch open this long was no spin, whatever ended it
_UNSEEN = object()  # a ConfigMap not listed yet: the first list reports it
LISTED = "LISTED"  # _list_and_watch: a fresh list (current state), then the watch's events

# ("RESET", {}), the listed pods as ("ADDED", pod), ("SYNCED", {}), then ADDED/MODIFIED/DELETED.
PodEvent = tuple[str, dict[str, Any]]


class KubeError(RuntimeError):
    """An API call failed; the message names the object and the status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class WatchError(KubeError):
    """The server ended a watch with an ERROR event; the message is the Status's code, reason and
    message (e.g. `410 Expired: too old resource version: 1 (246)`)."""


class Backoff:
    """Delays between retries: `first`, then doubled per call up to `cap`; `reset()` after success."""

    def __init__(self, first: float, cap: float) -> None:
        self.first, self.cap = first, cap
        self._next = first

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.cap)
        return delay

    def reset(self) -> None:
        self._next = self.first


class KubeClient(Protocol):
    async def get_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        """The ConfigMap's `data`, or None when it does not exist."""
        ...

    def watch_configmaps(self, configmaps: tuple[tuple[str, str], ...]) -> AsyncIterator[None]:
        """Yield once per change to any of the (namespace, name) ConfigMaps (re-read them with get); the real
        client also yields when it starts, and after a broken watch when the data changed meanwhile."""
        ...

    async def list_pods_on_node(self, node: str) -> list[dict[str, Any]]: ...

    def pod_events(self, node: str) -> AsyncIterator[PodEvent]:
        """The pods on `node` as a stream (see PodEvent); after a gap it starts again with RESET."""
        ...

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...

    async def consume_devices(self, namespace: str, name: str, old: str, new: str,
                              phase: str | None = None) -> dict[str, Any]:
        """Set devices-to-allocate to `new` only if it is still `old` (and, given `phase`, the pod
        is still in that phase: a pod the kubelet rejected meanwhile is not served); the updated
        pod. Raises KubeError (status 422) when either changed, (404) when the pod is gone."""
        ...

    async def patch_node(self, name: str, patch: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...


# Server, TLS and login; a tokenFile is re-read on every call (projected tokens rotate).
Connection = kubeapi.Endpoint


def in_cluster() -> Connection:
    try:
        return kubeapi.in_cluster(account=SERVICE_ACCOUNT)
    except kubeconfig.KubeconfigError as exc:
        raise KubeError(str(exc)) from exc


def from_kubeconfig(path: str) -> Connection:
    """Current context of a kubeconfig, read by the parser every command shares
    (vgpu_formats.kubeconfig: KubeconfigError names what is missing): server, CA, token or
    client certificate. Exec plugins and auth providers are refused: no client library here runs
    them."""
    return from_connection(kubeconfig.read(Path(path)), path)


def from_connection(found: kubeconfig.Connection, path: str) -> Connection:
    """The plugin's connection for one context that `kubeconfig.read` returned."""
    if found.external_login:
        raise KubeError(f"kubeconfig {path}: exec/auth-provider users are not supported; use a token")
    return kubeapi.from_connection(found, path)


class ApiKubeClient:
    """KubeClient over aiohttp (kubeconfig file, or in-cluster when none is given)."""

    def __init__(self, connection: Connection, watch_retry: float = WATCH_RETRY_FIRST,
                 watch_retry_max: float = WATCH_RETRY_MAX) -> None:
        self._api = kubeapi.KubeApi(connection, timeout=CALL_TIMEOUT, limit=8)
        self._watch_retry, self._watch_retry_max = watch_retry, watch_retry_max

    @classmethod
    async def connect(cls, path: str | None) -> ApiKubeClient:
        """From the kubeconfig at `path`; None: the pod's service account."""
        return cls(from_kubeconfig(path) if path else in_cluster())

    async def close(self) -> None:
        await self._api.close()

    async def _call(self, method: str, path: str, what: str, *, params: dict[str, str] | None = None,
                    body: Any = None, content_type: str | None = None) -> Any:
        try:
            return await self._api.request(method, path, body, params, content_type or "application/json")
        except kubeapi.ApiException as exc:
            raise KubeError(f"{what}: HTTP {exc.status} {exc.message()[:300]}", exc.status) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeError(f"{what}: {exc!r}") from exc

    async def _watch(self, path: str, params: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        """Raw watch events until the server ends the stream. Raises WatchError on an ERROR event;
        TimeoutError when the stream goes silent or outlives its deadline (kubeapi.KubeApi.stream)."""
        query = {**params, "watch": "true", "timeoutSeconds": str(WATCH_SECONDS),
                 "allowWatchBookmarks": "true"}
        events = self._api.stream(path, query, WATCH_SECONDS)
        async with contextlib.aclosing(events):
            try:
                async for event in events:
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise WatchError(_status_text(status), status.get("code"))
                    yield event
            except kubeapi.ApiException as exc:
                raise KubeError(f"watch {path}: HTTP {exc.status} {exc.message()[:300]}",
                                exc.status) from exc

    async def get_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            obj = await self._call("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}",
                                   f"ConfigMap {namespace}/{name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(obj.get("data") or {})

    async def watch_configmaps(self, configmaps: tuple[tuple[str, str], ...]) -> AsyncIterator[None]:
        queue: asyncio.Queue[None] = asyncio.Queue()
        tasks = [asyncio.create_task(self._watch_configmap(ns, name, queue)) for ns, name in configmaps]
        try:
            while True:
                await queue.get()
                yield None
        finally:
            for task in tasks:
                task.cancel()

    async def _watch_configmap(self, namespace: str, name: str, queue: asyncio.Queue[None]) -> None:
        """Put None on `queue` whenever the ConfigMap's data changed (and once at start: the caller
        read it before this watch began)."""
        seen: object = _UNSEEN
        path, selector = f"/api/v1/namespaces/{namespace}/configmaps", f"metadata.name={name}"
        async for kind, obj in self._list_and_watch(path, selector, f"ConfigMap {namespace}/{name}"):
            if kind == LISTED:  # a name selector: zero or one item
                items = obj.get("items") or []
                data = dict(items[0].get("data") or {}) if items else None
            else:
                data = None if kind == "DELETED" else dict(obj.get("data") or {})
            if data != seen:
                seen = data
                queue.put_nowait(None)

    async def _list_pods(self, node: str) -> dict[str, Any]:
        return dict(await self._call("GET", "/api/v1/pods", f"pods on node {node}",
                                     params={"fieldSelector": f"spec.nodeName={node}"}))

    async def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return list((await self._list_pods(node)).get("items") or [])

    async def pod_events(self, node: str) -> AsyncIterator[PodEvent]:
        async for kind, obj in self._list_and_watch("/api/v1/pods", f"spec.nodeName={node}",
                                                    f"pods on node {node}"):
            if kind == LISTED:
                yield ("RESET", {})
                for pod in obj.get("items") or []:
                    yield ("ADDED", pod)
                yield ("SYNCED", {})
            else:
                yield (kind, obj)

    async def _list_and_watch(self, path: str, selector: str, what: str) -> AsyncIterator[tuple[str, Any]]:
        """(LISTED, the list) and then the watch's (type, object) events, forever. After an ERROR
        event or a failure, the next thing is a fresh LISTED: the caller compares it with what it
        has. Every restart that follows a failure waits (`Backoff`), so this never spins."""
        backoff = Backoff(self._watch_retry, self._watch_retry_max)
        version: str | None = None  # None: list first
        pause = 0.0  # before the next watch: zero after a healthy one
        while True:
            if version is None:
                try:
                    listed = await self._call("GET", path, what, params={"fieldSelector": selector})
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    delay, pause = backoff.next(), 0.0  # this wait is the pause before the watch
                    log.warning("listing %s failed (%s); trying again in %.2f s", what, exc, delay)
                    await asyncio.sleep(delay)
                    continue
                version = str(listed.get("metadata", {}).get("resourceVersion", ""))
                yield (LISTED, listed)
            await asyncio.sleep(pause)
            watch = _WatchRound(asyncio.get_running_loop().time())
            try:
                async for event in self._watch(path, {"fieldSelector": selector, "resourceVersion": version}):
                    watch.events += 1
                    version = event["object"]["metadata"].get("resourceVersion", version)
                    if event.get("type") != "BOOKMARK":
                        yield (event.get("type", ""), event["object"])
            except asyncio.CancelledError:
                raise
            except WatchError as exc:  # the server is up but gave up on this watch: list again at once
                pause = watch.next_pause(backoff, failed=True)
                log.warning("watch of %s ended by the server: %s; listing again, watching again in %.2f s",
                            what, exc, pause)
                version = None
                continue
            except Exception as exc:  # connection or HTTP error: a list would fail too, wait first
                delay = watch.next_pause(backoff, failed=True)
                log.warning("watch of %s failed (%s); listing again in %.2f s", what, exc, delay)
                version, pause = None, 0.0
                await asyncio.sleep(delay)
                continue
            pause = watch.next_pause(backoff, failed=False)  # the server ended it: resume from `version`

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self._call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", f"Pod {namespace}/{name}",
                         body=patch, content_type=MERGE_PATCH)

    async def consume_devices(self, namespace: str, name: str, old: str, new: str,
                              phase: str | None = None) -> dict[str, Any]:
        path = "/metadata/annotations/" + DEVICES_TO_ALLOCATE.replace("~", "~0").replace("/", "~1")
        ops = [{"op": "test", "path": path, "value": old}, {"op": "replace", "path": path, "value": new}]
        if phase:  # a test reads the whole stored object, status included
            ops.insert(0, {"op": "test", "path": "/status/phase", "value": phase})
        return dict(await self._call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{quote(name)}",
                                     f"Pod {namespace}/{name}", body=ops, content_type=JSON_PATCH))

    async def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        await self._call("PATCH", f"/api/v1/nodes/{name}", f"Node {name}", body=patch,
                         content_type=MERGE_PATCH)


@dataclass
class _WatchRound:
    """One watch request: when it started and how many events it delivered."""

    started: float
    events: int = 0

    def next_pause(self, backoff: Backoff, failed: bool) -> float:
        """Seconds to wait before the next watch. A watch that delivered events (an ERROR is not
        one) or stayed open a while was healthy: it resets the backoff, and when the server simply
        ended it, the next one starts at once. A failure, or an empty stream ended at once, waits,
        longer each time in a row."""
        lasted = asyncio.get_running_loop().time() - self.started
        if self.events or lasted >= HEALTHY_WATCH_SECONDS:
            backoff.reset()
            if not failed:
                return 0.0
        return backoff.next()


def _status_text(status: dict[str, Any]) -> str:
    """`410 Expired: too old resource version: 1 (246)` from a Status object."""
    head = " ".join(str(status[k]) for k in ("code", "reason") if status.get(k))
    return f"{head}: {status.get('message', '')}" if head else str(status.get("message") or status)

