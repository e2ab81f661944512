"""The kubelet-facing gRPC service, one instance per resource (count, memory, cores).

The count resource's Allocate answers the containers that ask for it; the memory resource's
answers a container that asks for memory alone (allocate.py), and is empty for the others, as
cores' always is (the kubelet merges the answers of all plugins a container uses).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from vgpu_deviceplugin.allocate import AllocateError, Plan
from vgpu_deviceplugin.allocator import Allocator
from vgpu_deviceplugin.api import deviceplugin_pb2 as pb
from vgpu_deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc
from vgpu_deviceplugin.devices import ResourceKind, advertise
from vgpu_deviceplugin.state import PluginState

log = logging.getLogger(__name__)

OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


class DevicePlugin(pb_grpc.DevicePluginServicer):
    def __init__(self, kind: ResourceKind, state: PluginState, allocator: Allocator) -> None:
        self.kind = kind
        self._state = state
        self._allocator = allocator
        self._warned: str | None = None
        self._cached: tuple[int, bytes] | None = None

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> pb.DevicePluginOptions:
        return OPTIONS

    async def ListAndWatch(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        seen = self._state.version
        while True:
            yield self.current_list()
            seen = await self._state.wait_change(seen)

    def current_list(self) -> bytes:
        """The serialized ListAndWatchResponse, built once per state version."""
        state = self._state
        if self._cached is not None and self._cached[0] == state.version:
            return self._cached[1]
        adv = advertise(self.kind, state.gpus, state.health, state.settings)
        self._cached = (state.version, adv.payload)
        if adv.warning and adv.warning != self._warned:
            log.warning("%s", adv.warning)
            self._warned = adv.warning
        return adv.payload

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        # The real GPUs come from the pod annotations, so any ids do; prefer the required ones.
        response = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            chosen = list(req.must_include_deviceIDs)
            for dev in req.available_deviceIDs:
                if len(chosen) >= req.allocation_size:
                    break
                if dev not in chosen:
                    chosen.append(dev)
            response.container_responses.add(deviceIDs=chosen[: req.allocation_size])
        return response

    async def Allocate(
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        response = pb.AllocateResponse()
        for req in request.container_requests:
            try:
                result: Plan | None = None
                if self.kind is ResourceKind.COUNT:
                    result = await self._allocator.allocate(len(req.devices_ids))
                elif self.kind is ResourceKind.MEMORY:
                    result = await self._allocator.allocate_memory(len(req.devices_ids))
            except AllocateError as exc:
                code = grpc.StatusCode.FAILED_PRECONDITION if exc.pod else grpc.StatusCode.NOT_FOUND
                await context.abort(code, str(exc))
            response.container_responses.append(
                pb.ContainerAllocateResponse() if result is None else to_response(result))
        return response

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def _serialize(message: Any) -> bytes:
    return message if isinstance(message, bytes) else bytes(message.SerializeToString())


def add_to_server(plugin: DevicePlugin, server: grpc.aio.Server) -> None:
    """Like the generated add_DevicePluginServicer_to_server, but ListAndWatch may yield bytes."""
    empty = pb.Empty.FromString
    handlers = {
        "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
            plugin.GetDevicePluginOptions, request_deserializer=empty, response_serializer=_serialize),
        "ListAndWatch": grpc.unary_stream_rpc_method_handler(
            plugin.ListAndWatch, request_deserializer=empty, response_serializer=_serialize),
        "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
            plugin.GetPreferredAllocation, request_deserializer=pb.PreferredAllocationRequest.FromString,
            response_serializer=_serialize),
        "Allocate": grpc.unary_unary_rpc_method_handler(
            plugin.Allocate, request_deserializer=pb.AllocateRequest.FromString,
            response_serializer=_serialize),
        "PreStartContainer": grpc.unary_unary_rpc_method_handler(
            plugin.PreStartContainer, request_deserializer=pb.PreStartContainerRequest.FromString,
            response_serializer=_serialize),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1beta1.DevicePlugin", handlers),))


def to_response(result: Plan) -> pb.ContainerAllocateResponse:
    out = pb.ContainerAllocateResponse()
    out.envs.update(result.envs)
    for m in result.mounts:
        out.mounts.add(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
    for path in result.device_specs:
        out.devices.add(container_path=path, host_path=path, permissions="rw")
    return out
