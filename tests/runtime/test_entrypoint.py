"""The command line, the login from a kubeconfig, the metric names, the liveness endpoint."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import aiohttp
import kopf
import pytest
from prometheus_client import generate_latest
from vgpu_emulator import run_emulator
from vgpu_operator.metrics import Metrics
from vgpu_operator.plan import Restart
from vgpu_operator.runtime.run import connection_from_kubeconfig, events_where_accepted, run_operator
from vgpu_operator.settings import parse_args, start_time_priority

from tests.support.waiting import eventually

from .conftest import FIXTURES


def test_kopf_files_cluster_events_where_the_api_server_accepts_them() -> None:
    # In-cluster login sets kopf's default namespace to the pod's, where an Event about the
    # cluster-scoped VGPUPolicy is refused (422): both logins must say `default`.
    in_cluster = kopf.ConnectionInfo(server="https://10.0.0.1", token="t", default_namespace="vgpu-system")
    fixed = events_where_accepted(in_cluster)
    assert fixed is not None and fixed.default_namespace == "default" and fixed.token == "t"
    assert events_where_accepted(None) is None


def test_flags_the_chart_passes() -> None:
    settings = parse_args(["--namespace", "volcano-system", "-n", "kube-system", "--liveness-port", "8081",
                           "--metrics-port", "0", "--kubeconfig", "/k", "--verbose"])
    assert settings.namespaces == ["volcano-system", "kube-system"]
    assert settings.standalone and settings.peering is None
    assert (settings.liveness_port, settings.metrics_port, settings.kubeconfig) == (8081, None, "/k")
    peered = parse_args(["--peering", "vgpu"])
    assert peered.peering == "vgpu" and not peered.standalone


def test_peered_replicas_get_distinct_priorities_and_the_older_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    # kopf pauses all peers of equal priority: two replicas with the default would both idle.
    monkeypatch.delenv("VGPU_OPERATOR_PRIORITY", raising=False)
    assert parse_args([]).priority is None  # standalone: no peering, no priority
    first = parse_args(["--peering", "vgpu"]).priority
    second = parse_args(["--peering", "vgpu"]).priority
    assert first is not None and second is not None and first > second
    assert start_time_priority(1_000_000) > start_time_priority(2_000_000) > 0
    assert parse_args(["--peering", "vgpu", "--priority", "7"]).priority == 7
    monkeypatch.setenv("VGPU_OPERATOR_PRIORITY", "42")
    assert parse_args(["--peering", "vgpu"]).priority == 42


def test_console_script_answers_help() -> None:
    result = subprocess.run([sys.executable, "-m", "vgpu_operator.main", "--help"], capture_output=True,
                            text=True, timeout=60, check=True)
    assert "--peering" in result.stdout and "--liveness-port" in result.stdout


def test_metric_names_are_the_dashboard_contract() -> None:
    metrics = Metrics()
    metrics.record_restarts([Restart("plugin-pod", "n1", "x")])
    text = generate_latest(metrics.registry).decode()
    for name in ('vgpu_operator_reconciles_total{result="ok"}',
                 "vgpu_operator_reconcile_duration_seconds_bucket",
                 "vgpu_operator_drift_repairs_total", 'vgpu_operator_restarts_total{kind="plugin-pod"} 1.0',
                 "vgpu_operator_nodes_converged", "vgpu_operator_policy_ready", "vgpu_operator_active"):
        assert name in text, name


async def test_login_from_kubeconfig_and_liveness_endpoint() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with run_emulator(FIXTURES / "cluster") as running:
        info = connection_from_kubeconfig(str(running.kubeconfig))
        assert info.server == running.url and info.token == "emulator"
        assert info.default_namespace == "default"
        stop, ready = asyncio.Event(), asyncio.Event()
        namespaces = ["kube-system", "volcano-system"]
        task = asyncio.create_task(run_operator(str(running.kubeconfig), stop, liveness_port=port,
                                                ready_flag=ready, namespaces=namespaces))
        try:
            await asyncio.wait_for(ready.wait(), timeout=10)

            async def healthy() -> bool:
                url = f"http://127.0.0.1:{port}/healthz"
                for _ in range(100):
                    try:
                        async with aiohttp.ClientSession() as session, session.get(url) as response:
                            return response.status == 200
                    except aiohttp.ClientConnectionError:
                        await asyncio.sleep(0.05)  # the endpoint starts beside the watchers
                return False

            assert await healthy()
            running.emulator.apply({"apiVersion": "vgpu.io/v1alpha1", "kind": "VGPUPolicy",
                                    "metadata": {"name": "p"}, "spec": {}})
            policy = lambda: running.emulator.get_object("VGPUPolicy", None, "p") or {}  # noqa: E731
            await eventually(lambda: policy().get("status"), what="status written by a namespaced operator")
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=10)
