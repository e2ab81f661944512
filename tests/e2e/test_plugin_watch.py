"""The device plugin's ConfigMap watch against the real kube-apiserver when the server refuses the
watch with a 410 Gone ERROR event: the client does not hammer the server, applies a change made
while the watch is refused, and is back on a working watch once the server accepts it again.

The refusal is the server's own: while `reject` is set, the client's watches ask for
resourceVersion "1", which a running server no longer holds (the test makes sure of that first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu_deviceplugin.kube import ApiKubeClient, KubeError, WatchError, from_kubeconfig

from e2e import controlplane
from tests.support.waiting import eventually, eventually_awaited

NAMESPACE = "dp-watch-test"
NAME = "volcano-vgpu-device-config"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
FIRST, CAP = 0.05, 0.4  # the client's backoff here: short, so the test stays quick
WINDOW = 1.0  # requests are counted over this long (a measurement, not a wait for a state)
# At least FIRST between watches and two requests (list, watch) per round: a client that backs off
# stays under this whatever the machine's speed; the unfixed one made ~1,400 requests/s here.
BOUND = int(2 * WINDOW / FIRST) + 4


class RefusedWatches(ApiKubeClient):
    """The plugin's client, counting its requests; while `reject` is set its watches start from
    resourceVersion "1", which the server answers with an in-stream ERROR 410."""

    def __init__(self, kubeconfig: str) -> None:
        super().__init__(from_kubeconfig(kubeconfig), watch_retry=FIRST, watch_retry_max=CAP)
        self.reject = True
        self.lists = self.watches = self.accepted_watches = 0

    @property
    def requests(self) -> int:
        return self.lists + self.watches

    async def _call(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        if method == "GET" and path == CONFIGMAPS:
            self.lists += 1
        return await super()._call(method, path, what, **kwargs)

    def _watch(self, path: str, params: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        if self.reject:
            params = {**params, "resourceVersion": "1"}
        else:
            self.accepted_watches += 1
        return super()._watch(path, params)


async def _set_data(admin: ApiKubeClient, value: str) -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME}, "data": {"k": value}}
    await admin._call("PUT", f"{CONFIGMAPS}/{NAME}", NAME, body=body)


async def _version_1_refused(admin: ApiKubeClient) -> bool:
    """Whether a ConfigMap watch from resourceVersion 1 gets the 410; if not, write changes so the
    server's watch cache moves past it."""
    try:
        async with asyncio.timeout(10):
            async for _ in admin._watch(CONFIGMAPS, {"resourceVersion": "1"}):
                break  # accepted: the history since version 1 is still there
    except WatchError as exc:
        return exc.status == 410
    for i in range(200):
        await _set_data(admin, f"churn-{i}")
    return False


@pytest.fixture
async def admin(control_plane: controlplane.State) -> AsyncIterator[ApiKubeClient]:
    """Admin access, with the namespace dp-watch-test and the ConfigMap in it (both removed after)."""
    client = await ApiKubeClient.connect(control_plane.kubeconfig)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}

    async def created() -> bool:
        # A namespace left terminating by an earlier run refuses new objects until it is gone.
        with contextlib.suppress(KubeError):
            await client._call("POST", "/api/v1/namespaces", NAMESPACE, body=namespace)
        try:
            await client._call("POST", CONFIGMAPS, NAME, body={
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME}, "data": {"k": "0"}})
        except KubeError as exc:
            return exc.status == 409  # already there from an interrupted run: reused
        return True

    try:
        await eventually_awaited(created, 240, "the namespace dp-watch-test and its ConfigMap created")
        await eventually_awaited(lambda: _version_1_refused(client), 240,
                                 "the server refusing a watch from version 1")
        yield client
    finally:
        with contextlib.suppress(KubeError):
            await client._call("DELETE", f"/api/v1/namespaces/{NAMESPACE}", NAMESPACE)
        await client.close()


# The server's watch cache keeps at least ~75 s of events: on a fresh control plane, getting a 410
# from version 1 takes that long (in the whole suite the server is older and it is immediate).
@pytest.mark.timeout(300)
async def test_configmap_watch_refused_with_410_backs_off_and_applies_changes(
    control_plane: controlplane.State, admin: ApiKubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="vgpu_deviceplugin.kube")
    client = RefusedWatches(control_plane.kubeconfig)
    changes: list[None] = []

    async def consume() -> None:
        async for change in client.watch_configmaps(((NAMESPACE, NAME),)):
            changes.append(change)

    def refusals() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "ended by the server" in r.getMessage()]

    task = asyncio.create_task(consume())
    try:
        await eventually(lambda: client.watches >= 2, what="the client watching from version 1")
        # Bounded: the unfixed client re-watched at once, ~1,400 requests/s against this server.
        before = client.requests
        await asyncio.sleep(WINDOW)  # the measurement window itself (see BOUND)
        assert client.requests - before <= BOUND
        # Each refusal logged once (a watch still in flight may not be logged yet), at WARNING,
        # with the reason from the server's Status.
        assert client.watches - 1 <= len(refusals()) <= client.watches
        assert refusals() and all("410 Expired: too old resource version: 1 " in m for m in refusals())
        # A change made while every watch is refused is applied: the client lists after a 410.
        seen = len(changes)
        await _set_data(admin, "during")
        await eventually(lambda: len(changes) > seen, what="the change made during the refused watch")
        # The server accepts watches again: the next change arrives through the watch, no list.
        client.reject = False
        await eventually(lambda: client.accepted_watches >= 1, what="an accepted watch")
        lists, seen = client.lists, len(changes)
        await _set_data(admin, "after")
        await eventually(lambda: len(changes) > seen, what="the change through the watch")
        assert client.lists == lists
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()
