"""vgpu_emulator: an in-process Kubernetes API for tests, benches and `vgpuctl demo`.

    async with run_emulator("tests/fixtures/cluster") as running:
        running.url, running.kubeconfig        # point clients here
        running.emulator.get_object("ConfigMap", "kube-system", "volcano-vgpu-device-config")
        running.emulator.fail_next("PATCH", "/configmaps/", status=409)
        running.emulator.writes()              # successful PATCH/POST/PUT/DELETE requests
"""

from vgpu_emulator.emulator import ApiError, Emulator, Fault, Served, merge_patch
from vgpu_emulator.loader import ManifestError, iter_manifests, load_manifests, load_objects
from vgpu_emulator.resources import BUILTINS, VGPUPOLICY, ResourceSpec, specs_from_crd
from vgpu_emulator.server import RunningEmulator, kubeconfig_text, run_emulator
from vgpu_emulator.waiting import wait_until

__all__ = [
    "BUILTINS",
    "VGPUPOLICY",
    "ApiError",
    "Emulator",
    "Fault",
    "ManifestError",
    "ResourceSpec",
    "RunningEmulator",
    "Served",
    "iter_manifests",
    "kubeconfig_text",
    "load_manifests",
    "load_objects",
    "merge_patch",
    "run_emulator",
    "specs_from_crd",
    "wait_until",
]
