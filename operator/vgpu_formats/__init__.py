"""Upstream wire formats shared by the operator, the device plugin and vgpuctl.

One module per format: `device_config` (device-config.yaml), `node_config` (config.json),
`annotations` (node and pod annotations), `list_and_watch` (the kubelet's message limit and a device
list's size). Parsing is strict and raises `FormatError`;
rendering is deterministic.
"""

from vgpu_formats.errors import FormatError

__all__ = ["FormatError"]
