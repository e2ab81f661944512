"""ServiceMonitors, alerts and the Grafana dashboard point at things that exist: Services and
ports the chart renders, and metric names the operator, the node monitor and Volcano export."""

from __future__ import annotations

import json
import re
from typing import Any

from vgpu_operator.metrics import Metrics

from tests.charts import chart
from tests.charts.conftest import Renders

Obj = dict[str, Any]
FIXTURES = chart.ROOT / "tests" / "fixtures"

# The node monitor keeps HAMi's names (research: device-plugin.md §5.2).
MONITOR_METRICS = {"HostGPUMemoryUsage", "HostCoreUtilization", "vGPU_device_memory_usage_in_bytes",
                   "vGPU_device_memory_limit_in_bytes", "Device_memory_desc_of_container",
                   "Device_utilization_desc_of_container", "Device_last_kernel_of_container"}
# kube-state-metrics and Prometheus itself.
OTHER_METRICS = {"kube_node_status_allocatable", "up"}
METRIC = re.compile(r"\b(vgpu_operator_\w+|volcano_vgpu_\w+|vGPU_\w+|Host[A-Z]\w+|Device_\w+|kube_\w+|up)\b")


def scheduler_metrics() -> set[str]:
    text = (FIXTURES / "scheduler-metrics-sample.txt").read_text()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}


def operator_metrics() -> set[str]:
    names = set()
    for family in Metrics().registry.collect():
        names |= {sample.name for sample in family.samples}
    return names


def known_metrics() -> set[str]:
    return operator_metrics() | scheduler_metrics() | MONITOR_METRICS | OTHER_METRICS


def metric_names(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


def dashboard() -> Obj:
    data: Obj = json.loads((chart.CHART / "dashboards" / "vgpu-overview.json").read_text())
    return data


def dashboard_exprs() -> dict[str, list[str]]:
    return {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in dashboard()["panels"]}


def test_dashboard_uses_only_exported_metrics() -> None:
    known = known_metrics()
    for title, exprs in dashboard_exprs().items():
        for expr in exprs:
            names = metric_names(expr)
            assert names, f"{title}: no metric found in {expr!r}"
            assert names <= known, f"{title}: unknown metrics {names - known}"


def test_dashboard_covers_what_admins_ask_for() -> None:
    exprs = " ".join(e for es in dashboard_exprs().values() for e in es)
    titles = " ".join(dashboard_exprs()).lower()
    for needed in ("volcano_vgpu_device_shared_number", "volcano_vgpu_device_allocated_memory",
                   "volcano_vgpu_device_memory_limit", "volcano_vgpu_device_allocated_cores",
                   "vgpu_operator_drift_repairs_total", 'vgpu_operator_reconciles_total{result="error"}',
                   "vgpu_operator_nodes_converged", "vgpu_operator_policy_ready",
                   "vgpu_operator_restarts_total", "vGPU_device_memory_usage_in_bytes"):
        assert needed in exprs, needed
    for word in ("per node", "per gpu", "slots", "cores", "drift", "reconcile"):
        assert word in titles, word
    # Per node and per GPU: the scheduler's labels, as the sample shows them.
    sample = (FIXTURES / "scheduler-metrics-sample.txt").read_text()
    assert 'NodeName="' in sample and 'devID="' in sample
    assert "by (NodeName, devID)" in exprs and "by (NodeName)" in exprs


def test_dashboard_is_shipped_in_the_configmap(default_objects: list[Obj]) -> None:
    configmap = next(c for c in chart.of_kind(default_objects, "ConfigMap")
                     if c["metadata"]["name"].endswith("-dashboard"))
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["vgpu-overview.json"]) == dashboard()


def test_dashboard_namespace_is_configurable(full_objects: list[Obj]) -> None:
    configmap = next(c for c in chart.of_kind(full_objects, "ConfigMap")
                     if c["metadata"]["name"].endswith("-dashboard"))
    assert configmap["metadata"]["namespace"] == "monitoring"


def test_alerts_use_only_exported_metrics(full_objects: list[Obj]) -> None:
    rules = chart.one(full_objects, "PrometheusRule")["spec"]["groups"][0]["rules"]
    known = known_metrics()
    alerts = {r["alert"] for r in rules}
    assert {"VGPUPolicyNotReady", "VGPUReconcileErrors", "VGPUConfigDriftRepeated",
            "VGPUOperatorDown"} <= alerts
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names and names <= known, f"{rule['alert']}: {names - known}"
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
        assert rule["annotations"]["summary"]


def test_alert_templates_reach_prometheus_unexpanded(full_objects: list[Obj]) -> None:
    rules = chart.one(full_objects, "PrometheusRule")["spec"]["groups"][0]["rules"]
    over = next(r for r in rules if r["alert"] == "VGPUMemoryOverLimit")
    assert "{{ $labels.podnamespace }}" in over["annotations"]["summary"]


def test_service_monitors_select_rendered_services(full_objects: list[Obj]) -> None:
    services = chart.of_kind(full_objects, "Service")
    monitors = chart.of_kind(full_objects, "ServiceMonitor")
    assert len(monitors) == 2
    for monitor in monitors:
        assert monitor["metadata"]["labels"]["release"] == "prom"
        selector = monitor["spec"]["selector"]["matchLabels"]
        matched = [s for s in services if selector.items() <= s["metadata"]["labels"].items()
                   and s["metadata"]["namespace"] in monitor["spec"]["namespaceSelector"]["matchNames"]]
        assert len(matched) == 1, monitor["metadata"]["name"]
        ports = {p["name"] for p in matched[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports


def test_alert_jobs_are_the_scraped_services(full_objects: list[Obj]) -> None:
    # The Prometheus Operator names a ServiceMonitor's job after the Service.
    rules = chart.one(full_objects, "PrometheusRule")["spec"]["groups"][0]["rules"]
    services = {s["metadata"]["name"] for s in chart.of_kind(full_objects, "Service")}
    jobs = {j for r in rules for j in re.findall(r'job="([^"]+)"', r["expr"])}
    assert jobs and jobs <= services


def test_monitoring_is_opt_in(renders: Renders) -> None:
    kinds = {o["kind"] for o in renders("default")}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}, "needs the Prometheus Operator CRDs"


def test_dashboard_panels_do_not_overlap() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
