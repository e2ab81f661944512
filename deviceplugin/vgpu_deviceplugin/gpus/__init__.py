"""GPU discovery behind one interface: NVML on a GPU node, a mock everywhere else.

`backend_for(mock_spec, node_name)` picks: a mock when `--mock-gpus` / `VGPU_MOCK_GPUS` is set,
NVML otherwise.
"""

from vgpu_deviceplugin.gpus.base import GpuBackend, GpuDevice, GpuError
from vgpu_deviceplugin.gpus.mock import MockBackend, parse_mock_spec


def backend_for(mock_spec: str | None, node_name: str) -> GpuBackend:
    if mock_spec:
        return MockBackend(parse_mock_spec(mock_spec, node_name))
    from vgpu_deviceplugin.gpus.nvml import NvmlBackend  # imports pynvml only on real nodes

    return NvmlBackend()


__all__ = ["GpuBackend", "GpuDevice", "GpuError", "MockBackend", "backend_for", "parse_mock_spec"]
