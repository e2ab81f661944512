"""Every API call has a deadline (vgpu_formats.kubeapi): against a real TCP server that accepts
connections and never answers, or answers a watch and then goes silent, each call fails in time
with an error naming it, and the operator process ends with one line instead of hanging. Also the
transport's one login the generated client used to do for vgpuctl: an exec plugin."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from vgpu_formats import kubeapi
from vgpu_operator import crd, startup
from vgpu_operator.k8s import Kube, Retry, new_api_client, path_of
from vgpu_operator.runtime.run import run_operator
from vgpu_operator.settings import OperatorSettings
from vgpuctl.live import read_cluster

from tests.support.kubeconfigs import TOKEN_AT_PORT

DEADLINE = 0.5
SLACK = 2.0  # the most a failure may come after its deadline on a loaded machine
WATCH_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read the request, answer nothing, keep the connection open."""
    with contextlib.suppress(ConnectionError):
        await reader.read(65536)
        await asyncio.sleep(3600)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@contextlib.asynccontextmanager
async def _server(handler: Handler, tmp_path: Path) -> AsyncIterator[Path]:
    """A TCP server on a free local port; yields a kubeconfig that points at it."""
    handlers: set[asyncio.Task[None]] = set()

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(tracked, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = tmp_path / "kubeconfig"
    config.write_text(TOKEN_AT_PORT % port)
    try:
        yield config
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


@contextlib.asynccontextmanager
async def _kube(config: Path, **kwargs: Any) -> AsyncIterator[Kube]:
    kube = Kube(await new_api_client(str(config)), Retry(attempts=3, first_delay=0.01), timeout=DEADLINE,
                **kwargs)
    try:
        yield kube
    finally:
        await kube.close()


async def _fails_in_time(call: Awaitable[Any], match: str, deadline: float = DEADLINE) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=match):
        await call
    assert time.monotonic() - started < deadline + SLACK


async def _first_event(kube: Kube) -> list[dict[str, Any]]:
    return [event async for event in kube.watch("Node", "1")]


@pytest.mark.parametrize("call", ["get", "list_objects", "watch", "patch"])
async def test_a_server_that_never_answers_fails_each_call_at_its_deadline(call: str, tmp_path: Path) -> None:
    async with _server(_never_answer, tmp_path) as config, _kube(config) as kube:
        calls: dict[str, tuple[Awaitable[Any], str]] = {
            "get": (kube.get("Node", None, "n1"), r"GET /api/v1/nodes/n1: no answer within 0\.5s"),
            "list_objects": (kube.list_objects("Node"), r"GET /api/v1/nodes: no answer within 0\.5s"),
            "watch": (_first_event(kube), r"watch /api/v1/nodes: no answer within 0\.5s"),
            "patch": (kube.patch("Node", None, "n1", {"metadata": {"labels": {"a": "b"}}}),
                      r"PATCH /api/v1/nodes/n1: no answer within 0\.5s"),
        }
        for name, (awaitable, _) in calls.items():
            if name != call:
                awaitable.close()  # type: ignore[attr-defined]  # coroutines never awaited
        awaitable, match = calls[call]
        await _fails_in_time(awaitable, match)


async def test_a_watch_that_goes_silent_ends_at_its_read_timeout(tmp_path: Path) -> None:
    async def two_events_then_silence(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(WATCH_HEAD)
        for version in (b"2", b"3"):
            writer.write(_chunk(b'{"type": "ADDED", "object": {"metadata": {"resourceVersion": "%s"}}}\n'
                                % version))
        await writer.drain()
        await asyncio.sleep(3600)

    async with _server(two_events_then_silence, tmp_path) as config, \
            _kube(config, watch_read_timeout=DEADLINE) as kube:
        seen: list[str] = []

        async def follow() -> None:
            async for event in kube.watch("Node", "1"):
                seen.append(event["object"]["metadata"]["resourceVersion"])

        await _fails_in_time(follow(), r"watch /api/v1/nodes: no data for 0\.5s")
        assert seen == ["2", "3"]


async def test_a_watch_that_outlives_its_own_timeout_is_cut(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that keeps sending (no read timeout fires) but never ends the watch it was asked
    to end after timeoutSeconds: cut at timeoutSeconds + WATCH_SLACK."""
    monkeypatch.setattr(kubeapi, "WATCH_SLACK", DEADLINE)

    async def endless_bookmarks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(WATCH_HEAD)
        while True:
            writer.write(_chunk(b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "5"}}}\n'))
            await writer.drain()
            await asyncio.sleep(0.05)

    async with _server(endless_bookmarks, tmp_path) as config, _kube(config) as kube:
        count = 0

        async def follow() -> None:
            nonlocal count
            async for _ in kube.watch("Node", "1", timeout_seconds=0):
                count += 1

        await _fails_in_time(follow(), r"watch /api/v1/nodes: still open after 0\.5s")
        assert count > 1


async def test_the_operator_against_a_server_that_never_answers_stops_with_one_line(tmp_path: Path) -> None:
    async with _server(_never_answer, tmp_path) as config:
        started = time.monotonic()
        with pytest.raises(TimeoutError) as raised:
            await run_operator(str(config), asyncio.Event(), api_timeout=DEADLINE)
        assert time.monotonic() - started < DEADLINE + SLACK
        server = kubeapi.from_kubeconfig(config).server
        line = startup.describe(raised.value, OperatorSettings(kubeconfig=str(config)), server)
        crd_path = path_of("CustomResourceDefinition", None, crd.CRD_NAME)
        assert line == (f"the API server {server} did not answer (GET {crd_path}: no answer within 0.5s); "
                        f"check the network, or raise --api-timeout")

        # The installed command: exit status 1 and that line, in time.
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "vgpu-operator"), "--kubeconfig", str(config),
            "--api-timeout", str(DEADLINE), "--metrics-port", "0", "--liveness-port", "0",
            stderr=asyncio.subprocess.PIPE)
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 1, stderr
        assert stderr.decode().strip().splitlines()[-1] == f"vgpu-operator: error: {line}"


async def test_vgpuctl_logs_in_with_the_token_an_exec_plugin_prints(tmp_path: Path) -> None:
    seen: set[str] = set()

    async def empty_list(request: web.Request) -> web.Response:
        seen.add(request.headers.get("Authorization", ""))
        return web.json_response({"items": [], "metadata": {}})

    app = web.Application()
    app.router.add_get("/{path:.*}", empty_list)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    plugin = tmp_path / "bin" / "login"
    plugin.parent.mkdir()
    plugin.write_text(f"#!{sys.executable}\nimport json, os\n"
                      "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
                      "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
                      "                  'status': {'token': 'from-' + os.environ['WHO']}}))\n")
    plugin.chmod(0o755)
    config = tmp_path / "kubeconfig"
    exec_login = ("{exec: {apiVersion: client.authentication.k8s.io/v1, "
                  "command: bin/login, env: [{name: WHO, value: exec}]}}")
    config.write_text(TOKEN_AT_PORT.replace("{token: t}", exec_login) % port)
    try:
        assert await read_cluster(str(config)) == []
    finally:
        await runner.cleanup()
    assert seen == {"Bearer from-exec"}  # the command relative to the kubeconfig, its env set
