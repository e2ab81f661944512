"""The operator's API I/O: read what a policy renders against, write rendered targets, delete
plugin pods, patch status, post events. Thin on purpose: every decision is made by the pure core.

Objects travel as plain dicts (the JSON of `vgpu_formats.kubeapi`, the transport the device
plugin and vgpuctl share), so what is read is exactly what the renderers and `Observed` expect.
Transient failures (409, 429, 5xx, connection errors) are retried with a short exponential
backoff; anything else is raised to the caller. Every call has a deadline (`Kube.timeout`): a
request the server never answers fails the reconcile, which backs off and reads everything again,
instead of stalling the worker; it is not retried here.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import aiohttp
from vgpu_formats import kubeapi
from vgpu_formats.kubeapi import ApiException

from vgpu_operator import api
from vgpu_operator.observed import Observed
from vgpu_operator.registry import wanted_objects

logger = logging.getLogger(__name__)

T = TypeVar("T")

# kind -> (API prefix, plural, namespaced)
PATHS: dict[str, tuple[str, str, bool]] = {
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Pod": ("/api/v1", "pods", True),
    "Node": ("/api/v1", "nodes", False),
    "Event": ("/api/v1", "events", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    api.KIND: (f"/apis/{api.API_VERSION}", api.PLURAL, False),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
}
MERGE_PATCH = "application/merge-patch+json"
# The API server accepts an Event about a cluster-scoped object (VGPUPolicy, Node) only here
# (core/v1 Event validation; 422 elsewhere): ours and kopf's both go here.
CLUSTER_EVENTS_NAMESPACE = "default"
RETRIABLE = frozenset({409, 429, 500, 502, 503, 504})
DEFAULT_TIMEOUT = kubeapi.DEFAULT_TIMEOUT  # seconds for one API call (settings: --api-timeout)
WATCH_READ_TIMEOUT = kubeapi.WATCH_READ_TIMEOUT  # a watch silent this long is dead (kubeapi.py)


class TargetWrite(Protocol):
    """What `apply` needs from a rendered target (the core's TargetRender satisfies it)."""

    kind: str
    namespace: str
    name: str
    live: dict[str, Any] | None  # None: rendered as missing, so the patch is the whole object
    desired: dict[str, Any] | None

    def patch(self) -> dict[str, Any]: ...

    def written_part(self, obj: dict[str, Any] | None) -> Any: ...


@dataclass(frozen=True)
class Retry:
    """Backoff for transient API failures: attempts in total, first delay, cap."""

    attempts: int = 5
    first_delay: float = 0.05
    max_delay: float = 2.0

    def delays(self) -> Iterable[float]:
        delay = self.first_delay
        for _ in range(self.attempts - 1):
            yield delay * (0.5 + random.random())  # jitter: two operators must not retry in lockstep
            delay = min(delay * 2, self.max_delay)


def path_of(kind: str, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
    prefix, plural, namespaced = PATHS[kind]
    path = f"{prefix}/{plural}"
    if namespaced:
        path = f"{prefix}/namespaces/{quote(namespace or 'default')}/{plural}"
    if name is not None:
        path += f"/{quote(name)}"
    if sub is not None:
        path += f"/{sub}"
    return path


def now_rfc3339() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in RETRIABLE or exc.status == 0
    # A dropped connection (aiohttp's ServerDisconnectedError is no OSError) is transient too.
    return isinstance(exc, (ConnectionError, asyncio.TimeoutError, OSError, aiohttp.ClientConnectionError))


class TargetMissing(Exception):
    """A target the operator was patching is gone (deleted since it was read). It is not created
    again from the copy read before: the next reconcile reads the cluster anew and decides."""


class TargetChanged(Exception):
    """What a write replaces changed since the operator read the target (409 on the version read):
    not retried with the same patch; the next reconcile reads the cluster anew and decides."""


async def new_api_client(kubeconfig: str | None) -> kubeapi.KubeApi:
    """A client from an explicit kubeconfig path, else the in-cluster service account.

    $KUBECONFIG is deliberately not consulted here: `main` honours it through
    `vgpu_formats.kubeconfig.locate` and passes the path it found, so what a test or the demo
    sets later never sends this client to another cluster.
    """
    return await kubeapi.connect(kubeconfig)


class Kube:
    """The operator's API calls, with retries. One instance per operator process."""

    def __init__(self, api_client: kubeapi.KubeApi, retry: Retry | None = None,
                 timeout: float = DEFAULT_TIMEOUT, watch_read_timeout: float = WATCH_READ_TIMEOUT) -> None:
        self.api_client = api_client
        self.retry = retry or Retry()
        self.timeout = timeout
        self.watch_read_timeout = watch_read_timeout

    async def close(self) -> None:
        await self.api_client.close()

    # ----- transport -----

    async def _call(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
                    content_type: str = "application/json") -> dict[str, Any]:
        # The deadline covers connect, send, answer and body: TimeoutError "METHOD path: no
        # answer within Ns" (kubeapi.KubeApi.request).
        return await self.api_client.request(method, path, body, query, content_type, timeout=self.timeout)

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]], conflicts: bool = True) -> T:
        """`call`, again after transient failures. Not after a timeout (a hung server: the reconcile
        fails now rather than waiting out every attempt), nor after 409 unless `conflicts` (a
        write that carries a resourceVersion conflicts again: the caller must read anew)."""
        for delay in self.retry.delays():
            try:
                return await call()
            except Exception as exc:
                conflict = isinstance(exc, ApiException) and exc.status == 409
                if not is_transient(exc) or isinstance(exc, TimeoutError) or (conflict and not conflicts):
                    raise
                logger.info("%s failed (%s); retrying in %.2fs", what, _brief(exc), delay)
                await asyncio.sleep(delay)
        return await call()

    # ----- reads -----

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self._retrying(f"get {kind} {name}",
                                        lambda: self._call("GET", path_of(kind, namespace, name)))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def list_objects(self, kind: str, namespace: str | None = None, labels: str = "",
                           fields: str = "") -> list[dict[str, Any]]:
        return [item async for item in self.iter_objects(kind, namespace, labels, fields)]

    async def iter_objects(
        self, kind: str, namespace: str | None = None, labels: str = "", fields: str = "", page: int = 500,
        versions: list[str] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every matching object, fetched `page` at a time (a 5,000-node list never sits in memory
        as one response). The list's resourceVersion is appended to `versions` if given."""
        query = {key: value for key, value in (("labelSelector", labels), ("fieldSelector", fields)) if value}
        query["limit"] = str(page)
        prefix, plural, namespaced = PATHS[kind]
        path = path_of(kind, namespace) if namespaced and namespace else f"{prefix}/{plural}"
        while True:
            fetch = functools.partial(self._call, "GET", path, query=dict(query))
            listing = await self._retrying(f"list {kind}", fetch)
            if versions is not None:
                versions.append(str((listing.get("metadata") or {}).get("resourceVersion") or ""))
            for item in listing.get("items") or []:
                yield item
            token = (listing.get("metadata") or {}).get("continue")
            if not token:
                return
            query["continue"] = token

    async def watch(self, kind: str, resource_version: str, timeout_seconds: int = 300,
                    namespace: str | None = None, fields: str = "") -> AsyncIterator[dict[str, Any]]:
        """Watch events ({type, object}) after `resource_version`, until the server ends the
        stream: cluster-wide, or in `namespace`; `fields` a field selector (`metadata.name=X`
        keeps the request within RBAC `resourceNames`)."""
        prefix, plural, namespaced = PATHS[kind]
        query = [("watch", "true"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(timeout_seconds))]
        if fields:
            query.append(("fieldSelector", fields))
        path = path_of(kind, namespace) if namespaced and namespace else f"{prefix}/{plural}"
        # Headers within `timeout`, the whole stream within timeout_seconds + 30 s, and no silence
        # longer than `watch_read_timeout`: a hung server ends the watch with TimeoutError.
        events = self.api_client.stream(path, query, timeout_seconds, read_timeout=self.watch_read_timeout,
                                        timeout=self.timeout)
        async with contextlib.aclosing(events):
            async for event in events:
                yield event

    async def read_observed(self, spec: api.VGPUPolicySpec, nodes: list[dict[str, Any]]) -> Observed:
        """The objects the policy names (`wanted_objects`, read concurrently), plus the nodes the
        caller tracks."""
        wanted = wanted_objects(spec)
        found = await asyncio.gather(*(self._get_optional(*w.key) if w.optional else self.get(*w.key)
                                       for w in wanted))
        observed = Observed(nodes=nodes)
        for w, obj in zip(wanted, found, strict=True):
            setattr(observed, w.slot, obj)
        return observed

    async def _get_optional(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """`get`, but None when RBAC does not let the operator see the object."""
        try:
            return await self.get(kind, namespace, name)
        except ApiException as exc:
            if exc.status != 403:
                raise
            logger.debug("%s %s/%s: not readable with this RBAC; not checked", kind, namespace, name)
            return None

    async def plugin_pods(self, daemonset: dict[str, Any], node_names: Iterable[str]) -> list[dict[str, Any]]:
        """The DaemonSet's pods on the given nodes: one label+field-selected list per node, never
        a cluster-wide list of every pod."""
        match_labels = ((daemonset.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if not match_labels:
            return []  # without a selector we cannot tell its pods from others: touch nothing
        labels = ",".join(f"{key}={value}" for key, value in sorted(match_labels.items()))
        namespace = daemonset["metadata"].get("namespace")
        uid = daemonset["metadata"].get("uid")
        pods: list[dict[str, Any]] = []
        for node in sorted(set(node_names)):
            on_node = f"spec.nodeName={node}"
            for pod in await self.list_objects("Pod", namespace, labels=labels, fields=on_node):
                owners = (pod.get("metadata") or {}).get("ownerReferences") or []
                if uid and not any(owner.get("uid") == uid for owner in owners):
                    continue  # same labels, another owner or none (a hand-made pod): not ours
                    # to restart; deleted, it would not come back
                pods.append(pod)
        return pods

    # ----- writes -----

    async def apply(self, target: TargetWrite, annotations: dict[str, str | None] | None = None,
                    ) -> dict[str, Any]:
        """Merge-patch the target's owned fields (plus `annotations` on the object itself, in the
        same write); create it when it was rendered as missing.

        A 404 on a target that was read (deleted since) raises TargetMissing: creating it here
        would POST the stale copy read before, someone else's Deployment or DaemonSet or
        ConfigMap resurrected from memory. Only an object rendered from nothing is created, and
        by POST alone: one that someone made since the read (409) raises TargetChanged, where a
        merge patch would have written the render for "missing" over their data."""
        path = path_of(target.kind, target.namespace, target.name)
        where = f"{target.kind} {target.namespace}/{target.name}"
        patch = target.patch()
        if annotations:
            meta = patch.setdefault("metadata", {})
            meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}

        async def attempt() -> dict[str, Any]:
            if target.live is None:
                return await create()
            try:
                return await self._call("PATCH", path, patch, content_type=MERGE_PATCH)
            except ApiException as exc:
                if exc.status == 409 and target.live is not None:
                    return await again_if_untouched(exc)
                if exc.status != 404:
                    raise
            return await create()

        async def again_if_untouched(conflict: ApiException) -> dict[str, Any]:
            # The version changed since the read: a workload controller writes status all the
            # time. Write again over the new version only if what we replace is as we read it.
            try:
                fresh = await self._call("GET", path)
            except ApiException as exc:
                if exc.status == 404:
                    return await create()  # gone since the read: TargetMissing
                raise
            if target.written_part(fresh) != target.written_part(target.live):
                raise TargetChanged(f"{where} was changed while the operator was writing it "
                                    f"({conflict.status}); decided again at the next reconcile") from conflict
            version = (fresh.get("metadata") or {}).get("resourceVersion")
            again = {**patch, "metadata": {**(patch.get("metadata") or {}), "resourceVersion": version}}
            return await self._call("PATCH", path, again, content_type=MERGE_PATCH)

        async def create() -> dict[str, Any]:
            if target.live is not None:
                raise TargetMissing(f"{where} was deleted while the operator was writing it; not recreated")
            if target.desired is None:
                raise ValueError(f"{where} has nothing to create")
            # Rendered as missing: the patch is the whole new object (annotations set, none removed).
            meta = patch.get("metadata") or {}
            kept = {key: value for key, value in (meta.get("annotations") or {}).items() if value is not None}
            created = {**patch, "metadata": {**meta, "annotations": kept}} if "annotations" in meta else patch
            try:
                return await self._call("POST", path_of(target.kind, target.namespace), created)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # Also our own POST applied before a lost answer: the next reconcile reads it.
                raise TargetChanged(f"{where} was created by someone else while the operator was "
                                    "creating it; decided again at the next reconcile") from exc

        return await self._retrying(f"apply {target.kind} {target.namespace}/{target.name}", attempt)

    async def patch(self, kind: str, namespace: str | None, name: str, body: dict[str, Any],
                    sub: str | None = None) -> dict[str, Any]:
        path = path_of(kind, namespace, name, sub)
        return await self._retrying(f"patch {kind} {name}",
                                    lambda: self._call("PATCH", path, body, content_type=MERGE_PATCH))

    async def patch_status(self, name: str, status: dict[str, Any], resource_version: str | None = None,
                           ) -> dict[str, Any]:
        """Replace the policy's status fields (merge patch on the status subresource). With
        `resource_version`, the write applies only to that version of the policy: 409 otherwise
        (not retried; the caller reads the policy again), so a status computed from an older
        state (another replica wrote since) never overwrites a newer one."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        path = path_of(api.KIND, None, name, "status")
        return await self._retrying(f"patch {api.KIND} {name} status",
                                    lambda: self._call("PATCH", path, body, content_type=MERGE_PATCH),
                                    conflicts=not resource_version)

    async def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete one pod; False when it was already gone."""
        try:
            await self._retrying(f"delete pod {namespace}/{name}",
                                 lambda: self._call("DELETE", path_of("Pod", namespace, name)))
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def post_event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about `involved`, in its namespace or CLUSTER_EVENTS_NAMESPACE."""
        meta = involved.get("metadata") or {}
        now = now_rfc3339()
        event_ns = meta.get("namespace") or CLUSTER_EVENTS_NAMESPACE
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'vgpu')}.", "namespace": event_ns},
            "involvedObject": {"apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"),
                               "name": meta.get("name"), "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": type_, "reason": reason, "message": message[:1024],
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "source": {"component": "vgpu-operator"}, "reportingComponent": "vgpu-operator",
        }
        try:
            await self._retrying("post event", lambda: self._call("POST", path_of("Event", event_ns), body))
        except (ApiException, aiohttp.ClientError, OSError, TimeoutError) as exc:
            # An event is a report: losing one must not fail a reconcile.
            logger.warning("could not post event %s: %s", reason, _brief(exc))


def _brief(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"


def describe_error(exc: BaseException) -> str:
    """One line for status and events: the API's status and message (an ApiException's text is
    headers and body), else the exception's type and text."""
    if isinstance(exc, ApiException):
        try:
            message = str(json.loads(exc.body or "{}").get("message") or "")
        except (ValueError, AttributeError):
            message = ""
        return _brief(exc) + (f": {message}" if message else "")
    return _brief(exc)
