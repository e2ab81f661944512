"""vgpu_formats."""
