"""vgpu_operator."""
