"""vgpu_emulator."""
