"""vgpuctl."""
