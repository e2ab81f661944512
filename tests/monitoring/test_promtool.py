"""promtool, built from the pin in e2e/tools/prometheus (`make e2e-build`), on what the chart and the
code ship: `check rules` and `test rules` (alerts.test.yaml, at least one unit test per alert) on
the PrometheusRule `helm template` renders, and `check metrics` on live scrapes of the operator's
and the node monitor's /metrics.

Without a built promtool the tests skip (a cold build takes minutes, longer than a test may);
with VGPU_REQUIRE_E2E set they fail instead, so CI cannot pass by skipping them."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from vgpu_deviceplugin.monitor.exporter import LEGACY_NAMES

from e2e import controlplane
from tests.charts import chart
from tests.monitoring.scrapes import monitor_scrape, operator_scrape
from tests.support.required import unavailable

HERE = Path(__file__).resolve().parent
UNIT_TESTS = HERE / "alerts.test.yaml"


@pytest.fixture(scope="module")
def promtool() -> Path:
    found = controlplane.cached(controlplane.PROMETHEUS, "promtool")
    if found is None:
        unavailable("promtool is not built: run `make e2e-build` (python -m e2e.controlplane build)")
    return found


def run(promtool: Path, *args: str, stdin: str | None = None, cwd: Path | None = None) -> tuple[int, str]:
    result = subprocess.run([str(promtool), *args], input=stdin, capture_output=True, text=True, cwd=cwd,
                            timeout=60, check=False)
    return result.returncode, result.stdout + result.stderr


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The PrometheusRule's spec (a Prometheus rules file), rendered with the default values."""
    objects = chart.render({"metrics": {"prometheusRule": {"enabled": True},
                                        "serviceMonitor": {"enabled": True}}})
    folder = tmp_path_factory.mktemp("rules")
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump(chart.one(objects, "PrometheusRule")["spec"], sort_keys=False))
    shutil.copy(UNIT_TESTS, folder / UNIT_TESTS.name)
    return path


def test_check_rules(promtool: Path, rules_file: Path) -> None:
    code, out = run(promtool, "check", "rules", "--lint=all", "--lint-fatal", str(rules_file))
    assert code == 0, out
    assert "SUCCESS: 6 rules found" in out, out


def test_every_alert_has_a_unit_test(rules_file: Path) -> None:
    alerts = {r["alert"] for g in yaml.safe_load(rules_file.read_text())["groups"] for r in g["rules"]}
    tested = {case["alertname"] for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
              for case in test.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert alerts == tested, f"alerts without a firing unit test: {alerts - tested}"


def test_alert_unit_tests_pass(promtool: Path, rules_file: Path) -> None:
    code, out = run(promtool, "test", "rules", UNIT_TESTS.name, cwd=rules_file.parent)
    assert code == 0, out
    assert "SUCCESS" in out, out


@pytest.mark.parametrize("scrape", [operator_scrape, monitor_scrape], ids=["operator", "monitor"])
def test_check_metrics_on_a_live_scrape(promtool: Path, scrape: Callable[[], str]) -> None:
    code, out = run(promtool, "check", "metrics", stdin=scrape())
    # Upstream's own names are camelCase, kept for dashboards built for upstream: nothing else may fail.
    problems = [line for line in out.splitlines() if line.strip()]
    unexpected = [p for p in problems if p.split()[0] not in LEGACY_NAMES.values()]
    assert unexpected == [], out
    assert code == (3 if problems else 0), out
