"""vgpu_deviceplugin."""
