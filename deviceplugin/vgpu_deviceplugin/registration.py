"""Serving the plugin sockets and registering them with the kubelet, again after it restarts.

A kubelet restart creates a new `kubelet.sock` and wipes the plugin sockets in the directory; the
plugin then has to listen again and call Register again. The watcher polls `kubelet.sock` only
(every 0.25 s: no inotify dependency, and well inside the 2 s the plugin promises): the plugin's
own sockets come and go whenever it restarts its endpoints, and are no sign of a kubelet restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

import grpc

from vgpu_deviceplugin.api import deviceplugin_pb2 as pb
from vgpu_deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc
from vgpu_deviceplugin.server import OPTIONS, DevicePlugin, add_to_server

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
POLL_SECONDS = 0.25
REGISTER_TIMEOUT = 5.0


def socket_name(resource_name: str) -> str:
    """`volcano.sh/vgpu-number` -> `vgpu-volcano.sh-vgpu-number.sock` (distinct from NVIDIA's names)."""
    return "vgpu-" + resource_name.replace("/", "-") + ".sock"


@dataclass
class Endpoint:
    resource_name: str
    path: str
    server: grpc.aio.Server


async def serve(plugin: DevicePlugin, resource_name: str, directory: str) -> Endpoint:
    path = os.path.join(directory, socket_name(resource_name))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a stale socket from a previous run
    server = grpc.aio.server()
    add_to_server(plugin, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return Endpoint(resource_name, path, server)


async def stop(endpoint: Endpoint) -> None:
    # ListAndWatch streams never end on their own: a long grace only delays re-registration.
    await endpoint.server.stop(grace=0.1)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(endpoint.path)


async def register(directory: str, endpoint: Endpoint) -> None:
    """Register `endpoint` with the kubelet. Raises grpc.aio.AioRpcError or TimeoutError."""
    async with grpc.aio.insecure_channel(f"unix://{os.path.join(directory, KUBELET_SOCKET)}") as channel:
        stub = pb_grpc.RegistrationStub(channel)
        await stub.Register(
            pb.RegisterRequest(version=API_VERSION, endpoint=os.path.basename(endpoint.path),
                               resource_name=endpoint.resource_name, options=OPTIONS),
            timeout=REGISTER_TIMEOUT, wait_for_ready=True,
        )


# (device, inode, change time in ns): a re-created file may get the inode number back, not the time.
SocketId = tuple[int, int, int]


def socket_identity(path: str) -> SocketId | None:
    """Identity of a socket file, None when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)
