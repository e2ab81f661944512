"""An in-memory Kubernetes API server for tests, benches and the demo.

A thin subclass of `kmock.KubernetesEmulator`: kmock keeps serving discovery (`/api`, `/apis`,
`/apis/<group>/<version>`); object requests are served here, because kmock 0.8 lacks what a kopf
operator needs (docs/upstream.md §7.1): uid, resourceVersion, generation, creationTimestamp,
422 on a failed JSON-patch `test`, generateName, watch from a resourceVersion, label and field
selectors, namespace from the URL, PUT, a status subresource kept apart, and a bounded request
log. Tests can also inject faults (an error status, a dropped connection or a hang on the
next N matching requests; dropped watches).

Stored objects are never mutated in place: every change stores a new dict, so events already
queued for watchers keep the state they announced.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import json
import re
import secrets
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
from kmock._internal import apps, rendering  # kmock has no public name for these two

from vgpu_emulator.resources import BUILTINS, ResourceSpec, resource_info, specs_from_crd
from vgpu_emulator.selectors import Matcher, SelectorError, parse_field_selector, parse_label_selector

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
EVENT_LOG_SIZE = 20_000  # watch-from-resourceVersion replays from here; older -> 410 Gone
SERVED_LOG_SIZE = 20_000  # enough for assertions, bounded so long runs stay linear


class ApiError(kmock.KubernetesError):
    """An API error with the Kubernetes reason for its status code."""


def _error(status: int, message: str, reason: str | None = None) -> ApiError:
    reasons = {400: "BadRequest", 404: "NotFound", 405: "MethodNotAllowed", 409: "Conflict",
               410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid", 500: "InternalError"}
    return ApiError(status=status, reason=reason or reasons.get(status, "Failure"), message=message,
                    details={})


@attrs.frozen
class Route:
    """Where an object request points: resource, namespace, name and subresource."""

    spec: ResourceSpec
    namespace: str | None
    name: str | None
    subresource: str | None


@attrs.frozen
class Served:
    """One served request, kept in a bounded log for assertions."""

    method: str
    path: str
    query: str
    status: int
    at: float = attrs.field(factory=time.monotonic)  # when it was answered (for latency figures)

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS and 0 < self.status < 400  # 0: dropped, no answer


FaultAction = Literal["status", "drop", "hang"]


class DroppedConnection(Exception):
    """Raised by a fault that answers with nothing: `__call__` closes the connection."""


@attrs.define
class Fault:
    """The next `times` requests matching method and path, after letting `after` of them through,
    get `action`: "status" answers `status`, "drop" closes the connection without an answer (a
    crashed or restarted apiserver, a broken proxy), "hang" answers nothing until `release()` and
    then drops (a request stuck in a dead network path). A faulted request never changes state."""

    method: str
    path: re.Pattern[str]
    status: int
    times: int
    action: FaultAction = "status"
    after: int = 0
    released: asyncio.Event = attrs.field(factory=asyncio.Event)

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and self.method in ("*", method) and self.path.search(path) is not None

    def release(self) -> None:
        """End the fault: no further request matches, requests hanging now are dropped."""
        self.times = 0
        self.released.set()

    async def strike(self, method: str, path: str) -> None:
        if self.action == "hang":
            await self.released.wait()
        if self.action != "status":
            raise DroppedConnection(f"{self.action} fault for {method} {path}")
        raise _error(self.status, f"injected fault for {method} {path}")


@attrs.define
class _Watcher:
    key: str
    namespace: str | None
    labels: Matcher
    fields: Matcher
    queue: asyncio.Queue[dict[str, Any] | None] = attrs.field(factory=asyncio.Queue)

    def wants(self, namespace: str | None, obj: Mapping[str, Any]) -> bool:
        in_namespace = self.namespace is None or self.namespace == namespace
        return in_namespace and self.labels(obj) and self.fields(obj)


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, None deletes, everything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _without(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in obj.items() if key not in keys}


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """The Kubernetes API emulator. Start it on a port with `vgpu_emulator.run_emulator()`."""

    _specs: dict[str, ResourceSpec] = attrs.field(factory=dict, init=False)
    _store: dict[str, dict[tuple[str | None, str], dict[str, Any]]] = attrs.field(
        factory=lambda: collections.defaultdict(dict), init=False)
    _rv: int = attrs.field(default=0, init=False)
    _events: collections.deque[tuple[int, str, str | None, dict[str, Any]]] = attrs.field(
        factory=lambda: collections.deque(maxlen=EVENT_LOG_SIZE), init=False)
    _watchers: list[_Watcher] = attrs.field(factory=list, init=False)
    _faults: list[Fault] = attrs.field(factory=list, init=False)
    served: collections.deque[Served] = attrs.field(
        factory=lambda: collections.deque(maxlen=SERVED_LOG_SIZE), init=False)
    method_counts: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for spec in BUILTINS:
            self.declare(spec)
        for namespace in ("default", "kube-system"):  # present in every cluster
            self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        listing = await super()._serve_version(request)
        if isinstance(listing, dict) and str(listing.get("groupVersion", "")).startswith("/"):
            listing["groupVersion"] = listing["groupVersion"][1:]  # core is "v1", not "/v1"
        return listing

    # ----- set-up and assertions (in-process, no HTTP) -----

    def declare(self, spec: ResourceSpec) -> None:
        """Make a resource discoverable and servable."""
        self._specs[spec.key] = spec
        self.resources[spec.key] = resource_info(spec)

    def spec_for(self, kind_or_key: str, api_version: str | None = None) -> ResourceSpec:
        """Find a resource by its key (`apps/v1/daemonsets`) or its kind (`DaemonSet`)."""
        if kind_or_key in self._specs:
            return self._specs[kind_or_key]
        for spec in self._specs.values():  # built-ins first: core Event wins over events.k8s.io
            if spec.kind == kind_or_key and api_version in (None, spec.api_version):
                return spec
        raise KeyError(f"unknown resource {kind_or_key!r} (apiVersion {api_version}): declare() it first")

    def get_object(self, kind_or_key: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        spec = self.spec_for(kind_or_key)
        return self._store[spec.key].get((namespace if spec.namespaced else None, name))

    def list_objects(self, kind_or_key: str, namespace: str | None = None) -> list[dict[str, Any]]:
        spec = self.spec_for(kind_or_key)
        return [obj for (ns, _), obj in self._store[spec.key].items() if namespace in (None, ns)]

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create the object, or replace it if it exists (metadata kept fresh, watchers notified)."""
        spec = self.spec_for(obj.get("kind", ""), obj.get("apiVersion"))
        meta = obj.get("metadata") or {}
        namespace = (meta.get("namespace") or "default") if spec.namespaced else None
        # A CRD declares its resources when stored (`_store_object`), whichever way it arrives.
        if (namespace, meta.get("name")) in self._store[spec.key]:
            return self._replace(Route(spec, namespace, meta["name"], None), obj, status_too=True)
        return self._create(Route(spec, namespace, None, None), obj, seeding=True)

    def delete_object(self, kind_or_key: str, namespace: str | None, name: str) -> dict[str, Any]:
        """Delete the object as a DELETE request would (finalizers honoured, watchers notified)."""
        spec = self.spec_for(kind_or_key)
        return self._delete(Route(spec, namespace if spec.namespaced else None, name, None))

    def fail_next(self, method: str, path: str, status: int = 500, times: int = 1, *,
                  action: FaultAction = "status", after: int = 0) -> Fault:
        """The next `times` requests with this method ('*' for any) and path regex, once `after`
        of them went through, get `status` (or are dropped or hang: see `Fault`)."""
        fault = Fault(method=method.upper(), path=re.compile(path), status=status, times=times, action=action,
                      after=after)
        self._faults.append(fault)
        return fault

    def release_faults(self) -> None:
        """End every injected fault (hanging requests are dropped)."""
        for fault in self._faults:
            fault.release()
        self._faults.clear()

    def open_watches(self, kind_or_key: str | None = None) -> int:
        """Watch streams open now (all, or one resource's): tests wait for clients to be watching."""
        key = None if kind_or_key is None else self.spec_for(kind_or_key).key
        return sum(1 for watcher in self._watchers if key in (None, watcher.key))

    def drop_watches(self, kind_or_key: str | None = None) -> int:
        """End open watch streams (all, or one resource's), as a flaky network or apiserver does."""
        key = None if kind_or_key is None else self.spec_for(kind_or_key).key
        dropped = [watcher for watcher in self._watchers if key in (None, watcher.key)]
        for watcher in dropped:
            watcher.queue.put_nowait(None)
        return len(dropped)

    def writes(self, path_contains: str = "") -> list[Served]:
        """Successful PATCH/POST/PUT/DELETE requests served so far (bounded log)."""
        return [entry for entry in self.served if entry.is_write and path_contains in entry.path]

    @property
    def resource_version(self) -> int:
        return self._rv

    # ----- HTTP -----

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        await raw_request.read()
        self.method_counts[raw_request.method] += 1
        try:
            response = await self._serve_http(raw_request)
        except DroppedConnection:
            self.served.append(Served(raw_request.method, raw_request.path, raw_request.query_string, 0))
            if raw_request.transport is not None:
                raw_request.transport.close()
            return aiohttp.web.Response(status=499)  # never sent: the connection is gone
        except Exception as exc:  # ApiError with its status; a bug as a 500, not a dropped socket
            response = await self._render_error(exc)
        self.served.append(Served(raw_request.method, raw_request.path, raw_request.query_string,
                                  response.status))
        return response

    async def _serve_http(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        method, path = raw_request.method, raw_request.path
        for fault in self._faults:
            if fault.matches(method, path):
                if fault.after > 0:
                    fault.after -= 1
                    continue
                fault.times -= 1
                await fault.strike(method, path)
        route = self._route(path)
        if route is None:  # discovery and anything else: kmock's own routing
            request = await rendering.Request._parse(raw_request)
            # kmock's views match a request by finding it in the served list, and scan that list
            # on every request: keep it to the one request in flight (no quadratic slowdown).
            self._requests.append(request)
            try:
                return await apps.RawHandler._handle(self, request)
            finally:
                self._requests.remove(request)
        body = await raw_request.read()
        params = raw_request.query
        if method == "GET" and params.get("watch") in ("true", "1"):
            return await self._watch(raw_request, route)
        data = json.loads(body) if body else None
        result, status = self._dispatch(method, route, params, data, raw_request.content_type)
        return aiohttp.web.json_response(result, status=status)

    def _route(self, path: str) -> Route | None:
        parts = path.strip("/").split("/")
        if len(parts) >= 3 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        key = f"{group}/{version}/{rest[0]}" if group else f"{version}/{rest[0]}"
        spec = self._specs.get(key)
        if spec is None:
            raise _error(404, f"the server could not find the requested resource {key}")
        name = rest[1] if len(rest) > 1 else None
        subresource = "/".join(rest[2:]) or None
        return Route(spec, namespace if spec.namespaced else None, name, subresource)

    def _dispatch(
        self, method: str, route: Route, params: Mapping[str, str], data: Any, content_type: str,
    ) -> tuple[dict[str, Any], int]:
        if route.name is None:
            if method == "GET":
                return self._list(route, params), 200
            if method == "POST":
                return self._create(route, data), 201
        elif route.subresource not in (None, "status"):
            raise _error(404, f"subresource {route.subresource} is not served by the emulator")
        elif method == "GET":
            return self._existing(route), 200
        elif method == "PATCH":
            return self._patch(route, data, content_type), 200
        elif method == "PUT":
            return self._replace(route, data, status_too=False), 200
        elif method == "DELETE":
            return self._delete(route), 200
        raise _error(405, f"{method} is not supported on {route.spec.key}")

    # ----- object operations (synchronous: atomic within the event loop) -----

    def _existing(self, route: Route) -> dict[str, Any]:
        assert route.name is not None
        obj = self._store[route.spec.key].get((route.namespace, route.name))
        if obj is None:
            raise _error(404, f'{route.spec.plural} "{route.name}" not found')
        return obj

    def _list(self, route: Route, params: Mapping[str, str]) -> dict[str, Any]:
        """A list, paged when asked (`limit`, `continue`) as the API server pages large lists."""
        labels, fields = self._selectors(params)
        items = [obj for (ns, _), obj in self._store[route.spec.key].items()
                 if route.namespace in (None, ns) and labels(obj) and fields(obj)]
        meta: dict[str, Any] = {"resourceVersion": str(self._rv)}
        start = int(params["continue"]) if params.get("continue", "").isdigit() else 0
        limit = int(params["limit"]) if params.get("limit", "").isdigit() and int(params["limit"]) > 0 else 0
        if limit:
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
            items = items[start:start + limit]
        return {"apiVersion": route.spec.api_version, "kind": f"{route.spec.kind}List",
                "metadata": meta, "items": items}

    @staticmethod
    def _selectors(params: Mapping[str, str]) -> tuple[Matcher, Matcher]:
        try:
            return (parse_label_selector(params.get("labelSelector")),
                    parse_field_selector(params.get("fieldSelector")))
        except SelectorError as exc:
            raise _error(400, str(exc)) from exc

    def _create(self, route: Route, data: Any, seeding: bool = False) -> dict[str, Any]:
        """A POST; `seeding` (apply(): loading a cluster as it is) keeps status and versions."""
        if not isinstance(data, Mapping):
            raise _error(400, "the body of a create must be a JSON object")
        obj = copy.deepcopy(dict(data))
        meta = obj.setdefault("metadata", {})
        if not seeding:
            # As kube-apiserver: a stale copy posted back must not come back to life, and a custom
            # resource's status is written through its status subresource only.
            if meta.get("resourceVersion"):
                raise _error(500, "resourceVersion should not be set on objects to be created")
            if route.spec.custom and route.spec.status_subresource:
                obj.pop("status", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _error(422, "metadata.name or metadata.generateName is required")
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        namespace = route.namespace or (meta.get("namespace") or "default")
        if route.spec.namespaced:
            meta["namespace"] = namespace
        else:
            namespace = None
            meta.pop("namespace", None)
        if (namespace, meta["name"]) in self._store[route.spec.key]:
            raise _error(409, f'{route.spec.plural} "{meta["name"]}" already exists', "AlreadyExists")
        obj.setdefault("apiVersion", route.spec.api_version)
        obj.setdefault("kind", route.spec.kind)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        meta.pop("deletionTimestamp", None)
        return self._store_object(route.spec, namespace, obj, "ADDED")

    def _patch(self, route: Route, data: Any, content_type: str) -> dict[str, Any]:
        old = self._existing(route)
        if content_type == "application/json-patch+json":
            if not isinstance(data, list):
                raise _error(400, "a JSON patch must be a list of operations")
            try:
                patched = jsonpatch.apply_patch(old, data, in_place=False)
            except jsonpatch.JsonPatchTestFailed as exc:
                raise _error(422, f"the JSON patch test failed: {exc}") from exc
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                raise _error(422, f"the JSON patch cannot be applied: {exc}") from exc
        elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            # Strategic merge is served as a plain merge: lists are replaced, not merged.
            if not isinstance(data, Mapping):
                raise _error(400, "a merge patch must be a JSON object")
            self._check_version(old, data)
            patched = merge_patch(old, data)
        else:
            raise _error(415, f"unsupported patch type {content_type!r} (server-side apply is not emulated)")
        return self._update(route, old, patched)

    def _replace(self, route: Route, data: Any, *, status_too: bool) -> dict[str, Any]:
        if not isinstance(data, Mapping):
            raise _error(400, "the body of a replace must be a JSON object")
        old = self._existing(route)
        self._check_version(old, data)
        new = copy.deepcopy(dict(data))
        new["metadata"] = {**(new.get("metadata") or {}),
                           **{key: old["metadata"][key] for key in ("uid", "creationTimestamp", "namespace")
                              if key in old["metadata"]}}
        if status_too:
            new.setdefault("status", old.get("status"))
            if new["status"] is None:
                del new["status"]
            return self._update(Route(route.spec, route.namespace, route.name, None), old, new, raw=True)
        return self._update(route, old, new)

    @staticmethod
    def _check_version(old: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        wanted = (data.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise _error(409, "the object has been modified; please apply your changes to the latest "
                              "version and try again")

    def _update(
        self, route: Route, old: dict[str, Any], new: dict[str, Any], raw: bool = False,
    ) -> dict[str, Any]:
        """Store a new state, keeping status and spec apart as the subresource rules say."""
        if not raw and route.spec.status_subresource:
            if route.subresource == "status":
                new = {**old, "status": new.get("status")} if "status" in new else _without(old, "status")
            else:
                new = {**_without(new, "status"), **({"status": old["status"]} if "status" in old else {})}
        meta = new["metadata"] = dict(new.get("metadata") or {})
        for key in ("uid", "creationTimestamp", "name"):
            meta[key] = old["metadata"][key]
        meta["generation"] = old["metadata"].get("generation", 1)
        if _without(new, "metadata", "status") != _without(old, "metadata", "status"):
            meta["generation"] += 1
        if old["metadata"].get("deletionTimestamp"):
            meta["deletionTimestamp"] = old["metadata"]["deletionTimestamp"]
            if not meta.get("finalizers"):
                return self._remove(route.spec, route.namespace, new)
        return self._store_object(route.spec, route.namespace, new, "MODIFIED")

    def _delete(self, route: Route) -> dict[str, Any]:
        old = self._existing(route)
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return old
            marked = {**old, "metadata": {**old["metadata"], "deletionTimestamp": _now()}}
            return self._store_object(route.spec, route.namespace, marked, "MODIFIED")
        return self._remove(route.spec, route.namespace, old)

    def _store_object(self, spec: ResourceSpec, namespace: str | None, obj: dict[str, Any],
                      kind: str) -> dict[str, Any]:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._store[spec.key][(namespace, obj["metadata"]["name"])] = obj
        if spec.kind == "CustomResourceDefinition":
            for crd_spec in specs_from_crd(obj):
                self.declare(crd_spec)
        self._notify(spec, namespace, {"type": kind, "object": obj})
        return obj

    def _remove(self, spec: ResourceSpec, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        self._rv += 1
        gone = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self._rv)}}
        self._store[spec.key].pop((namespace, obj["metadata"]["name"]), None)
        self._notify(spec, namespace, {"type": "DELETED", "object": gone})
        return gone

    def _notify(self, spec: ResourceSpec, namespace: str | None, event: dict[str, Any]) -> None:
        self._events.append((self._rv, spec.key, namespace, event))
        for watcher in self._watchers:
            if watcher.key == spec.key and watcher.wants(namespace, event["object"]):
                watcher.queue.put_nowait(event)

    # ----- watch -----

    def _backlog(self, watcher: _Watcher, since: str | None) -> list[dict[str, Any]]:
        """What a new watch sends first: current objects, or only what changed after `since`."""
        if not since or since == "0":
            return [{"type": "ADDED", "object": obj} for (ns, _), obj in self._store[watcher.key].items()
                    if watcher.wants(ns, obj)]
        try:
            since_rv = int(since)
        except ValueError as exc:
            raise _error(400, f"invalid resourceVersion {since!r}") from exc
        oldest = self._events[0][0] if self._events else self._rv + 1
        if since_rv < oldest - 1 and len(self._events) == self._events.maxlen:
            gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                    "reason": "Expired", "message": f"too old resource version: {since_rv}"}
            return [{"type": "ERROR", "object": gone}]
        return [event for rv, key, ns, event in self._events
                if rv > since_rv and key == watcher.key and watcher.wants(ns, event["object"])]

    async def _watch(self, raw_request: aiohttp.web.BaseRequest, route: Route) -> aiohttp.web.StreamResponse:
        params = raw_request.query
        labels, fields = self._selectors(params)
        if route.name is not None:  # a watch on one object is a field selector on its name
            by_name = parse_field_selector(f"metadata.name={route.name}")
            fields = (lambda first, second: lambda obj: first(obj) and second(obj))(fields, by_name)
        watcher = _Watcher(key=route.spec.key, namespace=route.namespace, labels=labels, fields=fields)
        backlog = self._backlog(watcher, params.get("resourceVersion"))
        self._watchers.append(watcher)  # registered in the same step as the backlog: nothing is lost
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await response.prepare(raw_request)
            await self._stream(response, backlog, watcher, timeout)
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away
        finally:
            self._watchers.remove(watcher)
        return response

    @staticmethod
    async def _stream(response: aiohttp.web.StreamResponse, backlog: Iterable[dict[str, Any]],
                      watcher: _Watcher, timeout: float | None) -> None:
        for old_event in backlog:
            await response.write(json.dumps(old_event).encode() + b"\n")
            if old_event["type"] == "ERROR":
                return
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return
            event: dict[str, Any] | None
            try:
                event = await asyncio.wait_for(watcher.queue.get(), remaining)
            except TimeoutError:
                return
            if event is None:  # dropped by drop_watches()
                return
            await response.write(json.dumps(event).encode() + b"\n")
