"""The plugin's Allocate answer, applied as a container runtime applies it, caps the container.

The answer comes from the plugin over gRPC (kubelet simulator, fixture pod with a 3000 MiB
share). A private mount namespace stands in for the container: the answer's mounts are bind-mounted
at their container paths (read-only where the answer says so), `/etc/ld.so.preload` included, and
a process runs the hook's demo (500 MiB steps until refused) over the fake driver. libvgpu.so and
the plugin meet only here: the variable names, the settings file and the mounts must agree.

A process that drops its environment (`env -i`) or brings its own limits (the pod's env) keeps the
cap, because the settings file is mounted read-only; without that mount it would not, which the
last test shows. Needs a private mount namespace (root, or CAP_SYS_ADMIN) and the hook's build.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from vgpu_deviceplugin.allocate import SETTINGS_CONTAINER_PATH
from vgpu_deviceplugin.api import deviceplugin_pb2 as pb
from vgpu_deviceplugin.config import Flags

from tests.deviceplugin.kit import FIXTURE_NODE, FakeKube, fixture_pod
from tests.deviceplugin.test_plugin_kubelet import COUNT, running
from tests.support.hook import DEMO, HOOK_BUILD, LIBVGPU, ensure_built
from tests.support.required import unavailable

CAPPED = "refused at step 7 with 3000 MiB held"  # the fixture pod's 3000 MiB share, 500 MiB steps
STAGE = "/usr/local/.stage"  # inside the container's tmpfs: the host paths, before /tmp is covered


def _can_make_mount_namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs none /mnt"],
                           capture_output=True, check=False)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def hook_outputs() -> None:
    ensure_built()
    if not _can_make_mount_namespaces():
        unavailable("needs a private mount namespace (unshare -m: root or CAP_SYS_ADMIN)")


@pytest.fixture
async def answer(hook_outputs: None, flags: Flags, kube: FakeKube,
                 tmp_path: Path) -> pb.ContainerAllocateResponse:
    """The plugin's answer for the fixture pod; its hook folder holds the built libvgpu.so."""
    del hook_outputs
    hook = tmp_path / "hook"
    hook.mkdir()
    shutil.copy(LIBVGPU, hook / "libvgpu.so")
    (hook / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")  # as the chart's image has it
    kube.add_pod(fixture_pod())
    kube.nodes[FIXTURE_NODE] = {"metadata": {"name": FIXTURE_NODE, "annotations": {}}}
    async with running(replace(flags, hook_path=str(hook)), kube) as sim:
        response = await sim.allocate(COUNT, sim.free_ids(COUNT, 2))
    return response.container_responses[0]


@pytest.fixture(scope="module")
def etc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of /etc to mount over it, so that the answer's /etc/ld.so.preload has a place to go
    without touching the host's; made once for the module."""
    copy = tmp_path_factory.mktemp("container") / "etc"
    subprocess.run(["cp", "-a", "/etc", str(copy)], check=False, capture_output=True)
    return copy


def run_in_container(answer: pb.ContainerAllocateResponse, etc: Path, env: dict[str, str],
                     skip: str = "", gpus: str = "") -> str:
    """The demo in a mount namespace laid out by `answer` (without the mount at `skip`), with
    exactly `env` as its environment and `etc` over /etc; its output. The fake driver shows the
    GPUs the answer's NVIDIA_VISIBLE_DEVICES names, as the container runtime exposes them, or
    `gpus` (UUIDs) instead."""
    env = {**env, "FAKE_CUDA_UUIDS": gpus or answer.envs["NVIDIA_VISIBLE_DEVICES"]}
    mounts = [m for m in answer.mounts if m.container_path != skip]
    lines = ["set -eu", "mount -t tmpfs -o mode=755 none /usr/local", f"mkdir {STAGE}",
             f"mkdir {STAGE}/build && mount --bind {shlex.quote(str(HOOK_BUILD))} {STAGE}/build"]
    for i, m in enumerate(mounts):  # the host side, staged: /tmp is about to be covered
        lines.append(f"touch {STAGE}/{i} && mount --bind {shlex.quote(m.host_path)} {STAGE}/{i}")
    lines += [f"mount --bind {shlex.quote(str(etc))} /etc", "mount -t tmpfs -o mode=1777 none /tmp"]
    for i, m in enumerate(mounts):
        target = shlex.quote(m.container_path)
        lines.append(f'mkdir -p "$(dirname {target})" && {{ [ -e {target} ] || touch {target}; }}')
        lines.append(f"mount --bind {'-o ro ' if m.read_only else ''}{STAGE}/{i} {target}")
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    lines.append(f"exec env -i {assignments} {STAGE}/build/{DEMO.name} --max-steps 10")
    done = subprocess.run(["unshare", "-m", "sh", "-c", "\n".join(lines)], capture_output=True,
                          text=True, timeout=60, check=False)
    return done.stdout + done.stderr


def test_the_answer_caps_a_process_with_its_environment(answer: pb.ContainerAllocateResponse,
                                                          etc: Path) -> None:
    mounts = {m.container_path: m for m in answer.mounts}
    assert mounts[SETTINGS_CONTAINER_PATH].read_only
    output = run_in_container(answer, etc, dict(answer.envs))
    assert CAPPED in output, output


def test_a_process_that_drops_its_environment_keeps_the_cap(answer: pb.ContainerAllocateResponse,
                                                            etc: Path) -> None:
    output = run_in_container(answer, etc, {})
    assert CAPPED in output, output


def test_the_pods_own_env_cannot_raise_the_cap(answer: pb.ContainerAllocateResponse, etc: Path) -> None:
    # A pod's env names the same variables as the plugin's answer, with its own values.
    env = {**answer.envs, "CUDA_DEVICE_MEMORY_LIMIT_0": "80g", "CUDA_DEVICE_MEMORY_LIMIT": "80g"}
    output = run_in_container(answer, etc, env)
    assert CAPPED in output, output
    ignored = ("CUDA_DEVICE_MEMORY_LIMIT_0=80g ignored: the device plugin's settings file "
               f"{SETTINGS_CONTAINER_PATH}")
    assert ignored in output, output


def test_without_the_settings_file_a_scrubbed_environment_is_uncapped(
        answer: pb.ContainerAllocateResponse, etc: Path) -> None:
    # What the settings file closes (HAMi-core's contract alone): the same answer minus that
    # mount, and env -i runs on a default region with no cap.
    output = run_in_container(answer, etc, {}, skip=SETTINGS_CONTAINER_PATH)
    assert "never refused: 5000 MiB held after 10 steps" in output, output


def test_a_gpu_the_plugin_did_not_assign_gets_nothing(answer: pb.ContainerAllocateResponse,
                                                      etc: Path) -> None:
    # A runtime that also exposes another of the node's GPUs (a pod's own
    # NVIDIA_VISIBLE_DEVICES=all honoured): the library makes nothing on it.
    other = "GPU-0f0e0d0c-0b0a-0908-0706-050403020100"
    output = run_in_container(answer, etc, {}, gpus=f"{other},{answer.envs['NVIDIA_VISIBLE_DEVICES']}")
    assert f"CUDA device 0 is {other}, which the device plugin did not assign" in output, output
    assert "CUDA start failed: CUDA_ERROR_NOT_PERMITTED" in output, output
