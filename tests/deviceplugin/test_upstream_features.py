"""Upstream plugin features (issue 12 item 6): served ones work, refused ones stop the start."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest
from vgpu_deviceplugin import main as entry
from vgpu_deviceplugin import runner
from vgpu_deviceplugin.allocate import CONTROL_DEVICES, SETTINGS_CONTAINER_PATH, device_specs
from vgpu_deviceplugin.config import Flags
from vgpu_deviceplugin.gpus import MockBackend
from vgpu_deviceplugin.main import flags_from, install_signals, parser, refused
from vgpu_deviceplugin.testing.kubelet_sim import KubeletSim

from tests.deviceplugin.kit import FakeKube, fixture_pod
from tests.deviceplugin.test_plugin_kubelet import CORES, COUNT, MEMORY, REGISTER, device_config_data, running
from tests.support.waiting import eventually

UPSTREAM_ENV = ("MIG_STRATEGY", "FAIL_ON_INIT_ERROR", "PASS_DEVICE_SPECS", "DEVICE_ID_STRATEGY",
                "DEVICE_LIST_STRATEGY", "CDI_ANNOTATION_PREFIX", "MPS_ROOT", "GDRCOPY_ENABLED", "GDS_ENABLED",
                "MOFED_ENABLED", "CONFIG_FILE", "KUBELET_SOCKET")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in UPSTREAM_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("argv", "named"), [
    (["--mig-strategy", "single"], "--mig-strategy=single"),
    (["--mig-strategy=mixed"], "--mig-strategy=mixed"),
    (["--device-list-strategy", "cdi-annotations"], "--device-list-strategy=cdi-annotations"),
    (["--device-list-strategy", "envvar,cdi-cri"], "--device-list-strategy=envvar,cdi-cri"),
    (["--device-list-strategy", "volume-mounts"], "--device-list-strategy=volume-mounts"),
    (["--cdi-annotation-prefix", "nvidia.cdi.k8s.io/"], "--cdi-annotation-prefix=nvidia.cdi.k8s.io/"),
    (["--mps-root", "/run/nvidia/mps"], "--mps-root=/run/nvidia/mps"),
    (["--gdrcopy-enabled"], "--gdrcopy-enabled=true"),
    (["--gds-enabled=true"], "--gds-enabled=true"),
    (["--mofed-enabled=1"], "--mofed-enabled=true"),
    (["--config-file", "/etc/nvidia/config.yaml"], "--config-file=/etc/nvidia/config.yaml"),
])
def test_a_feature_not_served_stops_the_start_with_one_line(
        argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.main(["--node-name", "n", *argv]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"deviceplugin: error: {named} (or env ") and "not supported" in line


def test_mig_refusal_points_to_the_upstream_plugin(capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.main(["--node-name", "n", "--mig-strategy", "single"]) == 1
    assert "does not serve MIG; use the upstream plugin (generation current)" in capsys.readouterr().err


def test_values_that_mean_off_are_accepted() -> None:
    """What stock DaemonSets pass: nothing is refused and nothing changes."""
    args = parser().parse_args([
        "--node-name", "n", "--mig-strategy", "none", "--device-list-strategy", "envvar",
        "--pass-device-specs=false", "--gdrcopy-enabled=false", "--gds-enabled=false", "--mofed-enabled=F",
        "--cdi-annotation-prefix", "cdi.k8s.io/", "--device-id-strategy", "uuid", "--fail-on-init-error"])
    assert refused(args) is None
    assert args.fail_on_init_error is True
    flags = flags_from(args)
    assert (flags.pass_device_specs, flags.device_id_strategy) == (False, "uuid")


def test_upstream_env_variables_are_flag_defaults(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PASS_DEVICE_SPECS", "true")
    monkeypatch.setenv("DEVICE_ID_STRATEGY", "index")
    monkeypatch.setenv("FAIL_ON_INIT_ERROR", "false")
    monkeypatch.setenv("KUBELET_SOCKET", "/k/device-plugins/kubelet.sock")
    args = parser().parse_args(["--node-name", "n"])
    flags = flags_from(args)
    assert (flags.pass_device_specs, flags.device_id_strategy) == (True, "index")
    assert args.fail_on_init_error is False and flags.device_plugin_dir == "/k/device-plugins"
    # The flag wins over the env variable, as with urfave/cli.
    given = parser().parse_args(["--node-name", "n", "--pass-device-specs=false"])
    assert flags_from(given).pass_device_specs is False
    monkeypatch.setenv("MIG_STRATEGY", "mixed")
    assert entry.main(["--node-name", "n"]) == 1
    assert "--mig-strategy=mixed (or env MIG_STRATEGY)" in capsys.readouterr().err
    monkeypatch.setenv("MIG_STRATEGY", "bogus")
    with pytest.raises(SystemExit) as usage:
        entry.main(["--node-name", "n"])
    assert usage.value.code == 2


def test_device_specs_are_the_gpus_and_the_control_nodes_present() -> None:
    present = {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    assert device_specs([3, 1, 3], present.__contains__) == (
        "/dev/nvidia3", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm")


async def test_pass_device_specs_and_index_strategy_through_grpc(flags: Flags, kube: FakeKube) -> None:
    kube.add_pod(fixture_pod())
    backend = MockBackend.from_register_annotation(REGISTER)
    gpus = {g.uuid: g for g in backend.discover()}
    wanted = ["GPU-bc94e532-1820-8ee8-ceaa-704166369c7c", "GPU-5beec879-79c9-6252-3aaa-9f5e146ba220"]
    flags = replace(flags, pass_device_specs=True, device_id_strategy="index")
    async with running(flags, kube, backend) as sim:
        answer = (await sim.allocate(COUNT, sim.free_ids(COUNT, 2))).container_responses[0]
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(str(gpus[u].index) for u in wanted)
    # The settings file names the GPUs by UUID all the same: libvgpu.so matches limits to GPUs by it.
    settings = next(m.host_path for m in answer.mounts if m.container_path == SETTINGS_CONTAINER_PATH)
    assert f"\nNVIDIA_VISIBLE_DEVICES={','.join(wanted)}\n" in Path(settings).read_text()
    specs = [(d.container_path, d.host_path, d.permissions) for d in answer.devices]
    gpu_nodes = [f"/dev/nvidia{gpus[u].minor}" for u in wanted]
    assert specs[:2] == [(p, p, "rw") for p in gpu_nodes]
    assert [s[0] for s in specs[2:]] == [p for p in CONTROL_DEVICES if os.path.exists(p)]


async def test_sighup_rereads_the_configmaps_and_registers_again(
        flags: Flags, kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    kube.set_configmap("kube-system", "volcano-vgpu-device-config", device_config_data())
    reads: list[Flags] = []
    real_load = runner.load_config

    async def counting(client: FakeKube, f: Flags) -> runner.LoadedConfig:
        reads.append(f)
        return await real_load(client, f)

    monkeypatch.setattr(runner, "load_config", counting)
    sim = KubeletSim(flags.device_plugin_dir)
    await sim.start()
    stop, reload = asyncio.Event(), asyncio.Event()
    install_signals(stop, reload)  # what `deviceplugin` installs
    task = asyncio.create_task(runner.run_plugin(flags, stop, kube=kube,
                                                 backend=MockBackend.from_register_annotation(REGISTER),
                                                 reload=reload))
    try:
        await sim.wait_for([COUNT, MEMORY, CORES])
        registered, read = len(sim.registrations), len(reads)
        os.kill(os.getpid(), signal.SIGHUP)
        await eventually(lambda: len(sim.registrations) == registered + 3)
        assert len(reads) == read + 1 and not task.done()  # re-read, still running
        await sim.wait_for([COUNT, MEMORY, CORES])
        assert len(sim.devices[COUNT]) == 80
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await sim.stop()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
            loop.remove_signal_handler(sig)
