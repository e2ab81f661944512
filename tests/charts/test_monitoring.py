"""ServiceMonitors, alerts, the Grafana dashboard, NOTES and the README point at things that
exist: Services and ports the chart renders, and metric names found in live scrapes of the
operator and the node monitor (tests/monitoring/scrapes.py) or in Volcano's sample. promtool's
own checks of the same rules and scrapes are in tests/monitoring/test_promtool.py."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import pytest
import yaml
from vgpu_deviceplugin.monitor.exporter import LEGACY_NAMES

from tests.charts import chart
from tests.charts.conftest import Renders
from tests.monitoring.scrapes import exported_names, monitor_scrape, operator_scrape

Obj = dict[str, Any]
FIXTURES = chart.ROOT / "tests" / "fixtures"
RUNBOOK = chart.CHART / "RUNBOOK.md"
ALERTS = ("VGPUPolicyNotReady", "VGPUReconcileErrors", "VGPUConfigDriftRepeated", "VGPUOperatorDown",
          "VGPUNodeMonitorDown", "VGPUMemoryOverLimit")
# Exported by others: kube-state-metrics (node capacity) and Prometheus itself (target health).
EXTERNAL_METRICS = {"kube_node_status_allocatable", "up"}
# PromQL words that look like metric names: keywords, and `by (...)`-style label lists.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


@functools.cache
def operator_names() -> frozenset[str]:
    return frozenset(exported_names(operator_scrape()))


@functools.cache
def monitor_names() -> frozenset[str]:
    return frozenset(exported_names(monitor_scrape()))


def scheduler_metrics() -> set[str]:
    return exported_names((FIXTURES / "scheduler-metrics-sample.txt").read_text())


def known_metrics() -> set[str]:
    return operator_names() | monitor_names() | scheduler_metrics() | EXTERNAL_METRICS


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not its functions, labels or strings)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = GROUPING.sub(" ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", text):
        if not text[match.end():].lstrip().startswith("(") and match[0] not in KEYWORDS:
            names.add(match[0])
    return names


def test_metric_names_finds_selectors_only() -> None:
    assert metric_names('histogram_quantile(0.95, sum by (le) (rate(a_bucket{x="b c"}[5m])))') == {"a_bucket"}
    assert metric_names("max by (p) (a / (b > 0)) > 1e9 and on (n) c offset 5m") == {"a", "b", "c"}
    assert metric_names('absent(up{job="j"} == 1)') == {"up"}


def dashboard() -> Obj:
    data: Obj = json.loads((chart.CHART / "dashboards" / "vgpu-overview.json").read_text())
    return data


def dashboard_exprs() -> dict[str, list[str]]:
    return {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in dashboard()["panels"]}


def rules(objects: list[Obj]) -> list[Obj]:
    found: list[Obj] = chart.one(objects, "PrometheusRule")["spec"]["groups"][0]["rules"]
    return found


def test_the_monitor_exports_upstreams_names_beside_snake_case_ones() -> None:
    names = monitor_names()
    assert {"HostGPUMemoryUsage", "HostCoreUtilization", "vGPU_device_memory_usage_in_bytes",
            "vGPU_device_memory_limit_in_bytes", "Device_last_kernel_of_container"} <= names
    assert set(LEGACY_NAMES) | set(LEGACY_NAMES.values()) <= names
    assert "vgpu_monitor_build_info" in names and "vgpu_operator_build_info" in operator_names()
    camel = {n for n in names | operator_names() if re.search(r"[A-Z]", n)}
    assert camel == set(LEGACY_NAMES.values()), "only upstream's own names may be camelCase"


def test_dashboard_uses_only_exported_metrics() -> None:
    known = known_metrics()
    for title, exprs in dashboard_exprs().items():
        for expr in exprs:
            names = metric_names(expr)
            assert names, f"{title}: no metric found in {expr!r}"
            assert names <= known, f"{title}: unknown metrics {names - known}"
    for variable in dashboard()["templating"]["list"]:
        for name in re.findall(r"label_values\((\w+)", json.dumps(variable.get("query", ""))):
            assert name in known, f"variable {variable['name']}: unknown metric {name}"


def test_dashboard_prefers_the_snake_case_names() -> None:
    exprs = " ".join(e for es in dashboard_exprs().values() for e in es)
    legacy = metric_names(exprs) & set(LEGACY_NAMES.values())
    assert not legacy, "upstream's names are kept for upstream's dashboards, not ours"


def test_dashboard_covers_what_admins_ask_for() -> None:
    exprs = " ".join(e for es in dashboard_exprs().values() for e in es)
    titles = " ".join(dashboard_exprs()).lower()
    for needed in ("volcano_vgpu_device_shared_number", "volcano_vgpu_device_allocated_memory",
                   "volcano_vgpu_device_memory_limit", "volcano_vgpu_device_allocated_cores",
                   "vgpu_operator_drift_repairs_total", 'vgpu_operator_reconciles_total{result="error"}',
                   "vgpu_operator_nodes_converged", "vgpu_operator_policy_ready",
                   "vgpu_operator_restarts_total", "vgpu_container_memory_used_bytes",
                   "vgpu_host_gpu_memory_used_bytes", "vgpu_host_gpu_utilization_percent"):
        assert needed in exprs, needed
    for word in ("per node", "per gpu", "slots", "cores", "drift", "reconcile", "host gpu"):
        assert word in titles, word
    # Per node and per GPU: the scheduler's labels, as the sample shows them.
    sample = (FIXTURES / "scheduler-metrics-sample.txt").read_text()
    assert 'NodeName="' in sample and 'devID="' in sample
    assert "by (NodeName, devID)" in exprs and "by (NodeName)" in exprs


def shipped_dashboard(objects: list[Obj]) -> Obj:
    configmap = next(c for c in chart.of_kind(objects, "ConfigMap")
                     if c["metadata"]["name"].endswith("-dashboard"))
    data: Obj = json.loads(configmap["data"]["vgpu-overview.json"])
    return data


def test_dashboard_is_shipped_in_the_configmap(default_objects: list[Obj]) -> None:
    configmap = next(c for c in chart.of_kind(default_objects, "ConfigMap")
                     if c["metadata"]["name"].endswith("-dashboard"))
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert shipped_dashboard(default_objects) == dashboard()


def count_resource_default() -> str:
    spec = chart.crd_schema(yaml.safe_load(chart.CRD_FILE.read_text()))["properties"]["spec"]
    default: str = spec["properties"]["resources"]["properties"]["count"]["default"]
    return default


@pytest.mark.parametrize(("count", "ksm"), [(None, "volcano_sh_vgpu_number"),
                                           ("nvidia.com/gpu", "nvidia_com_gpu")])
def test_capacity_uses_the_policys_count_resource(count: str | None, ksm: str) -> None:
    values = {"policy": {"spec": {"resources": {"count": count}}}} if count else {}
    capacity = next(e for e in dashboard_exprs()["vGPU slots per node: used vs capacity"]
                    if "kube_node_status_allocatable" in e)
    assert 'resource="$count_resource"' in capacity
    variables = {v["name"]: v for v in shipped_dashboard(chart.render(values))["templating"]["list"]}
    assert variables["count_resource"]["type"] == "constant" and variables["count_resource"]["query"] == ksm
    step = notes(values).split("4. Find vGPU capacity", 1)[1].split("\n\n", 1)[0]
    escaped = (count or count_resource_default()).replace(".", "\\.")
    assert f"VGPUS:.status.allocatable.{escaped}'" in step
    assert count is None or "vgpu-number" not in step


def notes(values: Obj) -> str:
    out = chart.run_helm("install", chart.RELEASE, str(chart.CHART), "--namespace", chart.NAMESPACE,
                         "--dry-run=client", values=values)
    return out.split("\nNOTES:\n", 1)[1]


def test_dashboard_namespace_is_configurable(full_objects: list[Obj]) -> None:
    configmap = next(c for c in chart.of_kind(full_objects, "ConfigMap")
                     if c["metadata"]["name"].endswith("-dashboard"))
    assert configmap["metadata"]["namespace"] == "monitoring"


def test_alerts_use_only_exported_metrics(full_objects: list[Obj]) -> None:
    known = known_metrics()
    assert {r["alert"] for r in rules(full_objects)} == set(ALERTS)
    for rule in rules(full_objects):
        names = metric_names(rule["expr"])
        assert names and names <= known, f"{rule['alert']}: {names - known}"
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_every_alert_links_its_runbook_section(full_objects: list[Obj]) -> None:
    anchors = {heading.lower() for heading in re.findall(r"^## (\w+)$", RUNBOOK.read_text(), re.MULTILINE)}
    for rule in rules(full_objects):
        base, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert base.endswith("/charts/vgpu-operator/RUNBOOK.md") and anchor in anchors, rule["alert"]


def test_per_alert_settings() -> None:
    objects = chart.render({"metrics": {"serviceMonitor": {"enabled": True},
                                        "prometheusRule": {"enabled": True, "runbookUrl": "", "alerts": {
        "VGPUMemoryOverLimit": {"enabled": False},
        "VGPUOperatorDown": {"severity": "warning", "for": "3m", "labels": {"team": "gpu"}}}}}})
    by_name = {r["alert"]: r for r in rules(objects)}
    assert "VGPUMemoryOverLimit" not in by_name and "VGPUPolicyNotReady" in by_name
    down = by_name["VGPUOperatorDown"]
    assert down["for"] == "3m" and down["labels"]["severity"] == "warning" and down["labels"]["team"] == "gpu"
    assert by_name["VGPUPolicyNotReady"]["for"] == "15m"  # the others keep their defaults
    assert "for" not in by_name["VGPUConfigDriftRepeated"]  # "" = fire at once
    assert not any("runbook_url" in r["annotations"] for r in by_name.values())


DOWN = "/metrics/prometheusRule/alerts/VGPUOperatorDown"


@pytest.mark.parametrize(("alerts", "message"), [
    ({"VGPUOperatorDwn": {"enabled": False}}, "VGPUOperatorDwn"),
    ({"VGPUOperatorDown": {"severity": "page"}}, f"{DOWN}/severity"),
    ({"VGPUOperatorDown": {"for": "10 minutes"}}, f"{DOWN}/for"),
    ({"VGPUOperatorDown": {"labels": {"severity": "page"}}}, f"{DOWN}/labels"),
])
def test_a_bad_alert_setting_is_refused(alerts: Obj, message: str) -> None:
    with pytest.raises(chart.HelmError, match=re.escape(message)):
        chart.template({"metrics": {"serviceMonitor": {"enabled": True},
                                    "prometheusRule": {"enabled": True, "alerts": alerts}}})


@pytest.mark.parametrize("metrics", [{"serviceMonitor": {"enabled": False}},
                                     {"service": {"enabled": False}, "serviceMonitor": {"enabled": False}}])
def test_alerts_without_the_scrape_they_read_are_refused(metrics: Obj) -> None:
    # VGPUOperatorDown is absent(up{job=<the ServiceMonitor's>}): with nothing scraping that job
    # it fired for good, and VGPUNodeMonitorDown never could.
    with pytest.raises(chart.HelmError, match=re.escape("metrics.serviceMonitor.enabled=true")):
        chart.template({"metrics": {**metrics, "prometheusRule": {"enabled": True}}})


def test_operator_down_names_its_job_and_namespace(full_objects: list[Obj]) -> None:
    # absent() has no series to take labels from: the rule sets them, so routing by namespace works.
    down = next(r for r in rules(full_objects) if r["alert"] == "VGPUOperatorDown")
    job = down["labels"]["job"]
    assert down["labels"]["namespace"] == chart.NAMESPACE
    assert f'job="{job}"' in down["expr"] and f'namespace="{chart.NAMESPACE}"' in down["expr"]
    assert job in {s["metadata"]["name"] for s in chart.of_kind(full_objects, "Service")}


def test_alert_templates_reach_prometheus_unexpanded(full_objects: list[Obj]) -> None:
    over = next(r for r in rules(full_objects) if r["alert"] == "VGPUMemoryOverLimit")
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


def test_service_monitor_knobs() -> None:
    drop = {"sourceLabels": ["__name__"], "regex": "vGPU_.+", "action": "drop"}
    cluster = {"targetLabel": "cluster", "replacement": "eu-1"}
    objects = chart.render({"metrics": {"serviceMonitor": {
        "enabled": True, "interval": "60s", "scrapeTimeout": "20s", "relabelings": [cluster],
        "metricRelabelings": [drop]}}})
    for monitor in chart.of_kind(objects, "ServiceMonitor"):
        endpoint = monitor["spec"]["endpoints"][0]
        assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("60s", "20s")
        assert endpoint["metricRelabelings"] == [drop] and endpoint["relabelings"][-1] == cluster
    plugin = next(m for m in chart.of_kind(objects, "ServiceMonitor")
                  if m["metadata"]["name"].endswith("-monitor"))
    assert plugin["spec"]["endpoints"][0]["relabelings"][0]["targetLabel"] == "node"  # the chart's own first
    defaults = chart.render({"metrics": {"serviceMonitor": {"enabled": True}}})
    for monitor in chart.of_kind(defaults, "ServiceMonitor"):
        assert not {"scrapeTimeout", "metricRelabelings"} & set(monitor["spec"]["endpoints"][0])


def test_alert_jobs_are_the_scraped_services(full_objects: list[Obj]) -> None:
    # The Prometheus Operator names a ServiceMonitor's job after the Service.
    services = {s["metadata"]["name"] for s in chart.of_kind(full_objects, "Service")}
    jobs = {j for r in rules(full_objects) for j in re.findall(r'job="([^"]+)"', r["expr"])}
    assert jobs and jobs <= services


def test_readme_names_only_exported_metrics() -> None:
    readme = (chart.CHART / "README.md").read_text()
    section = readme.split("## Metrics, alerts, dashboard", 1)[1].split("\n## ", 1)[0]
    named = {n for n in re.findall(r"`([A-Za-z_:][A-Za-z0-9_:]*)[{`]", section)
             if n.startswith(("vgpu_", "vGPU_", "Host", "Device_", "volcano_"))}
    known = known_metrics() | {n.removesuffix("_bucket") for n in known_metrics()}  # histograms by family
    assert named and named <= known, named - known
    assert set(ALERTS) <= set(re.findall(r"`(VGPU\w+)`", section))


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


@pytest.mark.parametrize(("timeout", "refused"), [("30s", False), ("29s500ms", False), ("30s1ms", True),
                                                  ("1m", True)])
def test_a_scrape_timeout_longer_than_the_interval_is_refused(timeout: str, refused: bool) -> None:
    # Prometheus refuses such a scrape config: nothing is scraped and the down alerts fire.
    values = {"metrics": {"serviceMonitor": {"enabled": True, "interval": "30s", "scrapeTimeout": timeout}}}
    if refused:
        with pytest.raises(chart.HelmError, match="longer than the interval 30s"):
            chart.template(values)
    else:
        monitors = chart.of_kind(chart.render(values), "ServiceMonitor")
        assert {e["scrapeTimeout"] for m in monitors for e in m["spec"]["endpoints"]} == {timeout}
