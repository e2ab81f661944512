"""The daemons' command lines as a user meets them: the installed console scripts, run as
processes. A failure to start is one `prog: error: ...` line and exit status 1; $KUBECONFIG is
honoured; --version answers; the operator's logs carry the policy and one line per write."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from vgpu_emulator import run_emulator
from vgpu_formats.cli import version

from tests.support.kubeconfigs import TOKEN_AT_PORT
from tests.support.waiting import eventually

from .conftest import FIXTURES, plugin_pods

BIN = Path(sys.executable).parent
# The node daemons need a node name before they look for a kubeconfig.
DAEMONS = {"vgpu-operator": [], "deviceplugin": ["--node-name", "n1"], "vgpu-monitor": ["--node-name", "n1"]}


def _env(home: Path, **extra: str) -> dict[str, str]:
    """Nothing of the caller's cluster: no $KUBECONFIG, an empty HOME, not a pod."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return {**env, "HOME": str(home), **extra}


def _run(prog: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / prog), *DAEMONS[prog], *args], capture_output=True, text=True,
                          env=env, timeout=60)


def _error_line(result: subprocess.CompletedProcess[str], prog: str) -> str:
    """The one error line (last on stderr); nothing else failed loudly."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{prog}: error: "), result.stderr
    return last


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("prog", ["vgpu-operator", "deviceplugin"])
def test_no_kubeconfig_is_one_line_naming_the_flag_and_the_variable(prog: str, tmp_path: Path) -> None:
    result = _run(prog, env=_env(tmp_path))
    assert result.stderr.count("\n") == 1, result.stderr  # exactly one line, nothing before it
    line = _error_line(result, prog)
    assert "--kubeconfig" in line and "$KUBECONFIG" in line


@pytest.mark.parametrize("prog", sorted(DAEMONS))
def test_a_named_kubeconfig_that_is_missing_is_named(prog: str, tmp_path: Path) -> None:
    assert "--kubeconfig /nonexistent: no such file" in _error_line(
        _run(prog, "--kubeconfig", "/nonexistent", env=_env(tmp_path)), prog)
    assert "$KUBECONFIG=/nope: no such file" in _error_line(
        _run(prog, env=_env(tmp_path, KUBECONFIG="/nope")), prog)


@pytest.mark.parametrize("prog", sorted(DAEMONS))
def test_a_broken_kubeconfig_names_the_file_and_the_problem(prog: str, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    line = _error_line(_run(prog, "--kubeconfig", str(config), env=_env(tmp_path)), prog)
    assert f"kubeconfig {config}: no current-context" in line


@pytest.mark.parametrize("prog", sorted(DAEMONS))
def test_with_json_logs_the_failure_is_one_fatal_json_record(prog: str, tmp_path: Path) -> None:
    result = _run(prog, "--log-format", "json", "--kubeconfig", "/nonexistent", env=_env(tmp_path))
    assert result.returncode == 1, result.stderr
    entries = [json.loads(line) for line in result.stderr.splitlines()]  # every line is JSON
    assert entries[-1]["severity"] == "fatal" and entries[-1]["logger"] == prog
    assert entries[-1]["message"] == "--kubeconfig /nonexistent: no such file"
    assert "exc_info" not in entries[-1]  # the traceback only at --log-level debug
    debug = _run(prog, "--log-format", "json", "--log-level", "debug", "--kubeconfig", "/nonexistent",
                 env=_env(tmp_path))
    last = json.loads(debug.stderr.splitlines()[-1])
    assert last["message"] == entries[-1]["message"] and "Traceback" in last["exc_info"]


def test_the_operator_takes_kubeconfig_from_the_environment_and_names_the_unreachable_server(
        tmp_path: Path) -> None:
    port = _closed_port()
    config = tmp_path / "config"
    config.write_text(TOKEN_AT_PORT % port)
    env = _env(tmp_path, KUBECONFIG=str(config))
    result = _run("vgpu-operator", "--metrics-port", "0", "--liveness-port", "0", env=env)
    line = _error_line(result, "vgpu-operator")
    assert f"http://127.0.0.1:{port}" in line and str(config) in line and "Connection refused" in line
    # --log-level debug: the same line, after the traceback.
    debug = _run("vgpu-operator", "--metrics-port", "0", "--liveness-port", "0", "--log-level", "debug",
                 env=env)
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == line


@pytest.mark.parametrize("flag", ["--metrics-port", "--liveness-port"])
def test_a_port_in_use_names_its_flag(flag: str, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(TOKEN_AT_PORT % _closed_port())
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        other = "--liveness-port" if flag == "--metrics-port" else "--metrics-port"
        result = _run("vgpu-operator", "--kubeconfig", str(config), flag, str(port), other, "0",
                      env=_env(tmp_path))
    assert f"{flag} {port}: Address already in use" in _error_line(result, "vgpu-operator")


@pytest.mark.parametrize("prog", sorted(DAEMONS))
def test_version_and_usage_errors(prog: str, tmp_path: Path) -> None:
    shown = _run(prog, "--version", env=_env(tmp_path))
    assert shown.returncode == 0 and shown.stdout.strip() == f"{prog} {version()}"
    usage = _run(prog, "--log-format", "xml", env=_env(tmp_path))
    assert usage.returncode == 2 and "--log-format" in usage.stderr


async def _operator_logs(log_format: str, tmp_path: Path) -> str:
    """stderr of `vgpu-operator` run on the emulator (found through $KUBECONFIG) while it applies
    a policy, and its hand-edited device-config is repaired."""
    async with run_emulator(FIXTURES / "cluster") as running:
        plugin_pods(running.emulator)
        emulator = running.emulator
        process = await asyncio.create_subprocess_exec(
            str(BIN / "vgpu-operator"), "--metrics-port", "0", "--liveness-port", "0", "--resync", "0.3",
            "--log-format", log_format, stderr=asyncio.subprocess.PIPE,
            env=_env(tmp_path, KUBECONFIG=str(running.kubeconfig)))
        try:
            emulator.apply({"apiVersion": "vgpu.io/v1alpha1", "kind": "VGPUPolicy",
                            "metadata": {"name": "default"}, "spec": {}})

            def ready() -> bool:
                status = (emulator.get_object("VGPUPolicy", None, "default") or {}).get("status") or {}
                conditions = status.get("conditions") or []
                return any(c["type"] == "Applied" and c["status"] == "True" for c in conditions)

            await eventually(ready, what="the policy applied")
            device_config = emulator.get_object("ConfigMap", "kube-system", "volcano-vgpu-device-config")
            assert device_config is not None
            emulator.apply({**device_config, "data": {"device-config.yaml": "nvidia: {}\n"}})
            await eventually(lambda: [e for e in emulator.list_objects("Event")
                                      if e.get("reason") == "DriftRepaired"], what="the hand edit repaired")
        finally:
            process.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0, stderr.decode()
    return stderr.decode()


async def test_json_logs_carry_the_policy_and_one_line_per_write(tmp_path: Path) -> None:
    entries: list[dict[str, Any]] = [json.loads(line) for line in
                                     (await _operator_logs("json", tmp_path)).splitlines()]
    assert all({"timestamp", "severity", "message", "logger"} <= entry.keys() for entry in entries)
    policy_lines = [e for e in entries if (e.get("object") or {}).get("kind") == "VGPUPolicy"]
    assert policy_lines and all(e["object"]["name"] == "default" for e in policy_lines)
    # kopf's lines name the handler by its id, not by `register.<locals>.policy_changed`.
    assert any(e["message"] == "Handler 'policy_changed' succeeded." for e in policy_lines)
    assert not [e for e in entries if "<locals>" in e["message"]]
    writes = [e for e in policy_lines if e.get("action") and e["severity"] == "info"]
    device_config = {"kind": "ConfigMap", "namespace": "kube-system", "name": "volcano-vgpu-device-config"}
    assert any(e["action"] in ("created", "updated") and e["target"]["kind"] == "ConfigMap" for e in writes)
    assert any(e["action"] == "restarted" and e["target"]["kind"] == "Deployment" for e in writes)
    [repair] = [e for e in writes if e["action"] == "repaired"]
    assert repair["target"] == device_config and repair["reason"] == "drift"


async def test_text_logs_prefix_the_policy(tmp_path: Path) -> None:
    lines = (await _operator_logs("text", tmp_path)).splitlines()
    assert any("INFO kopf.objects: [default] Handler 'policy_changed' succeeded." in line for line in lines)
    assert any("[default] repaired ConfigMap kube-system/volcano-vgpu-device-config: hand edit undone" in line
               for line in lines), "\n".join(lines)
