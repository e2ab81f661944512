"""The `deviceplugin` command line: every flag documented, legacy flags accepted."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from vgpu_deviceplugin.main import IGNORED_FLAGS, flags_from, parser

README = Path(__file__).resolve().parents[2] / "deviceplugin" / "README.md"


def test_every_flag_has_help_and_is_in_the_readme() -> None:
    from vgpu_deviceplugin.monitor.main import parser as monitor_parser

    readme = README.read_text()
    for action in [*parser()._actions, *monitor_parser()._actions]:
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                assert action.help, option
                assert f"`{option}" in readme, f"{option} is not documented in deviceplugin/README.md"


def test_legacy_flags_map_to_flags() -> None:
    args = parser().parse_args(["--node-name", "n", "--resource-name", "nvidia.com/gpu",
                                "--device-split-count=4", "--gpu-memory-factor", "2",
                                "--device-cores-scaling", "1.5",
                                "--kubelet-socket", "/k/device-plugins/kubelet.sock", "--pass-device-specs"])
    flags = flags_from(args)
    assert (flags.resource_name, flags.device_split_count) == ("nvidia.com/gpu", 4)
    assert flags.gpu_memory_factor == 2
    assert flags.device_cores_scaling == 1.5 and flags.device_plugin_dir == "/k/device-plugins"
    assert flags.device_config_namespace is None  # not given: kube-system then volcano-system


def test_help_runs_and_missing_node_name_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    out = subprocess.run([sys.executable, "-m", "vgpu_deviceplugin.main", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "--mock-gpus" in out and "legacy flags" in out
    monkeypatch.delenv("NODE_NAME", raising=False)
    failed = subprocess.run([sys.executable, "-m", "vgpu_deviceplugin.main"], capture_output=True, text=True,
                            env={"PATH": "/usr/bin", "PYTHONPATH": ":".join(sys.path)})
    assert failed.returncode == 2 and "--node-name (or env NODE_NAME) is required" in failed.stderr


def test_nvidia_flags_are_accepted_with_a_warning(caplog: pytest.LogCaptureFixture,
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert "--driver-root" in IGNORED_FLAGS and "--pass-device-specs" not in IGNORED_FLAGS  # served
    from vgpu_deviceplugin import main as entry

    # In a pod (the service account would be used): the GPU spec is what stops it.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with caplog.at_level(logging.WARNING, logger="vgpu_deviceplugin"):
        code = entry.main(["--node-name", "n", "--driver-root", "/run/nvidia/driver",
                           "--device-list-strategy", "envvar", "--mock-gpus", "bogus"])
    assert code == 1
    assert "flag --driver-root has no effect" in caplog.text
    assert "--device-list-strategy" not in caplog.text  # envvar is what this plugin does
    [error] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert error.startswith("deviceplugin: error: ") and "--mock-gpus item 'bogus'" in error


def test_klog_verbosity_of_upstream_daemonsets_is_a_log_level() -> None:
    from vgpu_deviceplugin.main import klog_verbosity

    assert klog_verbosity(["-v=4", "--node-name", "n"]) == ["--log-level", "debug", "--node-name", "n"]
    assert klog_verbosity(["--v=2", "-v", "5", "-v", "--x"]) == ["--log-level", "debug", "-v", "--x"]
    args = parser().parse_args(klog_verbosity(["--node-name", "n", "-v=4"]))
    assert args.log_level == "debug"
    assert parser().parse_args(klog_verbosity(["-v=1", "--log-format", "json"])).log_level == "info"
