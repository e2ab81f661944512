"""vgpu-monitor: per-container GPU memory usage and limits from libvgpu.so's shared regions.

`region` parses one region file (layout: hook/include/vgpu_region.h, hook/README.md); `scan`
finds the containers' files and asks the kernel which processes are alive; `pods` reads the
node's pod list (names, containers that ended); `exporter` turns a scan into Prometheus metrics
on :9394; `main` is the `vgpu-monitor` command.
"""
