"""The plugin's watches when the API server answers a watch with an ERROR event (410 Gone).

A real kube-apiserver does not refuse a watch from a resourceVersion it no longer has with an HTTP
error: it answers 200 and sends one event of type ERROR holding a Status. The fake server here
does exactly that while `broken` is set, so the tests can count what the client does about it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from vgpu_deviceplugin.kube import ApiKubeClient, Backoff, Connection, PodEvent

from tests.support.waiting import eventually

NS, NAME, NODE = "kube-system", "volcano-vgpu-device-config", "node-a"
FIRST, CAP = 0.05, 0.4  # the client's backoff in these tests: short, so the tests stay quick
WINDOW = 1.0  # requests are counted over this long (a measurement, not a wait for a state)
# Over WINDOW, with delays of at least FIRST between watches and two requests (list, watch) per
# round, a client that backs off makes at most ~2 * WINDOW / FIRST requests; one that spins makes
# thousands. A slower machine only lowers the count.
BOUND = int(2 * WINDOW / FIRST) + 4
GONE = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "too old resource version: 1 (246)", "reason": "Expired", "code": 410}


@dataclass
class _Watch:
    kind: str
    matches: Any
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)


class FakeApi:
    """ConfigMaps and pods with list, get and watch (from a resourceVersion, or from now with the
    current objects sent as ADDED, as a real server does)."""

    def __init__(self) -> None:
        self.rv = 100
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.log: list[tuple[int, str, dict[str, Any]]] = []  # (rv, kind, event) for watches from a version
        self.watches: list[_Watch] = []
        self.broken = False  # every new watch gets one ERROR (410) event and ends
        self.requests: list[str] = []
        self.errors_sent = 0

    # ----- changing the state (what another client would do) -----

    def set_configmap(self, data: dict[str, str]) -> None:
        self.rv += 1
        kind = "MODIFIED" if (NS, NAME) in self.configmaps else "ADDED"
        obj = {"kind": "ConfigMap", "apiVersion": "v1", "data": dict(data),
               "metadata": {"name": NAME, "namespace": NS, "resourceVersion": str(self.rv)}}
        self.configmaps[(NS, NAME)] = obj
        self._notify("configmaps", {"type": kind, "object": copy.deepcopy(obj)})

    def add_pod(self, name: str) -> None:
        self.rv += 1
        pod = {"kind": "Pod", "apiVersion": "v1", "spec": {"nodeName": NODE},
               "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                            "resourceVersion": str(self.rv)}}
        self.pods[name] = pod
        self._notify("pods", {"type": "ADDED", "object": copy.deepcopy(pod)})

    def break_open_watches(self) -> int:
        """End the open watches with an in-stream ERROR, as a server whose cache moved on does."""
        for watch in self.watches:
            watch.queue.put_nowait({"type": "ERROR", "object": GONE})
        self.errors_sent += len(self.watches)
        return len(self.watches)

    def _notify(self, kind: str, event: dict[str, Any]) -> None:
        self.log.append((self.rv, kind, event))
        for watch in self.watches:
            if watch.kind == kind and watch.matches(event["object"]):
                watch.queue.put_nowait(event)

    # ----- HTTP -----

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/configmaps", self._configmaps)
        app.router.add_get("/api/v1/namespaces/{ns}/configmaps/{name}", self._configmap)
        app.router.add_get("/api/v1/pods", self._pods)
        return app

    def _count(self, request: web.Request) -> None:
        self.requests.append(f"{request.method} {request.path_qs}")

    async def _configmap(self, request: web.Request) -> web.Response:
        self._count(request)
        found = self.configmaps.get((request.match_info["ns"], request.match_info["name"]))
        if found is None:
            return web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)
        return web.json_response(found)

    async def _configmaps(self, request: web.Request) -> web.StreamResponse:
        self._count(request)
        wanted = re.sub("^metadata.name=", "", request.query.get("fieldSelector", ""))

        def matches(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            return bool(meta["namespace"] == request.match_info["ns"] and meta["name"] == wanted)

        items = [o for o in self.configmaps.values() if matches(o)]
        return await self._list_or_watch(request, "configmaps", items, matches)

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        self._count(request)
        node = re.sub("^spec.nodeName=", "", request.query.get("fieldSelector", ""))

        def matches(obj: dict[str, Any]) -> bool:
            return bool(obj["spec"]["nodeName"] == node)

        items = [p for p in self.pods.values() if matches(p)]
        return await self._list_or_watch(request, "pods", items, matches)

    async def _list_or_watch(self, request: web.Request, kind: str, items: list[dict[str, Any]],
                             matches: Any) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": str(self.rv)}, "items": items})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if self.broken:
            self.errors_sent += 1
            await response.write(json.dumps({"type": "ERROR", "object": GONE}).encode() + b"\n")
            return response
        since = request.query.get("resourceVersion", "")
        if since:
            backlog = [e for rv, k, e in self.log if k == kind and rv > int(since) and matches(e["object"])]
        else:
            backlog = [{"type": "ADDED", "object": item} for item in items]
        watch = _Watch(kind, matches)
        self.watches.append(watch)
        try:
            for event in backlog:
                await response.write(json.dumps(event).encode() + b"\n")
            while (queued := await watch.queue.get()) is not None:
                await response.write(json.dumps(queued).encode() + b"\n")
                if queued["type"] == "ERROR":
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away
        finally:
            self.watches.remove(watch)
        return response


@contextlib.asynccontextmanager
async def serving(api: FakeApi) -> AsyncIterator[ApiKubeClient]:
    runner = web.AppRunner(api.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = ApiKubeClient(Connection(f"http://127.0.0.1:{port}", False), watch_retry=FIRST,
                           watch_retry_max=CAP)
    try:
        yield client
    finally:
        await client.close()
        for watch in api.watches:  # a handler waiting for events would hold up the shutdown
            watch.queue.put_nowait(None)
        await runner.cleanup()


async def _requests_over_window(api: FakeApi) -> int:
    before = len(api.requests)
    await asyncio.sleep(WINDOW)  # the measurement window itself (see BOUND)
    return len(api.requests) - before


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "vgpu_deviceplugin.kube" and r.levelno == logging.WARNING]


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(0.5, 3.0)
    assert [backoff.next() for _ in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next() == 0.5


async def test_configmap_watch_error_relists_backs_off_and_applies_the_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="vgpu_deviceplugin.kube")
    api = FakeApi()
    api.set_configmap({"device-config.yaml": "nvidia:\n  deviceSplitCount: 10\n"})
    api.broken = True
    async with serving(api) as client:
        changes: list[None] = []

        async def consume() -> None:
            async for change in client.watch_configmaps(((NS, NAME),)):
                changes.append(change)

        task = asyncio.create_task(consume())
        try:
            await eventually(lambda: api.errors_sent >= 2, what="the watch answered with ERROR")
            # A server that keeps answering ERROR is not hammered.
            assert await _requests_over_window(api) <= BOUND
            # A change made while every watch fails is still seen: the client lists after an ERROR.
            seen = len(changes)
            api.set_configmap({"device-config.yaml": "nvidia:\n  deviceSplitCount: 4\n"})
            await eventually(lambda: len(changes) > seen, what="the change reported during the broken watch")
            # Once per failure, at WARNING, with the server's reason.
            api.broken = False
            await eventually(lambda: api.watches, what="a healthy watch again")
            assert len(_warnings(caplog)) == api.errors_sent
            assert all("410 Expired: too old resource version: 1 (246)" in m for m in _warnings(caplog))
            # The healthy watch delivers changes, and reports nothing that did not change.
            seen = len(changes)
            api.set_configmap({"device-config.yaml": "nvidia:\n  deviceSplitCount: 2\n"})
            await eventually(lambda: len(changes) == seen + 1, what="the change through the watch")
            # A healthy watch resets the backoff: the next failure waits the first delay again.
            api.break_open_watches()
            await eventually(lambda: len(_warnings(caplog)) == api.errors_sent and api.watches,
                             what="the watch recovered from an in-stream ERROR")
            assert _warnings(caplog)[-1].endswith(f"watching again in {FIRST:.2f} s")
            assert len(changes) == seen + 1  # the re-list found nothing new: no change reported
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_configmap_watch_backoff_grows_while_the_server_keeps_failing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="vgpu_deviceplugin.kube")
    api = FakeApi()
    api.broken = True
    async with serving(api) as client:
        async def consume() -> None:
            async for _ in client.watch_configmaps(((NS, NAME),)):
                pass

        task = asyncio.create_task(consume())
        try:
            await eventually(lambda: len(_warnings(caplog)) >= 5, what="five failed watches")
            delays = [float(m.rsplit(" ", 2)[1]) for m in _warnings(caplog)[:5]]
            assert delays == [FIRST, 2 * FIRST, 4 * FIRST, CAP, CAP]
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_pod_watch_error_relists_and_backs_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="vgpu_deviceplugin.kube")
    api = FakeApi()
    api.add_pod("first")
    api.broken = True
    async with serving(api) as client:
        events: list[PodEvent] = []

        async def consume() -> None:
            async for event in client.pod_events(NODE):
                events.append(event)

        task = asyncio.create_task(consume())
        try:
            await eventually(lambda: api.errors_sent >= 2, what="the pod watch answered with ERROR")
            assert await _requests_over_window(api) <= BOUND
            # A pod added while the watch is broken arrives with the next list.
            api.add_pod("during")
            await eventually(lambda: ("ADDED", api.pods["during"]) in events, what="the pod from a re-list")
            api.broken = False
            await eventually(lambda: api.watches, what="a healthy pod watch again")
            api.add_pod("after")
            await eventually(lambda: events[-1] == ("ADDED", api.pods["after"]),
                             what="the pod through the watch")
            assert len(_warnings(caplog)) == api.errors_sent
            assert all("410 Expired: too old resource version" in m for m in _warnings(caplog))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
