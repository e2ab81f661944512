"""A kubelet, as far as device plugins can tell: a Registration server on kubelet.sock that then
dials each registered plugin, asks GetDevicePluginOptions, and follows ListAndWatch.

    sim = KubeletSim(directory)
    await sim.start()
    await sim.wait_for(["volcano.sh/vgpu-number"])     # registered and first list received
    sim.devices["volcano.sh/vgpu-number"]                # latest advertised ids -> health
    await sim.allocate("volcano.sh/vgpu-number", ids)    # AllocateResponse
    await sim.restart()                                  # new kubelet.sock, plugin sockets wiped
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field

import grpc

from vgpu_deviceplugin.api import deviceplugin_pb2 as pb
from vgpu_deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc

KUBELET_SOCKET = "kubelet.sock"


@dataclass
class PluginConnection:
    request: pb.RegisterRequest
    channel: grpc.aio.Channel
    stub: pb_grpc.DevicePluginStub
    options: pb.DevicePluginOptions | None = None
    watcher: asyncio.Task[None] | None = None
    lists_received: int = 0
    last_list_bytes: int = 0


@dataclass
class KubeletSim(pb_grpc.RegistrationServicer):
    directory: str
    plugins: dict[str, PluginConnection] = field(default_factory=dict)
    devices: dict[str, dict[str, str]] = field(default_factory=dict)
    registrations: list[pb.RegisterRequest] = field(default_factory=list)
    _server: grpc.aio.Server | None = None
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def socket(self) -> str:
        return os.path.join(self.directory, KUBELET_SOCKET)

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)
        self._server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()

    async def stop(self) -> None:
        for conn in self.plugins.values():
            await self._drop(conn)
        self.plugins.clear()
        if self._server is not None:
            await self._server.stop(grace=0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)

    async def restart(self) -> None:
        """What a kubelet restart looks like to plugins: sockets in the directory wiped, new kubelet.sock."""
        await self.stop()
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if name.endswith(".sock"):
                os.unlink(path)
        self.devices.clear()
        await self.start()

    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        self.registrations.append(request)
        old = self.plugins.pop(request.resource_name, None)
        if old is not None:
            await self._drop(old)
        channel = grpc.aio.insecure_channel(f"unix://{os.path.join(self.directory, request.endpoint)}")
        conn = PluginConnection(request, channel, pb_grpc.DevicePluginStub(channel))
        self.plugins[request.resource_name] = conn
        conn.watcher = asyncio.create_task(self._follow(conn))
        return pb.Empty()

    async def _follow(self, conn: PluginConnection) -> None:
        name = conn.request.resource_name
        # As the kubelet does after Register: options first, then the device stream.
        conn.options = await conn.stub.GetDevicePluginOptions(pb.Empty(), wait_for_ready=True, timeout=5)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for response in conn.stub.ListAndWatch(pb.Empty()):
                self.devices[name] = {d.ID: d.health for d in response.devices}
                conn.lists_received += 1
                conn.last_list_bytes = response.ByteSize()
                async with self._changed:
                    self._changed.notify_all()

    async def _drop(self, conn: PluginConnection) -> None:
        if conn.watcher is not None:
            conn.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await conn.watcher
        await conn.channel.close(None)

    async def wait_for(self, resources: list[str], timeout: float = 20.0, lists: int = 1) -> None:
        """Until each resource is registered and has sent at least `lists` device lists."""

        def ready() -> bool:
            return all(r in self.plugins and self.plugins[r].lists_received >= lists for r in resources)

        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(ready), timeout)

    async def allocate(self, resource: str, device_ids: list[str]) -> pb.AllocateResponse:
        conn = self.plugins[resource]
        request = pb.AllocateRequest()
        request.container_requests.add(devices_ids=device_ids)
        response: pb.AllocateResponse = await conn.stub.Allocate(request, timeout=10)
        return response

    def free_ids(self, resource: str, count: int) -> list[str]:
        """Some advertised healthy ids (the plugin ignores which ones, as the kubelet's choice)."""
        healthy = [i for i, h in self.devices.get(resource, {}).items() if h == "Healthy"]
        return healthy[:count]
